"""The on-disk format of keyed state, organised by key group.

A keyed-state file is a sequence of frames, one per non-empty key group:
``<8-byte big-endian length><pickle of (key_group, "delta", [(state, keys,
values, deleted), …])>``: per state, the keys written and their values as
two parallel lists, and the keys deleted. A *full* file holds every entry
and no deletions; a *delta* file holds what changed since the file before it
in its chain (see :mod:`eddyflow.state.memory.snapshot`). Frames of the
earlier formats (``(key_group, "columns", [(state, keys, values)])`` and
``(key_group, [(state, key, value), …])``) are read too.

The frame index (key group -> (offset, length)) goes into the checkpoint
metadata with the file's checksum, so a restore at another parallelism, or an
offline reader on a Spark executor, reads exactly the key groups it owns.
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from eddyflow.state.storage import CheckpointCorrupted

__all__ = ["DELETED", "FrameIndex", "apply_entries", "decode_frame", "encode_frames",
           "read_key_groups"]

#: str(key group) -> (offset, length) of its frame (lists once read back from JSON)
FrameIndex = dict[str, tuple[int, int]]
#: per key group: [(state, keys, values, deleted keys)]
Columns = dict[int, list[tuple[str, list[Any], list[Any], list[Any]]]]

_LEN = struct.Struct(">Q")
_DELTA = "delta"
_COLUMNS = "columns"  # format 2: no deletions


class _Deleted:
    """The value :func:`decode_frame` gives a key that a delta deletes."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DELETED"

    def __reduce__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()


def encode_frames(columns: Columns) -> tuple[list[bytes], FrameIndex]:
    """The frames of a file, key group by key group, and their index."""
    index: FrameIndex = {}
    chunks: list[bytes] = []
    offset = 0
    for kg in sorted(columns):
        body = pickle.dumps((kg, _DELTA, columns[kg]), protocol=pickle.HIGHEST_PROTOCOL)
        frame = _LEN.pack(len(body)) + body
        # A tuple of ints, unlike a list, is untracked by the collector.
        index[str(kg)] = (offset, len(frame))
        offset += len(frame)
        chunks.append(frame)
    return chunks, index


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
        if len(body) == 3 and body[1] == _DELTA:
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


def apply_entries(tables: dict[str, dict[Any, Any]],
                  entries: Iterable[tuple[str, Any, Any]]) -> int:
    """Apply ``(state, key, value)`` entries of a chain, file after file, to
    ``tables``; :data:`DELETED` removes. Returns how many were applied."""
    n = 0
    for name, key, value in entries:
        table = tables.get(name)
        if table is None:
            table = tables[name] = {}
        if value is DELETED:
            table.pop(key, None)
        else:
            table[key] = value
        n += 1
    return n
