"""A worker process's side of a job: its tasks, their links, its coordinator stand-in.

The worker builds the attempt's tasks from the same plan as the caller (it
was forked with it), keeps those :class:`~eddyflow.runtime.workers.placement.Placement`
puts on it, and replaces each channel that crosses to another worker by its
end of a remote channel (``runtime/exchange/remote.py``). Its tasks talk to
a :class:`WorkerCoordinator`, which forwards their acknowledgements to the
caller's coordinator and mirrors what the tasks ask of it; each task writes
its own state to the checkpoint storage, as in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import Any

import anyio

from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.checkpoint.writer import WriterProcess
from eddyflow.connectors.asynciter import AsyncIterableSource, RelayedReader
from eddyflow.connectors.sink import ListSink
from eddyflow.connectors.source import Source, SourceReader
from eddyflow.errors import JobFailed
from eddyflow.graph.plan import ExchangeSpec, ExecutionPlan
from eddyflow.runtime.checkpointing.barriers import CheckpointMode
from eddyflow.runtime.checkpointing.coordinator import CheckpointConfig, CheckpointCoordinator
from eddyflow.runtime.checkpointing.messages import (
    AbortCheckpoint,
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    NotifyCheckpointComplete,
    SubtaskId,
    SwitchToUnaligned,
    TriggerCheckpoint,
)
from eddyflow.runtime.checkpointing.participant import CheckpointParticipant
from eddyflow.runtime.exchange.channel import Channel
from eddyflow.runtime.exchange.remote import (
    DATA,
    PRIORITY,
    CreditedChannel,
    Link,
    RemoteOutChannel,
)
from eddyflow.runtime.job import JobRunner, RuntimeConfig
from eddyflow.runtime.recovery.reinjection import reinject_backedge_logs, reinject_channel_state
from eddyflow.runtime.recovery.restore import RestoredCheckpoint
from eddyflow.runtime.task import Task
from eddyflow.runtime.workers.placement import Placement
from eddyflow.runtime.workers.process import WorkerSockets
from eddyflow.runtime.workers.protocol import (
    Acknowledged,
    AcknowledgeFinal,
    Counters,
    EndLoop,
    ProbeLoop,
    Shutdown,
    SourceCredit,
    SourceEnd,
    SourceRecords,
    TaskFinished,
    ToTask,
    WorkerDone,
    WorkerFailed,
    dump_exception,
    load_exception,
)
from eddyflow.runtime.workers.termination import LoopReports

__all__ = ["WorkerCoordinator", "WorkerJob", "WorkerRunner"]


#: Seconds a failed write waits for the caller's abort of its checkpoint.
ABORT_WAIT = 5.0


class WorkerCoordinator(CheckpointCoordinator):
    """What a worker's tasks see of the coordinator: the caller's, over the
    control link. Acknowledgements, declines and finished tasks go to the
    caller; the checkpoint in flight, aborts and the end of the job are
    mirrored from its messages. It never writes metadata nor removes files."""

    def __init__(self, control: Link, config: CheckpointConfig | None, job_name: str,
                 plan: ExecutionPlan, run_id: str, sinks: dict[str, ListSink]) -> None:
        super().__init__(None, job_name, plan, {})
        self.config = config
        self.mode = CheckpointMode(config.mode) if config else CheckpointMode.EXACTLY_ONCE
        self.storage = CheckpointStorage(config.directory) if config else None
        self.run_id = run_id
        self.control = control
        self.list_sinks = sinks
        self.job_finished = False
        self.triggered: list[int] = []
        self._in_flight: TriggerCheckpoint | None = None
        self._resumed = anyio.Event()
        self._resumed.set()
        self._ended: dict[int, anyio.Event] = {}

    async def run_periodic(self) -> None:
        """The caller triggers checkpoints."""

    @property
    def all_finished(self) -> bool:
        """Every task of the job (in any worker) has finished."""
        return self.job_finished

    def on_trigger(self, trigger: TriggerCheckpoint) -> None:
        """The caller triggered ``trigger``."""
        self._in_flight = trigger
        self.triggered.append(trigger.checkpoint_id)
        if self.synchronous and self._resumed.is_set():
            self._resumed = anyio.Event()

    def on_end(self, checkpoint_id: int, aborted: bool) -> None:
        """Checkpoint ``checkpoint_id`` completed (or was aborted)."""
        if aborted and checkpoint_id not in self.aborted:
            self.aborted.append(checkpoint_id)
        self._ended.setdefault(checkpoint_id, anyio.Event()).set()
        t = self._in_flight
        if t is not None and t.checkpoint_id == checkpoint_id:
            self._in_flight = None
        self._resumed.set()

    async def aborted_meanwhile(self, checkpoint_id: int) -> bool:
        """The caller removes an aborted checkpoint's folder before its
        abort reaches this worker: a write that failed meanwhile waits for
        the word (a real write failure fails the task after the wait)."""
        if checkpoint_id not in self.aborted:
            with anyio.move_on_after(ABORT_WAIT):
                await self._ended.setdefault(checkpoint_id, anyio.Event()).wait()
        return checkpoint_id in self.aborted

    def pending_trigger(self) -> TriggerCheckpoint | None:
        """The trigger of the checkpoint in flight, as the caller sent it."""
        return self._in_flight

    async def wait_resumed(self) -> None:
        """Synchronous mode: until the checkpoint in flight is done."""
        await self._resumed.wait()

    def task_finished(self, task: CheckpointParticipant) -> None:
        """Tell the caller, with the latest checkpoint the task took part in."""
        seen = max((n for n in self.triggered if task.saw_checkpoint(n)), default=0)
        self.control.send(TaskFinished(task.subtask_id, seen))

    async def acknowledge(self, ack: AcknowledgeCheckpoint) -> None:
        """Send ``ack`` with the records the sinks prepared meanwhile."""
        self.control.send(Acknowledged(ack, self._staged()))

    def decline(self, decline: DeclineCheckpoint) -> None:
        """Send ``decline``."""
        self.control.send(Acknowledged(decline, self._staged()))

    def _staged(self) -> dict[str, dict[tuple[int, str], list[Any]]]:
        staged = {uid: s.take_staged() for uid, s in self.list_sinks.items()}
        return {uid: part for uid, part in staged.items() if part}

    def stop(self) -> None:
        """Nothing to stop: the caller triggers."""

    def end_run(self) -> None:
        """The caller's coordinator ends the run."""

    def sweep_aborted(self) -> None:
        """The caller's coordinator keeps the folder."""

    def collect_shared_garbage(self) -> None:
        """The caller's coordinator keeps the shared files."""


