"""Sinks whose methods are coroutines: awaited on the job's event loop without
holding up its other tasks, one write at a time (a slow writer holds back its
inputs), exactly once across failures, and a failing commit fails the job
naming the sink."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

import eddyflow as ef


@dataclass
class Store:
    """An external system in memory: committed rows and prepared transactions."""

    committed: list[Any] = field(default_factory=list)
    prepared: dict[str, list[Any]] = field(default_factory=dict)
    writers_opened: int = 0
    writers_closed: int = 0
    aborts: int = 0
    #: Most writes of one writer in flight at once (the runtime awaits each).
    most_in_flight: int = 0
    txns: itertools.count[int] = field(default_factory=itertools.count)


class StoreSink(ef.Sink):
    """A two-phase-commit sink to a :class:`Store`, every method ``async def``."""

    def __init__(self, store: Store, fail_commit: bool = False) -> None:
        self.store = store
        self.fail_commit = fail_commit

    @property
    def name(self) -> str:
        return "store"

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        self.store.writers_opened += 1
        return StoreWriter(self.store)

    async def commit(self, committables: list[Any]) -> None:
        await asyncio.sleep(0)
        if self.fail_commit and committables:
            raise ConnectionError("the store went away")
        for txn in committables:
            rows = self.store.prepared.pop(txn, None)
            if rows is not None:  # None: committed already
                self.store.committed.extend(rows)

    async def recover(self, committed: list[Any]) -> None:
        await self.commit(committed)
        self.store.prepared.clear()


class StoreWriter(ef.SinkWriter):
    """Keeps the pending rows; a write yields to the loop in the middle."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.pending: list[Any] = []
        self.in_flight = 0

    async def write(self, records: list[Any]) -> None:
        self.in_flight += 1
        self.store.most_in_flight = max(self.store.most_in_flight, self.in_flight)
        await asyncio.sleep(0)
        self.pending.extend(records)
        self.in_flight -= 1

    async def prepare_commit(self, checkpoint_id: int) -> Any:
        await asyncio.sleep(0)
        if not self.pending:
            return None
        txn = f"chk-{checkpoint_id}-{next(self.store.txns)}"
        self.store.prepared[txn], self.pending = self.pending, []
        return txn

    async def abort(self) -> None:
        await asyncio.sleep(0)
        self.pending = []
        self.store.aborts += 1

    async def close(self) -> None:
        await asyncio.sleep(0)
        self.store.writers_closed += 1


def _pace(every: int) -> Any:
    seen = itertools.count(1)

    def pace(record: Any) -> Any:
        if next(seen) % every == 0:
            time.sleep(0.001)  # long enough for several checkpoints
        return record

    return pace


@pytest.mark.parametrize("parallelism", [1, 3])
def test_async_sink_is_exactly_once_across_failures(tmp_path: Any, parallelism: int) -> None:
    n = 4000
    store = Store()
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=32)
    env.enable_checkpointing(0.01, tmp_path / "chk")
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0))
    failing = ef.testing.FailingMap(after=n // 3, times=2)
    (env.from_collection(list(range(n))).map(_pace(16)).map(failing)
     .sink_to(StoreSink(store)))
    result = env.execute("async-sink")
    assert failing.failures == 2 and result.restarts == 2
    assert sorted(store.committed) == list(range(n))  # each record once
    assert store.prepared == {}
    assert store.most_in_flight == 1
    # Every writer was closed, the failed attempts' after their abort.
    assert store.writers_closed == store.writers_opened
    assert store.aborts >= 2 * parallelism


def test_awaiting_write_lets_the_other_tasks_run() -> None:
    """The sink's write waits for an event that only another pipeline of
    the same job sets: a write that held the event loop would never end."""
    seen_elsewhere = asyncio.Event()
    store = Store()

    class Waiting(StoreWriter):
        async def write(self, records: list[Any]) -> None:
            with anyio.fail_after(60):
                await seen_elsewhere.wait()
            await super().write(records)

    class WaitingSink(StoreSink):
        def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
            return Waiting(self.store)

    def mark(record: Any) -> Any:
        seen_elsewhere.set()
        return record

    env = ef.StreamEnvironment(parallelism=1)
    env.from_collection([1, 2, 3]).name("numbers").sink_to(WaitingSink(store))
    env.from_collection(["x"]).name("letters").map(mark).sink_to(ef.ListSink())
    env.execute("two-pipelines")
    assert sorted(store.committed) == [1, 2, 3]


def test_a_slow_writer_holds_back_its_inputs() -> None:
    """While writes are slow, what the source has read stays within what the
    channel into the sink holds plus a batch or two: records are not
    buffered without bound in front of the sink."""
    batch, capacity = 16, 4
    read = itertools.count()
    taken: list[int] = []
    store = Store()
    gaps: list[int] = []

    class Slow(StoreWriter):
        async def write(self, records: list[Any]) -> None:
            for _ in range(5):
                await asyncio.sleep(0)
            taken.append(len(records))
            gaps.append(counted[0] - sum(taken))
            await super().write(records)

    class SlowSink(StoreSink):
        def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
            return Slow(self.store)

    counted = [0]

    def count(record: Any) -> Any:
        counted[0] = next(read) + 1
        return record

    env = ef.StreamEnvironment(parallelism=1, batch_size=batch, channel_capacity=capacity)
    env.from_collection(list(range(3000))).map(count).rebalance().map(lambda r: r) \
        .set_parallelism(1).sink_to(SlowSink(store))
    env.execute("slow-writer")
    assert sorted(store.committed) == list(range(3000))
    # Channel capacity and the batches on either side of it, never the whole input.
    assert max(gaps) <= (capacity + 4) * batch


def test_a_failing_async_commit_fails_the_job_naming_the_sink() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=0, delay=0))
    env.from_collection([1, 2]).sink_to(StoreSink(Store(), fail_commit=True)).name("orders-out")
    with pytest.raises(ef.JobFailed) as err:
        env.execute("commit-fails")
    msg = str(err.value)
    assert "sink 'orders-out' could not commit checkpoint" in msg
    assert "ConnectionError: the store went away" in msg
    assert "\n" not in msg


def test_sync_write_with_async_pre_commit() -> None:
    """Methods of both kinds in one writer: each is called as what it is."""
    store = Store()

    class Mixed(StoreWriter):
        def write(self, records: list[Any]) -> None:  # type: ignore[override]
            self.pending.extend(records)

    class MixedSink(StoreSink):
        def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
            self.store.writers_opened += 1
            return Mixed(self.store)

    env = ef.StreamEnvironment(parallelism=2)
    env.from_collection(list(range(100))).sink_to(MixedSink(store))
    env.execute("mixed")
    assert sorted(store.committed) == list(range(100))
    assert store.writers_closed == store.writers_opened == 2
