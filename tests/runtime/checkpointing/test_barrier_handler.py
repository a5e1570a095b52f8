"""The barrier handler on its own, fed by a real input gate the way a task's
loop feeds it: alignment over two channels, unaligned barriers that
overtake, the switch after the aligned timeout, and the cancellation of a
checkpoint (an abort, or a newer barrier). ``tests/runtime/checkpointing/test_barriers.py``
checks its states call by call; these check what a task downstream sees."""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from eddyflow.errors import StateSerializationError
from eddyflow.runtime.checkpointing.barriers import BarrierHandler, CheckpointMode, HandlerState
from eddyflow.runtime.checkpointing.channel_state import ChannelStateLog
from eddyflow.runtime.exchange.channel import Channel, InputGate
from eddyflow.runtime.exchange.events import END_OF_INPUT, Barrier, EndOfInput, RecordBatch
from eddyflow.runtime.exchange.remote import CreditedChannel, Link


class Loop:
    """A task's loop around the handler: reads the gate, hands the handler
    what comes, processes records in order, and takes checkpoints as the
    handler asks (logging the inputs it names, as ``Snapshotting`` does)."""

    def __init__(self, mode: CheckpointMode, n: int = 2,
                 channels: list[Channel] | None = None) -> None:
        self.gate = InputGate(channels or [Channel(f"in{i}", 100) for i in range(n)])
        n = len(self.gate.channels)
        self.handler = BarrierHandler(self.gate, [True] * n, mode, self, owner="op")
        self.processed: list[Any] = []
        #: Per checkpoint taken: how it was taken and what was processed before.
        self.snapshots: list[dict[str, Any]] = []
        self.logs: list[ChannelStateLog] = []
        self.writes: list[Callable[[], Awaitable[None]]] = []

    # CheckpointHost
    async def take_checkpoint(self, barrier: Barrier, *, alignment: float, unaligned: bool,
                              waiting: set[int], taken: dict[int, list[RecordBatch]]) -> None:
        self.snapshots.append(dict(id=barrier.checkpoint_id, unaligned=unaligned,
                                   before=list(self.processed), waiting=set(waiting),
                                   taken={i: [list(b) for b in bs] for i, bs in taken.items()}))
        if waiting or taken:

            async def write(log: ChannelStateLog) -> None:
                self.logs.append(log)

            self.handler.open_log(barrier.checkpoint_id, waiting, [], taken, write)
            self.handler.close_log_if_complete()

    def spawn_write(self, write: Callable[[], Awaitable[None]]) -> None:
        self.writes.append(write)

    def state_error(self, exc: StateSerializationError) -> BaseException:
        return exc

    async def drain(self) -> None:
        """Read until nothing is readable (blocked channels wait)."""
        while (got := self.gate.poll()) is not None:
            i, item = got
            if type(item) is Barrier:
                await self.handler.on_barrier(i, item)
            elif type(item) is EndOfInput:
                await self.handler.on_end(i)
            else:
                self.handler.on_records(i, item)
                self.processed.extend(item)


def run(coro: Awaitable[None]) -> None:
    async def go() -> None:
        await coro

    asyncio.run(go())


def logged(log: ChannelStateLog, channel: int) -> list[Any]:
    return [r for blob in log.records.get(channel, []) for r in pickle.loads(blob)[0]]


def test_alignment_over_two_channels_holds_back_what_follows_the_barrier() -> None:
    task = Loop(CheckpointMode.EXACTLY_ONCE)
    a, b = task.gate.channels
    a.append(RecordBatch(["a1"]))
    a.append(Barrier(1, 0.0))
    a.append(RecordBatch(["a2"]))  # after barrier 1: not in checkpoint 1's stage
    b.append(RecordBatch(["b1"]))
    b.append(RecordBatch(["b2"]))
    b.append(Barrier(1, 0.0))
    run(task.drain())
    (snap,) = task.snapshots
    assert snap["id"] == 1 and not snap["unaligned"]
    assert sorted(snap["before"]) == ["a1", "b1", "b2"]  # a2 waited for the alignment
    assert task.processed[-1] == "a2" and task.gate.blocked == [False, False]
    assert task.handler.state is HandlerState.IDLE and task.handler.saw(1)


