"""The hand-off of unaligned checkpoints: a priority barrier overtakes what a
channel queues, what a writer has not sent and what a waiting put holds;
a waiting put can be interrupted to take part in a checkpoint."""

from __future__ import annotations

import asyncio

from eddyflow.runtime.exchange.channel import Channel, InputGate, Interrupt
from eddyflow.runtime.exchange.events import Barrier, RecordBatch, Watermark
from eddyflow.runtime.exchange.writers import ForwardWriter


def test_a_priority_item_goes_first_behind_earlier_priority_items() -> None:
    ch = Channel("c", 100)
    gate = InputGate([ch])
    ch.append(RecordBatch([1, 2]))
    ch.append(Watermark(5.0))
    ch.append(RecordBatch([3]))
    assert ch.overtake(Barrier(1, 0.0, unaligned=True)) == [[1, 2], [3]]
    assert ch.overtake(Barrier(2, 0.0, unaligned=True)) == [[1, 2], [3]]
    got = [gate.poll() for _ in range(5)]
    assert [item for _, item in got if item is not None] == [
        Barrier(1, 0.0, unaligned=True), Barrier(2, 0.0, unaligned=True),
        [1, 2], Watermark(5.0), [3]]


def test_a_priority_item_is_read_from_a_blocked_channel_first() -> None:
    a, b = Channel("a", 100), Channel("b", 100)
    gate = InputGate([a, b])
    a.append(RecordBatch([1]))
    b.append(RecordBatch([2]))
    gate.block(1)
    b.overtake(Barrier(3, 0.0, unaligned=True))
    assert gate.poll() == (1, Barrier(3, 0.0, unaligned=True))
    assert gate.poll() == (0, [1])
    assert gate.poll() is None  # b stays blocked for its records


def test_take_before_removes_a_queued_barrier_and_returns_what_was_in_front() -> None:
    ch = Channel("c", 100)
    ch.append(RecordBatch([1]))
    ch.append(Barrier(4, 0.0))
    ch.append(RecordBatch([2]))
    assert ch.take_before(lambda e: type(e) is Barrier and e.checkpoint_id == 5) is None
    assert ch.take_before(lambda e: type(e) is Barrier and e.checkpoint_id == 4) == [[1]]
    assert list(ch._items) == [[1], [2]] and ch.records == 2


def test_an_interrupted_put_takes_part_and_its_batch_is_overtaken() -> None:
    async def go() -> None:
        ch = Channel("c", 2)
        InputGate([ch])
        writer = ForwardWriter([ch], 2, "a -> b")
        captured: list[list[RecordBatch]] = []

        async def handler() -> None:
            captured.append(writer.overtake(Barrier(1, 0.0, unaligned=True))["c"])

        interrupt = Interrupt(handler)
        writer.interrupt = interrupt
        writer.add([1, 2], None)
        await writer.send_full()  # fills the channel
        writer.add([3, 4], None)
        put = asyncio.ensure_future(writer.send_full())  # waits for space
        await asyncio.sleep(0.01)
        assert not put.done()
        writer.add([5], None)  # an unsent buffer
        interrupt.request()
        await asyncio.wait_for(put, 1.0)  # delivered over capacity: it returns
        # Everything this writer had in flight was overtaken, oldest first.
        assert captured == [[[1, 2], [3, 4], [5]]]
        assert list(ch._items) == [Barrier(1, 0.0, unaligned=True), [1, 2], [3, 4], [5]]

    asyncio.run(go())


def test_an_aligned_barrier_held_up_is_replaced_by_the_overtaking_one() -> None:
    async def go() -> None:
        a, b = Channel("a", 1), Channel("b", 1)
        InputGate([a])
        InputGate([b])
        writer = ForwardWriter([a, b], 4, "x -> y")
        a.append(RecordBatch([1]))  # full: the aligned barrier waits on a
        aligned = Barrier(7, 0.0)

        async def handler() -> None:
            writer.overtake(Barrier(7, 0.0, unaligned=True), replacing=aligned)

        interrupt = Interrupt(handler)
        writer.interrupt = interrupt
        emit = asyncio.ensure_future(writer.emit_event(aligned))
        await asyncio.sleep(0.01)
        assert not emit.done()
        interrupt.request()
        await asyncio.wait_for(emit, 1.0)
        # Each channel holds the overtaking barrier once, and never the aligned one.
        assert list(a._items) == [Barrier(7, 0.0, unaligned=True), [1]]
        assert list(b._items) == [Barrier(7, 0.0, unaligned=True)]

    asyncio.run(go())


def test_a_put_whose_handler_ran_before_it_waited_still_gets_the_space() -> None:
    """A request made before the put waits runs the handler at once; the
    put then waits for space, and a record taken from the channel must
    wake it (the property suite's deep shape hung here once: the wake-up
    went to the future of the round the handler had cut short)."""
    async def main() -> list[str]:
        ch = Channel("c", 1)
        gate = InputGate([ch])
        calls: list[str] = []

        async def handler() -> None:
            calls.append("handled")

        interrupt = Interrupt(handler)
        ch.append(RecordBatch([0]))  # full
        interrupt.request()
        put = asyncio.ensure_future(ch.put(RecordBatch([1]), interrupt))
        for _ in range(3):
            await asyncio.sleep(0)
        assert calls == ["handled"] and not put.done()
        assert gate.poll() == (0, [0])  # space
        await asyncio.wait_for(put, 5.0)
        assert gate.poll() == (0, [1])
        # A request while it waits wakes it, runs the handler, and it waits on.
        ch.append(RecordBatch([2]))
        put = asyncio.ensure_future(ch.put(RecordBatch([3]), interrupt))
        await asyncio.sleep(0)
        interrupt.request()
        for _ in range(3):
            await asyncio.sleep(0)
        assert calls == ["handled", "handled"] and not put.done()
        assert gate.poll() == (0, [2])
        await asyncio.wait_for(put, 5.0)
        assert gate.poll() == (0, [3])
        return calls

    assert asyncio.run(main()) == ["handled", "handled"]
