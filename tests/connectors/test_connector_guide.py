"""The examples of docs/extending/connector.md are true: the page shows
sqlite_connector.py and sqlite_split_source.py as they are, and a job that
copies a table through them writes every row exactly once across a failure
and the restart from a checkpoint (the split source: also restored at
another parallelism, and reading a table that grows)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlite_connector import TableReader, TableSink, TableSource, connect
from sqlite_split_source import ChunkedTableSource

import eddyflow as ef

EXAMPLE = Path(__file__).with_name("sqlite_connector.py")
SPLIT_EXAMPLE = Path(__file__).with_name("sqlite_split_source.py")
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "extending" / "connector.md"
ROWS = 3000


def test_the_guide_shows_the_example_as_it_is() -> None:
    page = GUIDE.read_text(encoding="utf-8")
    section = page.split("<!-- sqlite_connector.py -->")[1].split("<!-- end -->")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert "\n\n".join(blocks) == EXAMPLE.read_text(encoding="utf-8")


def _events(path: str) -> None:
    with connect(path) as db, db:
        db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, value TEXT)")
        db.executemany("INSERT INTO events (id, value) VALUES (?, ?)",
                       [(i, json.dumps({"n": i})) for i in range(1, ROWS + 1)])


class Pace:
    """Identity, sleeping a millisecond every ``every`` records: the job
    runs long enough for several checkpoints before it fails."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.seen = 0

    def __call__(self, record: Any) -> Any:
        self.seen += 1
        if self.seen % self.every == 0:
            time.sleep(0.001)
        return record