class WorkerRunner(JobRunner):
    """The tasks of one worker, as a :class:`JobRunner` that builds only
    those placed here and links the channels that leave the worker."""

    def __init__(self, plan: ExecutionPlan, config: RuntimeConfig, job_name: str, *,
                 coordinator: WorkerCoordinator, restore: RestoredCheckpoint | None,
                 placement: Placement, worker: int, peers: dict[int, Link]) -> None:
        super().__init__(plan, config, job_name, restore=restore, coordinator=coordinator)
        self.worker_coordinator = coordinator
        self.placement = placement
        self.worker = worker
        self.peers = peers
        self.remote_in: dict[int, Channel] = {}
        self.remote_out: dict[int, RemoteOutChannel] = {}
        #: Readers of the async-iterable sources placed here, by source uid:
        #: the calling process reads the iterators and sends their records.
        self.relays: dict[str, RelayedReader] = {}
        self._next_channel = 0

    def _source_reader(self, uid: str, source: Source, subtask: int,
                       parallelism: int) -> SourceReader:
        if isinstance(source, AsyncIterableSource):
            reader = RelayedReader(functools.partial(self._credit, uid))
            self.relays[uid] = reader
            return reader
        return super()._source_reader(uid, source, subtask, parallelism)

    def _credit(self, uid: str, records: int) -> None:
        self.worker_coordinator.control.send(SourceCredit(uid, records))

    def relay(self, msg: SourceRecords | SourceEnd) -> None:
        """Hand what the caller read from an async iterable to its reader."""
        reader = self.relays[msg.uid]
        if isinstance(msg, SourceRecords):
            reader.push(msg.records)
            return
        reader.finish(None if msg.error_text is None
                      else load_exception(msg.error, msg.error_text))

    def _runs_here(self, chain_index: int, subtask: int) -> bool:
        return self.placement.worker_of[(chain_index, subtask)] == self.worker

    def _place_channels(self, x: ExchangeSpec, channels: dict[tuple[int, int], Channel]) -> None:
        # Channel ids: the order of the plan's exchanges and their channels,
        # the same in every worker.
        where = self.placement.worker_of
        for (i, j), ch in sorted(channels.items()):
            cid = self._next_channel
            self._next_channel += 1
            up, down = where[(x.source_chain, i)], where[(x.target_chain, j)]
            if up == down:
                continue
            if up == self.worker:
                out = RemoteOutChannel(ch.name, ch.capacity, self.peers[down], cid)
                out.key = ch.key
                channels[(i, j)] = self.remote_out[cid] = out
            elif down == self.worker and x.back_edge:
                # A back-edge into a loop head here: its producer's end is
                # unbounded (it never waits for credit), and this end is the
                # feedback channel itself, which always accepts, spilling to
                # disk past its memory bound (exchange/feedback.py).
                self.remote_in[cid] = ch
            elif down == self.worker:
                inp = CreditedChannel(ch.name, ch.capacity, self.peers[up], cid)
                inp.key = ch.key
                channels[(i, j)] = self.remote_in[cid] = inp

    async def start_writer(self) -> WriterProcess | None:
        """This worker's helper process for its checkpoint writes, as one
        process has its own (``checkpoint/writer.py``): on the worker's
        event loop the files' creation and fsyncs would stall its tasks."""
        return await self._start_writer()

    async def stop_writer(self, writer: WriterProcess | None) -> None:
        """Let ``writer`` finish and leave (every write has landed)."""
        if writer is None:
            return
        storage = self.worker_coordinator.storage
        assert storage is not None
        storage.writer = None
        await writer.aclose()

    def reinject_channel_state(self) -> None:
        """Restore of an unaligned checkpoint: the records in flight go back
        into the channels this worker produces into, before anything new
        (as in one process: ``recovery/reinjection.py``). Into a channel to
        another worker they are sent, counted against its credit, so they
        reach the consumer ahead of the producer's new records."""
        if self.restore is None:
            return
        where = self.placement.worker_of

        def produces_here(x: ExchangeSpec, upstream: int) -> bool:
            return where[(x.source_chain, upstream)] == self.worker

        reinject_channel_state(self.restore, self.plan, self.exchange_channels, self.loops,
                               self._writer, produces_here)

    async def read_peer(self, link: Link) -> None:
        """Feed this worker's ends of the channels ``link`` carries."""
        remote_in, remote_out = self.remote_in, self.remote_out
        while True:
            try:
                kind, cid, payload = await link.recv()
            except EOFError:
                return  # the peer is done, or dead: the caller sees which
            if kind == DATA:
                # Within credit: the channel has room (see exchange/remote.py).
                remote_in[cid].append(payload)
            elif kind == PRIORITY:
                remote_in[cid].overtake(payload)  # an unaligned barrier
            else:
                remote_out[cid].release(payload)


