"""The commit journal: which sink output each checkpoint committed.

A sink commits a checkpoint's transactions once the checkpoint is complete,
so its output runs ahead of any *older* checkpoint. Restoring an older one —
because the latest does not verify any more, or by a deliberate restore to
an earlier ``chk-<n>`` — replays that output a second time. To take it back
first, the runtime must know what was committed after the checkpoint it
restores, even when the later checkpoint's ``_metadata`` is what was lost.

So before the sinks commit checkpoint ``n`` the coordinator writes
``<dir>/_commits/chk-<n>.json`` (atomically, with a checksum): the job's
*lineage* (an id a fresh start draws and every restore inherits, so that the
output of an unrelated earlier run in the same folder is never touched) and
every sink's committables. A record is deleted when its checkpoint is
subsumed by retention (no restore can go back past a retained checkpoint);
a record whose output has been taken back is kept, marked ``superseded``,
until then: its id stays used, so that no later checkpoint takes the id of
one whose output once existed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage
from eddyflow.checkpoint.writer import FileWrite
from eddyflow.checkpoint.writer_main import write_durably

__all__ = [
    "CommitRecord",
    "commit_record_ids",
    "commit_record_write",
    "mark_superseded",
    "next_checkpoint_id",
    "read_commit_records",
    "remove_commit_records_before",
    "write_commit_record",
]


@dataclass(frozen=True)
class CommitRecord:
    """What the sinks committed for checkpoint ``checkpoint_id``."""

    checkpoint_id: int
    lineage: str
    #: Committables by sink uid, as the writers prepared them.
    sinks: Mapping[str, tuple[Any, ...]]
    #: Its output was taken back by a restore from an earlier checkpoint.
    superseded: bool = False
    #: The metadata's ``base``: the checkpoint of another folder the run
    #: that committed this descends from (``None``: its history began here).
    base: tuple[str, int] | None = None

    def to_bytes(self) -> bytes:
        body = {"checkpoint_id": self.checkpoint_id, "lineage": self.lineage,
                "sinks": {uid: list(c) for uid, c in self.sinks.items()},
                "superseded": self.superseded,
                "base": None if self.base is None else list(self.base)}
        return json.dumps(dict(body, checksum=_checksum(body)), sort_keys=True).encode()

    @staticmethod
    def from_bytes(data: bytes, path: str) -> CommitRecord:
        try:
            d = json.loads(data)
            body = {k: v for k, v in d.items() if k != "checksum"}
            if d.get("checksum") != _checksum(body):
                raise ValueError("checksum mismatch (truncated or altered)")
            return CommitRecord(int(d["checkpoint_id"]), str(d["lineage"]),
                                {str(u): tuple(c) for u, c in d["sinks"].items()},
                                bool(d.get("superseded", False)),
                                None if d.get("base") is None
                                else (str(d["base"][0]), int(d["base"][1])))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointCorrupted(f"{path}: unreadable commit record: {exc}") from exc


def _checksum(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def commit_record_ids(storage: CheckpointStorage) -> list[int]:
    """Ids of the checkpoints with a commit record, ascending."""
    try:
        names = os.listdir(storage.layout.commits_dir)
    except FileNotFoundError:
        return []
    return sorted(n for name in names
                  if (n := storage.layout.parse_commit_record(name)) is not None)


def read_commit_records(storage: CheckpointStorage, *, after: int = -1
                        ) -> list[CommitRecord]:
    """The commit records of checkpoints later than ``after``, ascending;
    raises :class:`CheckpointCorrupted` naming a record that does not
    verify (then what was committed cannot be known)."""
    out = []
    for n in commit_record_ids(storage):
        if n <= after:
            continue
        path = storage.layout.commit_record(n)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue  # deleted since the listing (retention)
        except OSError as exc:
            raise CheckpointCorrupted(f"{path}: unreadable commit record: {exc}") from exc
        out.append(CommitRecord.from_bytes(data, path))
    return out


def commit_record_write(storage: CheckpointStorage, record: CommitRecord) -> FileWrite:
    """``record``'s file (its folder entry included), for
    :meth:`~eddyflow.checkpoint.storage.CheckpointStorage.write_all`: the sinks
    may commit once it is written."""
    return storage.small_write(storage.layout.commit_record_file(record.checkpoint_id),
                               record.to_bytes())


async def write_commit_record(storage: CheckpointStorage, record: CommitRecord) -> None:
    """Write ``record`` durably (its folder entry included): the sinks may
    commit once this returns."""
    await storage.write_all([commit_record_write(storage, record)])


def mark_superseded(storage: CheckpointStorage, record: CommitRecord) -> None:
    """Rewrite ``record`` as taken back (atomically, durably)."""
    path = storage.layout.commit_record(record.checkpoint_id)
    write_durably(path, [dataclasses.replace(record, superseded=True).to_bytes()],
                  sync_after=[os.path.dirname(path)])


def remove_commit_records_before(storage: CheckpointStorage, checkpoint_id: int) -> None:
    """Remove the records of checkpoints older than ``checkpoint_id`` (the
    oldest retained): no restore can go back to before them any more."""
    for n in commit_record_ids(storage):
        if n < checkpoint_id:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(storage.layout.commit_record(n))


def next_checkpoint_id(storage: CheckpointStorage) -> int:
    """The next id no checkpoint folder and no commit record uses: a record
    of a checkpoint whose folder was removed must not be overwritten."""
    ids = commit_record_ids(storage)
    return max(storage.next_id(), ids[-1] + 1 if ids else 1)
