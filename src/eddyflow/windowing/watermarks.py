"""Watermark strategies: how a source split turns the timestamps of its
records into a watermark. The runtime owns one generator per parallel
source instance (per split) and carries the watermark in band; this module
only defines the arithmetic, so the rule lives in one place.

The rule (eddyflow's event-time contract, written down once)
--------------------------------------------------------------

* Timestamps and watermarks are float seconds. A watermark ``W`` is a
  promise: **no record still to come has a timestamp below W**. A record with
  timestamp ``t`` is *late* iff ``t < W``; ``t == W`` is on time.
* The bounded-out-of-orderness generator keeps ``max_ts``, the largest
  timestamp it has seen, and its watermark is ``W = max_ts - max_delay``
  (``-inf`` before the first record). A record at most ``max_delay`` behind
  the largest timestamp seen is therefore on time, *inclusive*: with
  ``max_delay = 0`` (``for_monotonous_timestamps``) a record whose timestamp
  equals the largest seen so far is on time, as many records of a
  monotonous stream share a timestamp.
* A window ``[start, end)`` is complete, and fires, when ``W >= end``: then no
  record below ``end`` can come, so nothing more can fall into it. An
  event-time timer registered for ``t`` likewise fires when ``W >= t``, so
  the window operator registers its timer at ``window.end``.

Why not Flink's ``t <= W``: Flink's generator emits ``max_ts - delay - 1``
(one millisecond) so that a record equal to the maximum stays on time, and
fires at ``window.maxTimestamp() = end - 1``. With float seconds there is no
"one unit" to subtract, so eddyflow moves the boundary instead: the strict
``t < W`` with ``W = max_ts - max_delay`` and firing at ``end`` is the same
rule with the epsilon taken out (``TimeWindow.max_timestamp`` still names
the last float inside a window, for readers who think in Flink's terms).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from eddyflow.checks import non_negative, positive

__all__ = ["BoundedOutOfOrdernessGenerator", "WatermarkStrategy", "is_late"]

_NEG_INF = -math.inf
_POS_INF = math.inf


def is_late(timestamp: float, watermark: float) -> bool:
    """Whether a record with ``timestamp`` is late under ``watermark``
    (``timestamp < watermark``; see the module docstring)."""
    return timestamp < watermark


class BoundedOutOfOrdernessGenerator:
    """The watermark of one parallel instance (one source split): the
    largest timestamp seen minus ``max_delay``. Never goes back.

    The runtime calls ``on_event`` for every record of the split and reads
    ``current_watermark`` when it emits watermarks (after a batch, say);
    both are O(1) and allocate nothing.
    """

    __slots__ = ("_max_ts", "max_delay")

    def __init__(self, max_delay: float) -> None:
        self.max_delay = max_delay
        self._max_ts = _NEG_INF

    def on_event(self, timestamp: float) -> None:
        """Take in one record's timestamp. A timestamp that is not a finite
        number is refused here, at the record, rather than turning the
        watermark into NaN (which compares false with everything, so no
        window would ever fire) or +inf (which would fire all of them)."""
        if not _NEG_INF < timestamp < _POS_INF:
            raise ValueError(f"record timestamp must be a finite number, got {timestamp!r}")
        if timestamp > self._max_ts:
            self._max_ts = timestamp

    def on_events(self, timestamps: list[float]) -> None:
        """``on_event`` for each of a batch's timestamps, at C speed (the
        runtime's path: a method call per record was a tenth of a session
        window job's time). ``fsum`` is finite only if every timestamp is a
        finite number; otherwise, or if it cannot tell (a type that does not
        add, an overflow), the records go one by one and the bad one is
        named."""
        if not timestamps:
            return
        try:
            finite = _NEG_INF < math.fsum(timestamps) < _POS_INF
        except (TypeError, ValueError, OverflowError):
            finite = False
        if not finite:
            for t in timestamps:
                self.on_event(t)
            return
        top = max(timestamps)
        if top > self._max_ts:
            self._max_ts = top

    def current_watermark(self) -> float:
        """``max timestamp seen - max_delay``; ``-inf`` before any record."""
        # -inf - max_delay is -inf, so no special case for "nothing seen".
        return self._max_ts - self.max_delay

    @property
    def max_timestamp(self) -> float:
        """The largest timestamp seen so far (``-inf`` before any record)."""
        return self._max_ts

    def __repr__(self) -> str:
        return (f"BoundedOutOfOrdernessGenerator(max_delay={self.max_delay!r}, "
                f"watermark={self.current_watermark()!r})")


@dataclass(frozen=True)
class WatermarkStrategy:
    """How records get timestamps and a split gets watermarks.

    Immutable: ``with_idleness`` returns a new strategy, so one strategy
    object can be shared by several streams. Build one with
    ``bounded_out_of_orderness`` or ``for_monotonous_timestamps``.

    The runtime reads ``timestamp`` (the extractor, called once per record),
    ``max_delay`` and ``idleness`` (``None``: a silent split holds the
    watermark back forever, as in Flink without ``withIdleness``), and calls
    ``create_generator()`` once per parallel instance.
    """

    timestamp: Callable[[Any], float]
    max_delay: float = 0.0
    idleness: float | None = None

    def __post_init__(self) -> None:
        if not callable(self.timestamp):
            raise TypeError(
                f"WatermarkStrategy: timestamp must be callable (record -> seconds), "
                f"got {self.timestamp!r}")
        # Frozen: normalize ints to floats through object.__setattr__.
        object.__setattr__(self, "max_delay",
                           non_negative("WatermarkStrategy", "max_delay", self.max_delay))
        if self.idleness is not None:
            object.__setattr__(self, "idleness",
                               positive("WatermarkStrategy", "idleness", self.idleness))

    @classmethod
    def bounded_out_of_orderness(cls, max_delay: float,
                                 timestamp: Callable[[Any], float]) -> WatermarkStrategy:
        """Records may arrive up to ``max_delay`` seconds behind the largest
        timestamp seen and still be on time."""
        return cls(timestamp=timestamp, max_delay=max_delay)

    @classmethod
    def for_monotonous_timestamps(cls, timestamp: Callable[[Any], float]) -> WatermarkStrategy:
        """Timestamps never decrease within a split: ``max_delay = 0``."""
        return cls(timestamp=timestamp, max_delay=0.0)

    def with_idleness(self, seconds: float) -> WatermarkStrategy:
        """A copy in which a split that has produced no record for
        ``seconds`` (processing time) is idle: it stops holding back the
        watermark of the tasks it feeds until it produces again."""
        return replace(self, idleness=seconds)

    def create_generator(self) -> BoundedOutOfOrdernessGenerator:
        """A fresh generator for one parallel instance; watermark ``-inf``."""
        return BoundedOutOfOrdernessGenerator(self.max_delay)

    def idle_at(self, last_record_at: float) -> float | None:
        """The processing time at which a split whose last record came at
        ``last_record_at`` turns idle (``None`` without ``idleness``): the
        time the runtime schedules its check for."""
        return None if self.idleness is None else last_record_at + self.idleness

    def is_idle(self, last_record_at: float, now: float) -> bool:
        """Whether a split whose last record came at processing time
        ``last_record_at`` is idle at ``now`` (never without ``idleness``).
        Decided on ``idle_at``'s time, so that a check scheduled for that
        time finds the split idle, whatever the rounding of the sum."""
        at = self.idle_at(last_record_at)
        return at is not None and now >= at
