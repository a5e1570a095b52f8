"""Back-pressure and latency of the batched channels.

A fast source feeding a slow sink must not pile records up in memory: every
channel holds at most ``channel_capacity`` batches, so what is queued is
bounded by the configuration, and the job still delivers every record. In the
other direction, a slow trickle of input must flow through an exchange
promptly instead of waiting for batches to fill.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import eddyflow as ef
from eddyflow.runtime.exchange.events import RecordBatch
from eddyflow.runtime.job import JobRunner


class QueueProbeSink(ef.Sink):
    """A slow sink that, at every write, measures what sits in all channels."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.runner: JobRunner | None = None
        self.count = 0
        self.writes = 0
        self.max_batches_per_channel = 0
        self.max_records_per_channel = 0
        self.max_total_records = 0
        self.max_batch_len = 0
        self.max_in_flight = 0

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        return _ProbeWriter(self)

    def channels(self) -> list[Any]:
        assert self.runner is not None
        return [ch for t in self.runner.tasks if t.gate is not None for ch in t.gate.channels]

    def sample(self) -> None:
        total = 0
        for ch in self.channels():
            self.max_batches_per_channel = max(self.max_batches_per_channel, len(ch))
            self.max_records_per_channel = max(self.max_records_per_channel, ch.records)
            for item in list(ch._items):
                if isinstance(item, RecordBatch):
                    total += len(item)
                    self.max_batch_len = max(self.max_batch_len, len(item))
        self.max_total_records = max(self.max_total_records, total)
        assert self.runner is not None
        read = sum(t.records_read for t in self.runner.tasks if t.reader is not None)
        self.max_in_flight = max(self.max_in_flight, read - self.count)


class _ProbeWriter(ef.SinkWriter):
    def __init__(self, sink: QueueProbeSink) -> None:
        self._sink = sink

    def write(self, records: list[Any]) -> None:
        sink = self._sink
        sink.count += len(records)
        sink.writes += 1
        # The sink is the first operator of its task: it gets channel batches.
        sink.max_batch_len = max(sink.max_batch_len, len(records))
        sink.sample()
        if sink.delay:
            time.sleep(sink.delay)  # a slow, blocking writer


def _run(env: ef.StreamEnvironment, sink: QueueProbeSink) -> tuple[JobRunner, ef.JobResult]:
    runner = JobRunner(env.plan(), env._runtime_config(), "backpressure")
    sink.runner = runner
    result = asyncio.run(runner.run())
    return runner, result


BATCH = 128
CAPACITY = 4


def test_fast_source_slow_sink_keeps_queues_bounded() -> None:
    # Four source subtasks feed one slow sink subtask: a batch costs the sink
    # 2 ms, so even working through its backlog for a whole turn (5 ms) it
    # takes fewer batches than the four producers add meanwhile, and its
    # channels fill up.
    n = 40_000
    # The bound by count alone, exactly (debloating sizes the sources' reads
    # by measured rates, so a writer's buffer may hold a short read's rest
    # when the next read tops it up: see test_debloat_job.py).
    env = ef.StreamEnvironment(parallelism=4, batch_size=BATCH, channel_capacity=CAPACITY,
                               chaining=False, buffer_debloat_target=None)
    sink = QueueProbeSink(delay=0.002)
    (env.from_collection(range(n)).set_parallelism(4)
        .map(lambda x: x + 1)
        .sink_to(sink).set_parallelism(1))
    _, result = _run(env, sink)

    n_channels = len(sink.channels())
    assert n_channels == 8  # 4 forward (source -> map) + 4 (map -> sink)
    assert sink.count == n
    assert result.records_in[result_sink_uid(result)] == n
    # Back-pressure really happened (otherwise this test shows nothing) ...
    bound = CAPACITY * BATCH  # records a channel holds before its producer waits
    assert sink.max_records_per_channel >= bound
    assert sink.max_total_records > bound
    # ... and it bounded what was queued: at most one batch beyond the bound.
    assert sink.max_batch_len <= BATCH
    assert sink.max_records_per_channel <= bound + BATCH - 1
    assert sink.max_total_records <= (bound + BATCH) * n_channels
    # The sources cannot run ahead of the sink by more than the channels,
    # the output buffers and one source batch per source subtask hold.
    assert sink.max_in_flight <= (CAPACITY + 1) * BATCH * n_channels + 4 * BATCH
    # Everything drained at the end.
    assert all(len(ch) == 0 for ch in sink.channels())


def result_sink_uid(result: ef.JobResult) -> str:
    return next(u for u in result.records_in if u.startswith("sink-"))


def test_fan_out_keeps_channels_bounded() -> None:
    # A flat_map emitting 8 records per input is ordinary (word count splits
    # lines into words). Its output batch is sent whole (one hand-off, not
    # eight), so a channel batch can hold one input batch's fan-out; the
    # channel still stops its producer at capacity x batch_size records.
    fan_out = 8
    # By count alone, as above: with debloating a read may fall short of a
    # batch, and the rest of its fan-out waits in the buffer for the next.
    env = ef.StreamEnvironment(parallelism=2, batch_size=BATCH, channel_capacity=CAPACITY,
                               chaining=False, buffer_debloat_target=None)
    sink = QueueProbeSink(delay=0.00005)
    (env.from_collection(range(20_000)).set_parallelism(2)
        .flat_map(lambda x: [x] * fan_out)
        .sink_to(sink).set_parallelism(1))
    _, _ = _run(env, sink)
    n_channels = len(sink.channels())
    assert sink.count == 20_000 * fan_out
    largest = fan_out * BATCH  # one source batch, fanned out
    assert sink.max_batch_len <= largest
    assert sink.max_records_per_channel <= CAPACITY * BATCH + largest - 1
    assert sink.max_total_records <= (CAPACITY * BATCH + largest) * n_channels


@pytest.mark.parametrize("partition", ["key_by", "rebalance"])
async def test_slow_trickle_flows_through_an_exchange(partition: str) -> None:
    n = 10
    yielded: list[int] = []

    async def trickle() -> Any:
        for i in range(n):
            yielded.append(i)
            yield i
            await asyncio.sleep(0.02)

    # For every record the sink sees: how many records the generator had
    # produced by then.
    seen_at: dict[int, int] = {}

    class WatchSink(ef.Sink):
        def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
            class W(ef.SinkWriter):
                def write(self, records: list[Any]) -> None:
                    for r in records:
                        seen_at[r] = len(yielded)
            return W()

    env = ef.StreamEnvironment(parallelism=2)
    ds = env.from_async_iterable(trickle())
    mid = ds.key_by(lambda x: x).map(lambda x: x) if partition == "key_by" else (
        ds.rebalance().map(lambda x: x))
    mid.sink_to(WatchSink())
    plan = env.plan()
    assert plan.exchanges, "the pipeline must have a real exchange"

    await env.execute_async()

    assert sorted(seen_at) == list(range(n))
    # Record 0 reached the sink long before the generator got to record 5 ...
    assert seen_at[0] < 5
    # ... and so did every record: none waited for the end of the input.
    for i in range(n - 5):
        assert seen_at[i] < i + 5, seen_at
