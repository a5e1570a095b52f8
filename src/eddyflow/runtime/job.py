"""The job runner: turns an execution plan into channels and tasks and runs
them under one anyio task group, so that a failing task cancels the others
and no coroutine outlives the job (DESIGN.md §7).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import anyio

from eddyflow.errors import JobFailed
from eddyflow.graph.logical import Partitioning
from eddyflow.graph.plan import ExchangeSpec, ExecutionPlan
from eddyflow.result import JobResult
from eddyflow.runtime.channel import Channel, InputGate
from eddyflow.runtime.operators import Operator, OperatorContext, SourceSpec
from eddyflow.runtime.task import Task, TaskFailure
from eddyflow.runtime.writers import (
    BroadcastWriter,
    ForwardWriter,
    KeyGroupWriter,
    RebalanceWriter,
    RecordWriter,
)
from eddyflow.state.backend import StateBackend

__all__ = ["JobRunner", "RuntimeConfig"]


@dataclass(frozen=True)
class RuntimeConfig:
    batch_size: int
    buffer_timeout: float
    channel_capacity: int
    max_parallelism: int
    state_backend: StateBackend


class JobRunner:
    """Runs one attempt of a job from its plan."""

    def __init__(self, plan: ExecutionPlan, config: RuntimeConfig, job_name: str) -> None:
        self.plan = plan
        self.config = config
        self.job_name = job_name
        self.tasks: list[Task] = []

    def _channels(self, x: ExchangeSpec) -> dict[tuple[int, int], Channel]:
        """Channels of one exchange, by (upstream subtask, downstream subtask)."""
        p_up = self.plan.chains[x.source_chain].parallelism
        p_down = self.plan.chains[x.target_chain].parallelism
        cap = None if x.back_edge else self.config.channel_capacity * self.config.batch_size
        nodes = self.plan.graph.nodes
        name = f"{nodes[x.source_node].uid}->{nodes[x.target_node].uid}"
        if x.partitioning is Partitioning.FORWARD:
            return {(i, i): Channel(f"{name}[{i}]", cap) for i in range(p_up)}
        return {
            (i, j): Channel(f"{name}[{i}->{j}]", cap)
            for i in range(p_up)
            for j in range(p_down)
        }

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
        outputs: dict[tuple[int, int], list[RecordWriter]] = {}
        for x in plan.exchanges:
            chans = self._channels(x)
            p_up = plan.chains[x.source_chain].parallelism
            for (_, j), ch in chans.items():
                inputs.setdefault((x.target_chain, j), []).append(ch)
            for i in range(p_up):
                mine = [ch for (u, _), ch in sorted(chans.items()) if u == i]
                outputs.setdefault((x.source_chain, i), []).append(self._writer(x, mine, i))

        tasks = []
        for chain in plan.chains:
            nodes = [plan.graph.nodes[n] for n in chain.node_ids]
            for s in range(chain.parallelism):
                ops: list[Operator] = []
                for node in nodes:
                    if node.is_source:
                        continue
                    ctx = OperatorContext(node.uid, s, chain.parallelism, cfg.max_parallelism,
                                          cfg.state_backend)
                    ops.append(node.payload.instantiate(ctx))
                head = nodes[0]
                common: dict[str, Any] = dict(
                    batch_size=cfg.batch_size, buffer_timeout=cfg.buffer_timeout
                )
                writers = outputs.get((chain.index, s), [])
                if head.is_source:
                    assert isinstance(head.payload, SourceSpec)
                    reader = head.payload.source.create_reader(s, chain.parallelism)
                    task = Task(chain.name, s, chain.parallelism, ops, writers,
                                reader=reader, source_uid=head.uid, **common)
                else:
                    gate = InputGate(inputs.get((chain.index, s), []))
                    task = Task(chain.name, s, chain.parallelism, ops, writers, gate=gate,
                                **common)
                tasks.append(task)
        self.tasks = tasks
        return tasks

    async def run(self) -> JobResult:
        started = time.monotonic()
        tasks = self.build()
        try:
            async with anyio.create_task_group() as tg:
                for t in tasks:
                    tg.start_soon(t.run, name=f"{t.name}[{t.subtask}]")
        except BaseExceptionGroup as group:
            failed = self._job_failed(group)
            # Chain the root cause, not the task group's ExceptionGroup.
            raise failed from failed.__cause__
        return self.result(time.monotonic() - started)

    def _job_failed(self, group: BaseExceptionGroup[Any]) -> BaseException:
        leaves: list[BaseException] = []

        def walk(e: BaseException) -> None:
            if isinstance(e, BaseExceptionGroup):
                for sub in e.exceptions:
                    walk(sub)
            else:
                leaves.append(e)

        walk(group)
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
        state: dict[str, dict[str, dict[Any, Any]]] = {}
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
                    for name, table in backend.tables().items():
                        merged.setdefault(name, {}).update(table)
        return JobResult(self.job_name, duration, rin, rout, final_state=state)
