"""The barrier handler on its own, without a task: its states (idle,
aligning, logging) and what it asks of its host in each mode."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from eddyflow.errors import StateSerializationError
from eddyflow.runtime.checkpointing.barriers import BarrierHandler, CheckpointMode, HandlerState
from eddyflow.runtime.checkpointing.channel_state import ChannelStateLog
from eddyflow.runtime.exchange.channel import Channel, InputGate
from eddyflow.runtime.exchange.events import Barrier, RecordBatch


class Host:
    """Records the checkpoints asked for; opens the log as a task does."""

    def __init__(self) -> None:
        self.handler: BarrierHandler | None = None
        self.taken: list[dict[str, Any]] = []
        self.written: list[ChannelStateLog] = []
        self.spawned: list[Callable[[], Awaitable[None]]] = []

    async def take_checkpoint(self, barrier: Barrier, *, alignment: float, unaligned: bool,
                              waiting: set[int], taken: dict[int, list[RecordBatch]]) -> None:
        self.taken.append(dict(id=barrier.checkpoint_id, unaligned=unaligned,
                               waiting=set(waiting), taken=taken))
        if waiting or taken:
            assert self.handler is not None

            async def write(log: ChannelStateLog) -> None:
                self.written.append(log)

            self.handler.open_log(barrier.checkpoint_id, waiting, [], taken, write)
            self.handler.close_log_if_complete()

    def spawn_write(self, write: Callable[[], Awaitable[None]]) -> None:
        self.spawned.append(write)

    def state_error(self, exc: StateSerializationError) -> BaseException:
        return exc


def make(mode: CheckpointMode, n: int = 2) -> tuple[BarrierHandler, InputGate, Host]:
    gate = InputGate([Channel(f"in{i}", 100) for i in range(n)])
    host = Host()
    handler = BarrierHandler(gate, [True] * n, mode, host, owner="op")
    host.handler = handler
    return handler, gate, host


def run(coro: Awaitable[None]) -> None:
    async def go() -> None:
        await coro
    asyncio.run(go())


def test_aligned_blocks_each_input_until_the_barrier_is_on_all() -> None:
    handler, gate, host = make(CheckpointMode.EXACTLY_ONCE)
    run(handler.on_barrier(0, Barrier(1, 0.0)))
    assert handler.state is HandlerState.ALIGNING
    assert gate.blocked == [True, False] and host.taken == []
    run(handler.on_barrier(1, Barrier(1, 0.0)))
    assert handler.state is HandlerState.IDLE
    assert gate.blocked == [False, False]
    assert [(t["id"], t["unaligned"]) for t in host.taken] == [(1, False)]
    assert handler.saw(1)


def test_at_least_once_never_blocks() -> None:
    handler, gate, _host = make(CheckpointMode.AT_LEAST_ONCE)
    run(handler.on_barrier(0, Barrier(1, 0.0)))
    assert handler.state is HandlerState.ALIGNING and gate.blocked == [False, False]


def test_end_of_input_counts_as_aligned() -> None:
    handler, _gate, host = make(CheckpointMode.EXACTLY_ONCE)
    run(handler.on_barrier(0, Barrier(1, 0.0)))
    run(handler.on_end(1))
    assert [t["id"] for t in host.taken] == [1] and handler.state is HandlerState.IDLE


def test_a_newer_barrier_cancels_the_alignment_of_an_aborted_one() -> None:
    handler, _gate, host = make(CheckpointMode.EXACTLY_ONCE)
    run(handler.on_barrier(0, Barrier(1, 0.0)))
    run(handler.on_barrier(1, Barrier(2, 0.0)))
    assert handler.state is HandlerState.ALIGNING and handler.align is not None
    assert handler.align.barrier.checkpoint_id == 2
    run(handler.on_barrier(0, Barrier(1, 0.0)))  # late: ignored
    run(handler.on_barrier(0, Barrier(2, 0.0)))
    assert [t["id"] for t in host.taken] == [2]


def test_abort_while_aligning_unblocks() -> None:
    handler, gate, host = make(CheckpointMode.EXACTLY_ONCE)
    run(handler.on_barrier(0, Barrier(1, 0.0)))
    handler.abort(1)
    assert handler.state is HandlerState.IDLE and gate.blocked == [False, False]
    run(handler.on_barrier(1, Barrier(1, 0.0)))  # late
    assert host.taken == []


def test_unaligned_snapshots_at_the_first_barrier_and_logs_the_others() -> None:
    handler, gate, host = make(CheckpointMode.UNALIGNED, n=3)
    run(handler.on_barrier(1, Barrier(1, 0.0, unaligned=True)))
    assert host.taken == [dict(id=1, unaligned=True, waiting={0, 2}, taken={})]
    assert handler.state is HandlerState.LOGGING and gate.blocked == [False] * 3
    batch = RecordBatch([{"n": 1}, {"n": 2}])
    handler.on_records(0, batch)
    for r in batch:
        r["n"] += 10  # the consumer changes them in place after the log
    handler.on_records(1, RecordBatch([{"n": 99}]))  # after its barrier: not logged
    run(handler.on_barrier(0, Barrier(1, 0.0, unaligned=True)))
    assert handler.state is HandlerState.LOGGING
    run(handler.on_end(2))  # the end counts as the barrier
    assert handler.state is HandlerState.IDLE and len(host.spawned) == 1
    run(host.spawned[0]())
    (log,) = host.written
    assert [pickle.loads(b)[0] for b in log.records[0]] == [[{"n": 1}, {"n": 2}]]
    assert set(log.records) == {0} and log.count == 2


def test_switch_while_aligning_takes_queued_barriers_with_what_is_before_them() -> None:
    handler, gate, host = make(CheckpointMode.EXACTLY_ONCE, n=3)
    run(handler.on_barrier(0, Barrier(1, 0.0)))
    ch1 = gate.channels[1]
    ch1.append(RecordBatch([1, 2]))
    ch1.append(Barrier(1, 0.0))
    ch1.append(RecordBatch([3]))
    run(handler.on_switch(1))
    (t,) = host.taken
    assert t["unaligned"] and t["waiting"] == {2} and t["taken"] == {1: [[1, 2]]}
    # The barrier left the queue; the records before and after it stay.
    assert list(ch1._items) == [[1, 2], [3]]
    assert gate.blocked == [False] * 3 and handler.state is HandlerState.LOGGING


def test_switch_before_the_barrier_arrives_takes_it_unaligned_when_it_does() -> None:
    handler, gate, host = make(CheckpointMode.EXACTLY_ONCE)
    run(handler.on_switch(1))
    assert handler.state is HandlerState.IDLE and 1 in handler.switched
    run(handler.on_barrier(0, Barrier(1, 0.0)))
    assert host.taken[0]["unaligned"] and host.taken[0]["waiting"] == {1}
    assert gate.blocked == [False, False]


def test_back_edge_barrier_before_the_snapshot_blocks_that_back_edge() -> None:
    gate = InputGate([Channel("in", 100), Channel("back", None)])
    host = Host()
    handler = BarrierHandler(gate, [True, False], CheckpointMode.EXACTLY_ONCE, host)
    handler.on_back_edge_barrier(1, Barrier(3, 0.0))
    assert gate.blocked == [False, True] and handler.early == {3: {1}}
    assert handler.take_early(3) == ([], {1})  # logged: none; released: the early one


@pytest.mark.parametrize("mode", list(CheckpointMode))
def test_modes_are_the_api_strings(mode: CheckpointMode) -> None:
    assert CheckpointMode(str(mode)) is mode and mode == mode.value
