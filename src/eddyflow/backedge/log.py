"""The back-edge log: records that arrived on a loop head's back-edge inputs
between its snapshot for checkpoint ``n`` and barrier ``n``'s return round
the loop. They were produced inside the loop before the barrier passed and
are in no operator's state yet, so they are the channel state of the
back-edges, part of checkpoint ``n`` (DESIGN.md §3, steps 3-4).

File format: one pickle of ``{"channels": {str(index): [records…]}}`` — a
log is written once per checkpoint per head subtask, and read whole on
restore (and by the offline reader).
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from eddyflow.state.storage import CheckpointCorrupted, CheckpointStorage, FileHandle

__all__ = ["decode_backedge_log", "read_backedge_log", "write_backedge_log"]


async def write_backedge_log(
    storage: CheckpointStorage, relpath: str, channels: dict[int, list[Any]]
) -> FileHandle:
    body = pickle.dumps({"channels": {str(i): recs for i, recs in channels.items()}},
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
    """The channels of a back-edge log file's content (``path`` for errors)."""
    try:
        body = pickle.loads(data)
        return {int(i): list(recs) for i, recs in body["channels"].items()}
    except Exception as exc:
        raise CheckpointCorrupted(f"{path}: unreadable back-edge log: {exc}") from exc
