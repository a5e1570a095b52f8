"""``from_async_iterable`` in a job over worker processes.

The iterator belongs to the calling process's event loop: the caller reads
it and relays its records to the worker that runs the source's task
(``runtime/workers/relay.py``). These tests run jobs of two workers in a
fresh process each (``in_clean_process``, see test_workers.py) and check:
every record arrives once and is processed in the workers, not in the
caller; a back-pressured job stops the caller reading the iterator; the
iterator's exception fails the job naming the source and the record;
cancelling ``execute_async`` finalises the iterator and leaves no worker.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sigkill_support import (
    in_clean_process,
    no_process_left_behind,  # noqa: F401 - the autouse fixture
)
from test_workers import KEYS, count, run_rocksdb_here

import eddyflow as ef
from eddyflow.connectors import AsyncIterableSource


class Feed:
    """An async generator of ``n`` ints (``None``: endless) that yields to
    the loop now and then, and records how far it got and how it ended."""

    def __init__(self, n: int | None, *, pause_every: int = 100) -> None:
        self.n = n
        self.pause_every = pause_every
        self.yielded = 0
        self.finalised = False

    async def gen(self) -> AsyncIterator[int]:
        try:
            while self.n is None or self.yielded < self.n:
                yield self.yielded
                self.yielded += 1
                if self.yielded % self.pause_every == 0:
                    await asyncio.sleep(0)
        finally:
            self.finalised = True


def tagged(record: int) -> tuple[int, int]:
    return record, os.getpid()


def every_record_once_in_the_workers(tmp_path: Path, start: str) -> None:
    if start == "spawn":
        run_rocksdb_here(tmp_path)  # from now on workers are spawned, not forked
    caller = os.getpid()
    feed = Feed(30_000)
    env = ef.StreamEnvironment(parallelism=2, workers=2)
    pids = ef.ListSink()
    stream = env.from_async_iterable(feed.gen()).name("feed").map(tagged).name("tag")
    stream.sink_to(pids)
    stream.map(lambda r: r[0]).key_by(lambda x: x % KEYS).map_with_state(
        count).name("count").sink_to(ef.ListSink())
    result = asyncio.run(env.execute_async("relayed"))

    assert sorted(r for r, _ in pids.results) == list(range(30_000))
    where = {pid for _, pid in pids.results}
    # The records are processed in both workers (the source's chain in
    # one of them), never in the caller.
    assert caller not in where and len(where) == 2
    assert result.state("count") == {k: len(range(k, 30_000, KEYS)) for k in range(KEYS)}
    assert feed.finalised


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_every_record_arrives_once_and_is_processed_in_the_workers(tmp_path: Path,
                                                                    start: str) -> None:
    in_clean_process(every_record_once_in_the_workers, tmp_path, start)


def slow(record: int) -> int:
    until = time.perf_counter() + 1e-3
    while time.perf_counter() < until:
        pass
    return record


def back_pressure_reaches_the_iterator() -> None:
    feed = Feed(None)
    env = ef.StreamEnvironment(parallelism=2, workers=2, batch_size=64, channel_capacity=2)
    (env.from_source(AsyncIterableSource(feed.gen(), buffer=128)).name("feed")
        .rebalance().map(slow).sink_to(ef.ListSink()))

    async def main() -> None:
        before = asyncio.all_tasks()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(env.execute_async("slow"), timeout=2.0)
        await asyncio.sleep(0.05)
        assert asyncio.all_tasks() == before

    asyncio.run(main())
    # Two subtasks take about 1 ms a record for 2 s: some 4,000 records,
    # plus what the source's buffer, the relay's credit and the channels
    # hold (a few hundred). An iterator read without back-pressure yields
    # millions in that time.
    assert 100 < feed.yielded < 20_000, feed.yielded
    assert feed.finalised


def test_a_back_pressured_job_stops_the_caller_reading_the_iterator() -> None:
    in_clean_process(back_pressure_reaches_the_iterator)


def failing_iterator_names_the_source() -> None:
    async def feed() -> AsyncIterator[int]:
        for i in range(5):
            yield i
            await asyncio.sleep(0)
        raise ConnectionError("peer went away")

    env = ef.StreamEnvironment(parallelism=2, workers=2)
    sink = ef.ListSink()
    env.from_async_iterable(feed()).name("ws").key_by(lambda x: x).count().sink_to(sink)
    with pytest.raises(ef.JobFailed) as info:
        asyncio.run(env.execute_async())
    msg = str(info.value)
    assert "source 'ws'" in msg, msg
    assert "ConnectionError: peer went away" in msg, msg
    assert "record #5" in msg, msg
    assert info.value.operator == "ws"
    assert sink.results == []


def test_the_iterators_exception_fails_the_job_naming_the_source() -> None:
    in_clean_process(failing_iterator_names_the_source)


def cancelling_finalises_the_iterator() -> None:
    feed = Feed(None, pause_every=1)
    seen = ef.ListSink()
    env = ef.StreamEnvironment(parallelism=2, workers=2)
    env.from_async_iterable(feed.gen()).rebalance().map(lambda x: x * 2).sink_to(seen)

    async def main() -> None:
        before = asyncio.all_tasks()
        task = asyncio.create_task(env.execute_async("endless"))
        deadline = time.monotonic() + 10
        while feed.yielded < 1_000:
            assert time.monotonic() < deadline, "the iterator was not read"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        assert asyncio.all_tasks() == before
        stopped_at = feed.yielded
        await asyncio.sleep(0.1)
        assert feed.yielded == stopped_at  # nothing reads it any more

    asyncio.run(main())
    assert feed.finalised


def test_cancelling_execute_async_finalises_the_iterator_and_the_workers() -> None:
    in_clean_process(cancelling_finalises_the_iterator)
