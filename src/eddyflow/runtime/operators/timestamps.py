"""Watermark generation: the runtime side of ``assign_timestamps_and_watermarks``.

The operator here (``_AssignTimestamps``) stamps each record with the
strategy's timestamp and feeds it to the strategy's generator; the task emits
the generator's watermark (``runtime/time/valve.py``). Chained right after a
source at the same parallelism, one instance sees exactly one source split
group (an ``ef.Log`` partition group, a text-file split): watermarks are then
per split (docs/concepts/event-time.md); elsewhere, per subtask of the operator.

The strategy is an ``ef.WatermarkStrategy`` (``windowing/watermarks.py``):
the runtime reads its ``timestamp`` extractor (``record -> float`` seconds)
and asks ``create_generator()`` for one generator per instance; when a
split turns idle is the strategy's ``idle_at``/``is_idle``. Lateness,
firing, idleness and the watermark arithmetic are defined once,
there: a record with timestamp ``t`` is late iff ``t <`` the watermark; an
event-time timer for ``t`` fires once the watermark is ``>= t``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eddyflow.runtime.operators.base import Operator, OperatorContext
from eddyflow.windowing.watermarks import WatermarkStrategy

__all__ = ["AssignTimestampsSpec"]


class _AssignTimestamps(Operator):
    """Stamps records; its generator's watermark replaces upstream's."""

    assigns_timestamps = True
    one_to_one = True

    def __init__(self, ctx: OperatorContext, strategy: WatermarkStrategy) -> None:
        super().__init__(ctx)
        self.strategy = strategy
        self.extract = strategy.timestamp
        self.generator = strategy.create_generator()
        self.uses_clock = strategy.idleness is not None
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
        on_events = getattr(self.generator, "on_events", None)
        if on_events is not None:
            on_events(stamps)
        else:  # a generator of the user's own
            on_event = self.generator.on_event
            for t in stamps:
                on_event(t)
        if batch and self.uses_clock:
            self.last_record = self.ctx.clock.now()
            if self.idle:
                self.idle = False
                self.status_changed = True
        return batch, stamps

    def generated(self) -> float:
        """The generator's watermark."""
        return self.generator.current_watermark()

    def next_processing_time(self) -> float | None:
        return None if self.idle else self.strategy.idle_at(self.last_record)

    def on_processing_time(self, now: float) -> list[Any]:
        if not self.idle and self.strategy.is_idle(self.last_record, now):
            self.idle = True
            self.status_changed = True
        return []


@dataclass(frozen=True)
class AssignTimestampsSpec:
    """``assign_timestamps_and_watermarks(strategy)``."""

    strategy: WatermarkStrategy

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _AssignTimestamps(ctx, self.strategy)
