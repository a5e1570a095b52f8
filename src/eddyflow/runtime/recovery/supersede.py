"""Before a restore: take back sink output committed after the checkpoint.

The rule (docs/architecture/checkpoints.md, "No silent duplicates"): a sink commits checkpoint
``n`` only after it completed, so a restore from an earlier checkpoint ``k``
— the latest no longer verifies, or an earlier one is restored on purpose —
would produce the output of ``k+1 … n`` a second time. Before such a
restore, every sink that committed output of a later checkpoint is asked to
take it back (:meth:`Sink.supersede`) — later: a higher id in ``k``'s own
folder (ids only grow there), or a higher id of ``k``'s lineage in another
folder (checkpoint/commits.py); never the output of an earlier run:
``FileSink`` moves the files aside, ``ListSink`` moves the records to
``superseded``, and a warning says where. A sink that cannot take output
back gets the restore refused (:class:`ef.RestoreRefused`) instead of
duplicates. A sink the job no longer has is left alone: the restored job
cannot write to it again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from eddyflow.checkpoint.commits import CommitRecord, mark_superseded, read_commit_records
from eddyflow.checkpoint.durable import fsync_dir
from eddyflow.checkpoint.lock import FolderLock
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage
from eddyflow.connectors.sink import Sink, awaited
from eddyflow.errors import RestoreRefused
from eddyflow.runtime.recovery.restore import RestoredCheckpoint

__all__ = ["supersede_later_output"]

log = logging.getLogger("eddyflow.checkpoint.listing")


def _takes_back(record: CommitRecord, folder: str, restored: RestoredCheckpoint | None,
                lineage: str | None) -> bool | None:
    """Whether ``record`` (in ``folder``) holds output later than
    ``restored`` in its history: True, False, or ``None`` when that cannot
    be told (another branch of the history; the restore is refused)."""
    if restored is None:  # a restart from the start of this execution's lineage
        return record.lineage == lineage
    home, k = restored.storage.root, restored.checkpoint_id
    if folder == home:
        # Ids only grow in a folder: every later one is later in time, a
        # later fresh start's output included.
        return record.checkpoint_id > k
    if record.lineage != lineage:
        return False  # another history: the restored job never wrote it
    base = restored.meta.base
    if base is not None and base[0] == folder:
        # The restored history came from this folder at checkpoint base[1]:
        # what was committed here up to it is part of that history.
        return record.checkpoint_id > base[1]
    if record.base is not None and record.base[0] == home:
        # Written by a run restored from the restored checkpoint's folder:
        # from the restored checkpoint or a later one, it comes after it.
        return True if record.base[1] >= k else None
    return None


def _later_records(restored: RestoredCheckpoint | None, lineage: str | None, what: str,
                   storages: Iterable[CheckpointStorage]
                   ) -> list[tuple[CheckpointStorage, CommitRecord]]:
    found: dict[str, CheckpointStorage] = {}
    for storage in storages:
        found.setdefault(storage.root, storage)
    out: list[tuple[CheckpointStorage, CommitRecord]] = []
    for storage in found.values():
        try:
            records = read_commit_records(storage)
        except CheckpointCorrupted as exc:
            raise RestoreRefused(
                f"cannot restart from {what}: {exc}; what the sinks committed after "
                "it is unknown, so its replay could duplicate output (delete that "
                "record to accept the risk)") from exc
        for r in records:
            if r.superseded:
                continue
            later = _takes_back(r, storage.root, restored, lineage)
            if later is None:
                raise RestoreRefused(
                    f"cannot restart from {what}: "
                    f"{storage.layout.commit_record(r.checkpoint_id)} records output of "
                    "another branch of this job's history (restored from an earlier "
                    "checkpoint of that folder); whether restoring would write it "
                    "again cannot be told. Restore the latest checkpoint of "
                    f"{storage.root} instead, or remove that record to accept it")
            if later:
                out.append((storage, r))
    out.sort(key=lambda sr: sr[1].checkpoint_id, reverse=True)
    return out


def _retire(storage: CheckpointStorage, checkpoint_id: int) -> None:
    """Make a checkpoint whose output is taken back unrestorable, first: it
    says that output was committed, which stops being true. Its folder then
    goes like an incomplete one's."""
    meta = storage.layout.metadata(checkpoint_id)
    if os.path.exists(meta):
        os.replace(meta, storage.layout.superseded_metadata(checkpoint_id))
        fsync_dir(os.path.dirname(meta))


