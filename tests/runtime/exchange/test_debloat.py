"""In-flight data bounded by time (``runtime/exchange/debloat.py``, after FLIP-183).

The estimator is driven by hand, with the times it is given (no clock, no
timing asserts): a consumer's measured rate sizes the real channels and
writers that feed it, within the configured bounds. A writer that sends a
buffer in a consumer's smaller batches keeps the rest where a barrier that
overtakes meanwhile finds it. And in a real job, a consumer slowed by a
sleep gets smaller channels than configured, the job's output unchanged.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import eddyflow as ef
from eddyflow.runtime.exchange.channel import Channel, InputGate, Interrupt
from eddyflow.runtime.exchange.debloat import (
    PERIOD,
    QUEUE_SHARE,
    TURNS,
    Debloater,
    Ewma,
    InFlightBounds,
)
from eddyflow.runtime.exchange.events import Barrier, RecordBatch
from eddyflow.runtime.exchange.writers import ForwardWriter, KeyGroupWriter, RebalanceWriter
from eddyflow.runtime.job import JobRunner

BOUNDS = InFlightBounds(target=1.0, batch_size=1024, batches=8)


def test_a_fast_consumer_keeps_the_configured_sizes() -> None:
    sizes = BOUNDS.input_sizes(rate=1e6, own_rate=2e6, channels=4)
    assert (sizes.capacity, sizes.batch) == (8 * 1024, 1024)


def test_a_slow_consumer_gets_what_it_drains_within_the_target() -> None:
    # 1,000 records a second over two channels: each may queue its share of
    # the target's worth, less the two batches a channel holds beyond it.
    sizes = BOUNDS.input_sizes(rate=1000.0, own_rate=2000.0, channels=2)
    share = 1000 * QUEUE_SHARE / 2
    assert sizes.batch == int(2000 / TURNS)  # one turn of the consumer
    assert sizes.capacity == int(share - 2 * sizes.batch)
    assert sizes.capacity + 2 * sizes.batch <= share
    # Twice the channels: each gets half.
    assert BOUNDS.input_sizes(1000.0, 2000.0, 4).capacity < sizes.capacity


def test_sizes_stay_within_floor_and_bounds() -> None:
    crawl = BOUNDS.input_sizes(rate=0.01, own_rate=0.01, channels=1)
    assert crawl.batch == 1
    assert crawl.capacity == 2 * BOUNDS.initial_batch  # the floor, never 0
    small = InFlightBounds(target=1.0, batch_size=4, batches=1)
    assert small.input_sizes(1e9, 1e9, 1).capacity == 4
    assert small.turn(1e9) == 4


def test_ewma_is_a_plain_mean_until_it_has_enough_samples() -> None:
    e = Ewma(weight=0.25)
    assert e.add(4.0) == 4.0
    assert e.add(2.0) == 3.0
    assert e.add(0.0) == 2.0
    assert e.add(2.0) == 2.0
    assert e.add(6.0) == 3.0  # weight 0.25 from the fourth sample on
    with pytest.raises(ValueError):
        Ewma(weight=0.0)


def _fed(n_channels: int, batch_size: int = 1024) -> tuple[list[Channel], RebalanceWriter]:
    chans = [Channel(f"up->down[{i}]", 8 * batch_size) for i in range(n_channels)]
    return chans, RebalanceWriter(chans, batch_size, "up -> down", start=0)


def test_the_debloater_sizes_its_inputs_and_their_writer() -> None:
    chans, writer = _fed(2)
    # Each channel feeds its own consumer; this one reads channel 1.
    mine = chans[1]
    d = Debloater(BOUNDS, [(mine, writer, 1)])
    first = BOUNDS.initial()
    assert (mine.capacity, writer.batch_size) == (first.capacity, first.batch)
    assert chans[0].capacity == 8 * 1024  # another consumer's: untouched

    # (Times are binary fractions: the sizes come out exact.)
    # The first batch sizes the batches only (its own time is no rate).
    t = 1 / 128
    d.worked(8, began=0.0, now=t)  # 1,024 records a second
    assert writer.batch_size == int(1024 / TURNS)
    assert mine.capacity == first.capacity  # two such batches hold less
    # Then a period in which it took 512 records, its operators busy 0.5 s
    # and the task idle (nothing queued) for 0.375 s of 0.875 s: 1,024
    # records a second while it had input.
    d.idle(0.375)
    d.worked(512, began=t + 0.375, now=t + 0.875)
    assert d.sizes.capacity == int(1024 * QUEUE_SHARE) - 2 * d.sizes.batch
    assert mine.capacity == d.sizes.capacity
    assert writer.batch_size == d.sizes.batch == int(1024 / TURNS)

    # The consumer speeds up a thousandfold: the sizes grow back to the
    # configured ones, never past them.
    t += 0.875
    for _ in range(40):
        d.worked(1_024_000, began=t, now=t + 1.0)
        t += 1.0
    assert (mine.capacity, writer.batch_size) == (8 * 1024, 1024)


def test_samples_wait_for_a_period() -> None:
    chans, writer = _fed(1)
    d = Debloater(BOUNDS, [(chans[0], writer, 0)])
    d.worked(10, began=0.0, now=0.01)
    before = d.sizes
    d.worked(10, began=0.01, now=0.01 + PERIOD / 8)  # counted, not yet sampled
    assert d.sizes == before
    assert d.cost.samples == 0


def test_a_writer_fills_to_the_smallest_batch_its_consumers_ask_for() -> None:
    chans = [Channel(f"c{i}", 64) for i in range(3)]
    w = KeyGroupWriter(chans, 16, "a -> b", key_fn=lambda r: r, max_parallelism=8)
    w.limit_batch(2, 4)
    assert w.batch_size == 4
    w.limit_batch(1, 2)
    assert w.batch_size == 2
    w.limit_batch(2, 1000)  # never past the configured size
    assert w.batch_size == 2
    w.limit_batch(1, 16)
    assert w.batch_size == 16


def test_a_source_reads_no_more_than_its_writers_hand_on() -> None:
    chans, writer = _fed(2)
    consumer = Debloater(BOUNDS, [(chans[0], writer, 0), (chans[1], writer, 1)])
    source = Debloater(BOUNDS, outputs=[writer])
    consumer.worked(10, began=0.0, now=0.01)  # 1 ms a record: batches of 10
    source.worked(1000, began=0.0, now=0.001)  # a fast chain: a turn holds 1024
    assert source.read_size == 2 * writer.batch_size  # a batch for each channel


def _drain(ch: Channel) -> list[Any]:
    gate = InputGate([ch])
    out = []
    while (got := gate.poll()) is not None:
        out.append(got[1])
    return out


async def test_a_buffer_goes_in_the_consumers_batches() -> None:
    ch = Channel("a->b", 100)
    w = ForwardWriter([ch], 8, "a -> b")
    w.limit_batch(0, 3)
    w.add(list(range(7)), None, list(range(100, 107)))
    await w.flush()
    got = _drain(ch)
    assert [list(b) for b in got] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [b.timestamps for b in got] == [[100, 101, 102], [103, 104, 105], [106]]


async def test_a_barrier_overtaking_a_split_buffer_takes_its_rest_along() -> None:
    # The channel takes two parts; the third waits for space when the
    # barrier comes (an unaligned one, say): it overtakes what is queued,
    # the part being put and the parts not yet sent, and nothing of the
    # buffer may come after it.
    ch = Channel("a->b", 4)
    w = ForwardWriter([ch], 8, "a -> b")
    w.limit_batch(0, 2)
    barrier = Barrier(1, 0.0, unaligned=True)
    overtaken: dict[str, list[RecordBatch]] = {}

    async def on_interrupt() -> None:
        overtaken.update(w.overtake(barrier))

    w.interrupt = Interrupt(on_interrupt)
    w.add(list(range(7)), None)
    sending = asyncio.ensure_future(w.send_full())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not sending.done()  # waiting for space
    w.interrupt.request()
    await asyncio.wait_for(sending, 5.0)
    assert [r for b in overtaken[ch.key] for r in b] == list(range(7))
    got = _drain(ch)
    assert got[0] is barrier
    assert [r for b in got[1:] for r in b] == list(range(7))
    assert not w.buffers[0]


class _SlowSink(ef.Sink):
    """Sleeps a millisecond a record: at most 1,000 records a second."""

    def __init__(self) -> None:
        self.results: list[Any] = []

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        sink = self

        class W(ef.SinkWriter):
            def write(self, records: list[Any]) -> None:
                time.sleep(0.001 * len(records))
                sink.results.extend(records)

        return W()


@pytest.mark.parametrize("target", [1.0, None])
def test_a_slow_consumer_gets_smaller_channels_than_configured(target: float | None) -> None:
    batch, capacity = 64, 32  # 2,048 records a channel by count: two seconds here
    env = ef.StreamEnvironment(parallelism=1, batch_size=batch, channel_capacity=capacity,
                               chaining=False, buffer_debloat_target=target)
    sink = _SlowSink()
    env.from_collection(range(400)).sink_to(sink)
    runner = JobRunner(env.plan(), env._runtime_config(), "debloat")
    asyncio.run(runner.run())
    assert sorted(sink.results) == list(range(400))
    (_, _, chans), = runner.exchange_channels
    (ch,) = chans.values()
    (source,) = [t for t in runner.tasks if t.reader is not None]
    (writer,) = source.writers
    if target is None:
        assert (ch.capacity, writer.batch_size) == (capacity * batch, batch)
    else:
        # At most 1,000 records a second: a second's worth is less than the
        # configured bound, and a turn's worth less than a batch.
        assert ch.capacity is not None and ch.capacity <= 1000 * QUEUE_SHARE
        assert writer.batch_size <= 1000 / TURNS
