"""Watermark generation: the runtime side of ``assign_timestamps_and_watermarks``.

The operator here (``_AssignTimestamps``) stamps each record with the
strategy's timestamp and feeds it to the strategy's generator; the task emits
the generator's watermark (``runtime/time/valve.py``). Chained right after a
source at the same parallelism, one instance sees exactly one source
subtask: it then keeps a generator per split of a split source, so that
watermarks are per split (docs/concepts/event-time.md); elsewhere, per subtask
of the operator.

The strategy is an ``ef.WatermarkStrategy`` (``windowing/watermarks.py``):
the runtime reads its ``timestamp`` extractor (``record -> float`` seconds)
and asks ``create_generator()`` for one generator per instance; when a
split turns idle is the strategy's ``idle_at``/``is_idle``. Lateness,
firing, idleness and the watermark arithmetic are defined once,
there: a record with timestamp ``t`` is late iff ``t <`` the watermark; an
event-time timer for ``t`` fires once the watermark is ``>= t``.
"""

from __future__ import annotations

import math
from collections.abc import Set
from dataclasses import dataclass
from typing import Any

from eddyflow.runtime.operators.base import Operator, OperatorContext
from eddyflow.windowing.watermarks import WatermarkStrategy

__all__ = ["AssignTimestampsSpec"]


class _AssignTimestamps(Operator):
    """Stamps records; its generator's watermark replaces upstream's.

    Chained right after a split source, it keeps a generator per split
    (the source task says which split each batch is from: :meth:`track_splits`,
    ``split``), as Flink's per-split watermarks do: a subtask reads its
    splits in turn, and one generator over them all would see a split that
    is behind in event time as disorder (its records late). The watermark is
    then the minimum over the splits that have records, are not read to
    their end, and are not idle (``with_idleness``); none before every split
    has been read once, and a split that had nothing to read when it was
    holds nothing back (docs/architecture/sources.md)."""

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
        #: The split of the batch being stamped (set by the source task).
        self.split: str | None = None
        #: Per split that had records: its generator and last record's time.
        self._splits: dict[str, tuple[Any, float]] = {}
        #: The source reader's splits not read yet, and those read to their end.
        self._unread: Set[str] = frozenset()
        self._finished: Set[str] = frozenset()

    def track_splits(self, unread: Set[str], finished: Set[str]) -> None:
        """Generate per split: ``unread`` and ``finished`` are the source
        reader's own (live) sets of its splits' ids."""
        self._unread = unread
        self._finished = finished

    def process(self, batch: list[Any]) -> list[Any]:
        return batch  # without process_ts nothing is stamped: not reached

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        extract = self.extract
        stamps = list(map(extract, batch))
        split = self.split
        if split is None:
            generator = self.generator
        else:
            known = self._splits.get(split)
            generator = known[0] if known else self.strategy.create_generator()
            if batch:
                self._splits[split] = (generator, self.ctx.clock.now() if self.uses_clock
                                       else 0.0)
        on_events = getattr(generator, "on_events", None)
        if on_events is not None:
            on_events(stamps)
        else:  # a generator of the user's own
            on_event = generator.on_event
            for t in stamps:
                on_event(t)
        if batch and self.uses_clock:
            self.last_record = self.ctx.clock.now()
            if self.idle:
                self.idle = False
                self.status_changed = True
        return batch, stamps

    def generated(self) -> float:
        """The generator's watermark (per split: see the class docstring)."""
        splits = self._splits
        if not splits:
            return self.generator.current_watermark()
        if self._unread:
            return -math.inf  # a split not read yet may be behind the others
        finished, strategy = self._finished, self.strategy
        now = self.ctx.clock.now() if self.uses_clock else 0.0
        marks = [g.current_watermark() for sid, (g, last) in splits.items()
                 if sid not in finished and not (self.uses_clock and strategy.is_idle(last, now))]
        return min(marks) if marks else -math.inf

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