class WorkerJob:
    """One worker process's run of an attempt (``main`` is its entry point)."""

    def __init__(self, plan: ExecutionPlan, config: RuntimeConfig, job_name: str,
                 checkpointing: CheckpointConfig | None, restore: RestoredCheckpoint | None,
                 placement: Placement, run_id: str) -> None:
        self.plan = plan
        self.config = config
        self.job_name = job_name
        self.checkpointing = checkpointing
        self.restore = restore
        self.placement = placement
        self.run_id = run_id

    def main(self, index: int, sockets: WorkerSockets) -> int:
        """Run worker ``index`` to its end; its exit code."""
        return asyncio.run(self._serve(index, sockets))

    async def _serve(self, index: int, sockets: WorkerSockets) -> int:
        control = Link(sockets.control, f"control of worker {index}")
        peers = {w: Link(s, f"worker {index} <-> worker {w}") for w, s in sockets.peers.items()}
        await control.open()
        for link in peers.values():
            await link.open()
        sinks = {n.uid: n.payload.sink for n in self.plan.graph.nodes
                 if isinstance(getattr(n.payload, "sink", None), ListSink)}
        for sink in sinks.values():
            sink.rename_transactions()
        coordinator = WorkerCoordinator(control, self.checkpointing, self.job_name, self.plan,
                                        self.run_id, sinks)
        runner = WorkerRunner(self.plan, self.config, self.job_name, coordinator=coordinator,
                              restore=self.restore, placement=self.placement, worker=index,
                              peers=peers)
        started = time.monotonic()
        code = 0
        writer = None
        try:
            writer = await runner.start_writer()
            await self._run(runner, control, peers)
        except BaseException as exc:
            control.send(_failure(runner, exc))
            code = 1
        finally:
            for t in runner.tasks:
                try:
                    t.close()
                except Exception as exc:
                    if code == 0:
                        control.send(_failure(runner, exc))
                        code = 1
            with anyio.CancelScope(shield=True):
                await runner.stop_writer(writer)
        if code == 0:
            _send_counters(runner, control)
            result = runner.result(time.monotonic() - started)
            state = {uid: {name: dict(table.items()) for name, table in tables.items()}
                     for uid, tables in result.final_state.items()}
            control.send(WorkerDone(result.records_in, result.records_out, state))
        # Leave once the caller has read this and closed its end: a socket
        # closed with unread input (the caller's messages since the failure)
        # resets the connection, and the caller would lose this last message.
        with contextlib.suppress(EOFError):
            while True:
                await control.recv()
        await control.aclose()
        for link in peers.values():
            link.close()
        return code

    async def _run(self, runner: WorkerRunner, control: Link, peers: dict[int, Link]) -> None:
        tasks = runner.build()
        runner.reinject_channel_state()
        by_id: dict[SubtaskId, Task] = {t.subtask_id: t for t in tasks}
        # Loops end when the caller finds them empty in every worker.
        loops = LoopReports(runner.loops, control.send)
        if runner.restore is not None:
            # Before any task or link reader runs: logged records first.
            await reinject_backedge_logs(runner.restore, tasks)
        coordinator = runner.worker_coordinator
        shutdown = anyio.Event()
        acknowledged: set[tuple[SubtaskId, int]] = set()

        def acknowledge_final(task: Task, trigger: TriggerCheckpoint) -> None:
            n = trigger.checkpoint_id
            if (task.subtask_id, n) in acknowledged or task.saw_checkpoint(n):
                return
            acknowledged.add((task.subtask_id, n))
            task.acknowledge_final_state(trigger)

        async def read_control() -> None:
            while True:
                msg = await control.recv()  # EOFError: the caller is gone
                if isinstance(msg, Shutdown):
                    shutdown.set()
                    return
                if isinstance(msg, ProbeLoop):
                    loops.on_probe(msg)
                    continue
                if isinstance(msg, EndLoop):
                    loops.on_end(msg)
                    continue
                if isinstance(msg, AcknowledgeFinal):
                    coordinator.job_finished |= msg.all_finished
                    acknowledge_final(by_id[msg.subtask], msg.trigger)
                    continue
                if isinstance(msg, SourceRecords | SourceEnd):
                    runner.relay(msg)
                    continue
                assert isinstance(msg, ToTask)
                task, m = by_id[msg.subtask], msg.message
                if isinstance(m, TriggerCheckpoint):
                    coordinator.on_trigger(m)
                    if not task.trigger_checkpoint(m):
                        acknowledge_final(task, m)
                elif isinstance(m, SwitchToUnaligned):
                    task.switch_to_unaligned(m)
                elif isinstance(m, NotifyCheckpointComplete):
                    coordinator.on_end(m.checkpoint_id, aborted=False)
                    task.notify_checkpoint_complete(m)
                elif isinstance(m, AbortCheckpoint):
                    coordinator.on_end(m.checkpoint_id, aborted=True)
                    task.abort_checkpoint(m)

        try:
            async with anyio.create_task_group() as outer:
                runner.spawn_into(outer.start_soon)
                outer.start_soon(read_control, name="control")
                for w, link in peers.items():
                    outer.start_soon(runner.read_peer, link, name=f"peer-{w}")
                outer.start_soon(_report_counters, runner, control, name="counters")
                async with anyio.create_task_group() as tg:
                    for t in tasks:
                        tg.start_soon(t.run, name=f"{t.name}[{t.subtask}]")
                await shutdown.wait()
                outer.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            failed = runner.failure_of(group)
            raise failed from failed.__cause__