def _unretire(storage: CheckpointStorage, checkpoint_id: int) -> None:
    retired = storage.layout.superseded_metadata(checkpoint_id)
    if os.path.exists(retired):
        os.replace(retired, storage.layout.metadata(checkpoint_id))
        fsync_dir(os.path.dirname(retired))


async def supersede_later_output(restored: RestoredCheckpoint | None, lineage: str | None,
                           storages: Iterable[CheckpointStorage],
                           sinks: Mapping[str, Sink], *, own: str | None = None) -> None:
    """Take back what ``sinks`` committed after ``restored`` in its
    history (after the lineage's start if ``None``: a restart that found no
    checkpoint to resume from), the newest first, as the commit records in
    ``storages`` say; raises :class:`RestoreRefused` before touching
    anything if a sink cannot, or if a record's place in the history is
    unknown. Folders other than ``own`` (the job's checkpoint folder, whose
    lock the job holds) are locked meanwhile: their records are rewritten."""
    what = "the start" if restored is None else f"checkpoint {restored.checkpoint_id}"
    later = _later_records(restored, lineage, what, storages)
    if not later:
        return
    for storage, record in later:
        for uid in record.sinks:
            sink = sinks.get(uid)
            if sink is not None and type(sink).supersede is Sink.supersede:
                raise RestoreRefused(
                    f"cannot restart from {what}: sink '{uid}' "
                    f"committed output of the later checkpoint {record.checkpoint_id} and "
                    f"cannot take it back ({type(sink).__name__} does not implement "
                    "Sink.supersede), so the restore would write it twice; restore "
                    f"the latest checkpoint, or delete "
                    f"{storage.layout.commit_record(record.checkpoint_id)} "
                    "to accept duplicates")
    with contextlib.ExitStack() as locks:
        for storage in {s.root: s for s, _ in later}.values():
            if storage.root != own:
                locks.enter_context(FolderLock(storage.root, "restore"))
        for storage, record in later:
            # Retired before anything moves (a crash in between leaves it
            # unrestorable, never restorable with its output gone); restored
            # if none of its output was here to take back.
            retire = restored is None or storage.root == restored.storage.root
            if retire:
                _retire(storage, record.checkpoint_id)
            complete, took = True, False
            for uid, committables in record.sinks.items():
                sink = sinks.get(uid)
                if sink is None:
                    # Not this job's sink: the restored job cannot write to
                    # it again. The record stays for the job that has it.
                    complete = False
                    continue
                # A sink carries a transaction into later checkpoints until
                # it learns that one completed: what the restored checkpoint
                # records is its own output, committed again, not taken back.
                kept = set() if restored is None else {
                    _canonical(c) for c in restored.committables(uid)}
                taken = [c for c in committables if _canonical(c) not in kept]
                if not taken:
                    continue
                where = await awaited(sink.supersede(record.checkpoint_id, taken))
                if where is None:
                    continue  # none of that output is in this sink
                took = True
                log.warning(
                    "restarting from %s: sink '%s' had committed the output of the later "
                    "checkpoint %d; it is moved aside to %s and will be written again",
                    what, uid, record.checkpoint_id, where)
            if not took:
                # Nothing of it was here: it stays as it was, for a job whose
                # sinks hold that output.
                if retire:
                    _unretire(storage, record.checkpoint_id)
            elif complete:
                mark_superseded(storage, record)


def _canonical(committable: Any) -> str:
    return json.dumps(committable, sort_keys=True)
