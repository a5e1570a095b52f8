"""Before a restore: take back sink output committed after the checkpoint.

The rule (DESIGN.md §4, docs/architecture.md): a sink commits checkpoint
``n`` only after it completed, so a restore from an earlier checkpoint ``k``
— the latest no longer verifies, or an earlier one is restored on purpose —
would produce the output of ``k+1 … n`` a second time. Before such a
restore, every sink that committed output of a later checkpoint is asked to
take it back (:meth:`Sink.supersede`) — later: a higher id in ``k``'s own
folder (ids only grow there), or a higher id of ``k``'s lineage in another
folder (state/commits.py); never the output of an earlier run:
``FileSink`` moves the files aside, ``ListSink`` moves the records to
``superseded``, and a warning says where. A sink that cannot take output
back gets the restore refused (:class:`ef.RestoreRefused`) instead of
duplicates. A sink the job no longer has is left alone: the restored job
cannot write to it again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from eddyflow.connectors.sink import Sink
from eddyflow.errors import RestoreRefused
from eddyflow.runtime.restore import RestoredCheckpoint
from eddyflow.state.commits import (
    CommitRecord,
    commit_record_path,
    mark_superseded,
    read_commit_records,
)
from eddyflow.state.storage import CheckpointCorrupted, CheckpointStorage

__all__ = ["supersede_later_output"]

log = logging.getLogger("eddyflow.checkpoints")


def _later_records(restored: RestoredCheckpoint | None, lineage: str | None, what: str,
                   storages: Iterable[CheckpointStorage]
                   ) -> list[tuple[CheckpointStorage, CommitRecord]]:
    after = -1 if restored is None else restored.checkpoint_id
    home = None if restored is None else restored.storage.root
    found: dict[str, CheckpointStorage] = {}
    for storage in storages:
        found.setdefault(storage.root, storage)
    out: list[tuple[CheckpointStorage, CommitRecord]] = []
    for storage in found.values():
        try:
            records = read_commit_records(storage, after=after)
        except CheckpointCorrupted as exc:
            raise RestoreRefused(
                f"cannot restart from {what}: {exc}; what the sinks committed after "
                "it is unknown, so its replay could duplicate output (delete that "
                "record to accept the risk)") from exc
        # In the restored checkpoint's own folder every later id is later in
        # time (ids only grow there), a later fresh start's output included.
        # Elsewhere only the restored history's own output is later than it.
        out.extend((storage, r) for r in records if not r.superseded and (
            storage.root == home or (lineage is not None and r.lineage == lineage)))
    out.sort(key=lambda sr: sr[1].checkpoint_id, reverse=True)
    return out


def supersede_later_output(restored: RestoredCheckpoint | None, lineage: str | None,
                           storages: Iterable[CheckpointStorage],
                           sinks: Mapping[str, Sink]) -> None:
    """Take back what ``sinks`` committed in ``lineage`` after ``restored``
    (after the lineage's start if ``None``: a restart that found no
    checkpoint to resume from), the newest first, as the commit records in
    ``storages`` say; raises :class:`RestoreRefused` before touching
    anything if a sink cannot."""
    what = "the start" if restored is None else f"checkpoint {restored.checkpoint_id}"
    later = _later_records(restored, lineage, what, storages)
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
                    f"{commit_record_path(storage, record.checkpoint_id)} "
                    "to accept duplicates")
    for storage, record in later:
        for uid, committables in record.sinks.items():
            sink = sinks.get(uid)
            if sink is None:
                continue
            # A sink carries a transaction into later checkpoints until it
            # learns that one completed: what the restored checkpoint
            # records is its own output, committed again, not taken back.
            own = set() if restored is None else {
                _canonical(c) for c in restored.committables(uid)}
            taken = [c for c in committables if _canonical(c) not in own]
            if not taken:
                continue
            where = sink.supersede(record.checkpoint_id, taken)
            log.warning(
                "restarting from %s: sink '%s' had committed the output of the later "
                "checkpoint %d; it is moved aside to %s and will be written again",
                what, uid, record.checkpoint_id, where)
        mark_superseded(storage, record)



def _canonical(committable: Any) -> str:
    return json.dumps(committable, sort_keys=True)