def test_at_least_once_lets_records_after_the_barrier_into_the_snapshot() -> None:
    task = Loop(CheckpointMode.AT_LEAST_ONCE)
    a, b = task.gate.channels
    a.append(Barrier(1, 0.0))
    a.append(RecordBatch(["a2"]))
    b.append(RecordBatch(["b1"]))
    run(task.drain())
    assert task.handler.aligning and task.snapshots == []
    b.append(Barrier(1, 0.0))
    run(task.drain())
    assert sorted(task.snapshots[0]["before"]) == ["a2", "b1"]  # a2 came through: at least once


def test_an_unaligned_barrier_overtakes_and_the_other_input_is_logged() -> None:
    task = Loop(CheckpointMode.UNALIGNED)
    a, b = task.gate.channels
    a.append(RecordBatch(["a1"]))
    a.append(RecordBatch(["a2"]))
    # Upstream overtakes its records in flight on a: they are its channel
    # state (captured by its writer), not this task's.
    overtaken = a.overtake(Barrier(1, 0.0, unaligned=True))
    assert [list(x) for x in overtaken] == [["a1"], ["a2"]]
    b.append(RecordBatch(["b1"]))
    run(task.drain())
    (snap,) = task.snapshots
    assert snap["unaligned"] and snap["before"] == [] and snap["waiting"] == {1}
    assert task.handler.state is HandlerState.LOGGING
    assert sorted(task.processed) == ["a1", "a2", "b1"]  # nothing was blocked
    b.overtake(Barrier(1, 0.0, unaligned=True))
    b.append(RecordBatch(["b2"]))  # after the barrier on b: not logged
    run(task.drain())
    assert task.handler.state is HandlerState.IDLE and len(task.writes) == 1
    run(task.writes[0]())
    (log,) = task.logs
    assert logged(log, 1) == ["b1"] and 0 not in log.records


def test_an_input_that_ended_before_the_barrier_is_channel_state_at_once() -> None:
    task = Loop(CheckpointMode.UNALIGNED)
    a, b = task.gate.channels
    b.append(RecordBatch(["b1"]))
    b.append(RecordBatch(["b2"]))
    b.append(END_OF_INPUT)  # its producer ended: it never sends barrier 1
    a.overtake(Barrier(1, 0.0, unaligned=True))
    run(task.drain())
    (snap,) = task.snapshots
    # Not waited for behind b's records: they are in flight, and still processed.
    assert snap["waiting"] == set() and snap["taken"] == {1: [["b1"], ["b2"]]}
    assert task.processed == ["b1", "b2"] and task.handler.ended == [False, True]
    run(task.writes[0]())
    (log,) = task.logs
    assert logged(log, 1) == ["b1", "b2"]


def test_a_priority_barrier_from_another_process_leaves_its_overtaken_records_here() -> None:
    """A producer in another worker has sent its records: its barrier
    overtakes them in this task's queue, and they are this task's channel
    state for that channel, after what it logged there since its snapshot."""
    here, there = socket.socketpair()
    remote = CreditedChannel("remote", 100, Link(here, "test"), 0)
    local = Channel("local", 100)
    task = Loop(CheckpointMode.UNALIGNED, channels=[local, remote])
    try:
        local.overtake(Barrier(1, 0.0, unaligned=True))
        remote.append(RecordBatch(["r1"]))
        run(task.drain())  # snapshot at the local barrier; r1 is logged
        remote.append(RecordBatch(["r2"]))
        remote.append(RecordBatch(["r3"]))
        remote.overtake(Barrier(1, 0.0, unaligned=True))  # as the link's reader does
        run(task.drain())
        assert task.processed == ["r1", "r2", "r3"]
        assert task.handler.state is HandlerState.IDLE
        run(task.writes[0]())
        (log,) = task.logs
        assert logged(log, 1) == ["r1", "r2", "r3"]
        assert remote.take_overtaken(1) == []  # handed over once
    finally:
        here.close()
        there.close()


