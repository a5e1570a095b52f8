"""The asynchronous two-phase-commit sink of docs/extending/connector.md is
true: the page shows json_table_sink.py as it is, and a job writing through
it with failures (and a failure between a checkpoint's completion and the
commit) leaves every record in the table exactly once, and no prepared
transaction behind."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from json_table_sink import JsonTableSink

import eddyflow as ef

EXAMPLE = Path(__file__).with_name("json_table_sink.py")
GUIDE = Path(__file__).resolve().parents[3] / "docs" / "extending" / "connector.md"
RECORDS = 3000


def test_the_guide_shows_the_example_as_it_is() -> None:
    page = GUIDE.read_text(encoding="utf-8")
    section = page.split("<!-- json_table_sink.py -->")[1].split("<!-- end -->")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert "\n\n".join(blocks) == EXAMPLE.read_text(encoding="utf-8")


def _pace(record: Any) -> Any:
    if record % 8 == 0:
        time.sleep(0.001)  # several checkpoints before the failures
    return record


@pytest.mark.parametrize("failure", ["record", "sink.before_commit"])
def test_the_example_writes_exactly_once_across_failures(
        postgres_dsn: str, tmp_path: Path, failure: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE copy (value jsonb)")
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.enable_checkpointing(0.02, tmp_path / "chk")
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0))
    ds = env.from_collection(list(range(RECORDS))).map(_pace)
    if failure == "record":
        ds = ds.map(ef.testing.FailingMap(after=RECORDS // 3, times=2))
    else:
        ef.testing.arm(failure, after=2)
    ds.map(lambda n: {"n": n}).sink_to(JsonTableSink(postgres_dsn, "copy"))
    try:
        result = env.execute("guide")
    finally:
        ef.testing.disarm_all()
    assert result.restarts >= 1
    with psycopg.connect(postgres_dsn) as conn:
        values = [v["n"] for (v,) in conn.execute("SELECT value FROM copy")]
        prepared = conn.execute("SELECT gid FROM pg_prepared_xacts "
                                "WHERE database = current_database()").fetchall()
    assert not [n for n, c in Counter(values).items() if c > 1]
    assert sorted(values) == list(range(RECORDS))
    assert prepared == []
