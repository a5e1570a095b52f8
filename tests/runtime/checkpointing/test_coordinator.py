"""The checkpoint coordinator on its own: fake participants that implement
:class:`CheckpointParticipant` and answer with messages, a real checkpoint
folder, no task and no channel."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

import eddyflow as ef
from eddyflow.checkpoint.metadata import SubtaskState, read_checkpoint
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.runtime.checkpointing.barriers import CheckpointMode
from eddyflow.runtime.checkpointing.coordinator import CheckpointConfig, CheckpointCoordinator
from eddyflow.runtime.checkpointing.messages import (
    AbortCheckpoint,
    AcknowledgeCheckpoint,
    CheckpointStats,
    DeclineCheckpoint,
    NotifyCheckpointComplete,
    SubtaskCheckpointStats,
    SubtaskId,
    SwitchToUnaligned,
    TaskStateSnapshot,
    TriggerCheckpoint,
)
from eddyflow.runtime.checkpointing.participant import CheckpointParticipant

WAIT = 5.0  # every step takes milliseconds; a hang fails the test instead


class News:
    """Told whenever a participant hears from the coordinator: what a test
    waits on."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def arrived(self) -> None:
        self._event.set()
        self._event = anyio.Event()

    async def until(self, cond: Callable[[], bool]) -> None:
        with anyio.fail_after(WAIT):
            while not cond():
                await self._event.wait()


@dataclass
class FakeParticipant:
    """Records what the coordinator sends; acknowledges only when told to."""

    name: str
    subtask_id: SubtaskId
    news: News = field(default_factory=News)
    finished: bool = False
    triggers: list[TriggerCheckpoint] = field(default_factory=list)
    final: list[TriggerCheckpoint] = field(default_factory=list)
    switches: list[SwitchToUnaligned] = field(default_factory=list)
    completed: list[NotifyCheckpointComplete] = field(default_factory=list)
    aborted: list[AbortCheckpoint] = field(default_factory=list)
    described: int = 0

    def trigger_checkpoint(self, trigger: TriggerCheckpoint) -> bool:
        if self.finished:
            return False
        self.triggers.append(trigger)
        self.news.arrived()
        return True

    def acknowledge_final_state(self, trigger: TriggerCheckpoint) -> None:
        self.final.append(trigger)

    def saw_checkpoint(self, checkpoint_id: int) -> bool:
        return any(t.checkpoint_id >= checkpoint_id for t in self.triggers + self.final)

    def switch_to_unaligned(self, switch: SwitchToUnaligned) -> None:
        self.switches.append(switch)
        self.news.arrived()

    def notify_checkpoint_complete(self, complete: NotifyCheckpointComplete) -> None:
        self.completed.append(complete)

    def abort_checkpoint(self, abort: AbortCheckpoint) -> None:
        self.aborted.append(abort)
        self.news.arrived()

    def describe_state(self) -> str:
        self.described += 1
        return f"{self.name}: waiting"


class Committed(ef.Sink):
    """A sink that records what the coordinator commits."""

    def __init__(self) -> None:
        self.commits: list[list[Any]] = []

    def create_writer(self, subtask: int, parallelism: int) -> Any:
        raise AssertionError("no task runs here")

    def commit(self, committables: list[Any]) -> None:
        self.commits.append(committables)


@dataclass
class Job:
    coordinator: CheckpointCoordinator
    participants: list[FakeParticipant]
    sink: Committed
    uids: list[str]  # source, map, sink
    storage: CheckpointStorage | None
    news: News

    def ack(self, p: FakeParticipant, n: int, **parts: SubtaskState) -> AcknowledgeCheckpoint:
        return AcknowledgeCheckpoint(n, p.subtask_id, TaskStateSnapshot(parts),
                                     SubtaskCheckpointStats(0.01, 0.002, 0.03))


