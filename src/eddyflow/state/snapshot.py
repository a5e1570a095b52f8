"""The on-disk format of keyed state, organised by key group.

A keyed-state file is a sequence of frames, one per non-empty key group:
``<8-byte big-endian length><pickle of (key_group, [(state, key, value), …])>``.
The frame index (key group -> [offset, length]) goes into the checkpoint
metadata with the file's checksum, so a restore at another parallelism, or an
offline reader on a Spark executor, reads exactly the key groups it owns.

Writing is the *asynchronous* phase of a snapshot: the tables were frozen by
a shallow copy in the synchronous phase, and grouping and pickling yield to
the event loop after each slice of a few milliseconds, so that processing
continues. (Yielding per key group instead made a checkpoint of 5,000 keys
take 0.77 s in a busy job: every yield waits for a full round of all the
tasks' batches.)
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import time
from collections.abc import Iterable, Iterator
from typing import Any

from eddyflow.keygroups import key_group_for
from eddyflow.state.storage import CheckpointCorrupted, CheckpointStorage, FileHandle

__all__ = ["FrozenState", "decode_frame", "read_key_groups", "write_keyed_state"]

#: state name -> (kind, frozen table)
FrozenState = dict[str, tuple[str, dict[Any, Any]]]

_LEN = struct.Struct(">Q")
_SLICE = 0.005  # seconds of CPU the asynchronous phase takes before it yields
_CHECK_EVERY = 1024  # entries between clock reads


async def write_keyed_state(
    storage: CheckpointStorage,
    relpath: str,
    frozen: FrozenState,
    max_parallelism: int,
    key_group_cache: dict[Any, int] | None = None,
) -> tuple[FileHandle, dict[str, list[int]], dict[Any, int]]:
    """Write ``frozen`` to ``relpath``; returns the handle, the frame index,
    and the key -> key group map of the keys written (pass it back next time:
    hashing every key at every checkpoint was 60% of this phase's CPU)."""
    known = key_group_cache or {}
    seen: dict[Any, int] = {}
    groups: dict[int, list[tuple[str, Any, Any]]] = {}
    n = 0
    deadline = time.monotonic() + _SLICE
    for name, (_, table) in frozen.items():
        for key, value in table.items():
            kg = known.get(key)
            if kg is None:
                kg = key_group_for(key, max_parallelism)
            seen[key] = kg
            groups.setdefault(kg, []).append((name, key, value))
            n += 1
            if n % _CHECK_EVERY == 0 and time.monotonic() > deadline:
                await asyncio.sleep(0)
                deadline = time.monotonic() + _SLICE
    index: dict[str, list[int]] = {}
    chunks: list[bytes] = []
    offset = 0
    for kg in sorted(groups):
        body = pickle.dumps((kg, groups[kg]), protocol=pickle.HIGHEST_PROTOCOL)
        frame = _LEN.pack(len(body)) + body
        index[str(kg)] = [offset, len(frame)]
        offset += len(frame)
        chunks.append(frame)
        if time.monotonic() > deadline:
            await asyncio.sleep(0)
            deadline = time.monotonic() + _SLICE
    handle = await storage.write_file(relpath, chunks)
    return handle, index, seen


def read_key_groups(
    root: str, handle: FileHandle, index: dict[str, list[int]], key_groups: Iterable[int]
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
        got_kg, entries = pickle.loads(frame[_LEN.size:])
    except Exception as exc:
        raise CheckpointCorrupted(f"{path}: key group {kg} unreadable: {exc}") from exc
    if got_kg != kg:
        raise CheckpointCorrupted(f"{path}: frame at {offset} holds key group {got_kg}")
    return list(entries)
