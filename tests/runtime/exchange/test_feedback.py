"""Tests of the back-edge machinery of cyclic jobs (DESIGN.md §3):
``eddyflow.backedge.FeedbackChannel`` — the channel of a loop's back-edge
that always accepts and spills to disk past a memory bound — and the
back-edge log (``write_backedge_log`` / ``read_backedge_log``), the channel
state of a loop in a checkpoint.

The channel is checked against a plain FIFO model: whatever mix of batches
and in-band events (``Barrier``, ``END_OF_INPUT``) is put and popped, in any
interleaving, it comes out in order with each batch's span intact, while
``len`` counts everything queued (memory and disk), ``records`` the records
held in memory, and memory stays within its bound. ``put`` never waits,
however much is queued and whether or not anyone reads.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage
from eddyflow.runtime.checkpointing.backedge_log import (
    BackEdgeRecords,
    read_backedge_log,
    write_backedge_log,
)
from eddyflow.runtime.exchange.channel import InputGate
from eddyflow.runtime.exchange.events import END_OF_INPUT, Barrier, EndOfInput, RecordBatch
from eddyflow.runtime.exchange.feedback import FeedbackChannel

# -- helpers ---------------------------------------------------------------------


def batch(start: int, n: int, *, span: bool = True) -> RecordBatch:
    return RecordBatch([(start + i, f"r{start + i}") for i in range(n)],
                       (("src (subtask 1 of 1)", start, start + n),) if span else None)


def same(a: Any, b: Any) -> bool:
    """Items equal, including a batch's type and span."""
    if type(a) is not type(b):
        return False
    if type(a) is RecordBatch:
        return list(a) == list(b) and a.span == b.span
    return bool(a == b)


def memory_events(ch: FeedbackChannel) -> int:
    return sum(1 for x in ch._items if type(x) is not RecordBatch)


def check_accounting(ch: FeedbackChannel, model: list[Any], max_batch: int) -> None:
    assert len(ch) == len(model)
    # ``records`` counts what sits in memory, an event as one record.
    in_memory = sum(len(x) if type(x) is RecordBatch else 1 for x in ch._items)
    assert ch.records == in_memory
    # Memory is bounded: a batch goes to memory only below the bound (or
    # alone, coming back from disk); events never wait for disk to drain.
    assert ch.records <= ch.memory_records - 1 + max_batch + memory_events(ch)
    # Whenever something is on disk, something is in memory: a reader polling
    # the memory part (as the input gate does) never misses queued items.
    if len(ch):
        assert ch._items


# -- FIFO across memory and disk -------------------------------------------------


def test_spills_past_memory_bound_and_keeps_fifo_order(tmp_path: Path) -> None:
    async def go() -> None:
        ch = FeedbackChannel("fb", memory_records=10, spill_dir=str(tmp_path))
        gate = InputGate([ch])
        sent = [batch(i * 4, 4) for i in range(50)]  # 200 records, bound 10
        for b in sent:
            await ch.put(b)
        assert ch.spilled_batches > 0
        assert len(ch) == 50
        assert ch.records < 10 + 4
        got = []
        while (item := gate.poll()) is not None:
            got.append(item[1])
        assert len(got) == 50
        assert all(same(a, b) for a, b in zip(got, sent, strict=True))
        assert len(ch) == 0 and ch.records == 0
        ch.close()

    asyncio.run(go())


def test_everything_after_the_first_spill_goes_to_disk_until_drained() -> None:
    async def go() -> None:
        ch = FeedbackChannel("fb", memory_records=5)
        await ch.put(batch(0, 5))  # at the bound now
        await ch.put(batch(5, 1))  # spilled
        assert ch.spilled_batches == 1
        ch.pop()  # memory empties: the spilled batch comes back
        assert ch.records == 1 and len(ch) == 1
        # Disk is drained again: a small batch fits in memory.
        await ch.put(batch(6, 1))
        assert ch.spilled_batches == 1
        await ch.put(batch(7, 10))  # below the bound before the put: memory
        assert ch.spilled_batches == 1
        await ch.put(batch(17, 1))  # now above: disk
        assert ch.spilled_batches == 2
        # An event behind a spilled batch must wait behind it, so it spills too.
        await ch.put(Barrier(3, 1.0))
        assert ch.spilled_batches == 3
        order = [ch.pop() for _ in range(len(ch))]
        assert [type(x).__name__ for x in order] == [
            "RecordBatch", "RecordBatch", "RecordBatch", "RecordBatch", "Barrier"]
        assert [x[0][0] for x in order[:4]] == [5, 6, 7, 17]
        assert order[4] == Barrier(3, 1.0)
        ch.close()

    asyncio.run(go())


def test_events_keep_their_place_among_spilled_batches() -> None:
    async def go() -> None:
        ch = FeedbackChannel("fb", memory_records=3)
        items: list[Any] = []
        for i in range(20):
            items.append(batch(i * 2, 2))
            if i % 3 == 0:
                items.append(Barrier(i, float(i)))
        items.append(END_OF_INPUT)
        for x in items:
            await ch.put(x)
        assert ch.spilled_batches > 0
        got = [ch.pop() for _ in range(len(ch))]
        assert all(same(a, b) for a, b in zip(got, items, strict=True))
        assert type(got[-1]) is EndOfInput
        barriers = [x for x in got if type(x) is Barrier]
        assert [b.checkpoint_id for b in barriers] == [0, 3, 6, 9, 12, 15, 18]
        ch.close()

    asyncio.run(go())


