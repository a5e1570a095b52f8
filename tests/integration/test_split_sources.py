"""Split sources restore at any parallelism, exactly once (issue 28).

Each built-in source (a text file, a log, a collection) feeds a keyed count
into a ``FileSink`` in three stages, at source parallelism 2, then 3, then
1. In each stage a ``FailingMap`` fails once and the restart strategy
restarts the job at the same parallelism from its latest checkpoint; the
first two stages then crash (their one restart spent) at the first record
after a checkpoint of the restarted attempt completed, and the next stage
restores that checkpoint from the folder at the next parallelism. The
committed output of the three stages together must be the failure-free
run's, record for record, and the last stage's final state the reference's.

Then the edges of the protocol: a user source of the old
``create_reader`` protocol runs, restores at its parallelism and is refused
by name at another; a partition added to a running log and a file dropped
into a watched folder are read; a split with nothing to read holds back
neither checkpoints nor windows.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace

import eddyflow as ef

N = 6000
WORDS = 37


def _word(i: int) -> str:
    return f"w{i % WORDS}"


def _setup(kind: str, tmp: Path) -> None:
    if kind == "text":
        with open(tmp / "in.txt", "w") as f:
            f.writelines(f"{_word(i)} {_word(i * 7 + 3)}\n" for i in range(N))
    elif kind == "log":
        with ef.Log(tmp / "log", partitions=6) as log:
            for i in range(N):
                log.append({"w": _word(i), "i": i})


def _source(kind: str, env: ef.StreamEnvironment, tmp: Path, p: int) -> ef.DataStream:
    if kind == "text":
        words = env.read_text_file(tmp / "in.txt").name("src").set_parallelism(p)
        return words.flat_map(str.split).name("split").set_parallelism(p)
    if kind == "log":
        return (env.from_log(tmp / "log").name("src").set_parallelism(p)
                .map(lambda r: r["w"]).name("word").set_parallelism(p))
    return (env.from_collection(range(N)).name("src").set_parallelism(p)
            .map(_word).name("word").set_parallelism(p))


class StartsCounted(ef.FileSink):
    """A ``FileSink`` that counts the attempts of its job: ``recover`` runs
    before every (re)start."""

    def __init__(self, path: Path, chk: Path) -> None:
        super().__init__(path)
        self.chk = chk
        self.starts = 0
        #: The newest checkpoint when the latest attempt started.
        self.newest_at_start = 0

    def recover(self, committed: list[Any]) -> None:
        self.starts += 1
        self.newest_at_start = _newest(self.chk)
        super().recover(committed)


def _newest(chk: Path) -> int:
    return max((c.id for c in ef.list_checkpoints(chk)), default=0) if chk.exists() else 0


class CrashAfterCheckpoint:
    """Identity map that fails (``InjectedFailure``) at its first record in
    the job's second attempt after a checkpoint of that attempt completed:
    with one restart allowed, the job then fails, leaving a checkpoint taken
    mid-way, whatever the machine's speed."""

    def __init__(self, sink: StartsCounted) -> None:
        self.sink = sink
        self.crashed = False

    def __call__(self, record: Any) -> Any:
        sink = self.sink
        if (not self.crashed and sink.starts >= 2
                and _newest(sink.chk) > sink.newest_at_start):
            self.crashed = True
            raise ef.testing.InjectedFailure("the stage ends here")
        return record

    def __deepcopy__(self, memo: dict[int, Any]) -> CrashAfterCheckpoint:
        return self


def _job(kind: str, tmp: Path, p: int, sink: ef.Sink,
         maps: list[Callable[[Any], Any]]) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment(parallelism=p, batch_size=16)
    words = _source(kind, env, tmp, p)
    for k, fn in enumerate(maps):
        words = words.map(fn).name(f"m{k}").set_parallelism(p)
    words.key_by(lambda w: w).count().name("count").set_parallelism(2).sink_to(sink)
    return env


def _committed(folder: Path) -> list[tuple[str, int]]:
    out = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("part-"):
            with open(folder / name) as f:
                out.extend(tuple(json.loads(line)) for line in f)
    return out


