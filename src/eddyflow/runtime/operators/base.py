"""What every operator of a chain is: ``Operator``, the context it runs in
(``OperatorContext``) and the synchronous half of its snapshot
(``OperatorSnapshot``). The operators themselves live by kind beside this
module: ``stateless`` (map, filter, flat_map), ``keyed`` (the keyed
operators' base and count, reduce, sum, map_with_state), ``process``
(keyed process functions), ``windows`` and ``side_outputs``, ``timestamps``
(watermark generation) and ``io`` (sources and sinks).

Each operator turns an input batch into an output batch with list
operations, so per-record work is a C-level loop wherever the operator
allows it and a tight Python loop over a dict where it keeps keyed state.
Its *spec* (``MapSpec`` …) is the payload of the logical graph's node: a
plain description that the runtime instantiates once per subtask
(``OperatorSpec``) and that offline jobs read to replay a job.

Failure location: when ``process`` raises, the task asks the operator which
input record failed (``failed_index``); keyed operators know it from their
loop, pure operators find it by re-running the batch record by record.

Event time: a batch whose records have timestamps goes through
``process_ts(batch, timestamps)``, which returns the outputs with theirs
(one-to-one operators keep the list, ``filter`` compresses it, ``flat_map``
repeats each input's timestamp for each of its outputs, a process function's
outputs take the timestamp of the record, or timer, that made them); a batch
without goes through ``process`` alone, as before event time existed. When
the task's watermark advances it calls ``on_watermark`` on each operator of
the chain, in order (see ``runtime/time/valve.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.keygroups import key_group_range
from eddyflow.runtime.time.clock import WALL_CLOCK, Clock
from eddyflow.state.abc import KeyedSnapshot, KeyedStateBackend, SnapshotTarget, StateBackend

__all__ = ["Operator", "OperatorContext", "OperatorSnapshot", "OperatorSpec"]


@dataclass(frozen=True)
class OperatorContext:
    """Where one operator instance runs."""

    uid: str
    subtask: int
    parallelism: int
    max_parallelism: int
    state_backend: StateBackend
    #: Snapshots will be taken: keyed state records what changes.
    checkpointing: bool = False
    #: Processing time (``env.set_clock``).
    clock: Clock = WALL_CLOCK
    #: The job's name (a sink names its transactions after it: ``Sink.for_job``).
    job: str = ""

    def keyed_backend(self) -> KeyedStateBackend:
        """This subtask's keyed backend: its key groups of the operator's state."""
        groups = key_group_range(self.subtask, self.max_parallelism, self.parallelism)
        return self.state_backend.create_keyed_backend(
            self.uid, self.subtask, groups, self.max_parallelism,
            checkpointing=self.checkpointing,
        )


@dataclass
class OperatorSnapshot:
    """The synchronous-phase result of one operator's snapshot."""

    #: Keyed state, its asynchronous half still to run.
    keyed: KeyedSnapshot | None = None
    #: Prepared, not yet committed sink transactions.
    committables: list[Any] = field(default_factory=list)
    #: Operator list state, pickled at the barrier (``map_async``'s records
    #: in flight): split among the subtasks of any parallelism on restore.
    operator_list: bytes | None = None
    #: How many items ``operator_list`` holds.
    operator_list_records: int = 0



