"""The on-disk format of keyed state, organised by key group.

A keyed-state file is a sequence of frames, one per non-empty key group:
``<8-byte big-endian length><pickle of (key_group, "columns", [(state, keys,
values), …])>``, a state's keys and values as two parallel lists (files of
format 1 hold ``(key_group, [(state, key, value), …])``; both are read).
The frame index (key group -> [offset, length]) goes into the checkpoint
metadata with the file's checksum, so a restore at another parallelism, or an
offline reader on a Spark executor, reads exactly the key groups it owns.

Writing is the *asynchronous* phase of a snapshot: the tables were frozen by
a shallow copy in the synchronous phase. Each table's keys are kept grouped
by key group from one snapshot to the next (:class:`KeyGroupLayout`), so a
snapshot only hashes new keys and looks the values up at C speed; pickling
yields to the event loop after each slice of a few milliseconds, so that
processing continues. (Yielding per key group instead made a checkpoint of 5,000 keys
take 0.77 s in a busy job: every yield waits for a full round of all the
tasks' batches.)
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from eddyflow.keygroups import key_group_for
from eddyflow.state.storage import CheckpointCorrupted, CheckpointStorage, FileHandle

__all__ = ["FrameIndex", "FrozenState", "KeyGroupLayout", "Layouts", "decode_frame",
           "read_key_groups", "write_keyed_state"]

#: state name -> (kind, frozen table)
FrozenState = dict[str, tuple[str, dict[Any, Any]]]
#: str(key group) -> (offset, length) of its frame (lists once read back from JSON)
FrameIndex = dict[str, tuple[int, int]]

_LEN = struct.Struct(">Q")
_SLICE = 0.005  # seconds of CPU the asynchronous phase takes before it yields
_COLUMNS = "columns"  # marks a frame of parallel key and value lists


class KeyGroupLayout:
    """A state table's keys grouped by key group, as the last snapshot wrote
    them; kept on the backend so that the next snapshot only hashes and
    places the keys that are new (set differences of the key views, in C).
    Measured on 5,000 keys: 0.47 ms a snapshot against 1.3 ms for grouping
    entry by entry, and files a third smaller."""

    __slots__ = ("busy", "by_group", "group_of")

    def __init__(self) -> None:
        self.group_of: dict[Any, int] = {}
        self.by_group: dict[int, list[Any]] = {}
        self.busy = False  # a write is using the lists: another must not change them

    def update(self, table: dict[Any, Any], max_parallelism: int) -> None:
        """Make the layout hold exactly the keys of ``table``."""
        group_of, by_group = self.group_of, self.by_group
        if len(group_of) == len(table) and table.keys() <= group_of.keys():
            return  # the usual case, same keys: one pass and no sets (46 against 141 µs)
        gone = group_of.keys() - table.keys()
        if len(gone) > len(group_of) // 8:
            group_of.clear()
            by_group.clear()
        elif gone:
            for key in gone:
                by_group[group_of.pop(key)].remove(key)
        for key in table.keys() - group_of.keys():
            kg = group_of[key] = key_group_for(key, max_parallelism)
            keys = by_group.get(kg)
            if keys is None:
                by_group[kg] = [key]
            else:
                keys.append(key)


#: state name -> its layout, per keyed backend
Layouts = dict[str, KeyGroupLayout]


async def write_keyed_state(
    storage: CheckpointStorage,
    relpath: str,
    frozen: FrozenState,
    max_parallelism: int,
    layouts: Layouts | None = None,
) -> tuple[FileHandle, FrameIndex]:
    """Write ``frozen`` to ``relpath``; returns the handle and the frame
    index. ``layouts`` (the backend's, kept from one snapshot to the next)
    is brought up to date with the tables written."""
    layouts = {} if layouts is None else layouts
    mine: list[KeyGroupLayout] = []
    try:
        columns: dict[int, list[tuple[str, list[Any], list[Any]]]] = {}
        for name, (_, table) in frozen.items():
            layout = layouts.get(name)
            if layout is None:
                layout = layouts[name] = KeyGroupLayout()
            elif layout.busy:
                layout = KeyGroupLayout()  # an earlier write still reads the stored one
            layout.busy = True
            mine.append(layout)
            layout.update(table, max_parallelism)
            get = table.__getitem__
            for kg, keys in layout.by_group.items():
                if keys:
                    columns.setdefault(kg, []).append((name, keys, list(map(get, keys))))
        index: FrameIndex = {}
        chunks: list[bytes] = []
        offset = 0
        deadline = time.monotonic() + _SLICE
        for kg in sorted(columns):
            body = pickle.dumps((kg, _COLUMNS, columns[kg]), protocol=pickle.HIGHEST_PROTOCOL)
            frame = _LEN.pack(len(body)) + body
            # A tuple of ints, unlike a list, is untracked by the collector.
            index[str(kg)] = (offset, len(frame))
            offset += len(frame)
            chunks.append(frame)
            if time.monotonic() > deadline:
                await asyncio.sleep(0)
                deadline = time.monotonic() + _SLICE
        # The lists above must die before the write is awaited: alive
        # while records flow, they outlive two collections and enter the
        # oldest generation, and every few checkpoints' worth of them
        # triggers a full collection, which traverses the whole heap
        # (measured: 15 full collections in a run at 0.05 s against 6).
        del columns
    finally:
        for layout in mine:
            layout.busy = False
    handle = await storage.write_file(relpath, chunks)
    return handle, index


def read_key_groups(
    root: str, handle: FileHandle, index: Mapping[str, Sequence[int]], key_groups: Iterable[int]
) -> Iterator[tuple[int, str, Any, Any]]:
    """Yield ``(key_group, state, key, value)`` for the wanted key groups of
    one keyed-state file (the file is verified by the caller's metadata)."""
    wanted = sorted(int(kg) for kg in key_groups if str(kg) in index)
    if not wanted:
        return
    path = os.path.join(root, handle.path)
    with open(path, "rb") as f:
        for kg in wanted:
            offset, length = index[str(kg)]
            f.seek(offset)
            frame = f.read(length)
            if len(frame) != length:
                raise CheckpointCorrupted(f"{path}: key group {kg} truncated")
            for name, key, value in decode_frame(frame, kg, path, offset):
                yield kg, name, key, value


def decode_frame(frame: bytes, kg: int, path: str, offset: int
                 ) -> list[tuple[str, Any, Any]]:
    """The ``(state, key, value)`` entries of key group ``kg``'s frame (read
    at ``offset`` of ``path``, named in errors)."""
    (body_len,) = _LEN.unpack_from(frame)
    if _LEN.size + body_len != len(frame):
        raise CheckpointCorrupted(f"{path}: key group {kg}: frame length mismatch")
    try:
        body = pickle.loads(frame[_LEN.size:])
        got_kg = body[0]
        if len(body) == 3 and body[1] == _COLUMNS:
            entries = [(name, key, value) for name, keys, values in body[2]
                       for key, value in zip(keys, values, strict=True)]
        else:
            entries = list(body[1])  # format 1: (state, key, value) triples
    except Exception as exc:
        raise CheckpointCorrupted(f"{path}: key group {kg} unreadable: {exc}") from exc
    if got_kg != kg:
        raise CheckpointCorrupted(f"{path}: frame at {offset} holds key group {got_kg}")
    return entries
