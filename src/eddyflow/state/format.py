"""The on-disk format of keyed state.

A keyed-state file is a sequence of frames: ``<8-byte big-endian
length><pickle of (key_group, "delta", [(state, keys, values, deleted),
…])>``: per state, the keys written and their values as two parallel lists,
and the keys deleted; or ``(key_group, "table", state, dict)``, a whole
table of a full snapshot. A *full* file holds every entry and no deletions; a
*delta* file holds what changed since the file before it in its chain (see
:mod:`eddyflow.state.memory.snapshot`). Frames of the earlier formats
(``(key_group, "columns", [(state, keys, values)])`` and ``(key_group,
[(state, key, value), …])``) are read too.

A file is *grouped* (a frame per non-empty key group, indexed by key group,
so a restore at another parallelism reads exactly the key groups it owns) or
not (frames of up to ``CHUNK`` entries in no particular order, key group
``-1``: grouping costs a stable hash per key, which is most of what writing
a snapshot of string keys costs; a reader that wants some key groups only
hashes the keys of a file whose owner had others too). The frame index goes
into the checkpoint metadata with the file's checksum.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, BinaryIO

from eddyflow.checkpoint.handles import StateFile
from eddyflow.checkpoint.storage import CheckpointCorrupted
from eddyflow.keygroups import key_groups_of
from eddyflow.values import SCALARS

__all__ = ["CHUNK", "DELETED", "FrameIndex", "Frames", "apply_entries", "decode_frame",
           "encode_chunks", "encode_frames", "read_key_groups", "read_state_file"]

#: str(key group) -> (offset, length) of its frame (lists once read back from JSON)
FrameIndex = dict[str, tuple[int, int]]
#: per key group: [(state, keys, values, deleted keys)]
Columns = dict[int, list[tuple[str, list[Any], list[Any], list[Any]]]]

_LEN = struct.Struct(">Q")
#: Entries per frame of an ungrouped file.
CHUNK = 1 << 16
#: The key group of an ungrouped file's frames.
UNGROUPED = -1
_DELTA = "delta"
_TABLE = "table"
_COLUMNS = "columns"  # format 2: no deletions


class _Deleted:
    """The value :func:`decode_frame` gives a key that a delta deletes."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DELETED"

    def __reduce__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()


class Frames:
    """A file's frames as they are encoded, and their index: kept as chunks
    in memory, or written to ``out`` as they come."""

    def __init__(self, out: BinaryIO | None = None) -> None:
        self.chunks: list[bytes] = []
        self.index: FrameIndex = {}
        self._offset = 0
        self._out = out

    def add(self, name: str, body: bytes) -> None:
        head = _LEN.pack(len(body))
        if self._out is None:
            self.chunks += (head, body)  # (not head + body: a copy of the body)
        else:
            self._out.write(head)
            self._out.write(body)
        self._note(name, _LEN.size + len(body))

    def add_pickle(self, name: str, obj: Any, fast: bool) -> None:
        """A frame holding ``obj`` pickled (see :func:`_dumps`); written to
        ``out`` as the pickler goes, its length filled in afterwards."""
        out = self._out
        if out is None:
            self.add(name, _dumps(obj, fast))
            return
        start = self._offset
        out.write(bytes(_LEN.size))  # the length, once known
        pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.fast = fast
        pickler.dump(obj)
        out.flush()
        end = out.tell()
        os.pwrite(out.fileno(), _LEN.pack(end - start - _LEN.size), start)
        self._note(name, end - start)

    def add_columns(self, name: str, keys: list[Any], values: list[Any],
                    deleted: list[Any]) -> None:
        """State ``name``'s keys and values written and keys deleted, in
        frames of up to ``CHUNK`` entries (``(-1, "delta", [(name, keys,
        values, deleted)])``), named by their number in the file."""
        parts: list[tuple[list[Any], list[Any], list[Any]]] = [
            (keys[i:i + CHUNK], values[i:i + CHUNK], []) for i in range(0, len(keys), CHUNK)]
        parts += [([], [], deleted[i:i + CHUNK]) for i in range(0, len(deleted), CHUNK)]
        for ks, vs, ds in parts:
            self.add(str(len(self.index)),
                     _dumps((UNGROUPED, _DELTA, [(name, ks, vs, ds)]),
                            fast=set(map(type, vs)) <= SCALARS))

    def _note(self, name: str, length: int) -> None:
        # A tuple of ints, unlike a list, is untracked by the collector.
        self.index[name] = (self._offset, length)
        self._offset += length


def encode_frames(columns: Columns) -> tuple[list[bytes], FrameIndex]:
    """The frames of a file, key group by key group, and their index."""
    frames = Frames()
    for kg in sorted(columns):
        frames.add(str(kg), pickle.dumps((kg, _DELTA, columns[kg]),
                                         protocol=pickle.HIGHEST_PROTOCOL))
    return frames.chunks, frames.index


def _dumps(obj: Any, fast: bool) -> bytes:
    """Pickle ``obj``; ``fast``: without the pickler's memo, which inserts
    every object it writes into a dict (measured: 0.36 s for 1M string keys
    with it, 0.03 s without). Only where nothing is shared that must stay
    shared: keys (immutable) and scalar values; other values keep the memo,
    so that objects shared within a value stay shared after a restore."""
    if not fast:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.fast = True  # deprecated in the docs, supported by the C pickler
    pickler.dump(obj)
    return out.getvalue()