def test_span_is_kept_and_none_span_stays_none() -> None:
    async def go() -> None:
        ch = FeedbackChannel("fb", memory_records=1)
        a = RecordBatch([1, 2], (("s", 0, 2), ("t", "x", "y")))
        b = RecordBatch([3], None)
        c = RecordBatch([4, 5, 6], (("s", 2, 5),))
        for x in (a, b, c):
            await ch.put(x)
        assert ch.spilled_batches == 2
        got = [ch.pop() for _ in range(3)]
        assert [g.span for g in got] == [(("s", 0, 2), ("t", "x", "y")), None, (("s", 2, 5),)]
        assert [list(g) for g in got] == [[1, 2], [3], [4, 5, 6]]
        assert all(type(g) is RecordBatch for g in got)
        ch.close()

    asyncio.run(go())


def test_disk_file_starts_over_once_drained() -> None:
    async def go() -> None:
        ch = FeedbackChannel("fb", memory_records=2)
        for round_ in range(5):
            for i in range(30):
                await ch.put(batch(round_ * 100 + i, 3))
            while len(ch):
                ch.pop()
            assert ch._disk is not None
            assert os.fstat(ch._disk.fileno()).st_size == 0, "the spill file grows forever"
        assert ch.spilled_batches == 5 * 29
        ch.close()

    asyncio.run(go())


# -- put never blocks ------------------------------------------------------------


def test_put_never_blocks_without_a_reader() -> None:
    async def go() -> None:
        ch = FeedbackChannel("fb", memory_records=64)
        InputGate([ch])  # attached, but nobody reads

        async def fill() -> None:
            for i in range(2000):
                await ch.put(batch(i * 8, 8))
                if i % 100 == 0:
                    await ch.put(Barrier(i, 0.0))

        await asyncio.wait_for(fill(), timeout=10)
        assert len(ch) == 2000 + 20
        assert ch.records < 64 + 8 + memory_events(ch)
        ch.close()

    asyncio.run(go())


def test_put_completes_without_yielding_to_the_event_loop() -> None:
    """``put`` on a back-edge must not even suspend: the loop tail can always
    hand its output over, whatever the head is doing."""
    ch = FeedbackChannel("fb", memory_records=4)
    for i in range(50):
        coro = ch.put(batch(i, 3))
        with pytest.raises(StopIteration):
            coro.send(None)  # runs to completion in one step
    assert len(ch) == 50
    ch.close()