#: Seconds between a worker's reports of its tasks' counters (the caller's
#: metrics sample them; its display updates every second by default).
COUNTERS_INTERVAL = 0.25


async def _report_counters(runner: JobRunner, control: Link) -> None:
    while True:
        await anyio.sleep(COUNTERS_INTERVAL)
        _send_counters(runner, control)


def _send_counters(runner: JobRunner, control: Link) -> None:
    for t in runner.tasks:
        queued = capacity = 0
        if t.gate is not None:
            for ch in t.gate.channels:
                if ch.capacity is not None:
                    queued += min(ch.records, ch.capacity)
                    capacity += ch.capacity
        control.send(Counters(t.subtask_id, t.records_read,
                              tuple((op.uid, op.records_in, op.records_out)
                                    for op in t.operators), queued, capacity))


def _failure(runner: JobRunner, exc: BaseException) -> WorkerFailed:
    """``exc`` as the message that fails the job in the caller."""
    if isinstance(exc, JobFailed):
        cause = exc.__cause__ or exc
        message, operator, subtask, position = str(exc), exc.operator, exc.subtask, exc.position
    else:
        cause = exc
        message = f"job '{runner.job_name}' failed: {type(exc).__name__}: {exc}"
        operator = subtask = position = None
    return WorkerFailed(message, operator, subtask, position, *dump_exception(cause))
