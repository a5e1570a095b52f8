"""The example of docs/extending/connector.md is true: the page shows
sqlite_connector.py as it is, and a job that copies a table through it
writes every row exactly once across a failure and the restart from a
checkpoint."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlite_connector import TableReader, TableSink, TableSource, connect

import eddyflow as ef

EXAMPLE = Path(__file__).with_name("sqlite_connector.py")
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