def test_put_wakes_a_waiting_gate_in_memory_and_when_spilling() -> None:
    async def go() -> None:
        ch = FeedbackChannel("fb", memory_records=2)
        gate = InputGate([ch])
        waiter = asyncio.ensure_future(gate.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        await ch.put(batch(0, 5))
        await asyncio.wait_for(waiter, 1)
        await ch.put(batch(5, 5))  # spills
        assert ch.spilled_batches == 1
        assert gate.poll_ready()
        polled = [gate.poll() for _ in range(2)]
        assert [p[1][0][0] for p in polled if p is not None] == [0, 5]
        assert gate.poll() is None
        ch.close()

    asyncio.run(go())


# -- property: a FIFO model ------------------------------------------------------

Op = tuple[str, int]


@st.composite
def programs(draw: st.DrawFn) -> tuple[int, list[Op]]:
    memory = draw(st.integers(1, 20))
    ops = draw(st.lists(st.one_of(
        st.tuples(st.just("batch"), st.integers(1, 8)),
        st.tuples(st.just("batch0"), st.integers(1, 8)),  # batch without span
        st.tuples(st.just("barrier"), st.integers(1, 1000)),
        st.tuples(st.just("end"), st.just(0)),
        st.tuples(st.just("pop"), st.integers(1, 6)),
    ), max_size=120))
    return memory, ops


@settings(max_examples=200, deadline=None)
@given(programs())
def test_fifo_model(program: tuple[int, list[Op]]) -> None:
    memory, ops = program

    async def go() -> None:
        ch = FeedbackChannel("fb", memory_records=memory)
        gate = InputGate([ch])
        model: list[Any] = []
        popped: list[Any] = []
        expected: list[Any] = []
        counter = 0
        for kind, arg in ops:
            if kind in ("batch", "batch0"):
                item: Any = batch(counter, arg, span=kind == "batch")
                counter += arg
            elif kind == "barrier":
                item = Barrier(arg, float(arg))
            elif kind == "end":
                item = END_OF_INPUT
            else:
                for _ in range(arg):
                    got = gate.poll()
                    if not model:
                        assert got is None
                        break
                    assert got is not None and got[0] == 0
                    popped.append(got[1])
                    expected.append(model.pop(0))
                check_accounting(ch, model, 8)
                continue
            await ch.put(item)
            model.append(item)
            check_accounting(ch, model, 8)
        while (got := gate.poll()) is not None:
            popped.append(got[1])
            expected.append(model.pop(0))
        assert model == []
        assert len(popped) == len(expected)
        for a, b in zip(popped, expected, strict=True):
            assert same(a, b), (a, b)
        total = sum(len(x) for x in expected if type(x) is RecordBatch)
        if total > memory + 8 and not any(k == "pop" for k, _ in ops):
            assert ch.spilled_batches > 0
        ch.close()

    asyncio.run(go())


# -- close -----------------------------------------------------------------------


def test_close_releases_the_spill_file(tmp_path: Path) -> None:
    async def go() -> None:
        spill = tmp_path / "spill"
        spill.mkdir()
        ch = FeedbackChannel("fb", memory_records=1, spill_dir=str(spill))
        for i in range(10):
            await ch.put(batch(i, 2))
        f = ch._disk
        assert f is not None and not f.closed
        ch.close()
        assert f.closed
        assert ch._disk is None
        assert os.listdir(spill) == []
        ch.close()  # idempotent

    asyncio.run(go())


def test_close_without_spilling_is_harmless() -> None:
    async def go() -> None:
        ch = FeedbackChannel("fb", memory_records=100)
        await ch.put(batch(0, 3))
        ch.close()
        assert ch._disk is None
        assert ch.spilled_batches == 0

    asyncio.run(go())


# -- the back-edge log -----------------------------------------------------------


def test_backedge_log_round_trip(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path / "chk")
    storage.ensure()
    channels: dict[int, list[Any]] = {
        0: [(1, 2, 3), ("a", [1, 2]), {"k": (1, None)}, None, 3.5],
        2: [],
        5: list(range(1000)),
    }
    handle = asyncio.run(write_backedge_log(storage, "chk-4/head-1/backedge-log",
                                            BackEdgeRecords.of(channels)))
    assert handle.path == "chk-4/head-1/backedge-log"
    assert handle.size == os.path.getsize(tmp_path / "chk" / "chk-4" / "head-1" / "backedge-log")
    storage.verify_file(handle)  # the checksum matches the content
    back = read_backedge_log(storage.root, handle)
    assert back == channels
    assert set(back) == {0, 2, 5}
    assert back[0][0] == (1, 2, 3)  # tuples stay tuples (pickle, not JSON)


def test_backedge_log_holds_records_as_they_were_when_logged(tmp_path: Path) -> None:
    """The loop body changes records in place after the head logged them:
    the log (channel state of the checkpoint) must not see those changes."""
    from eddyflow.runtime.checkpointing.channel_state import ChannelStateLog

    async def never(_: ChannelStateLog) -> None:
        raise AssertionError("not written here")

    log = ChannelStateLog(3, {0}, never, back_edges=frozenset({0}), records={0: []})
    batch = [{"id": 1, "steps": 3}, {"id": 2, "steps": 1}]
    log.log(0, batch)
    for r in batch:
        r["steps"] -= 1  # what the loop body does next
    storage = CheckpointStorage(tmp_path)
    handle = asyncio.run(write_backedge_log(
        storage, "chk-3/h-0/backedge-log", BackEdgeRecords(log.records, log.count)))
    assert read_backedge_log(storage.root, handle) == {
        0: [{"id": 1, "steps": 3}, {"id": 2, "steps": 1}]}
    assert log.count == 2


def test_backedge_log_empty(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path)
    handle = asyncio.run(write_backedge_log(storage, "chk-1/h-0/backedge-log",
                                            BackEdgeRecords.of({})))
    assert read_backedge_log(storage.root, handle) == {}


def test_backedge_log_corrupted_is_reported(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path)
    handle = asyncio.run(write_backedge_log(storage, "chk-1/h-0/backedge-log",
                                            BackEdgeRecords.of({0: [1, 2]})))
    path = tmp_path / "chk-1" / "h-0" / "backedge-log"
    path.write_bytes(path.read_bytes()[:5])
    with pytest.raises(CheckpointCorrupted, match="back-edge log"):
        read_backedge_log(storage.root, handle)
    with pytest.raises(CheckpointCorrupted):
        storage.verify_file(handle)
    path.unlink()
    with pytest.raises(CheckpointCorrupted):
        read_backedge_log(storage.root, handle)


def test_a_record_that_cannot_be_spilled_is_named(tmp_path: Path) -> None:
    # Spilling pickles a batch: a record that cannot be pickled is named,
    # with the channel, as a StateSerializationError (no restart retries it).
    from eddyflow.errors import StateSerializationError

    class Local:
        pass

    async def go() -> None:
        ch = FeedbackChannel("tail->head[0->0]", memory_records=1, spill_dir=str(tmp_path))
        await ch.put(batch(0, 2))  # in memory
        with pytest.raises(StateSerializationError,
                           match=r"cannot spill record \(7, <.*Local object .*>\) on back-edge "
                                 r"channel 'tail->head\[0->0\]' to disk: Can't pickle local "
                                 r"object") as info:
            await ch.put(RecordBatch([(6, "ok"), (7, Local())]))
        assert not info.value.retryable
        ch.close()

    asyncio.run(go())
