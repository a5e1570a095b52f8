"""A quiet source holds back neither checkpoints nor (with idleness) watermarks.

DESIGN.md "Idle inputs": a source with nothing to read answers a checkpoint
trigger at once, and a split that ``with_idleness`` declares idle stops
holding back the watermark. The quiet source here is the one that used to
hold both: ``from_async_iterable`` waiting for its next item (its reader
awaited the iterator inside ``read_batch``, so the task saw neither the
trigger nor its idleness timer until the item came). Each test keeps the
iterator silent on an event the test sets only after it has seen what it
waits for, so nothing depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import eddyflow as ef


class Busy(ef.Source):
    """``(name, i)`` for i = 0, 1, ... in batches until ``stop`` is set
    (replayable: the position is the next ``i``)."""

    def __init__(self, name: str) -> None:
        self.label = name
        self.stop = False

    @property
    def name(self) -> str:
        return f"busy:{self.label}"

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return _BusyReader(self)


class _BusyReader(ef.SourceReader):
    def __init__(self, source: Busy) -> None:
        self.source = source
        self.pos = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.source.stop:
            return None
        batch = [(self.source.label, i) for i in range(self.pos, self.pos + max_records)]
        self.pos += max_records
        return batch

    def position(self) -> int:
        return self.pos

    def seek(self, position: Any) -> None:
        self.pos = int(position)


class Quiet:
    """An async iterator that yields ``first`` and then stays silent until
    ``release`` is set (a websocket nobody writes to)."""

    def __init__(self, first: Any) -> None:
        self.first = first
        self.release = asyncio.Event()
        self.yielded = 0

    async def gen(self) -> AsyncIterator[Any]:
        yield self.first
        self.yielded += 1
        await self.release.wait()


async def _until(what: str, cond: Any, job: asyncio.Future[Any], limit: float = 60.0) -> None:
    """Wait until ``cond()``; fail (naming ``what``) if the job ends or the
    bound passes: a generous bound, not a timing assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not cond():
        if job.done():
            job.result()
            raise AssertionError(f"the job ended before {what}")
        if loop.time() > deadline:
            raise AssertionError(f"not within {limit:g} s: {what}")
        await asyncio.sleep(0.01)


async def test_checkpoints_complete_while_an_async_iterable_is_silent(tmp_path: Path) -> None:
    quiet = Quiet(("quiet", 0))
    busy = Busy("busy")
    chk = tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=2)
    env.enable_checkpointing(0.05, chk, retained=10_000)
    sink = ef.ListSink()
    (env.from_async_iterable(quiet.gen()).name("quiet")
        .union(env.from_source(busy).name("busy"))
        .key_by(lambda r: r[0]).count().name("count")
        .sink_to(sink))
    job = asyncio.ensure_future(env.execute_async("quiet"))
    try:
        await _until("the quiet source yielded its record", lambda: quiet.yielded == 1, job)
        silent_from = len(ef.list_checkpoints(chk))
        # The iterator is silent now (until release): checkpoints go on.
        await _until("3 checkpoints completed while the async iterable was silent",
                     lambda: len(ef.list_checkpoints(chk)) >= silent_from + 3, job)
        assert not quiet.release.is_set()
        quiet.release.set()
        busy.stop = True
        result = await asyncio.wait_for(job, 60)
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
    # Every record once, in the committed output and in the final state.
    state = result.state("count")
    assert state["quiet"] == 1
    assert [n for k, n in sink.results if k == "busy"] == list(range(1, state["busy"] + 1))
    assert [n for k, n in sink.results if k == "quiet"] == [1]


async def test_an_idle_async_iterable_stops_holding_the_watermark() -> None:
    """A silent ``from_async_iterable`` beside a busy source: with
    ``with_idleness`` it is declared idle on the job's clock, and the
    event-time windows fire on the busy source's watermark while it is
    still silent."""
    seen: list[ef.WindowResult] = []
    quiet = Quiet(("quiet", 5_000))  # event time 0.5 s
    busy = Busy("busy")
    clock = ef.testing.ManualClock(1000.0)
    env = ef.StreamEnvironment(parallelism=2)
    env.set_clock(clock)
    env.set_auto_watermark_interval(0)
    # Event time: record i at i/10,000 s, so the busy source's watermark
    # passes 1.0 s after 10,000 records.
    strategy = (ef.WatermarkStrategy.for_monotonous_timestamps(lambda r: r[1] / 10_000)
                .with_idleness(5.0))
    # Each generator chained to its source (parallelism 1 like the async
    # iterable), so it is the source task that must notice the silence.
    stamped_quiet = (env.from_async_iterable(quiet.gen()).name("quiet")
                     .assign_timestamps_and_watermarks(strategy).set_parallelism(1))
    stamped_busy = (env.from_source(busy).name("busy").set_parallelism(1)
                    .assign_timestamps_and_watermarks(strategy).set_parallelism(1))
    (stamped_quiet.union(stamped_busy)
        .key_by(lambda r: r[0]).window(ef.TumblingEventTimeWindows(1.0)).count()
        .name("counts").map(lambda r: seen.append(r) or r).name("observe")
        .sink_to(ef.ListSink()))
    job = asyncio.ensure_future(env.execute_async("idle-async"))
    try:
        await _until("the quiet source yielded its record", lambda: quiet.yielded == 1, job)

        def fired() -> bool:
            clock.advance(1.0)  # processing time moves; the quiet split stays silent
            return ef.WindowResult("quiet", 0.0, 1.0, 1) in seen

        await _until("the quiet key's window fired while its source was silent", fired, job)
        assert not quiet.release.is_set()
        assert ef.WindowResult("busy", 0.0, 1.0, 10_000) in seen
    finally:
        quiet.release.set()
        busy.stop = True
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)