class Operator:
    """One operator of a chain, for one subtask."""

    #: One output per input, in order: an output index is its input's index.
    one_to_one = False
    #: No state and no side effects: safe to re-run to locate a failure.
    pure = False
    #: Holds keyed state (restored by key group): true of ``KeyedOperator``,
    #: which every ``KeyedSpec`` makes, and of nothing else.
    keyed = False
    #: Sets its records' timestamps and generates watermarks of its own (the
    #: watermarks from upstream stop here).
    assigns_timestamps = False
    #: Has processing-time work (timers): the task asks it
    #: ``next_processing_time`` and calls ``on_processing_time``.
    uses_clock = False
    #: Keeps state every subtask holds whole (broadcast state): a restore
    #: also hands it the keyed snapshots of every old subtask
    #: (``restore_broadcast``), whatever its key groups.
    reads_every_key_group = False
    #: Awaits I/O, as ``open`` finds (a sink whose writer has coroutine
    #: methods; only ever the last operator of its chain). The task then
    #: awaits ``settle`` after a run of the chain that left ``io_pending``,
    #: ``prepare_snapshot`` before the synchronous phase of a snapshot, and
    #: ``aclose`` before ``close``.
    awaits = False
    #: ``process`` started I/O that ``settle`` awaits.
    io_pending = False

    def __init__(self, ctx: OperatorContext) -> None:
        self.ctx = ctx
        self.uid = ctx.uid
        self.records_in = 0
        self.records_out = 0
        self.failed_index: int | None = None
        #: The failure was raised by the key selector, not the operator's function.
        self.key_failed = False
        #: This operator's event time: the last watermark it was given (it
        #: only moves forward). A record with timestamp ``t < watermark`` is late
        #: (``windowing/watermarks.py`` states the rule).
        self.watermark = -math.inf

    def open(self) -> None:
        """Prepare for the first batch (state, user ``open``)."""

    def process(self, batch: list[Any]) -> list[Any]:
        """The outputs of ``batch`` (records without timestamps)."""
        raise NotImplementedError

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        """``process`` for records with timestamps: the outputs and theirs.
        One-to-one operators keep the input's; others may return a
        :class:`~eddyflow.runtime.exchange.events.RecordBatch` that carries its own
        (else their outputs have none)."""
        out = self.process(batch)
        if self.one_to_one:
            return out, timestamps
        return out, getattr(out, "timestamps", None)

    def next_processing_time(self) -> float | None:
        """When ``on_processing_time`` has work next (``uses_clock`` operators)."""
        return None

    def on_processing_time(self, now: float) -> list[Any]:
        """Processing time reached ``now``: fire what is due."""
        return []

    def on_watermark(self, watermark: float) -> list[Any]:
        """The watermark reached ``watermark`` (already set on
        ``self.watermark``): fire what it completes (event-time timers,
        windows). Outputs flow through the rest of the chain before it gets
        the watermark; a ``RecordBatch`` with ``timestamps`` gives them theirs."""
        return []

    def hold_watermark(self, watermark: float) -> bool:
        """Whether the operator keeps ``watermark`` back, to release it
        later itself (``map_async``, until the results before it are out);
        the task then passes it no further for now."""
        return False

    def restore_operator_list(self, items: list[Any]) -> None:
        """Take this subtask's share of the operator list state a
        checkpoint recorded (see ``OperatorSnapshot.operator_list``)."""
        raise TypeError(f"operator '{self.uid}' has no operator list state to restore")

    def locate_failure(self, batch: list[Any]) -> int | None:
        """The index of the input record ``process`` failed on, if known."""
        return self.failed_index

    def output_counts(self, batch: list[Any]) -> list[int] | None:
        """How many outputs each input yields; ``None`` if it cannot be
        recomputed without side effects. Used to trace a failing record back
        through the operators before it."""
        if self.one_to_one:
            return [1] * len(batch)
        return None

    def end_input(self) -> list[Any]:
        """The input is exhausted: anything left to emit."""
        return []

    def close(self) -> None:
        """Release resources; called once, also after a failure."""

    def abort(self) -> None:
        """The job is failing: discard uncommitted work."""

    async def settle(self) -> None:
        """Await the I/O ``process`` started (``awaits`` operators): the
        task's next input waits for it, which is its back-pressure."""

    async def prepare_snapshot(self, checkpoint_id: int) -> None:
        """The awaited part of checkpoint ``checkpoint_id``'s barrier, just
        before ``snapshot`` (``awaits`` operators: a sink's pre-commit)."""

    async def aclose(self) -> None:
        """Release what only an await can (``awaits`` operators), once,
        before ``close``; after ``abort`` if the job is failing."""

    # -- checkpoints -------------------------------------------------------

    def snapshot(self, checkpoint_id: int, target: SnapshotTarget | None = None
                 ) -> OperatorSnapshot | None:
        """The synchronous phase of checkpoint ``checkpoint_id``: cheap, and
        consistent with every record before the barrier and none after.
        ``target``: where keyed state goes (``None``: no checkpoint storage,
        keyed state is not snapshotted)."""
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is durable (its metadata is written)."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete."""

    def restore_keyed(self, root: str, kinds: dict[str, str],
                      handles: list[KeyedStateHandle]) -> None:
        """Load this subtask's key groups of the checkpointed keyed state."""
        raise TypeError(f"operator '{self.uid}' has no keyed state to restore")

    def restore_broadcast(self, root: str, handles: list[KeyedStateHandle]) -> None:
        """Load the state every subtask holds whole from the keyed snapshots
        of all old subtasks (``reads_every_key_group`` operators)."""


class OperatorSpec(Protocol):
    """A logical graph node's payload that the runtime turns into one
    operator per subtask."""

    def instantiate(self, ctx: OperatorContext) -> Operator:
        """The operator of the subtask ``ctx`` describes."""
        ...
