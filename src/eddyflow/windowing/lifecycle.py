"""When windows fire, re-fire, take late records and are dropped: the
window operator's decisions as pure functions of a window, a time and the
allowed lateness, so that the operator only stores state and timers.

``time`` is the watermark for event-time windows and the processing-time
clock for processing-time windows. With ``W`` that time and ``L`` the
allowed lateness (event time only; processing time has none):

* **fire**: a window ``[start, end)`` fires when ``W >= end`` (fire time
  ``end``; why ``end`` and not Flink's ``end - 1``: see
  ``eddyflow.windowing.watermarks``). Firing emits the window's result and
  keeps its state (Flink's ``FIRE``, not ``FIRE_AND_PURGE``).
* **cleanup**: the window's state (accumulator, timers) is dropped when
  ``W >= end + L`` (cleanup time; ``end`` in processing time). With
  ``L = 0`` fire and cleanup fall together: fire first, then drop.
* **late window**: a window whose cleanup time has come (``W >= end + L``)
  takes no more records. A record goes to every window of its that is not
  late; one that gets into none of its windows goes to the late side
  output (Flink's ``isSkippedElement && isElementLate``). For session
  windows, "its window" is the window after merging: a late record that
  extends a live session is not late.
* **re-fire**: a record added to a window that already fired (``W >= end``,
  still before cleanup) fires it again at once, with the updated result.
  A merged session window whose end is still ahead fires when ``W``
  reaches its new end.

The operator decides for whole batches at one time (its watermark or clock
before the batch): ``horizon`` turns that time into the two window ends
the rules compare with, once, and the functions below are those
comparisons. The operator's fast paths compare a window's end with a
batch's ``Horizon`` in their loops rather than call a function per record
(``benchmarks/windows.py``), so the rule is still written only here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from eddyflow.checks import non_negative
from eddyflow.windowing.windows import TimeWindow

__all__ = [
    "Horizon",
    "TimerAction",
    "check_allowed_lateness",
    "cleanup_at",
    "cleanup_time",
    "effective_lateness",
    "fire_time",
    "fires_on_element",
    "horizon",
    "is_window_late",
    "on_timer",
    "route_record",
    "should_fire",
    "timers_to_register",
]


def check_allowed_lateness(seconds: float) -> float:
    """``allowed_lateness(seconds)``: a finite float >= 0."""
    return non_negative("allowed_lateness", "seconds", seconds)


def effective_lateness(allowed_lateness: float, *, event_time: bool = True) -> float:
    """The lateness the rules apply: ``allowed_lateness`` in event time, none
    in processing time (a record always lands in the window of "now")."""
    return allowed_lateness if event_time else 0.0


class Horizon(NamedTuple):
    """The rules at one time, as two window ends: a window whose ``end <=
    fired`` is complete (it fires; a record added to it fires it again),
    one whose ``end <= late`` is late (takes no records; its state goes).
    Built by ``horizon``."""

    fired: float
    late: float


def horizon(time: float, allowed_lateness: float) -> Horizon:
    """The ``Horizon`` at ``time`` (watermark or clock) with ``allowed_lateness``.

    A window is complete when ``time >= end``: ``fired`` is ``time``. It is
    late when ``time >= end + allowed_lateness``. Compared as ``end <= late``,
    ``late`` is the largest float ``end`` for which the sum (rounded, as
    the operator's cleanup timers are) reaches ``time``: rounding is
    monotonic, so the ends that pass form exactly the floats up to it, and
    comparing with it decides as the sum would, for every end.
    """
    if not allowed_lateness:
        return Horizon(time, time)  # end + 0 is end
    return Horizon(time, _latest_late_end(time, allowed_lateness))


def _latest_late_end(time: float, lateness: float) -> float:
    """The largest float ``e`` with ``e + lateness <= time`` (rounded sum)."""
    late = time - lateness
    if not math.isfinite(late):
        return late  # +-inf: every end is late, or none
    above = math.nextafter(late, math.inf)
    if late + lateness <= time < above + lateness:
        return late  # the difference was exact, or rounded the right way
    # Rounding put ``late`` a few units of the sum away: bracket the answer
    # (``lo`` passes, ``hi`` does not) and bisect. Stepping one float at a
    # time would not end when ``late`` is far smaller than ``lateness``.
    step = math.ulp(time) + math.ulp(lateness) + math.ulp(late)
    lo = hi = late
    while lo + lateness > time:
        lo -= step
        step *= 2
    step = math.ulp(time) + math.ulp(lateness) + math.ulp(late)
    while hi + lateness <= time:
        hi += step
        step *= 2
    while True:
        mid = lo + (hi - lo) / 2
        if not lo < mid < hi:
            break
        if mid + lateness <= time:
            lo = mid
        else:
            hi = mid
    while (above := math.nextafter(lo, math.inf)) < hi and above + lateness <= time:
        lo = above
    return lo


def fire_time(window: TimeWindow) -> float:
    """The time (watermark or clock) at which ``window`` fires: its end."""
    return window.end


def cleanup_at(end: float, allowed_lateness: float) -> float:
    """The cleanup time of a window ending at ``end``, given the lateness
    ``effective_lateness`` gives: ``end + allowed_lateness``."""
    return end + allowed_lateness


def cleanup_time(window: TimeWindow, allowed_lateness: float, *,
                 event_time: bool = True) -> float:
    """The time at which ``window``'s state is dropped: ``end + allowed
    lateness`` in event time, ``end`` in processing time."""
    return cleanup_at(window.end, effective_lateness(allowed_lateness, event_time=event_time))


def should_fire(window: TimeWindow, time: float) -> bool:
    """Whether ``window`` is complete at ``time``: ``time >= end``."""
    return window.end <= horizon(time, 0.0).fired


def is_window_late(window: TimeWindow, watermark: float, allowed_lateness: float) -> bool:
    """Whether ``window`` takes no more records: its cleanup time has come
    (``watermark >= end + allowed_lateness``)."""
    return window.end <= horizon(watermark, allowed_lateness).late


def fires_on_element(window: TimeWindow, time: float) -> bool:
    """Whether adding a record to a (not late) ``window`` fires it at once:
    it is already complete, so the record is late within the allowed
    lateness (or the window's first record arrived that late)."""
    return should_fire(window, time)


def route_record(timestamp: float, windows: Sequence[TimeWindow], watermark: float,
                 allowed_lateness: float) -> tuple[list[TimeWindow], bool]:
    """``(windows that take the record, goes to the late side output)``.

    ``windows``: what the assigner gave (sessions: the single window after
    merging). The record is late when no window takes it and it was
    assigned some (then ``t < end`` for each and ``end + L <= W``, so it is
    late by any definition; testing that rather than ``t + L < W`` keeps
    float rounding of the sums from letting one slip through) or, assigned
    none (a sliding gap), when ``t + L < W`` — as Flink, which side-outputs
    a skipped element only if it is late.
    """
    late = horizon(watermark, allowed_lateness).late
    kept = [w for w in windows if w.end > late]
    if kept:
        return kept, False
    return kept, bool(windows) or timestamp + allowed_lateness < watermark


def timers_to_register(window: TimeWindow, time: float, allowed_lateness: float, *,
                       event_time: bool = True) -> list[float]:
    """The timers ``window`` needs at ``time`` (after taking a record, or
    after a merge): its fire and cleanup times that are still ahead, once
    each. A fire time already reached is not registered: the record fires
    the window at once (``fires_on_element``), and a timer at that time
    would fire it a second time."""
    fire = fire_time(window)
    cleanup = cleanup_time(window, allowed_lateness, event_time=event_time)
    times = [fire] if fire > time else []
    if cleanup > time and cleanup != fire:
        times.append(cleanup)
    return times


class TimerAction(NamedTuple):
    """What a window's timer at ``timer_time`` does: ``fire`` (emit the
    result) and then ``purge`` (drop the window's state)."""

    fire: bool
    purge: bool


def on_timer(window: TimeWindow, timer_time: float, allowed_lateness: float, *,
             event_time: bool = True) -> TimerAction:
    """The action of a timer registered by ``timers_to_register`` for
    ``window``, firing at ``timer_time`` (its registered time, not the
    watermark that made it fire: a jump of the watermark to ``+inf`` runs
    the fire timer and then the cleanup timer, in time order)."""
    at = horizon(timer_time, effective_lateness(allowed_lateness, event_time=event_time))
    return TimerAction(fire=fire_time(window) == at.fired, purge=window.end <= at.late)
