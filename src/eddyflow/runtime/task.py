"""A task: one coroutine running one subtask of one operator chain.

The loop reads a batch from the input gate (or the source reader), pushes it
through the chained operators with plain calls, and hands the result to the
record writers, awaiting only when a batch actually leaves (a full buffer)
or nothing is left to read. Output is flushed when the input runs dry or
when the oldest buffered record is older than the buffer timeout, so a slow
trickle still flows without a timer coroutine per task.

A failure inside an operator is turned into a :class:`TaskFailure` that
names the operator, the subtask, the record and the source position it came
from, traced back through the chain (see ``Operator.output_counts``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anyio

from eddyflow.connectors.source import SourceReader
from eddyflow.runtime.channel import InputGate
from eddyflow.runtime.events import END_OF_INPUT, EndOfInput, RecordBatch, Span
from eddyflow.runtime.operators import Operator
from eddyflow.runtime.writers import KeyRoutingError, RecordWriter

__all__ = ["Task", "TaskFailure"]


class TaskFailure(Exception):
    """An operator failed; the message says where, ``__cause__`` says why."""

    def __init__(self, message: str, operator: str, subtask: int, position: str | None) -> None:
        super().__init__(message)
        self.operator = operator
        self.subtask = subtask
        self.position = position


class Task:
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
    ) -> None:
        if (gate is None) == (reader is None):
            raise ValueError("a task reads either from a gate or from a source reader")
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
        self.finished = False

    # -- the chain ---------------------------------------------------------

    def _run_chain(self, batch: list[Any], start: int = 0) -> list[Any]:
        ops = self.operators
        stages: list[list[Any]] = []
        for k in range(start, len(ops)):
            op = ops[k]
            try:
                out = op.process(batch)
            except Exception as exc:
                stages.append(batch)
                raise self._failure(exc, op, start, stages, op.locate_failure(batch)) from exc
            op.records_in += len(batch)
            op.records_out += len(out)
            stages.append(batch)
            batch = out
            if not batch:
                return batch
        return batch

    async def _emit(self, records: list[Any], span: Span | None, stages_in: list[Any]) -> None:
        if not records:
            return
        for w in self.writers:
            try:
                full = w.add(records, span)
            except KeyRoutingError as exc:
                raise self._routing_failure(exc, w, stages_in) from exc.__cause__
            if full:
                await w.send_full()
        if not self._dirty_since:
            self._dirty_since = time.monotonic()

    async def _flush(self) -> None:
        for w in self.writers:
            await w.flush()
        self._dirty_since = 0.0

    async def _maybe_flush(self) -> None:
        since = self._dirty_since
        if since and time.monotonic() - since >= self.buffer_timeout:
            await self._flush()

    async def _process_input(self, batch: list[Any], span: Span | None) -> None:
        out = self._run_chain(batch)
        await self._emit(out, span, batch)

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
                f"{label} positions {first!r} to {end!r}" for label, (first, end) in span.items()
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
            if self.reader is not None:
                await self._run_source(self.reader)
            else:
                assert self.gate is not None
                await self._run_gate(self.gate)
            await self._end_of_input()
            self.finished = True
        except BaseException:
            for op in self.operators:
                op.abort()
            raise
        finally:
            for op in self.operators:
                op.close()
            if self.reader is not None:
                with anyio.CancelScope(shield=True):
                    await self.reader.close()

    async def _run_source(self, reader: SourceReader) -> None:
        size = self.batch_size
        label = self.source_label
        while True:
            start = reader.position()
            try:
                batch = await reader.read_batch(size)
            except Exception as exc:
                where = f"{label} at {reader.describe_position(reader.position())}"
                raise TaskFailure(self._describe(f"source '{self.source_uid}'", exc, _NO_RECORD,
                                                 where), str(self.source_uid), self.subtask,
                                  where) from exc
            if batch is None:
                return
            if batch:
                self.records_read += len(batch)
                span = {label: [start, reader.position()]}
                self._current_span = span
                await self._process_input(batch, span)
            if len(batch) < size:
                # The source has nothing more right now: let what we have go.
                await self._flush()
            else:
                await self._maybe_flush()
            # A source that never blocks must still let the rest of the job
            # (and the embedding program) run.
            await asyncio.sleep(0)

    async def _run_gate(self, gate: InputGate) -> None:
        remaining = len(gate.channels)
        while remaining:
            got = gate.poll()
            if got is None:
                await self._flush()
                got = await gate.get()
            _, item = got
            if type(item) is RecordBatch:
                self._current_span = item.span
                await self._process_input(item, item.span)
                await self._maybe_flush()
                await asyncio.sleep(0)
            elif isinstance(item, EndOfInput):
                remaining -= 1
            else:
                raise TypeError(f"task {self.name}: unexpected item on a channel: {item!r}")

    async def _end_of_input(self) -> None:
        self._current_span = None
        for k, op in enumerate(self.operators):
            try:
                extra = op.end_input()
            except Exception as exc:
                raise TaskFailure(self._describe(f"operator '{op.uid}'", exc, _NO_RECORD,
                                                 "the end of input"), op.uid, self.subtask,
                                  None) from exc
            if extra:
                out = self._run_chain(extra, k + 1)
                await self._emit(out, None, [])
        for w in self.writers:
            await w.emit_event(END_OF_INPUT)
        self._dirty_since = 0.0


_NO_RECORD: Any = object()
