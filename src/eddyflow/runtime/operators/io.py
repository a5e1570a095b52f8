"""Where a chain meets connectors: ``SourceSpec``, which the task reads
itself, and the sink operator with its two-phase commit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eddyflow.connectors.sink import Sink, SinkWriter
from eddyflow.runtime.operators.base import Operator, OperatorContext, OperatorSnapshot
from eddyflow.state.abc import SnapshotTarget

__all__ = ["SinkSpec", "SourceSpec"]


@dataclass(frozen=True)
class SourceSpec:
    """A source node's payload; the task reads it, no operator is made."""

    source: Any  # eddyflow.connectors.Source


class _SinkOperator(Operator):
    """Two-phase commit (docs/connectors.md, Writing a sink): the barrier prepares the pending
    transaction; the coordinator commits what a completed checkpoint
    recorded. A prepared transaction whose checkpoint was aborted stays
    pending and rides along with the next checkpoint."""

    def __init__(self, ctx: OperatorContext, sink: Sink) -> None:
        super().__init__(ctx)
        self.sink = sink
        self.writer: SinkWriter | None = None
        self.pending: list[Any] = []
        self._recorded: dict[int, list[Any]] = {}

    def open(self) -> None:
        self.writer = self.sink.create_writer(self.ctx.subtask, self.ctx.parallelism)

    def process(self, batch: list[Any]) -> list[Any]:
        assert self.writer is not None
        self.writer.write(batch)
        return []

    def snapshot(self, checkpoint_id: int, target: SnapshotTarget | None = None
                 ) -> OperatorSnapshot | None:
        assert self.writer is not None
        committable = self.writer.prepare_commit(checkpoint_id)
        if committable is not None:
            self.pending.append(committable)
        self._recorded[checkpoint_id] = list(self.pending)
        return OperatorSnapshot(committables=list(self.pending))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done: list[Any] = []
        for n in [n for n in self._recorded if n <= checkpoint_id]:
            done.extend(self._recorded.pop(n))
        if done:
            self.pending = [c for c in self.pending if c not in done]

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


@dataclass(frozen=True)
class SinkSpec:
    """``sink_to(sink)``: the records go to ``sink``'s writers, committed on checkpoints."""

    sink: Sink

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _SinkOperator(ctx, self.sink)