def test_the_aligned_timeout_switches_an_alignment_to_unaligned() -> None:
    task = Loop(CheckpointMode.EXACTLY_ONCE)
    a, b = task.gate.channels
    a.append(Barrier(1, 0.0))
    a.append(RecordBatch(["a2"]))
    b.append(RecordBatch(["b1"]))
    run(task.drain())
    assert task.handler.aligning and task.gate.blocked == [True, False]
    b.append(RecordBatch(["b2"]))  # back-pressured upstream: the barrier is late
    b.append(Barrier(1, 0.0))
    b.append(RecordBatch(["b3"]))
    # The coordinator's switch arrives; the task acts on it at its next turn.
    task.handler.request_switch(1)
    assert task.handler.has_switch_requests
    requests = task.handler.take_switch_requests()
    assert requests == [1] and not task.handler.has_switch_requests
    for n in requests:
        run(task.handler.on_switch(n))
    (snap,) = task.snapshots
    # b2, in front of the queued barrier, becomes channel state; a2 and b3
    # are after the checkpoint and flow at once.
    assert snap["unaligned"] and snap["taken"] == {1: [["b2"]]} and snap["waiting"] == set()
    assert task.gate.blocked == [False, False] and len(task.writes) == 1
    run(task.drain())
    assert sorted(task.processed) == ["a2", "b1", "b2", "b3"]
    run(task.writes[0]())
    assert logged(task.logs[0], 1) == ["b2"]


def test_a_switch_reaches_a_source_before_it_injects() -> None:
    mode = CheckpointMode.EXACTLY_ONCE
    handler = BarrierHandler(None, [], mode, Loop(mode))  # a source's: no inputs
    handler.mark_switched(3)
    assert handler.is_switched(3)
    handler.on_injected(3)
    assert not handler.is_switched(3) and handler.saw(3) and not handler.saw(4)


def test_an_abort_cancels_the_alignment_and_its_late_barrier_is_ignored() -> None:
    task = Loop(CheckpointMode.EXACTLY_ONCE)
    a, b = task.gate.channels
    a.append(Barrier(1, 0.0))
    a.append(RecordBatch(["a2"]))
    run(task.drain())
    assert task.gate.blocked == [True, False]
    task.handler.abort(1)  # the coordinator's abort of checkpoint 1
    assert task.gate.blocked == [False, False] and task.handler.state is HandlerState.IDLE
    b.append(Barrier(1, 0.0))  # late
    run(task.drain())
    assert task.snapshots == [] and task.processed == ["a2"]
    # Checkpoint 2 aligns as usual.
    a.append(Barrier(2, 0.0))
    b.append(Barrier(2, 0.0))
    run(task.drain())
    assert [s["id"] for s in task.snapshots] == [2]


def test_a_newer_barrier_cancels_the_checkpoint_being_aligned() -> None:
    task = Loop(CheckpointMode.EXACTLY_ONCE)
    a, b = task.gate.channels
    a.append(Barrier(1, 0.0))
    b.append(Barrier(2, 0.0))  # 1 was aborted upstream: b never sends it
    run(task.drain())
    assert task.handler.aligning and task.gate.blocked == [False, True]
    a.append(Barrier(2, 0.0))
    run(task.drain())
    assert [s["id"] for s in task.snapshots] == [2] and task.gate.blocked == [False, False]


def test_an_abort_while_logging_drops_the_log() -> None:
    task = Loop(CheckpointMode.UNALIGNED)
    a, b = task.gate.channels
    a.overtake(Barrier(1, 0.0, unaligned=True))
    b.append(RecordBatch(["b1"]))
    run(task.drain())
    assert task.handler.state is HandlerState.LOGGING
    task.handler.abort(1)
    assert task.handler.state is HandlerState.IDLE
    b.overtake(Barrier(1, 0.0, unaligned=True))  # late: nothing to complete
    run(task.drain())
    assert task.writes == [] and len(task.snapshots) == 1