def encode_chunks(tables: list[tuple[str, list[Any], list[Any], list[Any]]],
                  whole: Iterable[tuple[str, dict[Any, Any]]] = (),
                  out: BinaryIO | None = None) -> tuple[list[bytes], FrameIndex]:
    """The frames of an ungrouped file: per state, its keys, values and
    deleted keys, in frames of up to ``CHUNK`` entries; and the ``whole``
    tables of scalar values, a frame each (``(-1, "table", state, dict)``:
    pickling a dict walks it once, where key and value lists walk it twice
    and then the lists: 0.28 against 0.42 s for 1M string keys in random
    order). Indexed by frame number. With ``out`` (a new file, at its
    start) the frames are written there as they are encoded and no chunks
    are returned."""
    frames = Frames(out)
    for name, table in whole:
        frames.add_pickle(str(len(frames.index)), (UNGROUPED, _TABLE, name, table), fast=True)
    for name, keys, values, deleted in tables:
        frames.add_columns(name, keys, values, deleted)
    return frames.chunks, frames.index


def decode_frame(frame: bytes, kg: int, path: str, offset: int
                 ) -> list[tuple[str, Any, Any]]:
    """The ``(state, key, value)`` entries of key group ``kg``'s frame (read
    at ``offset`` of ``path``, named in errors); a deleted key has the value
    :data:`DELETED`, after the keys written."""
    (body_len,) = _LEN.unpack_from(frame)
    if _LEN.size + body_len != len(frame):
        raise CheckpointCorrupted(f"{path}: key group {kg}: frame length mismatch")
    try:
        body = pickle.loads(frame[_LEN.size:])
        got_kg = body[0]
        entries: list[tuple[str, Any, Any]] = []
        if len(body) == 4 and body[1] == _TABLE:
            name = body[2]
            entries = [(name, k, v) for k, v in body[3].items()]
        elif len(body) == 3 and body[1] == _DELTA:
            for name, keys, values, deleted in body[2]:
                entries.extend((name, k, v) for k, v in zip(keys, values, strict=True))
                entries.extend((name, k, DELETED) for k in deleted)
        elif len(body) == 3 and body[1] == _COLUMNS:
            entries = [(name, key, value) for name, keys, values in body[2]
                       for key, value in zip(keys, values, strict=True)]
        else:
            entries = list(body[1])  # format 1: (state, key, value) triples
    except Exception as exc:
        raise CheckpointCorrupted(f"{path}: key group {kg} unreadable: {exc}") from exc
    if got_kg != kg:
        raise CheckpointCorrupted(f"{path}: frame at {offset} holds key group {got_kg}")
    return entries


def read_key_groups(root: str, path: str, index: Mapping[str, Sequence[int]],
                    key_groups: Iterable[int]) -> Iterator[tuple[int, str, Any, Any]]:
    """Yield ``(key_group, state, key, value)`` for the wanted key groups of
    one keyed-state file (verified by the caller against its metadata)."""
    wanted = sorted(int(kg) for kg in key_groups if str(kg) in index)
    if not wanted:
        return
    full = os.path.join(root, path)
    try:
        with open(full, "rb") as f:
            for kg in wanted:
                offset, length = index[str(kg)]
                f.seek(offset)
                frame = f.read(length)
                if len(frame) != length:
                    raise CheckpointCorrupted(f"{full}: key group {kg} truncated")
                for name, key, value in decode_frame(frame, kg, full, offset):
                    yield kg, name, key, value
    except OSError as exc:
        raise CheckpointCorrupted(f"{full}: unreadable: {exc}") from exc


def read_state_file(root: str, file: StateFile, *, key_groups: range | None = None,
                    owner: range | None = None, max_parallelism: int = 0,
                    with_groups: bool = False) -> Iterator[tuple[int, str, Any, Any]]:
    """``(key_group, state, key, value)`` of one keyed-state file (verified
    by the caller), in the order they apply; of ``key_groups`` only if
    given. ``owner``: the key groups of the subtask that wrote it (an
    ungrouped file is filtered only when they are not all wanted). The key
    group of an entry of an ungrouped file is ``-1`` unless ``with_groups``
    or filtering needed it."""
    path, index = file.handle.path, file.index
    if file.grouped:
        groups = range(max(map(int, index), default=-1) + 1) if key_groups is None else key_groups
        yield from read_key_groups(root, path, index, groups)
        return
    hashing = with_groups or (key_groups is not None and not (
        owner is not None and len(owner) and owner.start >= key_groups.start
        and owner.stop <= key_groups.stop))
    full = os.path.join(root, path)
    try:
        with open(full, "rb") as f:
            for name_i in sorted(index, key=int):
                offset, length = index[name_i]
                f.seek(offset)
                frame = f.read(length)
                if len(frame) != length:
                    raise CheckpointCorrupted(f"{full}: frame {name_i} truncated")
                entries = decode_frame(frame, UNGROUPED, full, offset)
                if not hashing:
                    for name, key, value in entries:
                        yield UNGROUPED, name, key, value
                    continue
                kgs = key_groups_of([k for _, k, _ in entries], max_parallelism)
                for kg, (name, key, value) in zip(kgs, entries, strict=True):
                    if key_groups is None or kg in key_groups:
                        yield kg, name, key, value
    except OSError as exc:
        raise CheckpointCorrupted(f"{full}: unreadable: {exc}") from exc


def apply_entries(table_of: Callable[[str], MutableMapping[Any, Any]],
                  entries: Iterable[tuple[str, Any, Any]]) -> int:
    """Apply ``(state, key, value)`` entries of a chain, file after file, to
    the tables ``table_of(state)`` gives; :data:`DELETED` removes. Returns
    how many were applied."""
    n = 0
    for name, key, value in entries:
        table = table_of(name)
        if value is DELETED:
            table.pop(key, None)
        else:
            table[key] = value
        n += 1
    return n
