"""One loop-head ``Task`` driven by hand, event by event.

The job-level loop tests leave the interleaving of barriers, end-of-input
and records to the scheduler. The orders below are the rare ones that the
SIGKILL loop soak (``test_sigkill_loop.py``) hit only now and then; here
they are put on the head's channels one by one, so they happen every time.

The head under test is subtask 0 of a parallel loop, as in the SIGKILL job::

    log[0] --------------> head[0] --> (loop body, read by the test)
    again[0] -- back-edge --^  ^
    again[1] -- back-edge -----+   (fed by head subtask 1's side of the loop)

The coordinator is a stand-in that records acknowledgements; the channels,
gate, writer, loop tracker and checkpoint storage are the real ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.runtime.checkpointing.barriers import CheckpointMode
from eddyflow.runtime.checkpointing.messages import AcknowledgeCheckpoint, TriggerCheckpoint
from eddyflow.runtime.exchange.channel import Channel, InputGate
from eddyflow.runtime.exchange.events import END_OF_INPUT, Barrier, RecordBatch
from eddyflow.runtime.exchange.feedback import FeedbackChannel
from eddyflow.runtime.exchange.loops import LoopTracker
from eddyflow.runtime.exchange.writers import ForwardWriter
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.runtime.operators.stateless import IterationHeadSpec
from eddyflow.runtime.task import Task
from eddyflow.state.memory import MemoryStateBackend

LOG, BACK_OWN, BACK_OTHER = 0, 1, 2  # the head's input channels
TIMEOUT = 10.0  # every step takes microseconds; a hang fails the test instead


class _Plan:
    max_parallelism = 128


class StubCoordinator:
    """What a task asks of the coordinator, with one periodic checkpoint in
    flight (``pending``) and the acknowledgements recorded."""

    mode = CheckpointMode.EXACTLY_ONCE
    synchronous = False
    may_go_unaligned = False
    plan = _Plan()
    run_id = "test"
    all_finished = False

    def __init__(self, storage: CheckpointStorage) -> None:
        self.storage = storage
        self.pending: TriggerCheckpoint | None = None
        self.acks: dict[int, AcknowledgeCheckpoint] = {}
        self.finished = False

    def pending_trigger(self) -> TriggerCheckpoint | None:
        return self.pending

    async def acknowledge(self, ack: AcknowledgeCheckpoint) -> None:
        self.acks[ack.checkpoint_id] = ack

    def is_aborted(self, checkpoint_id: int) -> bool:
        return False

    def task_finished(self, task: Task) -> None:
        self.finished = True


class Head:
    """Head subtask 0 with its three inputs and its output to the loop body."""

    def __init__(self, tmp: Path) -> None:
        self.channels: list[Channel] = [
            Channel("log->head[0]", 1024),
            FeedbackChannel("again->head[0->0]"),
            FeedbackChannel("again->head[1->0]"),
        ]
        self.gate = InputGate(self.channels)
        self.loop = LoopTracker(0)
        self.loop.open_entries = 1  # log->head[0]; log[1] enters at head[1], ended here
        self.loop.heads.append(self.gate)
        self.body = Channel("head->step[0]", 1 << 20)
        writer = ForwardWriter([self.body], 1024, "head -> step")
        writer.tracker = self.loop
        self.coordinator = StubCoordinator(CheckpointStorage(tmp))
        self.writes: list[asyncio.Task[None]] = []
        ctx = OperatorContext("head", 0, 2, 128, MemoryStateBackend())
        self.task = Task(
            "head", 0, 2, [IterationHeadSpec().instantiate(ctx)], [writer],
            gate=self.gate, coordinator=self.coordinator,  # type: ignore[arg-type]
            regular_inputs=[True, False, False],
            input_loops=[None, self.loop, self.loop], head_of=self.loop,
            input_entries=[self.loop, None, None], spawn=self._spawn,
        )

    def _spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            await fn()

        self.writes.append(asyncio.ensure_future(run()))

    async def feed_back(self, channel: int, records: list[Any]) -> None:
        """Records coming round the loop: in flight until the head took them."""
        self.loop.in_flight += len(records)
        await self.channels[channel].put(RecordBatch(records))

    def body_items(self) -> list[Any]:
        out = []
        while len(self.body):
            out.append(self.body.pop())
        return out


async def settle() -> None:
    """Let the head run until it waits for input again."""
    for _ in range(20):
        await asyncio.sleep(0)


async def _early_barrier_then_input_ends(tmp: Path) -> None:
    head = Head(tmp)
    barrier = Barrier(7, 0.0)
    # Checkpoint 7 was triggered while log[0] had finished but head[0] had
    # not yet read its end-of-input, so head[0] was not asked to start 7:
    # it gets barrier 7 from its regular input's end (pending_barrier).
    head.coordinator.pending = TriggerCheckpoint(7, 0.0)
    await head.channels[LOG].put(RecordBatch([("a", 1)]))
    running = asyncio.ensure_future(head.task.run())
    await settle()
    assert head.body_items() == [[("a", 1)]]
    # Head subtask 1 started 7 in the loop; it comes round on again[1] before
    # head[0] has snapshotted 7: early, so that back-edge waits.
    await head.channels[BACK_OTHER].put(barrier)
    await head.feed_back(BACK_OTHER, [("b", 2)])  # after the barrier: not in 7
    await settle()
    assert head.gate.blocked[BACK_OTHER]
    assert not head.body_items()

    # log[0]'s end-of-input: head[0] starts 7 in its loop itself, logging only
    # again[0], whose barrier has not come back.
    await head.channels[LOG].put(END_OF_INPUT)
    await settle()
    # The snapshot is taken and the barrier forwarded: what waited behind the
    # early barrier on again[1] is after 7 and flows again, behind barrier 7.
    assert not head.gate.blocked[BACK_OTHER], (
        "the back-edge on which barrier 7 came back early is still blocked after "
        "head[0]'s snapshot 7 - it would never be read again")
    assert head.body_items() == [barrier, [("b", 2)]]

    await head.feed_back(BACK_OWN, [("c", 3)])  # logged: before 7 came back
    await head.channels[BACK_OWN].put(barrier)
    await settle()
    assert head.body_items() == [[("c", 3)]]
    await asyncio.gather(*head.writes)
    assert 7 in head.coordinator.acks
    backedge = head.coordinator.acks[7].state.operators["head"].backedge
    assert backedge is not None and backedge.records == 1

    # The loop is empty: head[0] ends it and drains both back-edges to their end.
    # The body takes what head[0] sent it, ("a", 1), ("b", 2) and ("c", 3),
    # and feeds nothing back.
    assert head.loop.in_flight == 3
    head.loop.consumed(3)
    await settle()
    assert head.body_items() == [END_OF_INPUT]
    await head.channels[BACK_OWN].put(END_OF_INPUT)
    await head.channels[BACK_OTHER].put(END_OF_INPUT)
    await asyncio.wait_for(running, TIMEOUT)
    assert head.task.finished and head.coordinator.finished


def test_back_edge_blocked_by_an_early_barrier_is_read_after_the_heads_own_snapshot(
        tmp_path: Path) -> None:
    """A head whose regular input has ended snapshots at its own trigger, not
    at alignment; the back-edges on which that barrier came back early must
    be unblocked then too (they were left blocked, and the head never
    finished: the SIGKILL loop soak's hang)."""
    asyncio.run(asyncio.wait_for(_early_barrier_then_input_ends(tmp_path), TIMEOUT))
