"""Running a job inside the embedding program's event loop.

``await env.execute_async()`` shares the loop with the program's other
coroutines; ``execute()`` refuses to block a running loop; cancelling the
awaiting task cancels every task of the job (no orphaned coroutine, the async
source's pump stops and the generator is finalised); and an exception inside
an embedding async generator fails the job naming the source.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import eddyflow as ef


class CallbackSink(ef.Sink):
    """Calls ``on_write(records)`` on every write (any subtask)."""

    def __init__(self, on_write: Any) -> None:
        self.on_write = on_write

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        sink = self

        class W(ef.SinkWriter):
            def write(self, records: list[Any]) -> None:
                sink.on_write(records)

        return W()


class Endless:
    """An endless async generator that reports what happened to it."""

    def __init__(self, delay: float = 0.001) -> None:
        self.delay = delay
        self.yielded = 0
        self.finalised = False
        self.cancelled = False

    async def gen(self) -> AsyncIterator[int]:
        try:
            while True:
                yield self.yielded
                self.yielded += 1
                await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.finalised = True


async def _until(cond: Any, limit: float = 5.0) -> None:
    """Wait (polling) until cond() holds; fail rather than hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_execute_async_shares_the_loop_with_other_coroutines() -> None:
    ticks = 0
    done = False
    ticks_at_write: list[int] = []

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    env = ef.StreamEnvironment(parallelism=2, batch_size=256)
    sink = ef.ListSink()
    keyed = env.from_collection(range(100_000)).key_by(lambda x: x % 10).count()
    keyed.sink_to(sink)
    keyed.sink_to(CallbackSink(lambda records: ticks_at_write.append(ticks)))

    ticker_task = asyncio.create_task(ticker())
    result = await env.execute_async("embedded")
    done = True
    await ticker_task

    assert ticks > 0
    # The ticker ran *while* the job ran, not only before or after it.
    assert len(ticks_at_write) > 2
    assert ticks_at_write[-1] > ticks_at_write[0]
    assert len(sink.results) == 100_000
    assert result.state(keyed.operator_name) == {k: 10_000 for k in range(10)}


async def test_execute_inside_running_loop_raises() -> None:
    env = ef.StreamEnvironment()
    sink = ef.ListSink()
    env.from_collection([1, 2, 3]).sink_to(sink)
    with pytest.raises(RuntimeError, match="execute_async"):
        env.execute()
    # The refusal did not consume anything: the same job still runs.
    await env.execute_async()
    assert sink.results == [1, 2, 3]


async def test_wait_for_timeout_cancels_every_task_of_the_job() -> None:
    before = asyncio.all_tasks()
    src = Endless()
    seen: list[int] = []
    env = ef.StreamEnvironment(parallelism=2)
    (env.from_async_iterable(src.gen())
        .key_by(lambda x: x % 3).map(lambda x: x)
        .sink_to(CallbackSink(seen.extend)))

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(env.execute_async("endless"), timeout=0.3)
    await asyncio.sleep(0.05)

    assert asyncio.all_tasks() == before
    assert src.finalised
    assert seen  # it was really running
    stopped_at = src.yielded
    await asyncio.sleep(0.05)
    assert src.yielded == stopped_at  # nothing pumps it any more


async def test_task_cancel_cancels_job_and_pump() -> None:
    before = asyncio.all_tasks()
    src = Endless()
    seen: list[int] = []
    env = ef.StreamEnvironment(parallelism=3, chaining=False)
    (env.from_async_iterable(src.gen()).name("feed")
        .rebalance().map(lambda x: x * 2)
        .sink_to(CallbackSink(seen.extend)))

    task = asyncio.create_task(env.execute_async("endless"))
    await _until(lambda: len(seen) >= 20)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)

    assert asyncio.all_tasks() == before
    assert src.cancelled and src.finalised
    stopped_at = src.yielded
    await asyncio.sleep(0.05)
    assert src.yielded == stopped_at


async def test_cancel_while_back_pressured() -> None:
    # A job stuck in back-pressure (a sink that never keeps up, a source that
    # never ends) must still cancel promptly and completely.
    before = asyncio.all_tasks()
    src = Endless(delay=0)
    env = ef.StreamEnvironment(parallelism=2, batch_size=8, channel_capacity=1,
                               chaining=False)
    (env.from_async_iterable(src.gen())
        .flat_map(lambda x: [x] * 4)
        .sink_to(ef.ListSink()))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(env.execute_async(), timeout=0.2)
    await asyncio.sleep(0.05)
    assert asyncio.all_tasks() == before
    assert src.finalised


async def test_exception_in_async_generator_fails_job_naming_source() -> None:
    async def feed() -> AsyncIterator[int]:
        for i in range(5):
            yield i
            await asyncio.sleep(0)
        raise ConnectionError("peer went away")

    env = ef.StreamEnvironment(parallelism=2)
    sink = ef.ListSink()
    env.from_async_iterable(feed()).name("ws").key_by(lambda x: x).count().sink_to(sink)
    with pytest.raises(ef.JobFailed) as info:
        await env.execute_async()
    msg = str(info.value)
    assert "source 'ws'" in msg
    assert "ConnectionError: peer went away" in msg
    assert "record #5" in msg
    assert info.value.operator == "ws"
    assert sink.results == []


async def test_async_source_is_not_replayable() -> None:
    async def feed() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    env = ef.StreamEnvironment()
    sink = ef.ListSink()
    env.from_async_iterable(feed()).sink_to(sink)
    await env.execute_async()
    assert sink.results == [0, 1, 2]
    # Not run again (an environment runs once), so nothing is read twice.
    with pytest.raises(RuntimeError, match="already executed"):
        await env.execute_async()
    assert sink.results == [0, 1, 2]
