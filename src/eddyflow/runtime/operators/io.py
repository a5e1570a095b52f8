"""Where a chain meets connectors: ``SourceSpec``, which the task reads
itself, and the sink operator with its two-phase commit."""

from __future__ import annotations

import inspect
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import anyio

from eddyflow.connectors.sink import Sink, SinkWriter, awaited
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
    pending and rides along with the next checkpoint.

    A writer's coroutine methods are found once, at ``open``. A synchronous
    writer is called as ever, with no await on the hot path. An ``async
    def write`` is started by ``process`` and awaited by the task (``settle``)
    before it takes its next input: one await per batch, at most one batch
    in the writer, and a slow writer holds back its inputs' channels (their
    bounded capacity is the buffer), as a slow operator does. The write is
    not overlapped with the next batch: a sink's connection does one thing
    at a time, and the other tasks of the job run while it waits."""

    def __init__(self, ctx: OperatorContext, sink: Sink) -> None:
        super().__init__(ctx)
        self.sink = sink
        self.writer: SinkWriter | None = None
        self.pending: list[Any] = []
        self._recorded: dict[int, list[Any]] = {}
        self._writes: list[Coroutine[Any, Any, Any]] = []
        self._write_async = self._prepare_async = False
        # Committables that prepare_snapshot got, for snapshot to record.
        self._prepared: dict[int, Any] = {}
        self._aborted = self._closed = False
        # A finished task's acknowledgements may prepare concurrently (the
        # periodic and the final checkpoint): one writer call at a time.
        self._lock = anyio.Lock()

    def open(self) -> None:
        w = self.writer = self.sink.create_writer(self.ctx.subtask, self.ctx.parallelism)
        self._write_async = inspect.iscoroutinefunction(w.write)
        self._prepare_async = inspect.iscoroutinefunction(w.prepare_commit)
        self.awaits = (self._write_async or self._prepare_async
                       or inspect.iscoroutinefunction(w.abort)
                       or inspect.iscoroutinefunction(w.close))

    def process(self, batch: list[Any]) -> list[Any]:
        assert self.writer is not None
        if self._write_async:
            self._writes.append(self.writer.write(batch))
            self.io_pending = True
        else:
            self.writer.write(batch)
        return []

    async def settle(self) -> None:
        writes, self._writes = self._writes, []
        self.io_pending = False
        for k, write in enumerate(writes):
            try:
                await write
            except BaseException:
                for rest in writes[k + 1:]:
                    rest.close()  # never started: no "never awaited" warning
                raise

    async def prepare_snapshot(self, checkpoint_id: int) -> None:
        assert self.writer is not None
        async with self._lock:
            await self.settle()
            if self._prepare_async:
                self._prepared[checkpoint_id] = await self.writer.prepare_commit(checkpoint_id)
            else:
                self._prepared[checkpoint_id] = self.writer.prepare_commit(checkpoint_id)

    def snapshot(self, checkpoint_id: int, target: SnapshotTarget | None = None
                 ) -> OperatorSnapshot | None:
        assert self.writer is not None
        if self.awaits:
            if checkpoint_id not in self._prepared:
                # Its records would slip into the next transaction, which a
                # restore from this checkpoint would never commit.
                raise RuntimeError(f"sink '{self.uid}': snapshot of checkpoint "
                                   f"{checkpoint_id} without its prepare_snapshot")
            committable = self._prepared.pop(checkpoint_id)
        else:
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
        for write in self._writes:
            write.close()
        self._writes = []
        self.io_pending = False
        self._aborted = True
        w = self.writer
        if w is not None and not inspect.iscoroutinefunction(w.abort):
            w.abort()

    async def aclose(self) -> None:
        w = self.writer
        if w is None or self._closed:
            return
        self._closed = True
        async with self._lock:
            if self._aborted and inspect.iscoroutinefunction(w.abort):
                await w.abort()
            await awaited(w.close())

    def close(self) -> None:
        w = self.writer
        if w is not None and not self._closed and not inspect.iscoroutinefunction(w.close):
            self._closed = True
            w.close()


@dataclass(frozen=True)
class SinkSpec:
    """``sink_to(sink)``: the records go to ``sink``'s writers, committed on checkpoints."""

    sink: Sink

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _SinkOperator(ctx, self.sink.for_job(ctx.job, ctx.uid))
