"""A task: one coroutine running one subtask of one operator chain.

The loop reads a batch from the input gate (or the source reader), pushes it
through the chained operators with plain calls, and hands the result to the
record writers, awaiting only when a batch actually leaves (a full buffer)
or nothing is left to read. Output is flushed when the input runs dry or
when the oldest buffered record is older than the buffer timeout, so a slow
trickle still flows without a timer coroutine per task.

Checkpoints (DESIGN.md §2): a source task emits barrier ``n`` between two
batches when the coordinator triggers it, recording its reader's position; a
task with inputs aligns barrier ``n`` over its regular inputs (blocking each
input that delivered it, in ``exactly_once`` and ``synchronous`` mode), then
takes the synchronous phase of its snapshot, forwards the barrier, unblocks,
and writes the snapshot asynchronously while records flow again; the write
acknowledges to the coordinator. At the end of its input a task snapshots its
final state for the final checkpoint before it sends end-of-input on.

Unaligned checkpoints (``mode="unaligned"``, or an aligned one switched
after ``aligned_timeout``): barriers travel as priority items, the task
snapshots at the first barrier ``n`` and forwards it ahead of its own
records in flight (``RecordWriter.overtake``); what was overtaken, and what
arrives on its other inputs until their barrier ``n`` does, is channel state
(``runtime/channel_state.py``, the same log a loop head keeps of its
back-edges). A task waiting for channel space takes part through its
:class:`~eddyflow.runtime.channel.Interrupt`.

Event time (``runtime/valve.py``, mixed in as :class:`EventTime`): records
carry timestamps beside the batch; ``Watermark`` and ``WatermarkStatus``
events come in band, the valve takes the minimum over the inputs, and each
advance runs ``on_watermark`` down the chain before it is forwarded; a
generator in the chain (``assign_timestamps_and_watermarks``) emits its own;
processing-time timers wake the task through the job's clock.

A failure inside an operator is turned into a :class:`TaskFailure` that
names the operator, the subtask, the record and the source position it came
from, traced back through the chain (see ``Operator.output_counts``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import anyio

from eddyflow.backedge.log import BackEdgeRecords, write_backedge_log
from eddyflow.connectors.source import SourceReader
from eddyflow.errors import StateSerializationError
from eddyflow.keygroups import key_group_range
from eddyflow.runtime.channel import InputGate, Interrupt
from eddyflow.runtime.channel_state import ChannelStateLog, encode_batches, write_channel_state
from eddyflow.runtime.clock import Clock
from eddyflow.runtime.coordinator import TaskSnapshot
from eddyflow.runtime.events import (
    END_OF_INPUT,
    Barrier,
    EndOfInput,
    RecordBatch,
    Span,
    Watermark,
    WatermarkStatus,
)
from eddyflow.runtime.faults import fault_point
from eddyflow.runtime.loops import LoopTracker
from eddyflow.runtime.operators import Operator, OperatorSnapshot
from eddyflow.runtime.valve import EventTime, WatermarkValve, encode_watermark
from eddyflow.runtime.writers import KeyRoutingError, RecordWriter
from eddyflow.state.abc import SnapshotTarget
from eddyflow.state.storage import FileHandle, checkpoint_dir_name
from eddyflow.values import immutable, independent_copy

if TYPE_CHECKING:
    from eddyflow.runtime.coordinator import CheckpointCoordinator
    from eddyflow.runtime.restore import RestoredCheckpoint

Spawn = Callable[[Callable[[], Awaitable[None]]], None]

__all__ = ["Task", "TaskFailure"]

_log = logging.getLogger("eddyflow")


class TaskFailure(Exception):
    """An operator failed; the message says where, ``__cause__`` says why."""

    def __init__(self, message: str, operator: str, subtask: int, position: str | None) -> None:
        super().__init__(message)
        self.operator = operator
        self.subtask = subtask
        self.position = position


@dataclass
class _Alignment:
    barrier: Barrier
    started: float
    seen: set[int] = field(default_factory=set)


@dataclass
class _Captured:
    """What unaligned barriers overtook on a task's outputs for one
    checkpoint: per channel key, the batches (pickled) and their records."""

    blobs: dict[str, list[bytes]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


class Task(EventTime):
    def __init__(
        self,
        name: str,
        subtask: int,
        parallelism: int,
        operators: list[Operator],
        writers: list[RecordWriter],
        *,
        gate: InputGate | None = None,
        reader: SourceReader | None = None,
        source_uid: str | None = None,
        batch_size: int = 1024,
        buffer_timeout: float = 0.01,
        chain_index: int = 0,
        coordinator: CheckpointCoordinator | None = None,
        regular_inputs: list[bool] | None = None,
        restore: RestoredCheckpoint | None = None,
        spawn: Spawn | None = None,
        input_loops: list[LoopTracker | None] | None = None,
        head_of: LoopTracker | None = None,
        input_entries: list[LoopTracker | None] | None = None,
        clock: Clock | None = None,
        auto_watermark_interval: float = 0.2,
    ) -> None:
        if (gate is None) == (reader is None):
            raise ValueError("a task reads either from a gate or from a source reader")
        self.chain_index = chain_index
        self.coordinator = coordinator
        self.restore = restore
        self.spawn = spawn
        n_in = len(gate.channels) if gate is not None else 0
        self.regular = regular_inputs if regular_inputs is not None else [True] * n_in
        self._ended = [False] * n_in
        # Loops: which loop each input channel lies in (its records count as in
        # flight round it), and the loop this task ends if it is a loop head
        # (it has back-edge inputs).
        self.input_loops = input_loops if input_loops is not None else [None] * n_in
        self.head_of = head_of
        # The loop each input channel enters from outside, if any.
        self.input_entries = input_entries if input_entries is not None else [None] * n_in
        # The channel-state log of the checkpoint in flight: a loop head's
        # back-edges, an unaligned checkpoint's inputs without the barrier.
        self._backlog: ChannelStateLog | None = None
        self._captured: dict[int, _Captured] = {}
        self._unaligned_ids: set[int] = set()  # checkpoints this task took unaligned
        # Checkpoints the coordinator switched to unaligned: requests not yet
        # acted on, and those whose barrier has not come yet.
        self._switch_requests: list[int] = []
        self._switched: set[int] = set()
        # Back-edge channels on which barrier n came back before this head
        # took snapshot n (possible with parallel loops: a tail subtask may
        # depend on other head subtasks only). Blocked until the snapshot.
        self._early: dict[int, set[int]] = {}
        self._loop_ended = False  # a head that ended: only draining its back-edges
        self._align: _Alignment | None = None
        self._done_id = 0  # highest checkpoint this task aligned, aborted or skipped
        self._trigger: Barrier | None = None
        self._late_triggers: list[Barrier] = []
        self._final_position: Any = None
        self._trigger_wakeup: asyncio.Future[None] | None = None
        self._source_done = False
        self.name = name
        self.subtask = subtask
        self.parallelism = parallelism
        self.operators = operators
        self.writers = writers
        self.gate = gate
        self.reader = reader
        self.source_uid = source_uid
        self.source_label = f"source '{source_uid}' (subtask {subtask + 1} of {parallelism})"
        self.batch_size = batch_size
        self.buffer_timeout = buffer_timeout
        self.records_read = 0
        self._dirty_since = 0.0
        self._warned_sharing = False
        self.finished = False
        self._closed = False
        self._snapshots: dict[int, dict[str, OperatorSnapshot | None]] = {}
        # Each operator's watermark at the synchronous phase of checkpoint n.
        self._snapshot_watermarks: dict[int, dict[str, float]] = {}
        self._valve = (WatermarkValve(list(self.regular), final_at_end=head_of is None)
                       if gate is not None else None)
        self._init_event_time(clock, auto_watermark_interval)
        self.interrupt: Interrupt | None = None
        if coordinator is not None and coordinator.may_go_unaligned:
            # Barriers may overtake: let this task's waits for channel space
            # be interrupted to take part in a checkpoint.
            self.interrupt = Interrupt(self._on_interrupt)
            for w in writers:
                w.interrupt = self.interrupt
            if gate is not None:
                gate.interrupt = self.interrupt

    # -- the chain ---------------------------------------------------------

    def _run_chain(self, batch: list[Any], start: int = 0, timestamps: list[Any] | None = None
                   ) -> tuple[list[Any], list[Any] | None]:
        """``batch`` through the operators from ``start`` on: the outputs and
        their timestamps (``None`` while the records have none: then only
        ``process`` runs, the path of jobs without event time)."""
        ops = self.operators
        stages: list[list[Any]] = []
        for k in range(start, len(ops)):
            op = ops[k]
            try:
                if timestamps is None and not op.assigns_timestamps:
                    out = op.process(batch)
                else:
                    out, timestamps = op.process_ts(batch, timestamps)
            except Exception as exc:
                stages.append(batch)
                raise self._failure(exc, op, start, stages, op.locate_failure(batch)) from exc
            op.records_in += len(batch)
            op.records_out += len(out)
            stages.append(batch)
            batch = out
            if not batch:
                return batch, None
        return batch, timestamps

    async def _emit(self, records: list[Any], span: Span | None, stages_in: list[Any],
                    timestamps: list[Any] | None = None) -> None:
        if not records:
            return
        given = records
        for j, w in enumerate(self.writers):
            if j:
                # Several consumers (a stream split by filters, say) must not
                # share mutable records: one would see what another's user
                # code changed in place, and when depends on scheduling.
                given = self._for_another_consumer(records, given)
            try:
                w.add(given, span, timestamps)
            except KeyRoutingError as exc:
                raise self._routing_failure(exc, w, stages_in) from exc.__cause__
            tracker = w.tracker
            if tracker is not None:
                tracker.in_flight += len(records) * w.copies
        for w in self.writers:
            if w.full:
                await w.send_full()
        if not self._dirty_since:
            self._dirty_since = time.monotonic()

    def _for_another_consumer(self, records: list[Any], last: list[Any]) -> list[Any]:
        """``records`` for one more consumer: themselves if immutable, else
        a copy (Flink hands each output its own copy too, unless object
        reuse is on). ``last``: what the previous writer got."""
        if last is records and immutable(records):
            return records
        copied = independent_copy(records)
        if copied is not None:
            return copied
        if not self._warned_sharing:
            self._warned_sharing = True
            _log.warning("task %s: records that can be neither pickled nor copied go to "
                         "several consumers as the same objects; a change one makes in "
                         "place, another sees", self.name)
        return records

    async def _flush(self) -> None:
        for w in self.writers:
            await w.flush()
        self._dirty_since = 0.0

    async def _maybe_flush(self) -> None:
        since = self._dirty_since
        if since and time.monotonic() - since >= self.buffer_timeout:
            await self._flush()

    async def _process_input(self, batch: list[Any], span: Span | None,
                             timestamps: list[Any] | None = None) -> None:
        out, stamps = self._run_chain(batch, 0, timestamps)
        if self._assigner is not None:
            await self._generator_status()  # active again: said before the records
            await self._emit(out, span, batch, stamps)
            await self._generator_watermark(False)
        else:
            await self._emit(out, span, batch, stamps)
        if self._clocked:
            self._schedule_clock()

    def _wake(self) -> None:
        """Processing time is due: wake the loop wherever it waits."""
        wake = self._trigger_wakeup
        if wake is not None and not wake.done():
            wake.set_result(None)
        if self.gate is not None:
            self.gate._wake()

    # -- failure reports ---------------------------------------------------

    def _trace_back(self, start: int, stages: list[list[Any]], index: int | None) -> int | None:
        """Map an index into ``stages[-1]`` back to an index into ``stages[0]``."""
        if index is None:
            return None
        for k in range(len(stages) - 2, -1, -1):
            counts = self.operators[start + k].output_counts(stages[k])
            if counts is None:
                return None
            acc = 0
            for i, c in enumerate(counts):
                acc += c
                if index < acc:
                    index = i
                    break
            else:
                return None
        return index

    def _where(self, input_index: int | None, span: Span | None) -> str | None:
        if self.reader is not None and input_index is not None:
            pos = self.reader.position_of(input_index)
            if pos is not None:
                return f"{self.source_label} at {self.reader.describe_position(pos)}"
        if span:
            return "; ".join(
                f"{label} positions {first!r} to {end!r}" for label, first, end in span
            )
        return None

    def _describe(self, what: str, exc: BaseException, record: Any, where: str | None) -> str:
        msg = (f"{what} (subtask {self.subtask + 1} of {self.parallelism}) raised "
               f"{type(exc).__name__}: {exc}")
        if record is not _NO_RECORD:
            msg += f"; on record {record!r:.200}"
        if where:
            msg += f"; read from {where}"
        return msg

    def _failure(self, exc: BaseException, op: Operator, start: int,
                 stages: list[list[Any]], index: int | None) -> TaskFailure:
        record = stages[-1][index] if index is not None and index < len(stages[-1]) else _NO_RECORD
        # Only a trace that reaches the task's own input names a source position.
        input_index = self._trace_back(start, stages, index) if start == 0 else None
        where = self._where(input_index, self._current_span)
        what = f"key selector of '{op.uid}'" if op.key_failed else f"operator '{op.uid}'"
        return TaskFailure(self._describe(what, exc, record, where), op.uid, self.subtask, where)

    def _serialization_failure(self, exc: StateSerializationError) -> TaskFailure:
        """A value of ``exc.operator`` that cannot be pickled, as a failure of
        that operator in this subtask."""
        uid = exc.operator or (self.operators[0].uid if self.operators else self.name)
        return TaskFailure(self._describe(f"operator '{uid}'", exc, _NO_RECORD, None),
                           uid, self.subtask, None)

    def _routing_failure(self, exc: KeyRoutingError, w: RecordWriter,
                         stages_in: list[Any]) -> TaskFailure:
        cause = exc.__cause__ or exc
        # The writer saw the chain's output: trace from it back to the input.
        stages = self._last_stages(stages_in) if stages_in else []
        index = self._trace_back(0, stages, exc.index) if stages else None
        where = self._where(index, self._current_span)
        source, target = w.label.split(" -> ")
        what = f"key selector of '{target}', evaluated after '{source}'"
        return TaskFailure(self._describe(what, cause, exc.record, where),
                           target, self.subtask, where)

    def _last_stages(self, task_input: list[Any]) -> list[list[Any]]:
        # Recompute the intermediate batches of the pure prefix; stop at the
        # first operator that cannot be re-run without side effects.
        stages = [task_input]
        for op in self.operators:
            if not (op.pure or op.one_to_one):
                return []
            if op.pure:
                stages.append(op.process(stages[-1]))
            else:
                stages.append(stages[-1])  # same length: indexes are unchanged
        return stages

    _current_span: Span | None = None

    # -- the loops ---------------------------------------------------------

    async def run(self) -> None:
        try:
            for op in self.operators:
                op.open()
            if self.restore is not None:
                self._restore(self.restore)
            if self.reader is not None:
                await self._run_source(self.reader)
                await self._end_of_input()
            else:
                assert self.gate is not None
                await self._run_gate(self.gate)
            self.finished = True
            coordinator = self.coordinator
            if coordinator is not None:
                for barrier in self._late_triggers:
                    if not self.saw_barrier(barrier.checkpoint_id):
                        coordinator._spawn_final_ack(self, barrier)
                self._late_triggers.clear()
                coordinator.task_finished(self)
        except BaseException:
            for op in self.operators:
                op.abort()
            try:
                self.close()
            except Exception as exc:  # the failure that got us here is the one to report
                _log.warning("task %s[%d]: closing after a failure failed too: %s: %s",
                             self.name, self.subtask, type(exc).__name__, exc)
            raise
        finally:
            if self.reader is not None:
                with anyio.CancelScope(shield=True):
                    await self.reader.close()

    def close(self) -> None:
        """Close the operators, once. A task that finished keeps them open
        until the job's last checkpoint is written (it acknowledges every
        later checkpoint with its final state), so the job runner closes
        them; a task that fails closes them at once."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for op in self.operators:
            try:
                op.close()
            except Exception as exc:  # close every operator, then report
                errors.append(exc)
        if errors:
            raise errors[0]

    def _source_failure(self, exc: BaseException, reader: SourceReader) -> TaskFailure:
        where = f"{self.source_label} at {reader.describe_position(reader.position())}"
        return TaskFailure(self._describe(f"source '{self.source_uid}'", exc, _NO_RECORD, where),
                           str(self.source_uid), self.subtask, where)

    async def _run_source(self, reader: SourceReader) -> None:
        size = self.batch_size
        label = self.source_label
        # A reader that may wait for data (an async iterator, a log tail) is
        # read in a future of its own, so a checkpoint trigger is not held up
        # by a quiet source.
        may_block = bool(getattr(reader, "may_block", False))
        pending: asyncio.Future[list[Any] | None] | None = None
        start = reader.position()
        if self._clocked:
            self._schedule_clock()
        try:
            while True:
                if self._timers_due:
                    await self._fire_processing_time()
                if self._switch_requests:
                    await self._on_switches()
                # A batch already read belongs before the barrier: its
                # records are counted in the reader's position.
                if self._trigger is not None and (pending is None or not pending.done()):
                    await self._inject_barrier(reader)
                    continue
                if may_block:
                    if pending is None:
                        pending = asyncio.ensure_future(reader.read_batch(size))
                    if not pending.done():
                        wake = self._trigger_wakeup = asyncio.get_running_loop().create_future()
                        try:
                            await asyncio.wait((pending, wake),
                                               return_when=asyncio.FIRST_COMPLETED)
                        finally:
                            self._trigger_wakeup = None
                        if not pending.done():
                            continue  # a trigger came first
                    fut, pending = pending, None
                    try:
                        batch = fut.result()
                    except Exception as exc:
                        raise self._source_failure(exc, reader) from exc
                else:
                    try:
                        batch = await reader.read_batch(size)
                    except Exception as exc:
                        raise self._source_failure(exc, reader) from exc
                if batch is None:
                    break
                end = reader.position()
                if batch:
                    self.records_read += len(batch)
                    span = ((label, start, end),)
                    self._current_span = span
                    await self._process_input(batch, span)
                start = end
                if len(batch) < size:
                    # The source has nothing more right now: let what we have go.
                    await self._generator_watermark(True)
                    await self._flush()
                else:
                    await self._maybe_flush()
                # A source that never blocks must still let the rest of the
                # job (and the embedding program) run.
                await asyncio.sleep(0)
            while self._trigger is not None:  # triggered just before the end
                await self._inject_barrier(reader)
            self._source_done = True
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)

    def trigger_barrier(self, barrier: Barrier) -> bool:
        """Coordinator: checkpoint ``barrier`` starts. A running source emits
        it at its next batch boundary, and so does a loop head whose regular
        inputs have all ended (into its loop); a task that gets the barrier
        through its channels ignores this. False if the task has finished:
        the coordinator then has it acknowledge with its final state."""
        if self.finished:
            return False
        if self.reader is not None:
            if self._source_done:
                self._late_triggers.append(barrier)  # acknowledged once finished
                return True
        elif not (self.head_of is not None and self._regular_ended()):
            return True
        self._trigger = barrier
        wake = self._trigger_wakeup
        if wake is not None and not wake.done():
            wake.set_result(None)
        if self.gate is not None:
            self.gate._wake()
        if self.interrupt is not None and barrier.unaligned:
            self.interrupt.request()  # held up by back-pressure: inject at once
        return True

    def _regular_ended(self) -> bool:
        return all(self._ended[i] for i, r in enumerate(self.regular) if r)

    def saw_barrier(self, checkpoint_id: int) -> bool:
        return self._done_id >= checkpoint_id

    async def acknowledge_finished(self, barrier: Barrier) -> None:
        """Acknowledge ``barrier``'s checkpoint with this finished task's
        final state (sources at their end, keyed state as it ended, pending
        sink transactions)."""
        n = barrier.checkpoint_id
        coordinator = self.coordinator
        assert coordinator is not None and self.finished
        self._done_id = max(self._done_id, n)
        snaps = self._snapshot_operators(n)
        await self._write_and_ack(n, snaps, self._final_position, 0.0, 0.0)

    async def _inject_barrier(self, reader: SourceReader) -> None:
        unaligned = self._unaligned_trigger()
        barrier, self._trigger = self._trigger, None
        assert barrier is not None
        self._done_id = max(self._done_id, barrier.checkpoint_id)
        self._switched.discard(barrier.checkpoint_id)
        if unaligned:
            barrier = replace(barrier, unaligned=True)
        await self._checkpoint(barrier, position=reader.position(), unaligned=unaligned)
        coordinator = self.coordinator
        if coordinator is not None and coordinator.synchronous:
            await coordinator.wait_resumed()  # stop the world until it completes

    def _loop_is_empty(self) -> bool:
        head = self.head_of
        return head is not None and head.empty

    async def _run_gate(self, gate: InputGate) -> None:
        regular_left = sum(1 for r in self.regular if r)
        back_left = len(gate.channels) - regular_left
        ended = False
        turn = time.monotonic()
        valve = self._valve
        assert valve is not None
        if self._clocked:
            self._schedule_clock()
        while regular_left or back_left:
            if self._timers_due:
                await self._fire_processing_time()
            if self._switch_requests:
                await self._on_switches()
            trigger = self._trigger
            if trigger is not None:
                # A loop head whose input has ended starts checkpoints in its
                # loop itself: nothing upstream will send it barriers.
                self._trigger = None
                if not ended and trigger.checkpoint_id > self._done_id:
                    self._done_id = trigger.checkpoint_id
                    await self._checkpoint(trigger, unaligned=trigger.unaligned)
                continue
            if not ended and self._loop_is_empty():
                # A loop head: its input is exhausted and nothing is left
                # anywhere in its loop. End, which ends the loop body in turn;
                # then drain the back-edges until their end-of-input.
                ended = self._loop_ended = True
                await self._end_of_input()
                continue
            got = gate.poll()
            if got is None:
                await self._generator_watermark(True)
                await self._flush()
                if not ended and self._loop_is_empty():
                    continue
                await gate.wait()
                continue
            i, item = got
            kind = type(item)
            if kind is RecordBatch:
                backlog = self._backlog
                if backlog is not None and i in backlog.waiting:
                    try:
                        backlog.log(i, item)
                    except StateSerializationError as exc:
                        raise self._serialization_failure(exc) from exc
                self._current_span = item.span
                await self._process_input(item, item.span, item.timestamps)
                tracker = self.input_loops[i]
                if tracker is not None:
                    tracker.consumed(len(item))
                await self._maybe_flush()
                # Yield after each batch, unless more than a batch is still
                # queued here: then work it off first, for up to one turn.
                # With a yield per batch every task of a busy job advances
                # at the same pace, so a queue that once filled up (behind
                # an alignment, a slow snapshot, a burst) stays full for
                # good. Measured in benchmarks/overhead.py: after the first
                # checkpoints the bottleneck's inputs held ~5,000 records
                # instead of ~1,000, every record waited in memory long
                # enough to cost 40% more to process, and barriers took
                # 60-70 ms instead of 20 ms to get through.
                if gate.backlog() <= self.batch_size or time.monotonic() - turn >= _TURN:
                    await asyncio.sleep(0)
                    turn = time.monotonic()
            elif kind is Barrier:
                if self.regular[i]:
                    await self._on_barrier(gate, i, item)
                else:
                    self._on_back_edge_barrier(i, item, gate)
            elif kind is Watermark:
                wm = valve.on_watermark(i, item.timestamp)
                if wm is not None:
                    await self._advance_watermark(wm)
                if self._assigner is None:
                    await self._set_idle(valve.idle_out)
            elif kind is WatermarkStatus:
                wm = valve.on_status(i, item.idle)
                if wm is not None:
                    await self._advance_watermark(wm)
                if self._assigner is None:
                    await self._set_idle(valve.idle_out)
            elif kind is EndOfInput:
                self._ended[i] = True
                wm = valve.on_end(i)
                if wm is not None:
                    await self._advance_watermark(wm)
                entry = self.input_entries[i]
                if entry is not None:
                    entry.entry_ended()
                if self.regular[i]:
                    regular_left -= 1
                    backlog = self._backlog
                    if backlog is not None and i in backlog.waiting:
                        self._log_arrived(i)
                    if self._align is not None:
                        await self._check_aligned(gate)
                    elif regular_left == 0 and self.head_of is not None and not ended:
                        # This head's input ended before the barrier of the
                        # checkpoint in flight reached it: none will now.
                        # Start that checkpoint in the loop itself.
                        coordinator = self.coordinator
                        pending = coordinator.pending_barrier() if coordinator else None
                        if pending is not None and pending.checkpoint_id > self._done_id:
                            self._trigger = pending
                else:
                    back_left -= 1
                    self._on_back_edge_barrier(i, None)
            else:
                raise TypeError(f"task {self.name}: unexpected item on a channel: {item!r}")
        if not ended:
            await self._end_of_input()

    def _on_back_edge_barrier(self, channel: int, barrier: Barrier | None,
                              gate: InputGate | None = None) -> None:
        """Barrier ``n`` came back round the loop on a back-edge (or the
        back-edge ended): stop logging it; once all have, write the log."""
        backlog = self._backlog
        if self._loop_ended and backlog is None:
            # This head has ended: it acknowledges checkpoints with its final
            # state, and must not block the back-edges it is draining.
            return
        if (barrier is not None and barrier.checkpoint_id > self._done_id
                and (backlog is None or barrier.checkpoint_id != backlog.checkpoint_id)):
            # Back before this head's own snapshot n: what follows on this
            # channel is after the barrier, so it must wait (exactly-once)
            # and nothing on it belongs to n's back-edge log.
            self._early.setdefault(barrier.checkpoint_id, set()).add(channel)
            coordinator = self.coordinator
            if gate is not None and (coordinator is None or coordinator.mode.blocks):
                gate.block(channel)
            return
        if backlog is None or channel not in backlog.waiting:
            return
        if barrier is not None and barrier.checkpoint_id != backlog.checkpoint_id:
            return  # a stale barrier of an aborted checkpoint
        self._log_arrived(channel)

    async def _on_barrier(self, gate: InputGate, channel: int, barrier: Barrier) -> None:
        n = barrier.checkpoint_id
        if barrier.unaligned or n in self._switched:
            await self._on_unaligned_barrier(gate, channel, barrier)
            return
        backlog = self._backlog
        if backlog is not None and backlog.checkpoint_id == n and channel in backlog.waiting:
            # Switched to unaligned here while this barrier was on its way.
            self._log_arrived(channel)
            return
        al = self._align
        if al is not None and n > al.barrier.checkpoint_id:
            # A newer barrier: the checkpoint being aligned was aborted.
            self._cancel_alignment(gate)
            al = None
        if al is None:
            if n <= self._done_id:
                return  # late barrier of an aborted checkpoint
            al = self._align = _Alignment(barrier, time.monotonic())
        elif n < al.barrier.checkpoint_id:
            return
        al.seen.add(channel)
        coordinator = self.coordinator
        if coordinator is None or coordinator.mode.blocks:
            gate.block(channel)
        await self._check_aligned(gate)
        if self._align is al:
            fault_point("task.aligning")

    async def _check_aligned(self, gate: InputGate) -> None:
        al = self._align
        assert al is not None
        for i in range(len(gate.channels)):
            if self.regular[i] and not self._ended[i] and i not in al.seen:
                return
        self._align = None
        self._done_id = max(self._done_id, al.barrier.checkpoint_id)
        await self._checkpoint(al.barrier, alignment=time.monotonic() - al.started)
        gate.unblock_all()

    async def _on_unaligned_barrier(self, gate: InputGate, channel: int,
                                    barrier: Barrier) -> None:
        """Barrier ``n`` overtook the records on ``channel`` (or ``n`` was
        switched to unaligned): the first one starts the checkpoint at
        once; each one ends the logging of its channel."""
        n = barrier.checkpoint_id
        backlog = self._backlog
        if backlog is not None and backlog.checkpoint_id == n:
            if channel in backlog.waiting:
                self._log_arrived(channel)
            return
        if n <= self._done_id:
            return  # late barrier of an aborted checkpoint, or one already logged
        await self._start_unaligned(gate, barrier, {channel})

    async def _start_unaligned(self, gate: InputGate, barrier: Barrier, seen: set[int]) -> None:
        """Snapshot for ``barrier`` now; log the regular inputs not in
        ``seen`` until their barrier comes. A barrier already queued behind
        records on one of them (sent aligned) is taken at once, with the
        records in front of it as that channel's state."""
        n = barrier.checkpoint_id
        al = self._align
        started = time.monotonic()
        if al is not None:
            if al.barrier.checkpoint_id == n:
                seen = seen | al.seen
                started = al.started
            self._align = None
            gate.unblock_all()
        self._switched.discard(n)
        self._done_id = max(self._done_id, n)
        waiting = {i for i, r in enumerate(self.regular)
                   if r and not self._ended[i] and i not in seen}
        taken: dict[int, list[RecordBatch]] = {}
        for i in sorted(waiting):
            before = gate.channels[i].take_before(
                lambda e: type(e) is Barrier and e.checkpoint_id == n)
            if before is not None:
                taken[i] = before
        waiting -= set(taken)
        await self._checkpoint(replace(barrier, unaligned=True),
                               alignment=time.monotonic() - started,
                               unaligned=True, waiting=waiting, taken=taken)

    def _log_arrived(self, channel: int) -> None:
        """The barrier or the end arrived on a channel the log waits on."""
        backlog = self._backlog
        assert backlog is not None
        if backlog.arrived(channel):
            self._backlog = None

            async def write() -> None:
                await backlog.write(backlog)

            if self.spawn is not None:
                self.spawn(write)

    def switch_to_unaligned(self, checkpoint_id: int) -> None:
        """Coordinator: checkpoint ``checkpoint_id`` is not aligned after the
        aligned timeout; take it unaligned from now on."""
        if self.finished:
            return
        self._switch_requests.append(checkpoint_id)
        if self.interrupt is not None:
            self.interrupt.request()
        self._wake()

    async def _on_switches(self) -> None:
        """Act on the coordinator's switches to unaligned."""
        requests, self._switch_requests = self._switch_requests, []
        for n in requests:
            # Forwarding barrier n aligned, and held up by back-pressure:
            # overtake instead.
            for w in self.writers:
                em = w._emitting
                if type(em) is Barrier and em.checkpoint_id == n:
                    self._capture(n, w.overtake(em))
                    self._unaligned_ids.add(n)
            trigger = self._trigger
            if self.reader is not None:
                if trigger is not None and trigger.checkpoint_id == n:
                    self._switched.add(n)  # injected unaligned, at once
                continue
            gate = self.gate
            if gate is None or n <= self._done_id:
                continue
            al = self._align
            if al is not None and al.barrier.checkpoint_id == n:
                await self._start_unaligned(gate, al.barrier, set())
                continue
            barrier = self._queued_barrier(gate, n)
            if barrier is not None:
                await self._start_unaligned(gate, barrier, set())
            else:
                self._switched.add(n)  # not here yet: unaligned when it comes

    @staticmethod
    def _queued_barrier(gate: InputGate, n: int) -> Barrier | None:
        for ch in gate.channels:
            for item in ch._items:
                if type(item) is Barrier and item.checkpoint_id == n:
                    return item
        return None

    async def _on_interrupt(self) -> None:
        """While a put of this task waits for channel space: take part in
        checkpoints (priority barriers, source triggers, switches) without
        reading any record. Everything here overtakes, so nothing waits."""
        if self._switch_requests:
            await self._on_switches()
        gate = self.gate
        if gate is not None:
            while True:
                got = gate.poll_priority()
                if got is None:
                    break
                i, item = got
                await self._on_barrier(gate, i, item)
        elif self.reader is not None and self._trigger is not None and self._unaligned_trigger():
            await self._inject_barrier(self.reader)

    def _unaligned_trigger(self) -> bool:
        trigger = self._trigger
        return trigger is not None and (trigger.unaligned
                                        or trigger.checkpoint_id in self._switched)

    def _capture(self, n: int, overtaken: dict[str, list[RecordBatch]]) -> None:
        cap = self._captured.setdefault(n, _Captured())
        uid = self.source_uid if self.reader is not None else self.operators[0].uid
        try:
            for key, batches in overtaken.items():
                cap.blobs.setdefault(key, []).extend(encode_batches(batches, str(uid), n))
                cap.counts[key] = cap.counts.get(key, 0) + sum(map(len, batches))
        except StateSerializationError as exc:
            raise self._serialization_failure(exc) from exc

    def _cancel_alignment(self, gate: InputGate) -> None:
        al, self._align = self._align, None
        if al is not None:
            self._done_id = max(self._done_id, al.barrier.checkpoint_id)
            gate.unblock_all()

    def abort_checkpoint(self, checkpoint_id: int) -> None:
        """Coordinator: checkpoint ``checkpoint_id`` was aborted."""
        if self._trigger is not None and self._trigger.checkpoint_id == checkpoint_id:
            self._trigger = None
        if self._backlog is not None and self._backlog.checkpoint_id == checkpoint_id:
            self._backlog = None
        self._captured.pop(checkpoint_id, None)
        self._unaligned_ids.discard(checkpoint_id)
        self._switched.discard(checkpoint_id)
        self._snapshot_watermarks.pop(checkpoint_id, None)
        snaps = self._snapshots.pop(checkpoint_id, None)
        if snaps is not None:
            self._cancel_snapshots(snaps)
        for op in self.operators:
            op.notify_checkpoint_aborted(checkpoint_id)
        if self._early.pop(checkpoint_id, None) and self.gate is not None:
            self.gate.unblock_all()
        al = self._align
        if al is not None and al.barrier.checkpoint_id == checkpoint_id and self.gate is not None:
            self._cancel_alignment(self.gate)
        self._done_id = max(self._done_id, checkpoint_id)

    def describe_state(self) -> str:
        """What this task is doing about checkpoints, for a timeout report."""
        parts = []
        if self._trigger is not None:
            parts.append(f"barrier {self._trigger.checkpoint_id} not yet emitted")
        al = self._align
        if al is not None:
            missing = [self.gate.channels[i].name for i in range(len(self.regular))
                       if self.regular[i] and not self._ended[i] and i not in al.seen
                       ] if self.gate is not None else []
            parts.append(f"aligning {al.barrier.checkpoint_id}, waiting on {missing}")
        if self._backlog is not None and self.gate is not None:
            waiting = [self.gate.channels[i].name for i in sorted(self._backlog.waiting)]
            parts.append(f"logging channel state for {self._backlog.checkpoint_id}, "
                         f"waiting on {waiting}")
        if self.gate is not None:
            queued = {ch.name: len(ch) for ch in self.gate.channels if len(ch)}
            blocked = [ch.name for i, ch in enumerate(self.gate.channels) if self.gate.blocked[i]]
            if queued:
                parts.append(f"queued {queued}")
            if blocked:
                parts.append(f"blocked {blocked}")
        if self.finished:
            parts.append("finished")
        if self.gate is not None and any(self._ended):
            parts.append("ended " + str([self.gate.channels[i].name
                                         for i, e in enumerate(self._ended) if e]))
        parts.append(f"last checkpoint {self._done_id}")
        return f"{self.name}[{self.subtask}]: " + "; ".join(parts)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for op in self.operators:
            op.notify_checkpoint_complete(checkpoint_id)

    # -- snapshots -----------------------------------------------------------

    async def _checkpoint(self, barrier: Barrier, *, alignment: float = 0.0,
                          position: Any = None, forward: bool = True, unaligned: bool = False,
                          waiting: set[int] | None = None,
                          taken: dict[int, list[RecordBatch]] | None = None) -> None:
        """Snapshot for ``barrier`` and forward it. Unaligned: it overtakes
        this task's output in flight, and the inputs in ``waiting`` are
        logged until their barrier comes (``taken``: records already
        captured on inputs whose barrier was taken out of the queue)."""
        n = barrier.checkpoint_id
        coordinator = self.coordinator
        if coordinator is None:
            return
        t0 = time.monotonic()
        snaps = self._snapshot_operators(n)
        sync_duration = time.monotonic() - t0
        if unaligned:
            self._unaligned_ids.add(n)

        async def write(backlog: ChannelStateLog | None = None) -> None:
            await self._write_and_ack(n, snaps, position, alignment, sync_duration, backlog)

        early = self._early.pop(n, set())
        stale: set[int] = set()
        for old in [k for k in self._early if k < n]:
            stale |= self._early.pop(old)
        back_edges = [i for i, r in enumerate(self.regular)
                      if not r and not self._ended[i] and i not in early]
        if not (forward and coordinator.storage is not None):
            back_edges = []
        logged = set(back_edges) | (waiting or set())
        if logged or taken:
            # A loop head: the snapshot is written once the barrier has come
            # back on every back-edge, with the records logged meanwhile; an
            # unaligned checkpoint: once it has come on every input.
            log = ChannelStateLog(n, logged, write, head=self.operators[0].uid,
                                  back_edges=frozenset(back_edges),
                                  records={i: [] for i in back_edges})
            try:
                for i, batches in (taken or {}).items():
                    log.add(i, batches)
            except StateSerializationError as exc:
                raise self._serialization_failure(exc) from exc
            self._backlog = log
            if forward:
                await self._forward(barrier, unaligned)
            if not logged:
                self._backlog = None
                if self.spawn is not None:
                    self.spawn(lambda: write(log))
                else:
                    await write(log)
        elif (coordinator.synchronous or self.spawn is None) and not unaligned:
            await write()
            if forward:
                await self._forward(barrier, unaligned)
        else:
            if forward:
                await self._forward(barrier, unaligned)
            if self.spawn is None:
                await write()
            else:
                self.spawn(write)
        # The back-edges on which barrier n came back before this snapshot
        # were blocked until it (_on_back_edge_barrier); it is taken and the
        # barrier forwarded, so what follows on them, which is after n, flows
        # again. This must happen here, where _early[n] is consumed, and not
        # only at the end of an alignment (_check_aligned unblocks the whole
        # gate): a head whose regular inputs have ended snapshots at its own
        # trigger (_run_gate), with no alignment. Left blocked, such a
        # back-edge was never read again: the records after the barrier stayed
        # in flight, or its end-of-input was never seen, so the head never
        # finished, every later checkpoint and the final one timed out, and
        # the job hung (the SIGKILL loop soak: head[0] read barrier n from
        # head[1]'s side of the loop before its own log input's end-of-input,
        # which is when it learnt of n, and then blocked again[1]->head[0]
        # forever). Channels blocked for an older checkpoint that this head
        # never snapshotted are released too: nothing is aligning on them.
        gate = self.gate
        if gate is not None:
            for i in sorted(early | stale):
                gate.unblock(i)

    async def _forward(self, barrier: Barrier, unaligned: bool) -> None:
        if unaligned:
            for w in self.writers:
                self._capture(barrier.checkpoint_id, w.overtake(barrier))
        else:
            for w in self.writers:
                await w.emit_event(barrier)

    def _snapshot_operators(self, n: int) -> dict[str, OperatorSnapshot | None]:
        """The synchronous half of every operator's snapshot for checkpoint
        ``n``. Without storage (no checkpointing) only the sinks'
        transactions matter: keyed state is not snapshotted."""
        coordinator = self.coordinator
        assert coordinator is not None
        storage = coordinator.storage
        target = None if storage is None else SnapshotTarget(
            storage, n, coordinator.run_id, self.subtask,
            at_end=coordinator.all_finished)
        snaps: dict[str, OperatorSnapshot | None] = {}
        for op in self.operators:
            try:
                snaps[op.uid] = op.snapshot(n, target)
            except Exception as exc:
                # Name the operator and subtask whose snapshot failed (a
                # value that cannot be pickled, mostly); the half-taken
                # snapshots of the operators before it are given up.
                self._cancel_snapshots(snaps)
                raise TaskFailure(self._describe(f"operator '{op.uid}'", exc, _NO_RECORD, None),
                                  op.uid, self.subtask, None) from exc
        # Until written: an abort stops their work (a forked child, say).
        self._snapshots[n] = snaps
        self._snapshot_watermarks[n] = {op.uid: op.watermark for op in self.operators
                                        if op.watermark > -math.inf}
        return snaps

    async def _write_and_ack(self, n: int, snaps: dict[str, OperatorSnapshot | None],
                             position: Any, alignment: float, sync_duration: float,
                             backlog: ChannelStateLog | None = None) -> None:
        try:
            await self._write_and_ack_now(n, snaps, position, alignment, sync_duration, backlog)
        except OSError:
            self._cancel_snapshots(snaps)
            coordinator = self.coordinator
            if coordinator is not None and coordinator.is_aborted(n):
                return  # the abort removed the folder under our write: nothing lost
            raise
        except StateSerializationError as exc:  # a forked snapshot's, or the checkpoint thread's
            self._cancel_snapshots(snaps)
            raise self._serialization_failure(exc) from exc
        except BaseException:
            self._cancel_snapshots(snaps)
            raise
        finally:
            self._snapshots.pop(n, None)
            self._snapshot_watermarks.pop(n, None)
            self._captured.pop(n, None)
            self._unaligned_ids.discard(n)

    @staticmethod
    def _cancel_snapshots(snaps: dict[str, OperatorSnapshot | None]) -> None:
        for snap in snaps.values():
            if snap is not None and snap.keyed is not None:
                snap.keyed.cancel()

    async def _write_and_ack_now(self, n: int, snaps: dict[str, OperatorSnapshot | None],
                                 position: Any, alignment: float, sync_duration: float,
                                 backlog: ChannelStateLog | None) -> None:
        coordinator = self.coordinator
        assert coordinator is not None
        storage = coordinator.storage
        t0 = time.monotonic()
        parts: dict[str, dict[str, Any]] = {}
        files: list[FileHandle] = []
        if self.source_uid is not None:
            parts[self.source_uid] = {"source": position}
        if storage is not None:
            fault_point("snapshot.async_write")
        watermarks = self._snapshot_watermarks.get(n, {})
        for uid, snap in snaps.items():
            part: dict[str, Any] = {}
            if uid in watermarks:
                # The operator's event time at the barrier (metadata `extra`).
                part["watermark"] = encode_watermark(watermarks[uid])
            if snap is not None:
                if snap.keyed is not None:
                    keyed = await snap.keyed.write()
                    files.extend(keyed.file_handles())
                    part["keyed"] = keyed.to_json()
                if snap.committables:
                    part["committables"] = snap.committables
            parts[uid] = part
        inputs: dict[str, list[bytes]] = {}
        in_counts: dict[str, int] = {}
        if backlog is not None and storage is not None and backlog.back_edges:
            # The back-edge log belongs to the head operator, first in this task.
            head = self.operators[0].uid
            rel = f"{checkpoint_dir_name(n)}/{head}-{self.subtask}/backedge-log"
            back = {i: backlog.records.get(i, []) for i in backlog.back_edges}
            handle = await write_backedge_log(storage, rel, BackEdgeRecords(
                back, sum(backlog.counts.get(i, 0) for i in backlog.back_edges)))
            files.append(handle)
            parts.setdefault(head, {})["backedge"] = {
                "file": handle.to_json(),
                "records": sum(backlog.counts.get(i, 0) for i in backlog.back_edges),
            }
        if backlog is not None and self.gate is not None:
            for i, blobs in backlog.records.items():
                if i not in backlog.back_edges and blobs:
                    key = self.gate.channels[i].key
                    inputs[key] = blobs
                    in_counts[key] = backlog.counts.get(i, 0)
        captured = self._captured.pop(n, None)
        outputs = {k: v for k, v in captured.blobs.items() if v} if captured else {}
        state_records = state_size = 0
        if (inputs or outputs) and storage is not None:
            owner = self.source_uid if self.reader is not None else self.operators[0].uid
            assert owner is not None
            rel = f"{checkpoint_dir_name(n)}/{owner}-{self.subtask}/channel-state"
            handle = await write_channel_state(storage, rel, inputs, outputs)
            files.append(handle)
            out_counts = {k: captured.counts[k] for k in outputs} if captured else {}
            parts.setdefault(owner, {})["channel_state"] = {
                "file": handle.to_json(), "inputs": in_counts, "outputs": out_counts}
            state_records = sum(in_counts.values()) + sum(out_counts.values())
            state_size = handle.size
        await coordinator.acknowledge(self, n, TaskSnapshot(
            parts, files, alignment, sync_duration, time.monotonic() - t0,
            unaligned=n in self._unaligned_ids, channel_state_records=state_records,
            channel_state_size=state_size))

    def _restore(self, restored: RestoredCheckpoint) -> None:
        for op in self.operators:
            c = op.ctx
            wm = restored.watermark(op.uid, key_group_range(c.subtask, c.max_parallelism,
                                                            c.parallelism))
            if wm is not None:
                op.watermark = wm
            if op.keyed:
                c = op.ctx
                groups = key_group_range(c.subtask, c.max_parallelism, c.parallelism)
                op.restore_keyed(restored.storage.root, restored.keyed_kinds(op.uid),
                                 restored.keyed_handles(op.uid, groups))
        if self.reader is not None:
            assert self.source_uid is not None
            pos = restored.source_position(self.source_uid, self.subtask, self.parallelism)
            if pos is not None:
                self.reader.seek(pos)

    async def _end_of_input(self) -> None:
        if self.interrupt is not None:
            # Operators emit their last records (window results, say): a
            # snapshot in the middle of that would be neither before nor after.
            self.interrupt.enabled = False
        self._current_span = None
        self._stop_clock()  # pending processing-time timers do not fire (as Flink)
        await self._end_event_time(self._valve)
        for k, op in enumerate(self.operators):
            try:
                extra = op.end_input()
            except Exception as exc:
                raise TaskFailure(self._describe(f"operator '{op.uid}'", exc, _NO_RECORD,
                                                 "the end of input"), op.uid, self.subtask,
                                  None) from exc
            if extra:
                op.records_out += len(extra)
                out, stamps = self._run_chain(extra, k + 1, getattr(extra, "timestamps", None))
                await self._emit(out, None, [], stamps)
            if op.assigns_timestamps:
                # A bounded input ends event time: every timer fires.
                op.watermark = math.inf
                await self._advance_watermark(math.inf, k + 1)
        # The final state is acknowledged later, checkpoint by checkpoint and
        # in the final checkpoint (CheckpointCoordinator.task_finished).
        self._final_position = self.reader.position() if self.reader is not None else None
        for w in self.writers:
            await w.emit_event(END_OF_INPUT)
        self._dirty_since = 0.0


_NO_RECORD: Any = object()

#: Longest a task works through a backlog of its inputs before it yields
#: (seconds): short enough for the rest of the job, and of the program that
#: embeds it, to stay responsive.
_TURN = 0.005
