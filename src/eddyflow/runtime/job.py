"""The job runner: turns an execution plan into channels and tasks and runs
them under one anyio task group, so that a failing task cancels the others
and no coroutine outlives the job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from eddyflow.checkpoint import writer as writer_process
from eddyflow.connectors.source import Source, SourceReader
from eddyflow.connectors.splits import RestoredSplit, SplitSource, SplitsReader
from eddyflow.errors import JobFailed
from eddyflow.graph.logical import Partitioning
from eddyflow.graph.plan import ExchangeSpec, ExecutionPlan
from eddyflow.result import JobResult, merge_state
from eddyflow.runtime.checkpointing.channel_state import channel_key
from eddyflow.runtime.checkpointing.coordinator import CheckpointConfig, CheckpointCoordinator
from eddyflow.runtime.exchange.channel import Channel, InputGate
from eddyflow.runtime.exchange.debloat import Debloater, InFlightBounds
from eddyflow.runtime.exchange.feedback import FeedbackChannel
from eddyflow.runtime.exchange.loops import LoopTracker
from eddyflow.runtime.exchange.writers import (
    BroadcastWriter,
    ForwardWriter,
    KeyGroupWriter,
    RebalanceWriter,
    RecordWriter,
)
from eddyflow.runtime.failures import TaskFailure, exception_leaves
from eddyflow.runtime.operators.base import Operator, OperatorContext
from eddyflow.runtime.operators.io import SinkSpec, SourceSpec
from eddyflow.runtime.recovery.reinjection import (
    recover_sinks,
    reinject_backedge_logs,
    reinject_channel_state,
)
from eddyflow.runtime.recovery.restore import RestoredCheckpoint
from eddyflow.runtime.task import Task
from eddyflow.runtime.time.clock import WALL_CLOCK, Clock
from eddyflow.state.abc import StateBackend

__all__ = ["JobRunner", "RuntimeConfig"]

log = logging.getLogger("eddyflow.checkpoint.listing")


@dataclass(frozen=True)
class RuntimeConfig:
    batch_size: int
    buffer_timeout: float
    channel_capacity: int
    max_parallelism: int
    state_backend: StateBackend
    feedback_memory: int = 1 << 16  # records a feedback channel keeps before spilling
    #: Processing time (``env.set_clock``).
    clock: Clock = WALL_CLOCK
    #: Seconds between a generator's watermarks while busy (0: every batch).
    auto_watermark_interval: float = 0.2
    #: Seconds of records a channel may queue, by its consumer's measured
    #: rate (``runtime/exchange/debloat.py``); ``None``: bounded by count alone.
    buffer_debloat_target: float | None = 1.0
    #: Worker processes that run the subtasks (``runtime/workers/``); 1: this process.
    workers: int = 1


class JobRunner:
    """Runs one attempt of a job from its plan."""

    def __init__(
        self,
        plan: ExecutionPlan,
        config: RuntimeConfig,
        job_name: str,
        *,
        checkpointing: CheckpointConfig | None = None,
        restore: RestoredCheckpoint | None = None,
        next_checkpoint_id: int = 1,
        completed_checkpoints: Sequence[int] = (),
        lineage: str = "",
        base: tuple[str, int] | None = None,
        coordinator: CheckpointCoordinator | None = None,
    ) -> None:
        self.plan = plan
        self.config = config
        self.job_name = job_name
        self.restore = restore
        self.tasks: list[Task] = []
        self.sinks = {
            n.uid: n.payload.sink.for_job(job_name, n.uid)
            for n in plan.graph.nodes if isinstance(n.payload, SinkSpec)
        }
        # (A worker process passes the stand-in of the caller's: runtime/workers/.)
        self.coordinator = coordinator or CheckpointCoordinator(
            checkpointing, job_name, plan, self.sinks, next_checkpoint_id, completed_checkpoints,
            lineage=lineage, base=base,
        )
        self._spawn: Any = None
        #: Per split source, its splits at the start of this attempt.
        self._splits: dict[str, list[RestoredSplit]] = {}
        self.loops = [LoopTracker(i) for i in range(len(plan.loops))]
        self.feedback_channels: list[FeedbackChannel] = []
        #: Per exchange, its name (``source->target``) and channels.
        self.exchange_channels: list[tuple[ExchangeSpec, str,
                                          dict[tuple[int, int], Channel]]] = []

    def _channels(self, x: ExchangeSpec) -> dict[tuple[int, int], Channel]:
        """Channels of one exchange, by (upstream subtask, downstream subtask)."""
        p_up = self.plan.chains[x.source_chain].parallelism
        p_down = self.plan.chains[x.target_chain].parallelism
        cap = self.config.channel_capacity * self.config.batch_size
        nodes = self.plan.graph.nodes
        name = f"{nodes[x.source_node].uid}->{nodes[x.target_node].uid}"

        def make(label: str) -> Channel:
            if not x.back_edge:
                return Channel(label, cap)
            # A back-edge always accepts (else a loop that multiplies records
            # deadlocks), spilling to disk past a memory bound.
            ch = FeedbackChannel(label, self.config.feedback_memory)
            self.feedback_channels.append(ch)
            return ch

        if x.partitioning is Partitioning.FORWARD:
            chans = {(i, i): make(f"{name}[{i}]") for i in range(p_up)}
        else:
            chans = {
                (i, j): make(f"{name}[{i}->{j}]")
                for i in range(p_up)
                for j in range(p_down)
            }
        for (i, j), ch in chans.items():
            ch.key = channel_key(name, i, j)
        self.exchange_channels.append((x, name, chans))
        return chans

    def _writer(self, x: ExchangeSpec, channels: list[Channel], subtask: int) -> RecordWriter:
        nodes = self.plan.graph.nodes
        label = f"{nodes[x.source_node].uid} -> {nodes[x.target_node].uid}"
        size = self.config.batch_size
        part = x.partitioning
        if part is Partitioning.FORWARD or len(channels) == 1:
            return ForwardWriter(channels, size, label)
        if part is Partitioning.KEY_GROUP:
            assert x.key_fn is not None
            return KeyGroupWriter(channels, size, label, x.key_fn, self.config.max_parallelism)
        if part is Partitioning.BROADCAST:
            return BroadcastWriter(channels, size, label)
        return RebalanceWriter(channels, size, label, start=subtask)

    def build(self) -> list[Task]:
        plan, cfg = self.plan, self.config
        inputs: dict[tuple[int, int], list[Channel]] = {}
        regular: dict[tuple[int, int], list[bool]] = {}
        in_loops: dict[tuple[int, int], list[LoopTracker | None]] = {}
        entries: dict[tuple[int, int], list[LoopTracker | None]] = {}
        heads: dict[tuple[int, int], LoopTracker] = {}
        outputs: dict[tuple[int, int], list[RecordWriter]] = {}
        # Each channel's writer and its index there: a consumer's debloating
        # sizes the batches its producers hand over.
        feeds: dict[int, tuple[Channel, RecordWriter, int]] = {}
        for x in plan.exchanges:
            chans = self._channels(x)
            self._place_channels(x, chans)
            p_up = plan.chains[x.source_chain].parallelism
            tracker = self.loops[x.loop] if x.loop is not None else None
            target_loop = plan.loop_of(x.target_node)
            entering = (self.loops[target_loop]
                        if target_loop is not None and x.loop is None else None)
            for (_, j), ch in chans.items():
                key = (x.target_chain, j)
                inputs.setdefault(key, []).append(ch)
                regular.setdefault(key, []).append(not x.back_edge)
                in_loops.setdefault(key, []).append(tracker)
                entries.setdefault(key, []).append(entering)
                if entering is not None and self._runs_here(x.target_chain, j):
                    entering.open_entries += 1  # (each worker counts its own)
                if x.back_edge and tracker is not None:
                    heads[key] = tracker
            for i in range(p_up):
                mine = [ch for (u, _), ch in sorted(chans.items()) if u == i]
                writer = self._writer(x, mine, i)
                writer.tracker = tracker
                for k, ch in enumerate(mine):
                    feeds[id(ch)] = (ch, writer, k)
                outputs.setdefault((x.source_chain, i), []).append(writer)

        tasks = []
        checkpointing = self.coordinator.storage is not None
        for chain in plan.chains:
            nodes = [plan.graph.nodes[n] for n in chain.node_ids]
            for s in range(chain.parallelism):
                if not self._runs_here(chain.index, s):
                    continue
                ops: list[Operator] = []
                for node in nodes:
                    if node.is_source:
                        continue
                    ctx = OperatorContext(node.uid, s, chain.parallelism, cfg.max_parallelism,
                                          cfg.state_backend, checkpointing, cfg.clock,
                                          job=self.job_name)
                    ops.append(node.payload.instantiate(ctx))
                head = nodes[0]
                common: dict[str, Any] = dict(
                    batch_size=cfg.batch_size, buffer_timeout=cfg.buffer_timeout,
                    chain_index=chain.index, coordinator=self.coordinator,
                    restore=self.restore, spawn=self._spawn_write, clock=cfg.clock,
                    auto_watermark_interval=cfg.auto_watermark_interval,
                )
                writers = outputs.get((chain.index, s), [])
                if head.is_source:
                    assert isinstance(head.payload, SourceSpec)
                    reader = self._source_reader(head.uid, head.payload.source, s,
                                                 chain.parallelism)
                    task = Task(chain.name, s, chain.parallelism, ops, writers,
                                reader=reader, source_uid=head.uid,
                                debloat=self._debloater([], writers), **common)
                else:
                    key = (chain.index, s)
                    gate = InputGate(inputs.get(key, []))
                    common["debloat"] = self._debloater(
                        [feeds[id(ch)] for ch in gate.channels
                         if ch.capacity is not None and id(ch) in feeds])
                    loop = heads.get(key)
                    if loop is not None:
                        loop.heads.append(gate)
                    task = Task(chain.name, s, chain.parallelism, ops, writers, gate=gate,
                                regular_inputs=regular.get(key, []),
                                input_loops=in_loops.get(key, []), head_of=loop,
                                input_entries=entries.get(key, []), **common)
                tasks.append(task)
        self.tasks = tasks
        self.coordinator.attach(tasks)
        return tasks

    def _source_reader(self, uid: str, source: Source, subtask: int,
                       parallelism: int) -> SourceReader:
        """The reader of source ``uid``'s subtask. A split source's splits
        are found once for all its subtasks, here on the caller's side:
        those the restored checkpoint recorded, with their positions, and
        those it did not know (all of them on a fresh start); each subtask
        takes its own (connectors/splits.py)."""
        if not isinstance(source, SplitSource):
            return source.create_reader(subtask, parallelism)
        splits = self._splits.get(uid)
        if splits is None:
            restored = self.restore.source_splits(uid, source) if self.restore else []
            found = source.discover_splits([r.split for r in restored], parallelism)
            splits = self._splits[uid] = restored + [RestoredSplit(f) for f in found]
        return SplitsReader(source, subtask, parallelism, splits)

    def _place_channels(self, x: ExchangeSpec, channels: dict[tuple[int, int], Channel]) -> None:
        """Where the channels of exchange ``x`` run: all in this process here;
        a worker process replaces those that cross to another worker
        (``runtime/workers/worker.py``)."""

    def _runs_here(self, chain_index: int, subtask: int) -> bool:
        """Whether this process runs that task: every one here; a worker
        process only those placed on it."""
        return True

    def _debloater(self, inputs: list[tuple[Channel, RecordWriter, int]],
                   outputs: list[RecordWriter] | None = None) -> Debloater | None:
        """What sizes a task's bounded ``inputs`` (or a source task's reads,
        by its ``outputs`` too) by its measured rate, unless debloating is off."""
        cfg = self.config
        if cfg.buffer_debloat_target is None:
            return None
        return Debloater(InFlightBounds(cfg.buffer_debloat_target, cfg.batch_size,
                                        cfg.channel_capacity), inputs, outputs or ())

    def spawn_into(self, spawn: Any) -> None:
        """Run snapshot writes with ``spawn`` (a task group's ``start_soon``)."""
        self._spawn = spawn


    def _spawn_write(self, fn: Any) -> None:
        # Snapshot writes run in the job's task group: a failing write fails
        # the job, and no write outlives it.
        assert self._spawn is not None
        self._spawn(fn)

    async def run(self) -> JobResult:
        started = time.monotonic()
        await recover_sinks(self.sinks, self.restore)
        tasks = self.build()
        if self.restore is not None:
            await reinject_backedge_logs(self.restore, tasks)
            reinject_channel_state(self.restore, self.plan, self.exchange_channels, self.loops,
                                   self._writer)
        coordinator = self.coordinator
        writer = await self._start_writer()
        try:
            async with anyio.create_task_group() as outer:
                self._spawn = outer.start_soon
                periodic = anyio.CancelScope()

                async def trigger_periodically() -> None:
                    with periodic:
                        await coordinator.run_periodic()

                outer.start_soon(trigger_periodically, name="checkpoint-coordinator")
                async with anyio.create_task_group() as tg:
                    for t in tasks:
                        tg.start_soon(t.run, name=f"{t.name}[{t.subtask}]")
                # Every task is done. Stop triggering; the outer group still
                # waits for the final checkpoint's writes and commit.
                coordinator.stop()
                periodic.cancel()
        except BaseExceptionGroup as group:
            self._close_feedback()
            failed = self.failure_of(group)
            # Chain the root cause, not the task group's ExceptionGroup.
            raise failed from failed.__cause__
        finally:
            self._close_feedback()
            # Every write has landed (they run in the outer task group): the
            # operators of finished tasks have taken their last snapshot.
            closing: list[BaseException] = []
            for t in tasks:
                try:
                    await t.aclose()
                except Exception as exc:
                    closing.append(exc)
            coordinator.end_run()
            coordinator.sweep_aborted()
            coordinator.collect_shared_garbage()
            if writer is not None:
                assert coordinator.storage is not None
                coordinator.storage.writer = None
                await writer.aclose()
        if closing:
            raise JobFailed(f"job '{self.job_name}' failed closing an operator: "
                            f"{type(closing[0]).__name__}: {closing[0]}") from closing[0]
        return self.result(time.monotonic() - started)

    async def _start_writer(self) -> writer_process.WriterProcess | None:
        """The helper process of this run's checkpoint writes, if any (see
        :mod:`eddyflow.checkpoint.writer`); without one they are done in-process."""
        storage = self.coordinator.storage
        if storage is None or not writer_process.ENABLED:
            return None
        writer = writer_process.WriterProcess()
        try:
            await writer.start()
        except OSError as exc:
            log.warning("no checkpoint writer process (%s): checkpoint files are written "
                        "on the event loop's thread", exc)
            return None
        storage.writer = writer
        return writer

    def _close_feedback(self) -> None:
        for ch in self.feedback_channels:
            ch.close()

    def failure_of(self, group: BaseExceptionGroup[Any]) -> BaseException:
        """The job's failure, from the task group's exceptions (its root
        cause as ``__cause__``)."""
        leaves = exception_leaves(group)
        for e in leaves:
            if not isinstance(e, Exception):
                return e  # KeyboardInterrupt, SystemExit: not ours to wrap
        for e in leaves:
            if isinstance(e, TaskFailure):
                failed = JobFailed(f"job '{self.job_name}' failed: {e}", operator=e.operator,
                                   subtask=e.subtask, position=e.position)
                failed.__cause__ = e.__cause__ or e
                return failed
        root = leaves[0]
        failed = JobFailed(f"job '{self.job_name}' failed: {type(root).__name__}: {root}")
        failed.__cause__ = root
        return failed

    def result(self, duration: float) -> JobResult:
        rin: dict[str, int] = {}
        rout: dict[str, int] = {}
        state: dict[str, dict[str, Mapping[Any, Any]]] = {}
        for t in self.tasks:
            if t.source_uid is not None:
                rout[t.source_uid] = rout.get(t.source_uid, 0) + t.records_read
                rin.setdefault(t.source_uid, 0)
            for op in t.operators:
                rin[op.uid] = rin.get(op.uid, 0) + op.records_in
                rout[op.uid] = rout.get(op.uid, 0) + op.records_out
                backend = getattr(op, "backend", None)
                if backend is not None:
                    merged = state.setdefault(op.uid, {})
                    # As user code reads it: states with a TTL without
                    # their write times and what expired by the job's end.
                    for name, table in backend.user_tables().items():
                        merged[name] = merge_state(merged.get(name), table)
        return JobResult(self.job_name, duration, rin, rout,
                         completed_checkpoints=sorted(self.coordinator.completed),
                         final_state=state)