def make_job(tmp: Path | None, *, timeout: float = 30.0, interval: float = 0.01,
             aligned_timeout: float | None = None) -> Job:
    """A job of a source, a map and a sink, acknowledged by three participants
    (the coordinator does not care which operators a participant chains)."""
    env = ef.StreamEnvironment(parallelism=1)
    sink = Committed()
    env.from_collection([1, 2]).map(lambda x: x).sink_to(sink)
    plan = env.plan()
    uids = [n.uid for n in plan.graph.nodes]
    config = None if tmp is None else CheckpointConfig(
        interval, str(tmp), timeout=timeout, aligned_timeout=aligned_timeout)
    coordinator = CheckpointCoordinator(config, "job", plan, {uids[-1]: sink})
    news = News()
    participants = [FakeParticipant(f"chain{c}", SubtaskId(c, 0), news) for c in range(3)]
    coordinator.attach(participants)
    return Job(coordinator, participants, sink, uids, coordinator.storage, news)


def test_the_fake_is_a_participant() -> None:
    participant: CheckpointParticipant = FakeParticipant("x", SubtaskId(0, 0))
    assert participant.subtask_id == SubtaskId(0, 0)


async def test_trigger_then_every_acknowledgement_completes(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    src, op, snk = job.participants
    source_uid, map_uid, sink_uid = job.uids
    async with anyio.create_task_group() as tg:
        tg.start_soon(job.coordinator.run_periodic)
        await job.news.until(lambda: all(p.triggers for p in job.participants))
        trigger = src.triggers[0]
        assert trigger.checkpoint_id == 1 and trigger.options.mode is CheckpointMode.EXACTLY_ONCE
        assert not trigger.options.unaligned
        assert job.coordinator.pending_trigger() == trigger
        await job.coordinator.acknowledge(job.ack(src, 1, **{
            source_uid: SubtaskState(is_source=True, position=2)}))
        await job.coordinator.acknowledge(job.ack(op, 1, **{
            map_uid: SubtaskState(watermark=math.inf)}))
        assert job.coordinator.completed == [] and not snk.completed
        await job.coordinator.acknowledge(job.ack(snk, 1, **{
            sink_uid: SubtaskState(committables=((0, "txn-1"),), watermark=12)}))
        job.coordinator.stop()
        tg.cancel_scope.cancel()
    assert job.coordinator.completed == [1]
    assert job.sink.commits == [[(0, "txn-1")]]
    assert all(p.completed == [NotifyCheckpointComplete(1)] for p in job.participants)
    assert job.coordinator.stats == [CheckpointStats(
        1, job.coordinator.stats[0].duration, 0.01, 0, 0)]
    assert job.storage is not None
    meta = read_checkpoint(job.storage, 1)
    assert meta.operators[source_uid].subtasks[0].position == 2
    assert meta.operators[map_uid].subtasks[0].watermark == math.inf
    assert meta.operators[sink_uid].subtasks[0].watermark == 12
    assert meta.operators[sink_uid].subtasks[0].committables == ([0, "txn-1"],)  # JSON
    assert set(meta.tasks) == {"chain0[0]", "chain1[0]", "chain2[0]"}


async def test_a_decline_aborts_the_checkpoint(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    src, op, _ = job.participants
    async with anyio.create_task_group() as tg:
        tg.start_soon(job.coordinator.run_periodic)
        await job.news.until(lambda: bool(src.triggers))
        await job.coordinator.acknowledge(job.ack(src, 1))
        job.coordinator.decline(DeclineCheckpoint(1, op.subtask_id, "snapshot abandoned"))
        job.coordinator.stop()
        tg.cancel_scope.cancel()
    assert job.coordinator.aborted == [1] and job.coordinator.completed == []
    for p in job.participants:
        (abort,) = p.aborted
        assert abort.checkpoint_id == 1
        assert abort.reason == "declined by subtask 0 of chain 1: snapshot abandoned"
    assert job.storage is not None
    assert not await anyio.Path(job.storage.layout.checkpoint_dir(1)).exists()
    assert job.sink.commits == [] and job.coordinator.is_aborted(1)


async def test_a_checkpoint_not_complete_in_time_is_aborted(tmp_path: Path) -> None:
    job = make_job(tmp_path, timeout=0.05, interval=0.01)
    src, op, snk = job.participants
    async with anyio.create_task_group() as tg:
        tg.start_soon(job.coordinator.run_periodic)
        await job.news.until(lambda: bool(src.triggers))
        await job.coordinator.acknowledge(job.ack(src, 1))
        await job.news.until(lambda: bool(op.aborted))
        job.coordinator.stop()
        tg.cancel_scope.cancel()
    assert op.aborted[0] == AbortCheckpoint(1, "not complete after 0.05 s")
    # The report names the tasks that did not acknowledge, and only them.
    assert (src.described, op.described, snk.described) == (0, 1, 1)
    assert 1 in job.coordinator.aborted and 1 not in job.coordinator.completed


async def test_a_late_acknowledgement_after_the_abort_is_ignored(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    src, op, snk = job.participants
    async with anyio.create_task_group() as tg:
        tg.start_soon(job.coordinator.run_periodic)
        await job.news.until(lambda: bool(src.triggers))
        job.coordinator.decline(DeclineCheckpoint(1, src.subtask_id, "gone"))
        for p in job.participants:  # late: every one of them
            await job.coordinator.acknowledge(job.ack(p, 1))
        assert job.coordinator.completed == [] and job.sink.commits == []
        assert not any(p.completed for p in job.participants)
        # The next checkpoint is not disturbed by them.
        await job.news.until(lambda: any(t.checkpoint_id == 2 for t in snk.triggers))
        for p in job.participants:
            await job.coordinator.acknowledge(job.ack(p, 2))
        job.coordinator.stop()
        tg.cancel_scope.cancel()
    assert job.coordinator.aborted == [1] and job.coordinator.completed == [2]
    assert [c.checkpoint_id for c in op.completed] == [2]


async def test_after_the_aligned_timeout_the_missing_tasks_switch(tmp_path: Path) -> None:
    job = make_job(tmp_path, aligned_timeout=0.02)
    src, op, snk = job.participants
    async with anyio.create_task_group() as tg:
        tg.start_soon(job.coordinator.run_periodic)
        await job.news.until(lambda: bool(src.triggers))
        await job.coordinator.acknowledge(job.ack(src, 1))
        await job.news.until(lambda: bool(op.switches))
        pending = job.coordinator.pending_trigger()
        assert pending is not None and pending.options.unaligned
        for p in (op, snk):
            await job.coordinator.acknowledge(job.ack(p, 1))
        job.coordinator.stop()
        tg.cancel_scope.cancel()
    assert (src.switches, op.switches, snk.switches) == (
        [], [SwitchToUnaligned(1)], [SwitchToUnaligned(1)])
    assert job.coordinator.completed == [1] and job.coordinator.stats[0].switched


async def test_when_every_task_finished_the_final_checkpoint_follows(tmp_path: Path) -> None:
    job = make_job(tmp_path, interval=3600)  # no periodic checkpoint gets in the way
    for p in job.participants:
        p.finished = True
        job.coordinator.task_finished(p)
    assert job.coordinator.all_finished
    finals = [p.final for p in job.participants]
    assert all(len(f) == 1 and f[0].checkpoint_id == 1 for f in finals)
    for p in job.participants:
        await job.coordinator.acknowledge(job.ack(p, 1))
    assert job.coordinator.completed == [1]
    assert job.storage is not None and read_checkpoint(job.storage, 1).final


async def test_without_checkpointing_the_final_commit_still_runs() -> None:
    job = make_job(None)
    for p in job.participants:
        p.finished = True
        job.coordinator.task_finished(p)
    *_, snk = job.participants
    for p in job.participants:
        parts = {job.uids[-1]: SubtaskState(committables=((0, "t"),))} if p is snk else {}
        await job.coordinator.acknowledge(job.ack(p, 1, **parts))
    assert job.sink.commits == [[(0, "t")]] and job.coordinator.stats == []
