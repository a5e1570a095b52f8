"""Watermark generation: the runtime side of ``assign_timestamps_and_watermarks``.

The operator here (``_AssignTimestamps``) stamps each record with the
strategy's timestamp and feeds it to the strategy's generator; the task emits
the generator's watermark (``runtime/eventtime.py``). Chained right after a
source at the same parallelism, one instance sees exactly one source split
group (an ``ef.Log`` partition group, a text-file split): watermarks are then
per split, as API.md says; elsewhere, per subtask of the operator.

What the runtime needs of a strategy (``ef.WatermarkStrategy`` provides it;
:class:`BoundedOutOfOrderness` here is the minimal one the runtime's tests
use): ``create_timestamp_assigner()`` -> a callable ``record -> float``
(seconds), ``create_watermark_generator()`` -> a :class:`WatermarkGenerator`,
and ``idleness``: seconds without a record after which the split is idle,
or ``None``.

Lateness: a record with timestamp ``t`` is late for an operator iff ``t <=``
its current watermark (Flink's rule; with float seconds there is no "minus
one millisecond": under bounded out-of-orderness the watermark is ``max
timestamp seen - max_delay``, so a record exactly ``max_delay`` behind the
newest is late, one less than that behind is not).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from eddyflow.runtime.operators import Operator, OperatorContext

__all__ = [
    "AssignTimestampsSpec",
    "BoundedOutOfOrderness",
    "BoundedOutOfOrdernessGenerator",
    "WatermarkGenerator",
    "WatermarkStrategyLike",
]


class WatermarkGenerator(Protocol):
    def on_event(self, record: Any, timestamp: float) -> None:
        """A record with ``timestamp`` went by."""
        ...

    def current_watermark(self) -> float:
        """The watermark now (``-inf`` before any); the runtime only ever
        moves its watermark forward, whatever this returns."""
        ...


class WatermarkStrategyLike(Protocol):
    idleness: float | None

    def create_timestamp_assigner(self) -> Callable[[Any], float]: ...

    def create_watermark_generator(self) -> WatermarkGenerator: ...


class BoundedOutOfOrdernessGenerator:
    """``max timestamp seen - max_delay``."""

    __slots__ = ("max_delay", "max_seen")

    def __init__(self, max_delay: float) -> None:
        self.max_delay = max_delay
        self.max_seen = -math.inf

    def on_event(self, record: Any, timestamp: float) -> None:
        if timestamp > self.max_seen:
            self.max_seen = timestamp

    def current_watermark(self) -> float:
        return self.max_seen - self.max_delay


@dataclass(frozen=True)
class BoundedOutOfOrderness:
    """A minimal strategy for the runtime's own tests (the public one is
    ``ef.WatermarkStrategy.bounded_out_of_orderness``)."""

    max_delay: float
    timestamp: Callable[[Any], float]
    idleness: float | None = None

    def create_timestamp_assigner(self) -> Callable[[Any], float]:
        return self.timestamp

    def create_watermark_generator(self) -> WatermarkGenerator:
        return BoundedOutOfOrdernessGenerator(self.max_delay)

    def with_idleness(self, seconds: float) -> BoundedOutOfOrderness:
        return BoundedOutOfOrderness(self.max_delay, self.timestamp, seconds)


class _AssignTimestamps(Operator):
    """Stamps records; its generator's watermark replaces upstream's."""

    assigns_timestamps = True
    one_to_one = True

    def __init__(self, ctx: OperatorContext, strategy: WatermarkStrategyLike) -> None:
        super().__init__(ctx)
        self.strategy = strategy
        self.extract = strategy.create_timestamp_assigner()
        self.generator = strategy.create_watermark_generator()
        self.idleness = strategy.idleness
        self.uses_clock = self.idleness is not None
        self.last_record = ctx.clock.now()
        self.idle = False
        #: The output's idleness changed and the task has not said so yet.
        self.status_changed = False

    def process(self, batch: list[Any]) -> list[Any]:
        return batch  # without process_ts nothing is stamped: not reached

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        extract = self.extract
        stamps = list(map(extract, batch))
        on_event = self.generator.on_event
        for r, t in zip(batch, stamps, strict=True):
            on_event(r, t)
        if batch and self.idleness is not None:
            self.last_record = self.ctx.clock.now()
            if self.idle:
                self.idle = False
                self.status_changed = True
        return batch, stamps

    def generated(self) -> float:
        return self.generator.current_watermark()

    def next_processing_time(self) -> float | None:
        if self.idleness is None or self.idle:
            return None
        return self.last_record + self.idleness

    def on_processing_time(self, now: float) -> list[Any]:
        if self.idleness is not None and not self.idle and now - self.last_record >= self.idleness:
            self.idle = True
            self.status_changed = True
        return []


@dataclass(frozen=True)
class AssignTimestampsSpec:
    strategy: Any  # WatermarkStrategyLike

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _AssignTimestamps(ctx, self.strategy)
