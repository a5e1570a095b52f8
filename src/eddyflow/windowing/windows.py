"""Windows and window assigners: which windows a record belongs to.

``TimeWindow(start, end)`` is a half-open interval of float seconds. An
assigner maps a timestamp (event time, or the processing time at which the
record is handled) to its windows; it holds no state, so one object serves
every key and subtask. Window boundaries are computed from an integer index
(``offset + k * size``), never by subtracting a remainder from the
timestamp: every record of a window then computes bit-identical ``start`` and
``end`` floats, so windows compare and hash equal across records, keys,
subtasks and restarts.

Also here: ``WindowResult``, what a window emits, and ``OutputTag``, the name
of a side output (late data).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, NamedTuple

from eddyflow.checks import finite, positive

__all__ = [
    "EventTimeSessionWindows",
    "OutputTag",
    "SlidingEventTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "TumblingWindows",
    "WindowAssigner",
    "WindowResult",
    "window_index",
]


@dataclass(frozen=True, order=True, slots=True)
class TimeWindow:
    """The interval ``[start, end)`` of float seconds: ``start`` inclusive,
    ``end`` exclusive. Frozen, hashable and ordered by ``(start, end)``."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if not self.start < self.end:
            raise ValueError(f"TimeWindow: start must be < end, got [{self.start}, {self.end})")

    @property
    def max_timestamp(self) -> float:
        """The largest timestamp inside the window: the float just below
        ``end`` (Flink's ``maxTimestamp``; the window fires at ``end``, see
        ``eddyflow.windowing.watermarks``)."""
        return math.nextafter(self.end, -math.inf)

    def contains(self, timestamp: float) -> bool:
        return self.start <= timestamp < self.end

    def intersects(self, other: TimeWindow) -> bool:
        """Whether the two windows overlap *or touch* (Flink's rule, which is
        what session merging needs: with gap 5, records at 0 and 5 give
        ``[0, 5)`` and ``[5, 10)``, one session)."""
        return self.start <= other.end and other.start <= self.end

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window containing both."""
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))

    def __repr__(self) -> str:
        return f"TimeWindow({self.start!r}, {self.end!r})"


class WindowResult(NamedTuple):
    """What a window emits for ``reduce``/``aggregate``/``sum``/``count``.

    A NamedTuple, so it pickles by value and ``json.dumps`` (what
    ``FileSink`` writes) turns it into the list ``[key, start, end, value]``
    (a tuple key becomes a nested list); read it back with
    ``WindowResult(*json.loads(line))``.
    """

    key: Any
    start: float
    end: float
    value: Any


@dataclass(frozen=True)
class OutputTag:
    """The name of a side output: ``ef.OutputTag("late")``. Two tags with the
    same name are the same side output (equal and hashing alike), so the tag
    given to ``side_output_late_data`` and the one given to
    ``get_side_output`` need not be the same object."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"OutputTag: name must be a non-empty string, got {self.name!r}")

    def __repr__(self) -> str:
        return f"OutputTag({self.name!r})"


class WindowAssigner(ABC):
    """Maps a timestamp to the windows a record belongs to.

    ``is_event_time``: windows fire on the watermark (else on the
    processing-time clock, and ``assign`` is given the current processing
    time). ``is_merging``: windows of a key merge when they intersect
    (sessions; see ``eddyflow.windowing.merging``).
    """

    is_event_time: bool = True
    is_merging: bool = False

    @abstractmethod
    def assign(self, timestamp: float) -> list[TimeWindow]:
        """The windows for a record at ``timestamp``, ordered by start."""


def _check_offset(owner: str, offset: Any, period: float, period_name: str) -> float:
    value = finite(owner, "offset", offset)
    # As Flink: an offset is a shift within one period; more is a mistake
    # (a whole number of periods more would give the same windows).
    if not -period < value < period:
        raise ValueError(f"{owner}: offset must lie strictly between -{period_name} and "
                         f"{period_name} ({period}), got {offset!r}")
    return value


def window_index(timestamp: float, offset: float, period: float) -> int:
    """The k with ``offset + k*period <= timestamp < offset + (k+1)*period``,
    computed on the boundaries themselves (division alone can be one off
    in floating point: 0.3 / 0.1 is 2.9999999999999996)."""
    k = math.floor((timestamp - offset) / period)
    if offset + k * period > timestamp:
        k -= 1
    elif offset + (k + 1) * period <= timestamp:
        k += 1
    return k


@dataclass(frozen=True)
class TumblingWindows(WindowAssigner):
    """Fixed, non-overlapping windows ``[offset + k*size, offset + (k+1)*size)``:
    what the event-time and processing-time tumbling assigners share (the
    window operator's tumbling fast path takes either)."""

    size: float
    offset: float = 0.0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        object.__setattr__(self, "size", positive(owner, "size", self.size))
        object.__setattr__(self, "offset", _check_offset(owner, self.offset, self.size, "size"))

    def assign(self, timestamp: float) -> list[TimeWindow]:
        size, offset = self.size, self.offset
        k = window_index(timestamp, offset, size)
        return [TimeWindow(offset + k * size, offset + (k + 1) * size)]


@dataclass(frozen=True)
class TumblingEventTimeWindows(TumblingWindows):
    """Fixed, non-overlapping event-time windows ``[offset + k*size,
    offset + (k+1)*size)``, fired by the watermark."""


@dataclass(frozen=True)
class TumblingProcessingTimeWindows(TumblingWindows):
    """Tumbling windows over processing time: ``assign`` is given the clock's
    time when the record is processed, and windows fire on that clock. There
    is no lateness in processing time: a record always lands in the window
    of "now", which has not fired yet."""

    is_event_time = False


@dataclass(frozen=True)
class SlidingEventTimeWindows(WindowAssigner):
    """Windows of ``size`` starting every ``slide``: ``[offset + k*slide,
    offset + k*slide + size)``; a record belongs to ``ceil(size / slide)``
    of them (fewer at some timestamps when ``slide`` does not divide
    ``size``; none are missed when ``slide > size``: records between
    windows then belong to none)."""

    size: float
    slide: float
    offset: float = 0.0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        object.__setattr__(self, "size", positive(owner, "size", self.size))
        object.__setattr__(self, "slide", positive(owner, "slide", self.slide))
        object.__setattr__(self, "offset",
                           _check_offset(owner, self.offset, self.slide, "slide"))

    def assign(self, timestamp: float) -> list[TimeWindow]:
        size, slide, offset = self.size, self.slide, self.offset
        k = window_index(timestamp, offset, slide)   # the last window starting at or before t
        windows: list[TimeWindow] = []
        while True:
            start = offset + k * slide
            end = start + size
            if end <= timestamp:
                break
            windows.append(TimeWindow(start, end))
            k -= 1
        windows.reverse()
        return windows


@dataclass(frozen=True)
class EventTimeSessionWindows(WindowAssigner):
    """Sessions: a record at ``t`` opens ``[t, t + gap)``; windows of a key
    that intersect (overlap or touch) merge, so a session ends after ``gap``
    seconds without records."""

    gap: float
    is_merging = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "gap", positive(type(self).__name__, "gap", self.gap))

    def assign(self, timestamp: float) -> list[TimeWindow]:
        return [TimeWindow(timestamp, timestamp + self.gap)]
