"""The joins: the window join (``a.join(b).where(ka).equal_to(kb)
.window(assigner).apply(fn)``) and the interval join
(``a.key_by(ka).interval_join(b.key_by(kb)).between(lower, upper).apply(fn)``).

The window join is the window operator itself over the tagged union of
both inputs (``two_input.py``), keyed by each side's key, with a
``ProcessWindowFunction`` that pairs the window's records of one side with
those of the other (``WindowJoinFunction``): windows, their triggers,
merging sessions, state and replay are the window operator's.

The interval join keeps each key's records of both sides in two buffers
(map state ``left`` and ``right``: timestamp -> the records at that
timestamp). A record of ``a`` at ``t`` pairs with the buffered records of
``b`` with timestamps in ``[t + lower, t + upper]``, and one of ``b`` at
``t`` with those of ``a`` in ``[t - upper, t - lower]``; each pair is
``fn(a_record, b_record)``, stamped with the later of the two timestamps
(as Flink). A buffered record leaves when the watermark has passed the last
timestamp it can still pair with (an event-time timer of its key); a
record behind the watermark is late: it pairs with nothing, and goes to
the side output if one was asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from eddyflow.functions import RuntimeContext
from eddyflow.runtime.exchange.events import timestamped
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.runtime.operators.keyed import KeyedOperator, KeyedSpec
from eddyflow.runtime.operators.side_outputs import SideRecord
from eddyflow.runtime.operators.two_input import SideKeys, TwoInputKeyedOperator, after
from eddyflow.state.handles import MapState
from eddyflow.windowing.functions import ProcessWindowFunction
from eddyflow.windowing.windows import TimeWindow

__all__ = ["IntervalJoinSpec", "WindowJoinFunction"]


class WindowJoinFunction(ProcessWindowFunction):
    """The window function of a window join: ``fn(left, right)`` for every
    pair of a window's left and right records (an inner join: a window with
    records of one side only emits nothing), left records in arrival order,
    and for each the right ones in arrival order."""

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def process(self, key: Any, window: TimeWindow, elements: list[Any]) -> Iterator[Any]:
        left = [r for side, r in elements if not side]
        if not left:
            return
        right = [r for side, r in elements if side]
        fn = self.fn
        for a in left:
            for b in right:
                yield fn(a, b)


class _IntervalJoin(TwoInputKeyedOperator):
    def __init__(self, ctx: OperatorContext, key_fn: SideKeys, lower: float, upper: float,
                 fn: Callable[[Any, Any], Any], late_tag: str | None) -> None:
        super().__init__(ctx, key_fn)
        self.lower = lower
        self.upper = upper
        self.fn = fn
        self.late_tag = late_tag
        self.buffers: tuple[MapState[float, tuple[Any, ...]], ...] = ()

    def open_function(self, rctx: RuntimeContext) -> None:
        assert self.backend is not None
        self.buffers = (MapState(self.backend, "left"), MapState(self.backend, "right"))

    def handle(self, side: int, record: Any, ctx: RuntimeContext) -> Iterable[Any] | None:
        t = ctx.timestamp
        if t is None:
            raise ValueError(
                f"operator '{self.uid}': an interval join needs event time; the record "
                f"{record!r:.100} has no timestamp (assign_timestamps_and_watermarks before it)")
        if t < self.watermark:
            # Late: everything it could pair with may be gone already.
            return [SideRecord(self.late_tag, record)] if self.late_tag is not None else None
        mine, theirs = self.buffers[side], self.buffers[1 - side]
        # The other side's timestamps this record pairs with.
        if side:
            lo, hi, last = t - self.upper, t - self.lower, t - self.lower
        else:
            lo, hi, last = t + self.lower, t + self.upper, t + self.upper
        fn = self.fn
        out: list[Any] = []
        stamps: list[float] = []
        for ts, records in sorted(theirs.items()):
            if lo <= ts <= hi:
                out.extend([fn(o, record) if side else fn(record, o) for o in records])
                # A pair carries the later of its two timestamps (Flink's
                # rule): the same whichever record came first.
                stamps.extend([max(t, ts)] * len(records))
        held = mine.get(t)
        mine.put(t, (record,) if held is None else (*held, record))
        # Kept until the watermark passes ``last``: a record of the other
        # side at ``last`` itself is not late, and may still come.
        assert self.timers is not None
        self.timers.register_event_time_timer(after(last))
        return timestamped(out, stamps) if out else None

    def timer(self, timestamp: float, ctx: RuntimeContext) -> Iterable[Any] | None:
        # Drop what can pair with nothing more once the watermark reached
        # ``timestamp``: left records with t + upper < timestamp, right ones
        # with t - lower < timestamp.
        for buffer, reach in ((self.buffers[0], self.upper), (self.buffers[1], -self.lower)):
            for ts in [ts for ts, _ in buffer.items() if ts + reach < timestamp]:
                buffer.remove(ts)
        return None


@dataclass(frozen=True)
class IntervalJoinSpec(KeyedSpec):
    """``interval_join(...).between(lower, upper).apply(fn)``; ``late_tag``:
    the side output of late records (``None``: dropped)."""

    lower: float
    upper: float
    fn: Callable[[Any, Any], Any]
    late_tag: str | None = None

    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        assert isinstance(self.key_fn, SideKeys)
        return _IntervalJoin(ctx, self.key_fn, self.lower, self.upper, self.fn, self.late_tag)
