"""Reading a completed checkpoint back for a restore: source positions,
keyed state by key group (so the new parallelism may differ from the old),
and the sinks' committables."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.metadata import CheckpointMetadata, OperatorState, SubtaskState
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.connectors.splits import RestoredSplit, SplitSource, checkpointed_splits
from eddyflow.errors import IncompatibleCheckpoint
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.keygroups import key_group_range
from eddyflow.runtime.checkpointing.backedge_log import Logged, read_backedge_batches
from eddyflow.runtime.checkpointing.channel_state import read_channel_state
from eddyflow.runtime.operators.io import SourceSpec

__all__ = ["RestoredCheckpoint"]

log = logging.getLogger("eddyflow.checkpoint.listing")


def _plural(n: int, what: str, many: str = "") -> str:
    return f"{n:,} {what if n == 1 else many or what + 's'}"


def _held_state(op: OperatorState) -> str:
    """What state ``op`` recorded, for messages; empty if none."""
    parts = list(op.subtasks.values())
    held = []
    sources = sum(1 for p in parts if p.is_source)
    if sources:
        held.append(f"the source positions of {_plural(sources, 'subtask')}")
    keyed = [p.keyed for p in parts if p.keyed is not None]
    if keyed:
        kinds = {name: kind for h in keyed for name, kind in h.kinds.items()}
        what = "keyed state " + ", ".join(f"'{name}' ({kind})"
                                          for name, kind in sorted(kinds.items())).rstrip()
        entries = sum(h.entries for h in keyed)
        held.append(f"{what} of {_plural(entries, 'entry', 'entries')}" if entries else what)
    pending = sum(len(p.committables) for p in parts)
    if pending:
        held.append(f"{_plural(pending, 'pending transaction')}")
    logs = [p.backedge for p in parts if p.backedge is not None]
    if logs:
        held.append(f"back-edge logs of {_plural(sum(b.records for b in logs), 'record')}")
    in_flight = sum(p.channel_state.records for p in parts if p.channel_state is not None)
    if in_flight:
        held.append(f"channel state of {_plural(in_flight, 'record')}")
    return " and ".join(held)


class RestoredCheckpoint:
    """A completed checkpoint a job starts from: what each of its operators
    (by uid) recorded, offered to the job's tasks as they start. Built
    before the job runs, it is checked against the job first
    (:meth:`check_compatible`)."""

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

    def check_compatible(self, plan: ExecutionPlan, *,
                         allow_non_restored_state: bool = False) -> None:
        """Refuse, before anything runs (and before any restart is spent), a
        restore that would be wrong: raise one :class:`IncompatibleCheckpoint`
        naming every problem.

        Strict state matching, as Flink does by default: every operator with
        state in the checkpoint (a source's positions, keyed state, a loop
        head's back-edge log, a sink's pending transactions) must match an
        operator of the job by uid and by kind. State nothing matches would
        be dropped without a word, and whatever depends on it restored
        against it: a renamed source starts from its beginning again while
        the counts downstream are restored. With ``allow_non_restored_state``
        that state is dropped deliberately, with a warning naming it, and
        this checkpoint no longer offers it to the job (also on restarts).
        What cannot be restored at all (a source of the ``create_reader``
        protocol at another parallelism, split positions a source cannot
        take, another ``max_parallelism``) is refused with or without it."""
        nodes = {n.uid: n for n in plan.graph.nodes}
        self._adopt_positional_uids(plan, nodes)
        unmatched: dict[str, str] = {}
        for uid, op in sorted(self.operators.items()):
            held = _held_state(op)
            if not held:
                continue  # a stateless operator: nothing to lose
            node = nodes.get(uid)
            if node is None:
                why = f"'{uid}' ({op.kind}): {held}, but the job has no operator '{uid}'"
                new = [n.uid for n in plan.graph.nodes
                       if n.kind == op.kind and n.uid not in self.operators]
                if new:  # most likely renamed, or its upstream chain changed
                    why += f" (its {op.kind} operators new to the checkpoint: " + ", ".join(
                        f"'{u}'" for u in new) + ")"
                unmatched[uid] = why
            elif node.kind != op.kind:
                unmatched[uid] = (f"'{uid}' ({op.kind}): {held}, but in the job '{uid}' is a "
                                  f"{node.kind} operator")
        if unmatched and allow_non_restored_state:
            log.warning("restoring checkpoint %d with allow_non_restored_state: dropping the "
                        "state of %s", self.checkpoint_id, "; ".join(unmatched.values()))
            self.operators = {uid: op for uid, op in self.operators.items()
                              if uid not in unmatched}
            unmatched = {}
        others: list[str] = []  # what no flag can restore
        for n in plan.graph.nodes:
            was = self.operators.get(n.uid)
            if not n.is_source or was is None or was.kind != n.kind:
                continue
            source = n.payload.source if isinstance(n.payload, SourceSpec) else None
            if isinstance(source, SplitSource):
                # Its splits go to the subtasks anew, at any parallelism.
                try:
                    checkpointed_splits(source, n.uid, was)
                except ValueError as exc:
                    others.append(str(exc))
            elif any(part.splits is not None for part in was.subtasks.values()):
                others.append(
                    f"source '{n.uid}' was checkpointed as a split source, but the job's "
                    f"{type(source).__name__} reads by subtask (create_reader) and cannot "
                    "take positions per split")
            elif was.parallelism != plan.parallelism[n.id]:
                # The old protocol: a position belongs to a subtask.
                others.append(
                    f"source '{n.uid}' was checkpointed with parallelism {was.parallelism} "
                    f"and cannot be restored with parallelism {plan.parallelism[n.id]}"
                )
        mp = self.meta.max_parallelism
        if mp != plan.max_parallelism:
            others.append(
                f"the checkpoint was taken with max_parallelism {mp}, the job has "
                f"{plan.max_parallelism}: key groups would not line up"
            )
        if not unmatched and not others:
            return
        parts = []
        if unmatched:
            parts.append("it holds state of operators the job does not match (by name and "
                         "kind): " + "; ".join(unmatched.values()))
        parts.extend(others)
        message = f"cannot restore checkpoint {self.checkpoint_id}: " + "; ".join(parts)
        if unmatched:
            message += (". Pass allow_non_restored_state=True (eddyflow run "
                        "--allow-non-restored-state) to drop that state, or give those "
                        "operators the names they had (.name())")
        raise IncompatibleCheckpoint(message, checkpoint_id=self.checkpoint_id,
                                     unmatched=tuple(unmatched),
                                     problems=(*unmatched.values(), *others))

    def _adopt_positional_uids(self, plan: ExecutionPlan, nodes: Mapping[str, Any]) -> None:
        """Checkpoints written before lineages existed also predate stable
        generated uids: an unnamed operator was ``<kind>-<declaration
        index>``. For those, an unchanged job's unnamed operators take their
        state under that old uid (same kind), with a warning, so that a job
        restores its own checkpoints across the upgrade."""
        if self.meta.lineage is not None:
            return
        renamed: dict[str, str] = {}
        for n in plan.graph.nodes:
            old = f"{n.kind}-{n.id}"
            op = self.operators.get(old)
            if (not n.named and n.uid not in self.operators and old not in nodes
                    and op is not None and op.kind == n.kind):
                renamed[old] = n.uid
        if not renamed:
            return
        log.warning("checkpoint %d predates stable operator ids: unnamed operators take the "
                    "state of their old position-based ids (%s); name them to be safe",
                    self.checkpoint_id,
                    ", ".join(f"'{o}' -> '{u}'" for o, u in sorted(renamed.items())))
        self.operators = {renamed.get(uid, uid): op for uid, op in self.operators.items()}

    def _subtasks(self, uid: str) -> list[SubtaskState]:
        """The old subtasks of ``uid`` in subtask order (none if it is new)."""
        op = self.operators.get(uid)
        return [] if op is None else [part for _, part in sorted(op.subtasks.items())]

    def source_splits(self, uid: str, source: SplitSource) -> list[RestoredSplit]:
        """Every split split source ``uid`` recorded, over all its old
        subtasks (none for a source the checkpoint does not know)."""
        op = self.operators.get(uid)
        return [] if op is None else checkpointed_splits(source, uid, op)

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

    def watermark(self, uid: str, key_groups: range) -> float | None:
        """The watermark operator ``uid`` restarts from in the subtask that
        owns ``key_groups``: the minimum over the old subtasks whose key
        groups overlap them (at the same parallelism, its own), ``None`` if
        none recorded one. The minimum, because a later watermark would make
        records late that were not late for the key groups that move here;
        a lower one cannot re-fire anything, since timers (and so windows)
        are deleted from the state as they fire."""
        op = self.operators.get(uid)
        if op is None:
            return None
        mp = self.meta.max_parallelism
        found: list[float] = []
        for s, part in sorted(op.subtasks.items()):
            old = key_group_range(s, mp, op.parallelism)
            if old.stop <= key_groups.start or old.start >= key_groups.stop:
                continue
            if part.watermark is None:
                return None  # that one had no event time yet: -inf
            found.append(part.watermark)
        return min(found) if found else None

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
        """The records of :meth:`backedge_batches`."""
        return [r for records, _ in self.backedge_batches(head_uid, subtask, parallelism)
                for r in records]

    def backedge_batches(self, head_uid: str, subtask: int, parallelism: int
                         ) -> list[Logged]:
        """The batches logged on the back-edges of loop head ``head_uid`` for
        ``subtask``, with their records' timestamps. At another parallelism
        the logs of old subtasks are dealt out round-robin: any head subtask
        may process any fed-back record unless the feedback is keyed, and
        keyed state is re-partitioned anyway by the head's downstream keyed
        operators."""
        op = self.operators.get(head_uid)
        if op is None:
            return []
        old_p = op.parallelism
        out: list[Logged] = []
        for s, part in sorted(op.subtasks.items()):
            if part.backedge is None:
                continue
            if old_p == parallelism and s != subtask:
                continue
            if old_p != parallelism and s % parallelism != subtask:
                continue
            channels = read_backedge_batches(self.storage.root, part.backedge.file)
            for i in sorted(channels):
                out.extend(channels[i])
        return out

    def channel_state(self) -> dict[str, list[Logged]]:
        """The records in flight at an unaligned barrier, per channel key
        (``source->target/upstream/downstream``), in the order they
        travelled: what the downstream subtask logged on the channel after
        its snapshot, then what the barrier overtook there."""
        inputs: dict[str, list[Logged]] = {}
        outputs: dict[str, list[Logged]] = {}
        for op in self.operators.values():
            for part in op.subtasks.values():
                if part.channel_state is None:
                    continue
                ins, outs = read_channel_state(self.storage.root, part.channel_state.file)
                for key, batches in ins.items():
                    inputs.setdefault(key, []).extend(batches)
                for key, batches in outs.items():
                    outputs.setdefault(key, []).extend(batches)
        return {key: inputs.get(key, []) + outputs.get(key, [])
                for key in sorted({*inputs, *outputs})}

    def parallelism_of(self, uid: str) -> int | None:
        op = self.operators.get(uid)
        return None if op is None else op.parallelism

    def committables(self, uid: str) -> list[Any]:
        return list(itertools.chain.from_iterable(
            part.committables for part in self._subtasks(uid)))
