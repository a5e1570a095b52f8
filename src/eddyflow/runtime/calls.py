"""The side of a task that runs a ``map_async``, mixed into ``Task`` as
:class:`CallsInFlight` (docs/concepts/async.md).

A ``map_async`` operator always heads its chain, so its task reads a gate.
The operator's completions call the task's ``_wake``; the task's loop then
takes the results (``_take_calls``) and runs them through the rest of the
chain, a segment at a time. While the operator is at capacity the loop
reads only priority items and otherwise waits on the gate's wake-ups
(``InputGate.wait_wake``): a completion, a checkpoint trigger, a priority
barrier. Inside a loop, the records it admitted and has not emitted count as
in flight in that loop, so the loop is not found empty while calls are.
"""

from __future__ import annotations

from typing import Any

from eddyflow.runtime.exchange.channel import InputGate
from eddyflow.runtime.exchange.events import Span
from eddyflow.runtime.exchange.loops import LoopTracker
from eddyflow.runtime.failures import TaskFailure
from eddyflow.runtime.operators.async_calls import AsyncCallFailed, AsyncCallOperator
from eddyflow.runtime.operators.base import Operator
from eddyflow.runtime.time.valve import WatermarkValve

__all__ = ["CallsInFlight"]


class CallsInFlight:
    """Mixed into ``Task``: a ``map_async`` at the head of the chain."""

    operators: list[Operator]
    gate: InputGate | None
    input_loops: list[LoopTracker | None]
    _valve: WatermarkValve | None
    _assigner: int | None

    # what Task provides
    def _wake(self) -> None:
        raise NotImplementedError

    def _run_chain(self, batch: list[Any], start: int = 0, timestamps: list[Any] | None = None
                   ) -> tuple[list[Any], list[Any] | None]:
        raise NotImplementedError

    async def _emit(self, records: list[Any], span: Span | None, stages_in: list[Any],
                    timestamps: list[Any] | None = None) -> None:
        raise NotImplementedError

    async def _flush(self) -> None:
        raise NotImplementedError

    async def _advance_watermark(self, wm: float, start: int = 0) -> None:
        raise NotImplementedError

    def _call_failure(self, op: Operator, exc: AsyncCallFailed) -> TaskFailure:
        raise NotImplementedError

    async def _set_idle(self, idle: bool) -> None:
        raise NotImplementedError

    def _init_calls(self) -> None:
        ops = self.operators
        #: The ``map_async`` heading this chain, if any: its completions
        #: wake the task, which then takes their results.
        self._calls = ops[0] if ops and isinstance(ops[0], AsyncCallOperator) else None
        # The loop its inputs lie in: its admitted records are in flight there.
        self._calls_loop = next((t for t in self.input_loops if t is not None), None)
        #: All the loops its inputs lie in, told when the task runs out of
        #: input (over worker processes: ``runtime/workers/termination.py``).
        self._idle_loops = list({id(t): t for t in self.input_loops if t is not None}.values())
        self._calls_held = 0
        if self._calls is not None:
            self._calls.on_ready = self._wake

    async def _take_calls(self) -> None:
        """Emit what the ``map_async`` heading the chain has ready, through
        the rest of the chain: results, and watermarks it held back until
        the results before them were out."""
        calls = self._calls
        assert calls is not None
        while True:
            try:
                got = calls.take()
            except AsyncCallFailed as exc:
                raise self._call_failure(calls, exc) from exc.cause
            if got is None:
                break
            results, stamps, watermark = got
            if results:
                out, out_stamps = self._run_chain(results, 1, stamps)
                await self._emit(out, None, [], out_stamps)
            if watermark is not None:
                await self._advance_watermark(watermark, 1)
            self._count_calls_in_loop()
        if not calls.count and self._assigner is None and self._valve is not None:
            # The inputs went idle while results were still to come: now it is.
            await self._set_idle(self._valve.idle_out)

    def _idle_unless_calls(self, idle: bool) -> bool:
        """Whether the task's output is idle: not while a ``map_async``
        holds records, whose results are still to come (downstream would
        let its watermark pass them, and they would arrive late)."""
        calls = self._calls
        return idle and (calls is None or not calls.count)

    async def _finish_calls(self) -> None:
        """The input has ended: wait for every call still in flight and
        emit its result before the chain ends its input."""
        calls = self._calls
        assert calls is not None and self.gate is not None
        while calls.count:
            if calls.ready:
                await self._take_calls()
                continue
            await self._flush()
            if not calls.ready:  # it may have come while the flush waited
                await self.gate.wait_wake()
        await self._take_calls()  # a watermark held behind the last results

    def _count_calls_in_loop(self) -> None:
        """In a loop, the records a ``map_async`` admitted and has not yet
        emitted are in flight in it: the loop is not empty while calls are
        (docs/concepts/cycles.md, Termination)."""
        loop, calls = self._calls_loop, self._calls
        if loop is None or calls is None:
            return
        delta = calls.count - self._calls_held
        self._calls_held = calls.count
        if delta > 0:
            loop.in_flight += delta
        elif delta < 0:
            loop.consumed(-delta)
