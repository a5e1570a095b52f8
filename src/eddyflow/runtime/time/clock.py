"""Processing time: where a job's clock comes from.

Processing-time timers (and idleness timeouts) read ``clock.now()`` and ask
``clock.call_at(when, callback)`` to be woken, so a task sleeps until its
next timer instead of polling. The default is the wall clock on the event
loop; tests use :class:`ManualClock` (``ef.testing.ManualClock``) and drive
time with ``advance``, never with sleeps. ``env.set_clock(clock)`` sets it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["WALL_CLOCK", "Cancellable", "Clock", "ManualClock", "WallClock"]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Processing time, in seconds."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        """Call ``callback`` (once, soon, from any thread) when ``now()`` reaches ``when``."""
        ...


class WallClock:
    """``time.time()``; wake-ups are the running event loop's timers."""

    def now(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - time.time()), callback)

    def __repr__(self) -> str:
        return "WallClock()"


WALL_CLOCK = WallClock()


class _Call:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told: ``advance(seconds)`` (or
    ``set(t)``) runs every callback whose time has come, in time order."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._calls: list[tuple[float, int, _Call]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        call = _Call(callback)
        with self._lock:
            heapq.heappush(self._calls, (when, next(self._seq), call))
        if when <= self._now:
            self._run_due()
        return call

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance({seconds})")
        self.set(self._now + seconds)

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"a clock does not go back: from {self._now} to {t}")
        self._now = float(t)
        self._run_due()

    def _run_due(self) -> None:
        while True:
            with self._lock:
                if not self._calls or self._calls[0][0] > self._now:
                    return
                _, _, call = heapq.heappop(self._calls)
            if not call.cancelled:
                call.callback()

    def __deepcopy__(self, memo: dict[int, object]) -> ManualClock:
        return self  # one clock for the whole job, whatever copies functions

    def __repr__(self) -> str:
        return f"ManualClock(now={self._now})"