@pytest.mark.parametrize("failure", ["record", "sink.before_commit"])
def test_copy_is_exactly_once_across_a_failure_and_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    """``record``: a map fails halfway through the rows, after checkpoints
    committed output; ``sink.before_commit``: the third checkpoint is
    complete but the sink has not committed it, so the restart's
    ``recover`` commits it."""
    db = str(tmp_path / "db.sqlite")
    _events(db)
    seeks: list[Any] = []
    seek = TableReader.seek

    def watched(reader: TableReader, position: Any) -> None:
        seeks.append(position)
        seek(reader, position)

    monkeypatch.setattr(TableReader, "seek", watched)
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.enable_checkpointing(0.01, tmp_path / "chk")
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0))
    ds = env.from_source(TableSource(db, "events")).map(Pace(8))
    if failure == "record":
        ds = ds.map(ef.testing.FailingMap(after=ROWS // 2))
    else:
        ef.testing.arm(failure, after=2)
    ds.sink_to(TableSink(db, "copy"))
    try:
        result = env.execute("copy-events")
    finally:
        ef.testing.disarm_all()

    assert result.restarts == 1
    assert any(p > 0 for p in seeks), f"the restart read from the start: seeks {seeks}"
    with connect(db) as conn:
        copied = [json.loads(v)["n"] for (v,) in conn.execute("SELECT value FROM copy")]
        staged = conn.execute("SELECT count(*) FROM copy_staged").fetchone()[0]
    c = Counter(copied)
    assert c == Counter(range(1, ROWS + 1)), (
        f"lost {sorted(Counter(range(1, ROWS + 1)) - c)[:5]}, "
        f"duplicated {sorted(c - Counter(range(1, ROWS + 1)))[:5]}")
    assert staged == 0


# -- the split source ---------------------------------------------------------------------


def test_the_guide_shows_the_split_source_as_it_is() -> None:
    page = GUIDE.read_text(encoding="utf-8")
    section = page.split("<!-- sqlite_split_source.py -->")[1].split("<!-- end -->")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert "\n\n".join(blocks) == SPLIT_EXAMPLE.read_text(encoding="utf-8")


class CountedSink(TableSink):
    """``TableSink`` counting its job's attempts (``recover`` runs before
    each) and the newest checkpoint when the last one started."""

    def __init__(self, path: str, table: str, chk: Path) -> None:
        super().__init__(path, table)
        self.chk = chk
        self.starts = 0
        self.newest_at_start = 0

    def recover(self, committed: list[Any]) -> None:
        self.starts += 1
        self.newest_at_start = _newest(self.chk)
        super().recover(committed)


def _newest(chk: Path) -> int:
    return max((c.id for c in ef.list_checkpoints(chk)), default=0) if chk.exists() else 0


class Crash:
    """Fails at the first record of the job's second attempt after one of
    its checkpoints completed: with one restart allowed, the job ends there,
    its latest checkpoint taken mid-way."""

    def __init__(self, sink: CountedSink, armed: bool) -> None:
        self.sink = sink
        self.armed = armed

    def __call__(self, record: Any) -> Any:
        sink = self.sink
        if self.armed and sink.starts >= 2 and _newest(sink.chk) > sink.newest_at_start:
            raise ef.testing.InjectedFailure("crash")
        return record

    def __deepcopy__(self, memo: dict[int, Any]) -> Crash:
        return self


def _copied(db: str) -> Counter[int]:
    with connect(db) as conn:
        return Counter(json.loads(v)["n"] for (v,) in conn.execute("SELECT value FROM copy"))


def test_the_split_source_copies_exactly_once_restored_at_another_parallelism(
        tmp_path: Path) -> None:
    """Chunks of 500 ids, copied at parallelism 2 through a failure and a
    restart, then a crash; the latest checkpoint restored at parallelism 3
    (its chunks dealt out anew), through another failure."""
    db, chk = str(tmp_path / "db.sqlite"), tmp_path / "chk"
    _events(db)
    for p, last in ((2, False), (3, True)):
        env = ef.StreamEnvironment(parallelism=p, batch_size=16)
        env.enable_checkpointing(0.01, chk)
        env.set_restart_strategy(ef.FixedDelayRestart(attempts=1, delay=0))
        sink = CountedSink(db, "copy", chk)
        ds = (env.from_source(ChunkedTableSource(db, "events", chunk=500)).name("events")
              .map(Pace(8)).map(ef.testing.FailingMap(after=ROWS // 6))
              .map(Crash(sink, armed=not last)))
        ds.sink_to(sink)
        restore = None if p == 2 else "latest"
        if last:
            assert env.execute("copy", restore=restore).restarts == 1
        else:
            with pytest.raises(ef.JobFailed, match="crash"):
                env.execute("copy", restore=restore)
            latest = ef.list_checkpoints(chk)[-1]
            assert not latest.final
            splits = {sid for part in latest.operators["events"]["subtasks"].values()
                      for sid in part["splits"]}
            assert splits == {f"chunk-{k}" for k in range(ROWS // 500)}
    assert _copied(db) == Counter(range(1, ROWS + 1))


async def test_the_split_source_finds_chunks_as_the_table_grows(tmp_path: Path) -> None:
    db = str(tmp_path / "db.sqlite")
    _events(db)
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.enable_checkpointing(0.02, tmp_path / "chk")
    source = ChunkedTableSource(db, "events", chunk=1000, discovery_interval=0.02)
    env.from_source(source).name("events").sink_to(TableSink(db, "copy"))
    job = asyncio.ensure_future(env.execute_async("grow"))
    try:
        await _until(lambda: len(_copied(db)) == ROWS, job)
        # Rows into the last chunk (not yet full) and into two new ones.
        with connect(db) as conn, conn:
            conn.executemany("INSERT INTO events (id, value) VALUES (?, ?)",
                             [(i, json.dumps({"n": i})) for i in range(ROWS + 1, ROWS + 2001)])
        await _until(lambda: len(_copied(db)) == ROWS + 2000, job)
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
    assert _copied(db) == Counter(range(1, ROWS + 2001))


async def _until(cond: Any, job: asyncio.Future[Any], limit: float = 60.0) -> None:
    """Wait until ``cond()`` (committed output: after a checkpoint); a
    generous bound, not a timing assertion."""
    deadline = asyncio.get_running_loop().time() + limit
    while not cond():
        if job.done():
            job.result()
            raise AssertionError("the job ended first")
        assert asyncio.get_running_loop().time() < deadline, "not within the bound"
        await asyncio.sleep(0.02)
