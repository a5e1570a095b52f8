"""The calling process's side of a job over worker processes: one attempt.

The caller keeps the checkpoint coordinator, the sinks' commits (so
``ListSink.results`` fill here) and the restart loop; it starts the workers
(``process.py``: forked, or spawned where a fork is not safe) with the
attempt's plan, talks to each task through a
:class:`RemoteTask` (the coordinator's
:class:`~eddyflow.runtime.checkpointing.participant.CheckpointParticipant`
for a task in a worker), and gathers the workers' results. A worker that
fails or dies fails the attempt: every worker is stopped, and the restart
strategy restarts them all from the latest checkpoint (Flink's full restart).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import anyio

from eddyflow.connectors.sink import ListSink
from eddyflow.errors import JobFailed
from eddyflow.graph.logical import Partitioning
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.result import JobResult, merge_state
from eddyflow.runtime.checkpointing.coordinator import CheckpointConfig
from eddyflow.runtime.checkpointing.messages import (
    AbortCheckpoint,
    AcknowledgeCheckpoint,
    NotifyCheckpointComplete,
    SubtaskId,
    SwitchToUnaligned,
    TriggerCheckpoint,
)
from eddyflow.runtime.exchange.remote import Link
from eddyflow.runtime.exchange.writers import load_bulk_routing
from eddyflow.runtime.failures import exception_leaves
from eddyflow.runtime.job import JobRunner, RuntimeConfig
from eddyflow.runtime.recovery.reinjection import recover_sinks
from eddyflow.runtime.recovery.restore import RestoredCheckpoint
from eddyflow.runtime.task import Task
from eddyflow.runtime.workers.placement import Placement
from eddyflow.runtime.workers.process import WorkerProcesses, WorkersRefused, fork_hazard
from eddyflow.runtime.workers.protocol import (
    Acknowledged,
    AcknowledgeFinal,
    Counters,
    LoopCounts,
    LoopIdle,
    Shutdown,
    SourceCredit,
    TaskFinished,
    ToTask,
    WorkerDone,
    WorkerFailed,
    load_exception,
)
from eddyflow.runtime.workers.relay import IterableRelay, relays_of
from eddyflow.runtime.workers.spawn import pickle_job
from eddyflow.runtime.workers.termination import LoopTermination
from eddyflow.runtime.workers.worker import WorkerJob

__all__ = ["RemoteTask", "WorkerJobRunner"]


class RemoteTask:
    """A task in a worker process, as the coordinator sees it: its messages
    go over the worker's control link; what the coordinator asks of it
    synchronously (finished, checkpoints seen) is mirrored from the worker."""

    def __init__(self, runner: WorkerJobRunner, name: str, subtask_id: SubtaskId,
                 worker: int) -> None:
        self.runner = runner
        self._name = name
        self._id = subtask_id
        self.worker = worker
        self._finished = False
        self.seen = 0

    @property
    def name(self) -> str:
        """The task's chain name."""
        return self._name

    @property
    def subtask_id(self) -> SubtaskId:
        """Which task it is."""
        return self._id

    @property
    def finished(self) -> bool:
        """Whether the worker reported the task finished."""
        return self._finished

    def mark_finished(self, seen: int) -> None:
        """The worker reported the task finished, having taken part in ``seen``."""
        self._finished = True
        self.seen = max(self.seen, seen)

    def _send(self, message: Any) -> None:
        self.runner.send(self.worker, message)

    def trigger_checkpoint(self, trigger: TriggerCheckpoint) -> bool:
        """Forward ``trigger`` unless the task finished (False then)."""
        if self._finished:
            return False
        self._send(ToTask(self._id, trigger))
        return True

    def acknowledge_final_state(self, trigger: TriggerCheckpoint) -> None:
        """Have the finished task acknowledge ``trigger`` with its final state."""
        all_finished = self.runner.coordinator.all_finished
        if all_finished:
            self.runner.final_id = trigger.checkpoint_id
        self._send(AcknowledgeFinal(self._id, trigger, all_finished))

    def saw_checkpoint(self, checkpoint_id: int) -> bool:
        """Whether the task took part in ``checkpoint_id``, as last reported."""
        return self.seen >= checkpoint_id

    def switch_to_unaligned(self, switch: SwitchToUnaligned) -> None:
        """Forward ``switch``."""
        self._send(ToTask(self._id, switch))

    def notify_checkpoint_complete(self, complete: NotifyCheckpointComplete) -> None:
        """Forward ``complete``."""
        self._send(ToTask(self._id, complete))
        self.runner.checkpoint_ended(complete.checkpoint_id)

    def abort_checkpoint(self, abort: AbortCheckpoint) -> None:
        """Forward ``abort``."""
        self._send(ToTask(self._id, abort))
        self.runner.checkpoint_ended(abort.checkpoint_id)

    def describe_state(self) -> str:
        """Where the task runs (its own report is in its worker)."""
        done = "finished" if self._finished else "running"
        return f"{self._name}[{self._id.subtask}] in worker {self.worker}: {done}"


