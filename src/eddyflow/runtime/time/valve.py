"""Event time inside a task: the watermark valve and the task's time keeping.

:class:`WatermarkValve` combines the watermarks of a task's input channels:
the task's input watermark is the minimum over its *counted* channels that
are neither idle nor ended (an ended channel never holds it back), it only
moves forward, and when every counted channel is idle the task's output is
idle. Back-edge inputs of a loop head are not counted: records fed back round
a loop keep their timestamps but never hold the head's watermark back (the
loop's own watermark would otherwise wait on itself forever); they may be late
for the operators they meet again. A loop head reaches ``+inf`` only at its
end of input, once the loop is empty, so timers registered by records still
circulating fire before the job ends.

:class:`EventTime` is the part of :class:`~eddyflow.runtime.task.Task` that
acts on it: advancing the chain's watermark (``on_watermark`` of each operator
in chain order, the outputs of one run through the operators after it before
those get the watermark, then ``Watermark`` forwarded on every output),
emitting a generator's watermarks and idleness, and waking the task for
processing-time timers at the clock's time without polling.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any

from eddyflow.runtime.exchange.events import Watermark, WatermarkStatus
from eddyflow.runtime.time.clock import WALL_CLOCK, Cancellable, Clock

if TYPE_CHECKING:
    from eddyflow.runtime.exchange.events import Span
    from eddyflow.runtime.exchange.writers import RecordWriter
    from eddyflow.runtime.operators.base import Operator

__all__ = ["EventTime", "WatermarkValve"]

_INF = math.inf


class WatermarkValve:
    """The input side: per channel watermark, idleness and end."""

    __slots__ = ("counted", "current", "ended", "final_at_end", "idle", "idle_out", "seen", "wm")

    def __init__(self, counted: list[bool], *, final_at_end: bool = True) -> None:
        n = len(counted)
        self.counted = counted
        self.wm = [-_INF] * n
        self.idle = [False] * n
        self.ended = [False] * n
        self.current = -_INF
        self.seen = False  # a watermark ever arrived: this input has event time
        self.idle_out = False
        #: All counted inputs ended means +inf (not for a loop head: its
        #: loop may still hold records; it reaches +inf at its end of input).
        self.final_at_end = final_at_end

    def on_watermark(self, i: int, t: float) -> float | None:
        """The new input watermark if it advanced."""
        if not self.counted[i]:
            return None
        self.seen = True
        if t > self.wm[i]:
            self.wm[i] = t
        self.idle[i] = False  # a watermark is a sign of life
        return self._recompute()

    def on_status(self, i: int, idle: bool) -> float | None:
        if not self.counted[i]:
            return None
        self.idle[i] = idle
        return self._recompute()

    def on_end(self, i: int) -> float | None:
        self.ended[i] = True
        return self._recompute() if self.seen and self.counted[i] else None

    def _recompute(self) -> float | None:
        live = [self.wm[i] for i, c in enumerate(self.counted)
                if c and not self.ended[i] and not self.idle[i]]
        waiting = any(c and not self.ended[i] for i, c in enumerate(self.counted))
        self.idle_out = waiting and not live
        if live:
            m = min(live)
        elif not waiting and self.final_at_end:
            m = _INF
        else:
            return None
        if m == _INF and not self.final_at_end:
            return None  # a loop head: +inf only once its loop is empty
        if m > self.current:
            self.current = m
            return m
        return None


class EventTime:
    """Mixed into ``Task``: what the task does with watermarks and clocks."""

    operators: list[Operator]
    writers: list[RecordWriter]
    _dirty_since: float

    def _init_event_time(self, clock: Clock | None, interval: float) -> None:
        ops = self.operators
        self._clock: Clock = clock if clock is not None else WALL_CLOCK
        self._wm_interval = interval
        self._wm_out = -_INF  # last watermark sent downstream
        self._idle_out = False
        self._wm_sent_at = 0.0  # monotonic time of the last generated one sent
        self._assigner = next((k for k, op in enumerate(ops) if op.assigns_timestamps), None)
        self._clocked = [k for k, op in enumerate(ops) if op.uses_clock]
        self._timers_due = False
        self._wake_at: float | None = None
        self._wake_handle: Cancellable | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # what Task provides
    def _run_chain(self, batch: list[Any], start: int = 0, timestamps: list[Any] | None = None
                   ) -> tuple[list[Any], list[Any] | None]:
        raise NotImplementedError

    async def _emit(self, records: list[Any], span: Span | None, stages_in: list[Any],
                    timestamps: list[Any] | None = None) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        raise NotImplementedError

    # -- watermarks --------------------------------------------------------

    async def _advance_watermark(self, wm: float, start: int = 0) -> None:
        """Event time reached ``wm`` at operator ``start`` of the chain."""
        ops = self.operators
        for k in range(start, len(ops)):
            op = ops[k]
            if op.assigns_timestamps:
                return  # upstream event time stops at a generator of its own
            if wm <= op.watermark:
                continue  # restored beyond it: nothing new to fire
            if op.hold_watermark(wm):
                return  # map_async: released after the results before it
            op.watermark = wm
            out = op.on_watermark(wm)
            if out:
                op.records_out += len(out)
                res, stamps = self._run_chain(out, k + 1, getattr(out, "timestamps", None))
                await self._emit(res, None, [], stamps)
        if wm > self._wm_out:
            self._wm_out = wm
            await self._send_event(Watermark(wm))

    async def _send_event(self, event: Any) -> None:
        for w in self.writers:
            await w.emit_event(event)
        self._dirty_since = 0.0

    async def _set_idle(self, idle: bool) -> None:
        if idle != self._idle_out:
            self._idle_out = idle
            await self._send_event(WatermarkStatus(idle))

    async def _generator_status(self) -> None:
        """Say a generator's idleness change downstream (before the records
        that ended an idle spell)."""
        a = self._assigner
        if a is None:
            return
        op: Any = self.operators[a]
        if op.status_changed:
            op.status_changed = False
            await self._set_idle(op.idle)

    async def _generator_watermark(self, force: bool) -> None:
        """Send the generator's watermark if it advanced: after a batch at
        most every ``auto_watermark_interval`` (0: after every batch), and
        whenever the task's input runs dry (``force``)."""
        a = self._assigner
        if a is None:
            return
        op: Any = self.operators[a]
        wm = op.generated()
        if wm <= op.watermark:
            return
        now = time.monotonic()
        if not force and now - self._wm_sent_at < self._wm_interval:
            return
        self._wm_sent_at = now
        op.watermark = wm
        await self._advance_watermark(wm, a + 1)

    async def _end_event_time(self, valve: WatermarkValve | None) -> None:
        """Before the end of input: ``+inf`` through the chain, so every
        event-time timer fires before the job ends."""
        if valve is not None and valve.seen:
            await self._advance_watermark(_INF, 0)

    # -- processing time ---------------------------------------------------

    def _schedule_clock(self) -> None:
        """Ask the clock to wake this task when its earliest processing-time
        work is due (only ever earlier than what is already asked for: a
        wake-up that comes too early finds nothing and asks again)."""
        nxt: float | None = None
        ops = self.operators
        for k in self._clocked:
            t = ops[k].next_processing_time()
            if t is not None and (nxt is None or t < nxt):
                nxt = t
        if nxt is None or (self._wake_at is not None and self._wake_at <= nxt):
            return
        if self._wake_handle is not None:
            self._wake_handle.cancel()
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._wake_at = nxt
        self._wake_handle = self._clock.call_at(nxt, self._on_clock)

    def _on_clock(self) -> None:
        # Any thread (a test advancing a ManualClock): hand over to the loop.
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._clock_woke)

    def _clock_woke(self) -> None:
        self._wake_at = None
        self._wake_handle = None
        self._timers_due = True
        self._wake()

    async def _fire_processing_time(self) -> None:
        self._timers_due = False
        now = self._clock.now()
        ops = self.operators
        for k in self._clocked:
            out = ops[k].on_processing_time(now)
            if out:
                ops[k].records_out += len(out)
                res, stamps = self._run_chain(out, k + 1, getattr(out, "timestamps", None))
                await self._emit(res, None, [], stamps)
        await self._generator_status()
        self._schedule_clock()

    def _stop_clock(self) -> None:
        if self._wake_handle is not None:
            self._wake_handle.cancel()
            self._wake_handle = None
        self._wake_at = None