@pytest.mark.parametrize("kind", ["text", "log", "collection"])
def test_a_split_source_restores_at_2_then_3_then_1_exactly_once(
        tmp_path: Path, kind: str) -> None:
    _setup(kind, tmp_path)
    ref_sink = ef.ListSink()
    reference = _job(kind, tmp_path, 2, ref_sink, []).execute("reference")
    assert len(ref_sink.results) == (2 * N if kind == "text" else N)

    chk, out = tmp_path / "chk", tmp_path / "out"
    stages = [2, 3, 1]
    restore: str | None = None
    for k, p in enumerate(stages):
        last = k == len(stages) - 1
        seen = 2 * N if kind == "text" else N
        failing = ef.testing.FailingMap(after=max(1, seen // 10), times=1)
        maps: list[Callable[[Any], Any]] = [Pace(4), failing]
        sink = StartsCounted(out, chk)
        crash = None if last else CrashAfterCheckpoint(sink)
        if crash is not None:
            maps.append(crash)
        env = _job(kind, tmp_path, p, sink, maps)
        env.enable_checkpointing(0.02, chk, retained=3)
        env.set_restart_strategy(ef.FixedDelayRestart(attempts=1, delay=0))
        if last:
            result = env.execute(f"stage-{p}", restore=restore)
            assert result.restarts == 1
        else:
            with pytest.raises(ef.JobFailed, match="the stage ends here"):
                env.execute(f"stage-{p}", restore=restore)
            assert failing.failures == 1 and crash is not None and crash.crashed
            latest = ef.list_checkpoints(chk)[-1]
            assert not latest.final
            # The checkpoint of a split source holds splits, whatever the
            # parallelism that took it.
            src = latest.operators["src"]
            assert src["parallelism"] == p
            assert all("splits" in part for part in src["subtasks"].values())
            restore = "latest"

    got = Counter(_committed(out))
    want = Counter(tuple(r) for r in ref_sink.results)
    lost, extra = want - got, got - want
    assert not lost and not extra, (f"{sum(lost.values())} lost, e.g. {list(lost)[:3]}; "
                                    f"{sum(extra.values())} extra, e.g. {list(extra)[:3]}")
    assert result.state("count") == reference.state("count")


# -- the old protocol -------------------------------------------------------------------


class Numbers(ef.Source):
    """A user source of the ``create_reader`` protocol: subtask ``s`` of
    ``p`` reads the numbers ``i < n`` with ``i % p == s``."""

    def __init__(self, n: int) -> None:
        self.n = n

    @property
    def name(self) -> str:
        return "numbers"

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return _NumbersReader(self.n, subtask, parallelism)


class _NumbersReader(ef.SourceReader):
    def __init__(self, n: int, subtask: int, parallelism: int) -> None:
        self.n, self.step, self.next = n, parallelism, subtask

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.next >= self.n:
            return None
        out = list(range(self.next, min(self.n, self.next + self.step * max_records),
                         self.step))
        self.next += self.step * len(out)
        return out

    def position(self) -> int:
        return self.next

    def seek(self, position: Any) -> None:
        self.next = int(position)


def _numbers_job(p: int, sink: ef.Sink, maps: list[Callable[[Any], Any]]
                 ) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment(parallelism=p, batch_size=16)
    ds = env.from_source(Numbers(N)).name("src")
    for k, fn in enumerate(maps):
        ds = ds.map(fn).name(f"m{k}")
    ds.key_by(lambda i: i % WORDS).count().name("count").set_parallelism(2).sink_to(sink)
    return env


def test_a_source_of_the_old_protocol_runs_restores_at_its_parallelism_and_no_other(
        tmp_path: Path) -> None:
    ref_sink = ef.ListSink()
    reference = _numbers_job(2, ref_sink, []).execute("reference")
    chk = tmp_path / "chk"
    failing = ef.testing.FailingMap(after=N // 10, times=1)
    sink = StartsCounted(tmp_path / "out", chk)
    crash = CrashAfterCheckpoint(sink)
    env = _numbers_job(2, sink, [Pace(4), failing, crash])
    env.enable_checkpointing(0.02, chk)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=1, delay=0))
    with pytest.raises(ef.JobFailed, match="the stage ends here"):
        env.execute("old")
    latest = ef.list_checkpoints(chk)[-1]
    # Its positions are per subtask, as they always were.
    assert {s: type(p["source"]) for s, p in latest.operators["src"]["subtasks"].items()} == {
        "0": int, "1": int}
    assert all("splits" not in p for p in latest.operators["src"]["subtasks"].values())

    env = _numbers_job(3, ef.FileSink(tmp_path / "out"), [])
    env.enable_checkpointing(0.02, chk)
    with pytest.raises(ef.IncompatibleCheckpoint,
                       match="source 'src' was checkpointed with parallelism 2 and cannot be "
                             "restored with parallelism 3"):
        env.execute("old", restore="latest")

    env = _numbers_job(2, ef.FileSink(tmp_path / "out"), [])
    env.enable_checkpointing(0.02, chk)
    result = env.execute("old", restore="latest")
    assert result.state("count") == reference.state("count")
    # Exactly once: every running count of every key, once.
    assert Counter(_committed(tmp_path / "out")) == Counter(tuple(r) for r in ref_sink.results)


def test_a_split_source_checkpoint_is_refused_by_a_source_of_the_old_protocol(
        tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=2)
    env.enable_checkpointing(60.0, chk)
    env.from_collection(range(100)).name("src").set_parallelism(2).sink_to(ef.ListSink())
    env.execute("split")
    env = ef.StreamEnvironment(parallelism=2)
    env.enable_checkpointing(60.0, chk)
    env.from_source(Numbers(100)).name("src").sink_to(ef.ListSink())
    with pytest.raises(ef.IncompatibleCheckpoint,
                       match="source 'src' was checkpointed as a split source"):
        env.execute("split", restore="latest")


# -- splits found while the job runs, and idle splits --------------------------------------


async def _until(what: str, cond: Callable[[], bool], job: asyncio.Future[Any],
                 limit: float = 60.0) -> None:
    """Wait until ``cond()``; fail naming ``what`` if the job ends first or
    the (generous) bound passes: not a timing assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not cond():
        if job.done():
            job.result()
            raise AssertionError(f"the job ended before {what}")
        if loop.time() > deadline:
            raise AssertionError(f"not within {limit:g} s: {what}")
        await asyncio.sleep(0.01)


async def _stop(job: asyncio.Future[Any]) -> None:
    job.cancel()
    await asyncio.gather(job, return_exceptions=True)


async def test_a_partition_added_to_a_running_log_is_read(tmp_path: Path) -> None:
    log = ef.Log(tmp_path / "log", partitions=2)
    for i in range(10):
        log.append({"i": i})
    log.flush()
    seen: list[int] = []
    chk = tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=2, batch_size=4)
    env.enable_checkpointing(0.02, chk, retained=1000)
    source = ef.connectors.LogSource(tmp_path / "log", bounded=False, poll_interval=0.01,
                                     partition_discovery=0.02)
    (env.from_source(source).name("src").map(lambda r: seen.append(r["i"]) or r)
        .name("seen").sink_to(ef.ListSink()))
    job = asyncio.ensure_future(env.execute_async("grow"))
    try:
        await _until("the first 10 records were read", lambda: len(seen) == 10, job)
        log.add_partitions(3)
        for i in range(10, 20):
            log.append({"i": i}, partition=2)
        log.flush()
        await _until("the new partition's records were read", lambda: len(seen) == 20, job)
        # And a checkpoint records the new partition with its position.
        def recorded() -> bool:
            infos = ef.list_checkpoints(chk)
            parts = infos[-1].operators["src"]["subtasks"].values() if infos else []
            return any(p["source"].get("2") == 10 for p in parts)
        await _until("a checkpoint recorded partition 2 at offset 10", recorded, job)
    finally:
        await _stop(job)
        log.close()
    assert sorted(seen) == list(range(20))


async def test_a_file_dropped_into_a_watched_folder_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("a1\na2\n")
    seen: list[str] = []
    env = ef.StreamEnvironment(parallelism=2, batch_size=4)
    env.enable_checkpointing(0.02, tmp_path / "chk")
    source = ef.connectors.TextFolderSource(folder, monitor_interval=0.02)
    env.from_source(source).name("src").map(seen.append).sink_to(ef.ListSink())
    job = asyncio.ensure_future(env.execute_async("watch"))
    try:
        await _until("a.txt was read", lambda: len(seen) == 2, job)
        # Written under a hidden name, then renamed: never seen half-written.
        (folder / ".b.txt").write_text("b1\nb2\nb3\n")
        os.rename(folder / ".b.txt", folder / "b.txt")
        await _until("b.txt was read", lambda: len(seen) == 5, job)
    finally:
        await _stop(job)
    assert sorted(seen) == ["a1", "a2", "b1", "b2", "b3"]


async def test_an_idle_split_holds_back_neither_checkpoints_nor_windows(
        tmp_path: Path) -> None:
    """One subtask reads two partitions of an unbounded log, one of them
    empty: the busy one's windows fire and checkpoints complete while the
    other has nothing (no ``with_idleness`` needed: only the subtask's
    records make its watermark, and a split without any makes none)."""
    log = ef.Log(tmp_path / "clicks", partitions=2)
    for t in range(30):
        log.append({"user": "u", "ts": float(t)}, partition=0)  # partition 1 stays empty
    log.close()
    fired: list[Any] = []
    chk = tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=1, batch_size=8)
    env.enable_checkpointing(0.02, chk)
    strategy = ef.WatermarkStrategy.bounded_out_of_orderness(0.0, lambda r: float(r["ts"]))
    env.set_auto_watermark_interval(0)
    (env.from_log(tmp_path / "clicks", bounded=False).name("clicks")
        .assign_timestamps_and_watermarks(strategy)
        .key_by(lambda r: r["user"]).window(ef.TumblingEventTimeWindows(10.0)).count()
        .name("counts").map(fired.append).sink_to(ef.ListSink()))
    job = asyncio.ensure_future(env.execute_async("idle"))
    try:
        await _until("two windows fired", lambda: len(fired) >= 2, job)
        first = _newest(chk)
        await _until("two checkpoints completed after", lambda: _newest(chk) >= first + 2, job)
    finally:
        await _stop(job)
    assert [(w.start, w.value) for w in fired[:2]] == [(0.0, 10), (10.0, 10)]
