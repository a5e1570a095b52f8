"""The back-edge log: records that arrived on a loop head's back-edge inputs
between its snapshot for checkpoint ``n`` and barrier ``n``'s return round
the loop. They were produced inside the loop before the barrier passed and
are in no operator's state yet, so they are the channel state of the
back-edges, part of checkpoint ``n`` (docs/concepts/cycles.md, steps 3-4).

A batch is pickled the moment it is logged, before the head passes its
records on: the loop body may change them in place afterwards, and the log
must hold them as they were at the barrier. It is logged with its records'
event timestamps, which go back into the loop with them on restore.

File format: one pickle of ``{"format": 3, "channels": {str(index):
[pickled (records, timestamps or None), …]}}``. Format 2 held pickled record
lists (no timestamps), format 1 the record lists themselves; all are read.
A log is written once per checkpoint per head subtask, and read whole on
restore (and by the offline reader).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage, FileHandle

__all__ = ["BackEdgeRecords", "Logged", "decode_backedge_batches", "decode_backedge_log",
           "decode_logged_channels", "encode_batch", "encode_logged_channels",
           "read_backedge_batches", "read_backedge_log", "write_backedge_log"]

#: One logged batch: its records and their timestamps (``None``: none).
Logged = tuple[list[Any], list[Any] | None]


@dataclass(frozen=True)
class BackEdgeRecords:
    """A finished log: per back-edge channel, the batches logged (pickled),
    and how many records they hold."""

    channels: dict[int, list[bytes]]
    count: int

    @staticmethod
    def of(channels: dict[int, list[Any]]) -> BackEdgeRecords:
        """A log of ``channels``' records (without timestamps), each channel
        logged as one batch."""
        return BackEdgeRecords(
            {i: [encode_batch(list(recs), None)] if recs else []
             for i, recs in channels.items()},
            sum(map(len, channels.values())))


def encode_batch(records: list[Any], timestamps: list[Any] | None) -> bytes:
    """One logged batch as the log stores it (pickling may raise: the
    caller names the record)."""
    return pickle.dumps((records, timestamps), protocol=pickle.HIGHEST_PROTOCOL)


def write_backedge_log(storage: CheckpointStorage, relpath: str,
                       log: BackEdgeRecords) -> Coroutine[Any, Any, FileHandle]:
    """Write a loop head's back-edge log to ``relpath``; the request goes to
    the writer process before this returns (``CheckpointStorage.start_write_file``):
    await the result for the file's handle."""
    body = encode_logged_channels({str(i): blobs for i, blobs in log.channels.items()})
    return storage.start_write_file(relpath, [body])


def _read(root: str, handle: FileHandle) -> tuple[bytes, str]:
    path = os.path.join(root, handle.path)
    try:
        with open(path, "rb") as f:
            return f.read(), path
    except OSError as exc:
        raise CheckpointCorrupted(f"{path}: unreadable back-edge log: {exc}") from exc


def read_backedge_log(root: str, handle: FileHandle) -> dict[int, list[Any]]:
    return decode_backedge_log(*_read(root, handle))


def read_backedge_batches(root: str, handle: FileHandle) -> dict[int, list[Logged]]:
    return decode_backedge_batches(*_read(root, handle))


def decode_backedge_log(data: bytes, path: str) -> dict[int, list[Any]]:
    """The records of each channel of a back-edge log file's content
    (``path`` for errors): fresh objects at every call."""
    return {i: [r for records, _ in batches for r in records]
            for i, batches in decode_backedge_batches(data, path).items()}


def decode_backedge_batches(data: bytes, path: str) -> dict[int, list[Logged]]:
    """The batches of each channel of a back-edge log file's content, with
    their timestamps (``None`` for logs of formats 1 and 2)."""
    return {int(i): batches
            for i, batches in decode_logged_channels(data, path, "back-edge log").items()}


def encode_logged_channels(channels: dict[str, list[bytes]]) -> bytes:
    """A file of logged batches per channel (the back-edge log's format,
    also that of unaligned checkpoints' channel state)."""
    return pickle.dumps({"format": 3, "channels": channels}, protocol=pickle.HIGHEST_PROTOCOL)


def decode_logged_channels(data: bytes, path: str, what: str) -> dict[str, list[Logged]]:
    """The batches of each channel of such a file, by the channel's name
    in it; ``what`` names the file in errors."""
    try:
        body = pickle.loads(data)
        fmt = body.get("format")
        out: dict[str, list[Logged]] = {}
        for i, items in body["channels"].items():
            if fmt == 3:
                batches: list[Logged] = []
                for blob in items:
                    records, timestamps = pickle.loads(blob)
                    if timestamps is not None and len(timestamps) != len(records):
                        raise ValueError(f"a batch of {len(records)} records has "
                                         f"{len(timestamps)} timestamps")
                    batches.append((list(records), timestamps))
                out[str(i)] = batches
            elif fmt == 2:
                out[str(i)] = [(list(pickle.loads(blob)), None) for blob in items]
            else:
                out[str(i)] = [(list(items), None)] if items else []
        return out
    except Exception as exc:
        raise CheckpointCorrupted(f"{path}: unreadable {what}: {exc}") from exc
