"""A task: one coroutine running one subtask of one operator chain.

:class:`Task` is the loop: it drives a source reader or reads its input
gate, and pushes each batch through the chain. Its other concerns are
mixed in from their own modules: event time (``runtime/time/valve.py``),
failure reports (``runtime/failures.py``) and its side of the checkpoint
protocol (``runtime/checkpointing/participation.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from eddyflow.connectors.source import SourceReader
from eddyflow.connectors.splits import SplitsReader
from eddyflow.runtime.calls import CallsInFlight
from eddyflow.runtime.checkpointing.barriers import BarrierHandler, CheckpointMode
from eddyflow.runtime.checkpointing.messages import SubtaskId
from eddyflow.runtime.checkpointing.participation import Participation
from eddyflow.runtime.exchange.channel import InputGate, Interrupt
from eddyflow.runtime.exchange.debloat import Debloater
from eddyflow.runtime.exchange.events import (
    END_OF_INPUT,
    Barrier,
    EndOfInput,
    RecordBatch,
    Span,
    Watermark,
    WatermarkStatus,
)
from eddyflow.runtime.exchange.loops import LoopTracker
from eddyflow.runtime.exchange.writers import KeyRoutingError, RecordWriter
from eddyflow.runtime.failures import FailureReports
from eddyflow.runtime.operators.base import Operator
from eddyflow.runtime.time.clock import Clock
from eddyflow.runtime.time.valve import EventTime, WatermarkValve
from eddyflow.values import immutable, independent_copy

if TYPE_CHECKING:
    from eddyflow.runtime.checkpointing.coordinator import CheckpointCoordinator
    from eddyflow.runtime.recovery.restore import RestoredCheckpoint

Spawn = Callable[[Callable[[], Awaitable[None]]], None]

__all__ = ["Task"]

_log = logging.getLogger("eddyflow")


class Task(EventTime, FailureReports, Participation, CallsInFlight):
    """One subtask of one operator chain, run as one coroutine (:meth:`run`).

    The loop reads a batch from its input gate (or its source reader), pushes
    it through the chained operators with plain calls, and hands the result
    to the record writers, awaiting only when a batch actually leaves (a full
    buffer) or nothing is left to read. Output is flushed when the input
    runs dry or when the oldest buffered record is older than the buffer
    timeout, so a slow trickle flows without a timer coroutine per task.

    In checkpoints a source emits barrier ``n`` between two batches when
    triggered, and a task with inputs hands what its gate delivers to its
    :class:`BarrierHandler`, which aligns (or logs) and calls back
    :meth:`take_checkpoint`; the coordinator talks to it as a
    :class:`~eddyflow.runtime.checkpointing.participant.CheckpointParticipant`."""

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
        debloat: Debloater | None = None,
    ) -> None:
        if (gate is None) == (reader is None):
            raise ValueError("a task reads either from a gate or from a source reader")
        self.chain_index = chain_index
        self.subtask_id = SubtaskId(chain_index, subtask)
        self.coordinator = coordinator
        self.restore = restore
        self.spawn = spawn
        n_in = len(gate.channels) if gate is not None else 0
        self.regular = regular_inputs if regular_inputs is not None else [True] * n_in
        # Loops: which loop each input channel lies in (its records count as in
        # flight round it), and the loop this task ends if it is a loop head
        # (it has back-edge inputs).
        self.input_loops = input_loops if input_loops is not None else [None] * n_in
        self.head_of = head_of
        # The loop each input channel enters from outside, if any.
        self.input_entries = input_entries if input_entries is not None else [None] * n_in
        self._init_participation()
        #: Resolved to wake the source loop waiting for input (``_await_input``).
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
        #: Sizes this task's inputs (or reads) by its measured rate, if on.
        self.debloat = debloat
        self.records_read = 0
        self._dirty_since = 0.0
        self._warned_sharing = False
        self.finished = False
        self._closed = False
        #: The operators that await I/O (``Operator.awaits``, known once open).
        self._awaiting: list[Operator] = []
        self._init_snapshots()
        self._valve = (WatermarkValve(list(self.regular), final_at_end=head_of is None)
                       if gate is not None else None)
        self._init_event_time(clock, auto_watermark_interval)
        #: The input side of checkpoints: alignment, logging, switches.
        self.barriers = BarrierHandler(
            gate, self.regular,
            coordinator.mode if coordinator is not None else CheckpointMode.EXACTLY_ONCE, self,
            owner=self.state_owner)
        self._init_calls()
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
        for op in self._awaiting:
            # A sink's asynchronous write of what the chain just gave it:
            # awaited before the next input is taken (its back-pressure).
            if op.io_pending:
                try:
                    await op.settle()
                except Exception as exc:
                    raise self._operator_failure(op, exc) from exc
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
        debloat = self.debloat
        if debloat is None:
            out, stamps = self._run_chain(batch, 0, timestamps)
        else:
            # Its own work, not the waits for output space: what a turn is.
            began = time.perf_counter()
            out, stamps = self._run_chain(batch, 0, timestamps)
            debloat.worked(len(batch), began, time.perf_counter())
        if self._assigner is not None:
            await self._generator_status()  # active again: said before the records
            await self._emit(out, span, batch, stamps)
            await self._generator_watermark(False)
        else:
            await self._emit(out, span, batch, stamps)
        if self._clocked:
            self._schedule_clock()

    def _wake(self) -> None:
        """Wake the loop wherever it waits: processing time is due, a
        checkpoint was triggered, a switch to unaligned was asked for, or
        a ``map_async`` call completed."""
        wake = self._trigger_wakeup
        if wake is not None and not wake.done():
            wake.set_result(None)
        if self.gate is not None:
            self.gate.wake()

    # -- the loops ---------------------------------------------------------

    async def run(self) -> None:
        try:
            for op in self.operators:
                op.open()
            self._awaiting = [op for op in self.operators if op.awaits]
            if self.restore is not None:
                self._restore(self.restore)
                self._count_calls_in_loop()  # the records in flight it restored
            if self.reader is not None:
                await self._run_source(self.reader)
                await self._end_of_input()
            else:
                assert self.gate is not None
                await self._run_gate(self.gate)
            self.finished = True
            coordinator = self.coordinator
            if coordinator is not None:
                self._acknowledge_late_triggers()
                coordinator.task_finished(self)
        except BaseException:
            for op in self.operators:
                op.abort()
            try:
                await self.aclose()
            except Exception as exc:  # the failure that got us here is the one to report
                _log.warning("task %s[%d]: closing after a failure failed too: %s: %s",
                             self.name, self.subtask, type(exc).__name__, exc)
            raise
        finally:
            if self.reader is not None:
                with anyio.CancelScope(shield=True):
                    await self.reader.close()

    async def aclose(self) -> None:
        """:meth:`close`, after the awaited closing of the operators that
        await I/O (a sink's connection): shielded from the cancellation that
        may be ending the job, and bounded, so that a peer that no longer
        answers cannot hold the job's end."""
        errors: list[BaseException] = []
        if not self._closed:
            for op in self._awaiting:
                with anyio.move_on_after(_ACLOSE_TIMEOUT, shield=True) as scope:
                    try:
                        await op.aclose()
                    except Exception as exc:  # close every operator, then report
                        errors.append(exc)
                if scope.cancelled_caught:
                    _log.warning("task %s[%d]: operator '%s' did not close within %.0f s",
                                 self.name, self.subtask, op.uid, _ACLOSE_TIMEOUT)
        self.close()
        if errors:
            raise errors[0]

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

    async def _run_source(self, reader: SourceReader) -> None:
        # The reader's fetch runs beside the reads in a task group of this
        # task: cancelled with it, and never outliving it.
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader.fetch, name=f"{self.name}[{self.subtask}] fetch")
            try:
                await self._read_source(reader)
            except Exception as exc:  # raised as itself, not in the group's ExceptionGroup
                failure = exc
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _read_source(self, reader: SourceReader) -> None:
        debloat = self.debloat
        size = self.batch_size if debloat is None else debloat.read_size
        label = self.source_label
        # A split source's batch comes from one of its splits: its span
        # names the split (and position() of all its splits is not asked
        # for at every batch).
        splits = reader if isinstance(reader, SplitsReader) else None
        start = reader.position() if splits is None else None
        # A generator chained right after a split source: per split.
        stamp: Any = None
        if splits is not None and self.operators and self.operators[0].assigns_timestamps:
            stamp = self.operators[0]
            stamp.track_splits(splits.unread, splits.finished)
        if self._clocked:
            self._schedule_clock()
        while True:
            if self._timers_due:
                await self._fire_processing_time()
            if self.barriers.has_switch_requests:
                await self._on_switches()
            if self._trigger is not None:
                await self._inject_barrier(reader)
                continue
            try:
                batch = await reader.read_batch(size)
            except Exception as exc:
                raise self._source_failure(exc, reader) from exc
            if batch is None:
                break
            end = reader.position() if splits is None else None
            if batch:
                self.records_read += len(batch)
                if splits is not None and splits.last_span is not None:
                    sid, first, last = splits.last_span
                    span: Span = ((f"{label} split '{sid}'", first, last),)
                    if stamp is not None:
                        stamp.split = sid
                else:
                    span = ((label, start, end),)
                self._current_span = span
                await self._process_input(batch, span)
            start = end
            if len(batch) < size:
                # The source has nothing more right now: let what we have go.
                await self._generator_watermark(True)
                await self._flush()
                if not batch:
                    await self._await_input(reader)
            else:
                await self._maybe_flush()
            if debloat is not None:
                size = debloat.read_size
            # A source that never blocks must still let the rest of the
            # job (and the embedding program) run.
            await asyncio.sleep(0)
        while self._trigger is not None:  # triggered just before the end
            await self._inject_barrier(reader)
        self._source_done = True

    async def _await_input(self, reader: SourceReader) -> None:
        """The reader has nothing now: wait until it has, a checkpoint is
        triggered, a switch to unaligned is asked for or processing time is
        due, whichever comes first (each of them resolves the wake-up
        future). At once if the reader cannot tell when it will have more."""
        ready = reader.available()
        if (ready is None or ready.done() or self._trigger is not None or self._timers_due
                or self.barriers.has_switch_requests):
            return
        wake = self._trigger_wakeup = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait((ready, wake), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._trigger_wakeup = None

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
        debloat = self.debloat
        if self._clocked:
            self._schedule_clock()
        while regular_left or back_left:
            if self._timers_due:
                await self._fire_processing_time()
            if self.barriers.has_switch_requests:
                await self._on_switches()
            if self._trigger is not None:
                await self._on_loop_trigger(ended=ended)
                continue
            calls = self._calls
            if calls is not None and calls.ready:
                await self._take_calls()
            if not ended and self._loop_is_empty():
                # A loop head: its input is exhausted and nothing is left
                # anywhere in its loop. End, which ends the loop body in turn;
                # then drain the back-edges until their end-of-input.
                ended = True
                self.barriers.end_loop()
                await self._end_of_input()
                continue
            # A map_async at capacity reads no records (back-pressure) until
            # a call completes, but takes part in unaligned checkpoints.
            full = calls is not None and calls.saturated
            got = gate.poll_priority() if full else gate.poll()
            if got is None:
                await self._generator_watermark(True)
                await self._flush()
                if calls is not None and calls.ready:
                    continue  # completed while the flush waited: its wake-up is spent
                if full:
                    await gate.wait_wake()
                    continue
                if not ended and self._loop_is_empty():
                    continue
                for loop in self._idle_loops:
                    loop.idle()
                waited = time.perf_counter()
                await gate.wait()
                if debloat is not None:
                    debloat.idle(time.perf_counter() - waited)
                continue
            i, item = got
            kind = type(item)
            if kind is RecordBatch:
                self.barriers.on_records(i, item)
                self._current_span = item.span
                await self._process_input(item, item.span, item.timestamps)
                if calls is not None:
                    self._count_calls_in_loop()  # before the batch leaves the count
                tracker = self.input_loops[i]
                if tracker is not None:
                    tracker.consumed(len(item))
                await self._maybe_flush()
                # Yield after each batch, unless more than a batch is still
                # queued here: then work it off first, for up to one turn.
                # With a yield per batch every task of a busy job advances
                # at the same pace, so a queue that once filled up (behind
                # an alignment, a slow snapshot, a burst) stays full for
                # good: more records wait in memory, each costs more to
                # process, and barriers take longer to get through
                # (benchmarks/overhead.py shows it).
                backlog = gate.backlog()
                if backlog <= self.batch_size or time.monotonic() - turn >= _TURN:
                    if debloat is not None and not backlog:
                        # Nothing left to take: the other tasks' turns are
                        # idle time here, not a slow drain.
                        waited = time.perf_counter()
                        await asyncio.sleep(0)
                        debloat.idle(time.perf_counter() - waited)
                    else:
                        await asyncio.sleep(0)
                    turn = time.monotonic()
            elif kind is Barrier:
                paused = time.perf_counter()
                if self.regular[i]:
                    await self.barriers.on_barrier(i, item)
                else:
                    self.barriers.on_back_edge_barrier(i, item)
                if debloat is not None:
                    # Snapshotting (and writing, in synchronous mode) is no
                    # slow drain: a fixed cost per checkpoint, not per record.
                    debloat.idle(time.perf_counter() - paused)
            elif kind is Watermark:
                wm = valve.on_watermark(i, item.timestamp)
                if wm is not None:
                    await self._advance_watermark(wm)
                if self._assigner is None:
                    await self._set_idle(self._idle_unless_calls(valve.idle_out))
            elif kind is WatermarkStatus:
                wm = valve.on_status(i, item.idle)
                if wm is not None:
                    await self._advance_watermark(wm)
                if self._assigner is None:
                    await self._set_idle(self._idle_unless_calls(valve.idle_out))
            elif kind is EndOfInput:
                aligning = self.barriers.aligning
                await self.barriers.on_end(i)
                wm = valve.on_end(i)
                if wm is not None:
                    await self._advance_watermark(wm)
                entry = self.input_entries[i]
                if entry is not None:
                    entry.entry_ended()
                if self.regular[i]:
                    regular_left -= 1
                    if (not aligning and regular_left == 0 and self.head_of is not None
                            and not ended):
                        self._trigger_pending_in_loop()
                else:
                    back_left -= 1
            else:
                raise TypeError(f"task {self.name}: unexpected item on a channel: {item!r}")
        if not ended:
            await self._end_of_input()

    async def _end_of_input(self) -> None:
        if self._calls is not None:
            await self._finish_calls()
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
                raise self._end_input_failure(op, exc) from exc
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
        self._keep_final_position(self.reader.position() if self.reader is not None else None)
        for w in self.writers:
            await w.emit_event(END_OF_INPUT)
        self._dirty_since = 0.0


#: Longest the awaited closing of an operator may take (seconds): a sink's
#: connection to a server that no longer answers is given up after it.
_ACLOSE_TIMEOUT = 10.0

#: Longest a task works through a backlog of its inputs before it yields
#: (seconds): short enough for the rest of the job, and of the program that
#: embeds it, to stay responsive.
_TURN = 0.005
