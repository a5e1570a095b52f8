"""``validate`` and ``map_async``: the calls are not replayed offline (their
results come from an external system when the job ran, and the records in
flight at the checkpoint are in no downstream state yet), so validation
names the operator and everything downstream of it as not replayed, and does
not vouch for their state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import run_with_failures

import eddyflow as ef
from eddyflow.offline import validate

JOB = Path(__file__).parent / "jobs" / "enriched_counts.py"


def test_validate_names_a_map_async_as_not_replayed(spark: Any, in_tmp: Path) -> None:
    run_with_failures(JOB, in_tmp / "chk", interval=0.01)
    info = ef.list_checkpoints(in_tmp / "chk")[-1]
    report = validate(spark, info.path, job=JOB)
    assert not report.ok  # it cannot vouch for the state of 'count'
    assert "map_async 'enrich' is not replayed offline" in report.unreplayed["enrich"]
    assert report.unreplayed["count"] == "downstream of 'enrich'"
    assert "count" not in report.operators
