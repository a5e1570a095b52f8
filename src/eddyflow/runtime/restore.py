"""Reading a completed checkpoint back for a restore: source positions,
keyed state by key group (so the new parallelism may differ from the old),
and the sinks' committables."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from eddyflow.backedge.log import read_backedge_log
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.state.abc import KeyedStateHandle
from eddyflow.state.metadata import CheckpointMetadata, OperatorState, SubtaskState
from eddyflow.state.storage import CheckpointStorage

__all__ = ["RestoredCheckpoint"]

log = logging.getLogger("eddyflow.checkpoints")


class RestoredCheckpoint:
    def __init__(
        self, storage: CheckpointStorage, checkpoint_id: int, meta: CheckpointMetadata
    ) -> None:
        self.storage = storage
        self.checkpoint_id = checkpoint_id
        self.meta = meta
        self.operators: Mapping[str, OperatorState] = meta.operators

    @staticmethod
    def latest(storage: CheckpointStorage, among: Iterable[int] | None = None
               ) -> RestoredCheckpoint | None:
        """The newest checkpoint of ``storage`` (of ``among``, if given) whose
        metadata and files verify; ``None`` if there is none."""
        found = storage.latest_valid(among)
        if found is None:
            return None
        n, raw = found
        return RestoredCheckpoint(storage, n, CheckpointMetadata.from_json(raw))

    def check_compatible(self, plan: ExecutionPlan) -> None:
        """Fail before anything runs (and before any restart is spent) if the
        job cannot resume from this checkpoint; warn about state it drops."""
        nodes = {n.uid: n for n in plan.graph.nodes}
        problems = []
        for n in plan.graph.nodes:
            op = self.operators.get(n.uid)
            if n.is_source and op is not None and op.parallelism != plan.parallelism[n.id]:
                problems.append(
                    f"source '{n.uid}' was checkpointed with parallelism {op.parallelism} "
                    f"and cannot be restored with parallelism {plan.parallelism[n.id]}"
                )
        mp = self.meta.max_parallelism
        if mp != plan.max_parallelism:
            problems.append(
                f"the checkpoint was taken with max_parallelism {mp}, the job has "
                f"{plan.max_parallelism}: key groups would not line up"
            )
        if problems:
            raise ValueError(f"cannot restore checkpoint {self.checkpoint_id}: "
                             + "; ".join(problems))
        for uid, op in self.operators.items():
            has_state = any(p.keyed is not None for p in op.subtasks.values())
            if uid not in nodes and has_state:
                log.warning("checkpoint %d holds keyed state of operator '%s', which the "
                            "job no longer has; that state is dropped",
                            self.checkpoint_id, uid)

    def _subtasks(self, uid: str) -> list[SubtaskState]:
        """The old subtasks of ``uid`` in subtask order (none if it is new)."""
        op = self.operators.get(uid)
        return [] if op is None else [part for _, part in sorted(op.subtasks.items())]

    def source_position(self, uid: str, subtask: int, parallelism: int) -> Any:
        """The recorded position of source ``uid``'s subtask, or ``None`` for
        a source the checkpoint does not know (a new operator)."""
        op = self.operators.get(uid)
        if op is None:
            return None
        if op.parallelism != parallelism:
            raise ValueError(
                f"source '{uid}' was checkpointed with parallelism {op.parallelism} and "
                f"cannot be restored with parallelism {parallelism}"
            )
        part = op.subtasks.get(subtask)
        return None if part is None else part.position

    def keyed_handles(self, uid: str, key_groups: range) -> list[KeyedStateHandle]:
        """The keyed state of the old subtasks of ``uid`` whose key groups
        overlap ``key_groups``, in subtask order. A handle that does not
        record its key groups (metadata format 1) may hold any: it is
        included, and its entries must be filtered by key group."""
        out = []
        for part in self._subtasks(uid):
            handle = part.keyed
            if handle is None:
                continue
            old = handle.key_groups
            if len(old) and (old.stop <= key_groups.start or old.start >= key_groups.stop):
                continue  # none of its key groups is ours
            out.append(handle)
        return out

    def keyed_kinds(self, uid: str) -> dict[str, str]:
        """The kinds of the states of ``uid`` in every old subtask, not only
        in those a new subtask reads: each new subtask declares every state,
        holding keys of it or not."""
        kinds: dict[str, str] = {}
        for part in self._subtasks(uid):
            if part.keyed is not None:
                kinds.update(part.keyed.kinds)
        return kinds

    def backedge_records(self, head_uid: str, subtask: int, parallelism: int) -> list[Any]:
        """The records logged on the back-edges of loop head ``head_uid`` for
        ``subtask``. At another parallelism the logs of old subtasks are dealt
        out round-robin: any head subtask may process any fed-back record
        unless the feedback is keyed, and keyed state is re-partitioned anyway
        by the head's downstream keyed operators."""
        op = self.operators.get(head_uid)
        if op is None:
            return []
        old_p = op.parallelism
        out: list[Any] = []
        for s, part in sorted(op.subtasks.items()):
            if part.backedge is None:
                continue
            if old_p == parallelism and s != subtask:
                continue
            if old_p != parallelism and s % parallelism != subtask:
                continue
            channels = read_backedge_log(self.storage.root, part.backedge.file)
            for i in sorted(channels):
                out.extend(channels[i])
        return out

    def committables(self, uid: str) -> list[Any]:
        return list(itertools.chain.from_iterable(
            part.committables for part in self._subtasks(uid)))
