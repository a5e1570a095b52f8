"""The back-edge log: records that arrived on a loop head's back-edge inputs
between its snapshot for checkpoint ``n`` and barrier ``n``'s return round
the loop. They were produced inside the loop before the barrier passed and
are in no operator's state yet, so they are the channel state of the
back-edges, part of checkpoint ``n`` (DESIGN.md §3, steps 3-4).

A batch is pickled the moment it is logged, before the head passes its
records on: the loop body may change them in place afterwards, and the log
must hold them as they were at the barrier.

File format: one pickle of ``{"format": 2, "channels": {str(index):
[pickled batch, …]}}`` (format 1 held the record lists themselves; both are
read) — a log is written once per checkpoint per head subtask, and read
whole on restore (and by the offline reader).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Any

from eddyflow.state.storage import CheckpointCorrupted, CheckpointStorage, FileHandle

__all__ = ["BackEdgeRecords", "decode_backedge_log", "read_backedge_log", "write_backedge_log"]


@dataclass(frozen=True)
class BackEdgeRecords:
    """A finished log: per back-edge channel, the batches logged (pickled),
    and how many records they hold."""

    channels: dict[int, list[bytes]]
    count: int

    @staticmethod
    def of(channels: dict[int, list[Any]]) -> BackEdgeRecords:
        """A log of ``channels``' records, each channel logged as one batch."""
        return BackEdgeRecords(
            {i: [pickle.dumps(list(recs), protocol=pickle.HIGHEST_PROTOCOL)] if recs else []
             for i, recs in channels.items()},
            sum(map(len, channels.values())))


async def write_backedge_log(storage: CheckpointStorage, relpath: str,
                             log: BackEdgeRecords) -> FileHandle:
    body = pickle.dumps({"format": 2,
                         "channels": {str(i): blobs for i, blobs in log.channels.items()}},
                        protocol=pickle.HIGHEST_PROTOCOL)
    return await storage.write_file(relpath, [body])


def read_backedge_log(root: str, handle: FileHandle) -> dict[int, list[Any]]:
    path = os.path.join(root, handle.path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise CheckpointCorrupted(f"{path}: unreadable back-edge log: {exc}") from exc
    return decode_backedge_log(data, path)


def decode_backedge_log(data: bytes, path: str) -> dict[int, list[Any]]:
    """The channels of a back-edge log file's content (``path`` for errors):
    fresh objects at every call."""
    try:
        body = pickle.loads(data)
        if body.get("format") == 2:
            out: dict[int, list[Any]] = {}
            for i, blobs in body["channels"].items():
                records: list[Any] = []
                for blob in blobs:
                    records.extend(pickle.loads(blob))
                out[int(i)] = records
            return out
        return {int(i): list(recs) for i, recs in body["channels"].items()}
    except Exception as exc:
        raise CheckpointCorrupted(f"{path}: unreadable back-edge log: {exc}") from exc