class _Fill:
    """A task's bounded inputs, as the metrics read their fill."""

    def __init__(self) -> None:
        self.records = 0
        self.capacity: int | None = None


class _Gate:
    def __init__(self) -> None:
        self.channels = [_Fill()]


class _OperatorCounters:
    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.records_in = 0
        self.records_out = 0


class TaskMirror:
    """A task in a worker as the metrics sample it (``runtime/metrics.py``
    reads these attributes of a ``Task``), from the worker's reports."""

    def __init__(self, subtask: int, source_uid: str | None, operators: list[str]) -> None:
        self.subtask = subtask
        self.source_uid = source_uid
        self.records_read = 0
        self.operators = [_OperatorCounters(uid) for uid in operators]
        self.gate: _Gate | None = None if source_uid is not None else _Gate()

    def update(self, counters: Counters) -> None:
        """The worker's latest report."""
        self.records_read = counters.records_read
        for op, (_, r_in, r_out) in zip(self.operators, counters.operators, strict=False):
            op.records_in, op.records_out = r_in, r_out
        if self.gate is not None:
            fill = self.gate.channels[0]
            fill.records = counters.queued
            fill.capacity = counters.capacity or None


class WorkerJobRunner(JobRunner):
    """One attempt of a job over ``config.workers`` worker processes."""

    def __init__(self, plan: ExecutionPlan, config: RuntimeConfig, job_name: str, *,
                 checkpointing: CheckpointConfig | None = None,
                 restore: RestoredCheckpoint | None = None,
                 next_checkpoint_id: int = 1, completed_checkpoints: Sequence[int] = (),
                 lineage: str = "", base: tuple[str, int] | None = None) -> None:
        super().__init__(plan, config, job_name, checkpointing=checkpointing, restore=restore,
                         next_checkpoint_id=next_checkpoint_id,
                         completed_checkpoints=completed_checkpoints, lineage=lineage,
                         base=base)
        self.checkpointing = checkpointing
        self.placement = Placement(plan, config.workers)
        self.proxies: list[RemoteTask] = []
        self.mirrors: dict[SubtaskId, TaskMirror] = {}
        self.final_id: int | None = None
        self._final_done = anyio.Event()
        self._links: list[Link] = []
        self._done: dict[int, WorkerDone] = {}
        self._ended: set[int] = set()
        self._relays: dict[str, IterableRelay] = {}
        self._loops = LoopTermination(0, 0, self.send)

    def build(self) -> list[Task]:
        """No task runs here: the coordinator gets one :class:`RemoteTask` per
        task, the metrics a :class:`TaskMirror`."""
        where = self.placement.worker_of
        self.proxies = [RemoteTask(self, chain.name, SubtaskId(chain.index, s),
                                   where[(chain.index, s)])
                        for chain in self.plan.chains for s in range(chain.parallelism)]
        self.coordinator.attach(self.proxies)
        nodes = self.plan.graph.nodes
        self.mirrors = {}
        for chain in self.plan.chains:
            head = nodes[chain.node_ids[0]]
            source = head.uid if head.is_source else None
            ops = [nodes[n].uid for n in chain.node_ids if not nodes[n].is_source]
            for s in range(chain.parallelism):
                self.mirrors[SubtaskId(chain.index, s)] = TaskMirror(s, source, ops)
        # What the metrics sample (they read a Task's counters and inputs).
        self.tasks = cast(list[Task], list(self.mirrors.values()))
        return []

    def send(self, worker: int, message: Any) -> None:
        """Send ``message`` to ``worker``'s control link."""
        self._links[worker].send(message)

    def checkpoint_ended(self, checkpoint_id: int) -> None:
        """A checkpoint completed or was aborted: the final one ends the job
        (looked at once the message that ended it is handled: a periodic
        checkpoint the final one subsumes is aborted before the final one
        is triggered)."""
        self._ended.add(checkpoint_id)

    async def run(self) -> JobResult:
        """Fork the workers, coordinate their checkpoints, gather their results."""
        started = time.monotonic()
        await recover_sinks(self.sinks, self.restore)
        self.build()
        coordinator = self.coordinator
        job = WorkerJob(self.plan, self.config, self.job_name, self.checkpointing,
                        self.restore, self.placement, coordinator.run_id)
        spawned: bytes | None = None
        if fork_hazard() is not None:  # new interpreters load the job (spawn.py)
            try:
                spawned = pickle_job(job)
            except WorkersRefused as refused:
                raise JobFailed(f"job '{self.job_name}' cannot run with workers="
                                f"{self.config.workers}: {refused}") from refused
        procs = WorkerProcesses(self.config.workers, job.main, spawned)
        if fork_hazard() is None and any(x.partitioning is Partitioning.KEY_GROUP
                                         for x in self.plan.exchanges):
            load_bulk_routing()  # before the fork: every worker has it then
        self._loops = LoopTermination(len(self.plan.loops), procs.count, self.send)
        procs.start()
        ok = False
        try:
            await procs.send_job()
            self._links = [Link(s, f"control of worker {w}") for w, s in enumerate(procs.controls)]
            for link in self._links:
                await link.open()
            async with anyio.create_task_group() as outer:
                periodic = anyio.CancelScope()

                async def trigger_periodically() -> None:
                    with periodic:
                        await coordinator.run_periodic()

                outer.start_soon(trigger_periodically, name="checkpoint-coordinator")
                # Async iterables are read here and relayed (relay.py).
                self._relays = relays_of(self.plan, self.placement.worker_of, self.send)
                for uid, relay in self._relays.items():
                    outer.start_soon(relay.run, name=f"relay {uid}")
                for w in range(procs.count):
                    outer.start_soon(self._serve, procs, w, name=f"worker-{w}")
                await self._final_done.wait()
                coordinator.stop()
                periodic.cancel()
                for w in range(procs.count):
                    self.send(w, Shutdown())
            ok = True
        except BaseExceptionGroup as group:
            failed = self.failure_of(group)
            raise failed from failed.__cause__
        finally:
            if ok:
                # The workers leave once their links close (worker.py).
                with anyio.CancelScope(shield=True):
                    for link in self._links:
                        await link.aclose()
                    await procs.stop(grace=5.0)
            for link in self._links:
                link.close()  # (unregisters it from the loop before its socket closes)
            procs.kill()
            coordinator.end_run()
            coordinator.sweep_aborted()
            coordinator.collect_shared_garbage()
        return self._result(time.monotonic() - started)

    async def _serve(self, procs: WorkerProcesses, worker: int) -> None:
        link = self._links[worker]
        coordinator = self.coordinator
        by_id = {p.subtask_id: p for p in self.proxies}
        while True:
            try:
                msg = await link.recv()
            except EOFError:
                status = await procs.wait_status(worker, 1.0)
                raise JobFailed(f"job '{self.job_name}' failed: worker {worker} "
                                f"(pid {procs.pids[worker]}) {status}") from None
            if isinstance(msg, Acknowledged):
                for uid, staged in msg.staged.items():
                    sink = self.sinks[uid]
                    assert isinstance(sink, ListSink)
                    sink.add_staged(staged)
                if isinstance(msg.answer, AcknowledgeCheckpoint):
                    await coordinator.acknowledge(msg.answer)
                else:
                    coordinator.decline(msg.answer)
            elif isinstance(msg, Counters):
                self.mirrors[msg.subtask].update(msg)
            elif isinstance(msg, SourceCredit):
                self._relays[msg.uid].add_credit(msg.records)
            elif isinstance(msg, LoopIdle):
                self._loops.on_idle(worker, msg)
            elif isinstance(msg, LoopCounts):
                self._loops.on_counts(worker, msg)
            elif isinstance(msg, TaskFinished):
                proxy = by_id[msg.subtask]
                proxy.mark_finished(msg.seen)
                coordinator.task_finished(proxy)
            elif isinstance(msg, WorkerDone):
                self._done[worker] = msg
                return  # the worker leaves when its link closes (see run)
            elif isinstance(msg, WorkerFailed):
                raise _job_failed(msg)
            if self.final_id in self._ended:
                self._final_done.set()

    def failure_of(self, group: BaseExceptionGroup[Any]) -> BaseException:
        """The first worker's failure as it came, else the group's root cause."""
        for e in exception_leaves(group):
            if isinstance(e, JobFailed):
                return e
        return super().failure_of(group)

    def _result(self, duration: float) -> JobResult:
        rin: dict[str, int] = {}
        rout: dict[str, int] = {}
        state: dict[str, dict[str, Any]] = {}
        for done in self._done.values():
            for uid, n in done.records_in.items():
                rin[uid] = rin.get(uid, 0) + n
            for uid, n in done.records_out.items():
                rout[uid] = rout.get(uid, 0) + n
            for uid, tables in done.state.items():
                merged = state.setdefault(uid, {})
                for name, table in tables.items():
                    merged[name] = merge_state(merged.get(name), table)
        return JobResult(self.job_name, duration, rin, rout,
                         completed_checkpoints=sorted(self.coordinator.completed),
                         final_state=state)


def _job_failed(msg: WorkerFailed) -> JobFailed:
    failed = JobFailed(msg.message, operator=msg.operator, subtask=msg.subtask,
                       position=msg.position)
    failed.__cause__ = load_exception(msg.cause, msg.cause_text)
    return failed
