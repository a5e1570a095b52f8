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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from eddyflow.checks import non_negative
from eddyflow.windowing.windows import TimeWindow

__all__ = [
    "TimerAction",
    "check_allowed_lateness",
    "cleanup_time",
    "fire_time",
    "fires_on_element",
    "is_window_late",
    "on_timer",
    "route_record",
    "should_fire",
    "timers_to_register",
]


def check_allowed_lateness(seconds: float) -> float:
    """``allowed_lateness(seconds)``: a finite float >= 0."""
    return non_negative("allowed_lateness", "seconds", seconds)


def fire_time(window: TimeWindow) -> float:
    """The time (watermark or clock) at which ``window`` fires: its end."""
    return window.end


def cleanup_time(window: TimeWindow, allowed_lateness: float, *,
                 event_time: bool = True) -> float:
    """The time at which ``window``'s state is dropped: ``end + allowed
    lateness`` in event time, ``end`` in processing time."""
    return window.end + allowed_lateness if event_time else window.end


def should_fire(window: TimeWindow, time: float) -> bool:
    """Whether ``window`` is complete at ``time``: ``time >= end``."""
    return time >= window.end


def is_window_late(window: TimeWindow, watermark: float, allowed_lateness: float) -> bool:
    """Whether ``window`` takes no more records: its cleanup time has come."""
    return watermark >= window.end + allowed_lateness


def fires_on_element(window: TimeWindow, time: float) -> bool:
    """Whether adding a record to a (not late) ``window`` fires it at once:
    it is already complete, so the record is late within the allowed
    lateness (or the window's first record arrived that late)."""
    return time >= window.end


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
    kept = [w for w in windows if not watermark >= w.end + allowed_lateness]
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
    return TimerAction(
        fire=timer_time == fire_time(window),
        purge=timer_time >= cleanup_time(window, allowed_lateness, event_time=event_time),
    )