async def test_without_idleness_a_silent_async_iterable_holds_the_watermark() -> None:
    """The same job without ``with_idleness``: the silent iterator's
    watermark (0.5 s) holds every window that ends after it, however far
    processing time moves (over a bounded number of clock steps) and however
    far the busy source gets."""
    seen: list[ef.WindowResult] = []
    quiet = Quiet(("quiet", 5_000))
    busy = Busy("busy")
    clock = ef.testing.ManualClock(1000.0)
    env = ef.StreamEnvironment(parallelism=2)
    env.set_clock(clock)
    env.set_auto_watermark_interval(0)
    strategy = ef.WatermarkStrategy.for_monotonous_timestamps(lambda r: r[1] / 10_000)
    (env.from_async_iterable(quiet.gen()).name("quiet")
        .assign_timestamps_and_watermarks(strategy).set_parallelism(1)
        .union(env.from_source(busy).name("busy").set_parallelism(1)
               .assign_timestamps_and_watermarks(strategy).set_parallelism(1))
        .key_by(lambda r: r[0]).window(ef.TumblingEventTimeWindows(1.0)).count()
        .name("counts").map(lambda r: seen.append(r) or r).name("observe")
        .sink_to(ef.ListSink()))
    job = asyncio.ensure_future(env.execute_async("held-async"))
    try:
        await _until("the quiet source yielded its record", lambda: quiet.yielded == 1, job)
        for _ in range(50):
            clock.advance(10.0)
            await asyncio.sleep(0.01)
        assert not job.done()
        # (Checked here: once released, the iterator ends, and its end of
        # input fires every window.)
        assert seen == []
    finally:
        quiet.release.set()
        busy.stop = True
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)


async def test_an_empty_unbounded_log_neither_holds_checkpoints_nor_misses_appends(
        tmp_path: Path) -> None:
    """``from_log(bounded=False)`` polls for appends through ``available()``
    (no read waits): while its partitions are empty checkpoints complete,
    and a record appended later is still read."""
    log = ef.Log(tmp_path / "events", partitions=2)
    chk = tmp_path / "chk"
    seen: list[Any] = []
    env = ef.StreamEnvironment(parallelism=2)
    env.enable_checkpointing(0.05, chk, retained=10_000)
    (env.from_log(tmp_path / "events", bounded=False).name("events")
        .map(lambda r: seen.append(r) or r).name("observe")
        .sink_to(ef.ListSink()))
    job = asyncio.ensure_future(env.execute_async("tail"))
    try:
        await _until("3 checkpoints completed while the log was empty",
                     lambda: len(ef.list_checkpoints(chk)) >= 3, job)
        assert seen == []
        log.append({"n": 1}, partition=1)
        log.flush()
        await _until("the appended record was read", lambda: seen == [{"n": 1}], job)
    finally:
        log.close()
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)


class Announced(ef.Source):
    """A reader that has nothing until the test hands it records, and says
    so through ``available()``; it counts the reads the task makes."""

    def __init__(self) -> None:
        self.reads = 0
        self.pending: list[Any] = []
        self.ended = False
        self.ready: asyncio.Future[None] | None = None

    def give(self, records: list[Any], end: bool = False) -> None:
        self.pending.extend(records)
        self.ended = end
        if self.ready is not None and not self.ready.done():
            self.ready.set_result(None)

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return _AnnouncedReader(self)


class _AnnouncedReader(ef.SourceReader):
    def __init__(self, source: Announced) -> None:
        self.source = source
        self.pos = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        src = self.source
        src.reads += 1
        batch, src.pending = src.pending, []
        self.pos += len(batch)
        return None if not batch and src.ended else batch

    def available(self) -> asyncio.Future[None] | None:
        src = self.source
        if src.ready is None or src.ready.done():
            src.ready = asyncio.get_running_loop().create_future()
        return src.ready

    def position(self) -> int:
        return self.pos

    def seek(self, position: Any) -> None:
        self.pos = int(position)


async def test_the_source_task_waits_for_available_instead_of_polling() -> None:
    """Between an empty read and ``available()`` resolving, the task does not
    read again (no busy wait), however long the rest of the program runs."""
    source = Announced()
    sink = ef.ListSink()
    env = ef.StreamEnvironment()
    env.from_source(source).name("announced").map(lambda r: r).sink_to(sink)
    job = asyncio.ensure_future(env.execute_async("announced"))
    try:
        await _until("the first read", lambda: source.reads >= 1, job)
        for _ in range(100):
            await asyncio.sleep(0)
        assert source.reads == 1
        source.give([1, 2, 3], end=True)
        await asyncio.wait_for(job, 60)
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
    assert sink.results == [1, 2, 3]
