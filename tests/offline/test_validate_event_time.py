"""``validate`` on event-time jobs: tumbling windows with allowed lateness
and late records, sessions, and a process function with event-time timers.
Every retained checkpoint of a run with failures validates (the replay
handles the input up to the checkpoint's positions, then advances each
operator to the watermark the checkpoint recorded, firing what it had
fired); altering input before a checkpoint's position fails, naming the
keys it changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import env_for, run_with_failures

import eddyflow as ef
from eddyflow.offline import validate

JOB = Path(__file__).resolve().parent / "jobs" / "windowed_events.py"
OPERATORS = {"per-minute", "sessions", "last-click"}


def _run(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[ef.CheckpointInfo]:
    from importlib import util

    spec = util.spec_from_file_location("windowed_events", JOB)
    assert spec is not None and spec.loader is not None
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_events(str(tmp / "events.jsonl"))
    env_for(monkeypatch, EF_WINDOWED_INPUT=str(tmp / "events.jsonl"))
    # Checkpoint writes in-process: starting the writer's helper process
    # takes about a second on a loaded machine, as long as this run, and the
    # checkpoints taken mid-run are the point of the test.
    monkeypatch.setattr("eddyflow.checkpoint.writer.ENABLED", False)
    result = run_with_failures(JOB, tmp / "chk", interval=0.02, retained=4,
                               faults=(("snapshot.async_write", 2),))
    assert result.restarts >= 1
    infos = ef.list_checkpoints(tmp / "chk")
    assert any(not i.final for i in infos), [(i.id, i.final) for i in infos]
    return infos


def test_every_retained_checkpoint_of_an_event_time_job_validates(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for info in _run(in_tmp, monkeypatch):
        report = validate(spark, info.path, job=JOB)
        assert report.ok, (f"checkpoint {info.id}: {report.mismatch_count} mismatches, e.g. "
                           f"{report.first_mismatches(5)}; unreplayed {report.unreplayed}")
        assert set(report.operators) >= OPERATORS and report.compared > 0


def test_event_time_input_altered_before_the_position_fails_naming_the_keys(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    infos = _run(in_tmp, monkeypatch)
    mid = next(i for i in infos if not i.final)
    position = int(mid.operators["clicks"]["subtasks"]["0"]["source"])
    assert position > 100
    path = in_tmp / "events.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[50])
    old_user = record["user"]
    record["user"] = "zz"  # a click moves to a user nobody else is
    lines[50] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")

    report = validate(spark, mid.path, job=JOB)
    assert not report.ok
    keys = {r[2] for r in report.mismatches.collect()}
    # The new user's state appears; the old user's changes (its last click
    # or its windows, if still open at the checkpoint's watermark).
    assert "zz" in keys
    assert keys <= {"zz", old_user}


def test_read_windows_and_read_timers_give_a_row_each(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eddyflow.offline import read_timers, read_windows

    mid = next(i for i in _run(in_tmp, monkeypatch) if not i.final)
    windows = read_windows(spark, mid.path, operator="per-minute").collect()
    timers = read_timers(spark, mid.path, operator="per-minute").collect()
    assert windows and timers
    for w in windows:
        assert w.window_end - w.window_start == 10.0 and w.window_start % 10.0 == 0
        assert int(w.value) >= 1 and w.state == "_windows"
    # Each open window has its fire time (its end) or its cleanup time (end
    # + 5 s of allowed lateness) ahead, as a timer of its key.
    times = {(t.key, t.timestamp) for t in timers}
    assert {t.domain for t in timers} == {"event"}
    for w in windows:
        assert (w.key, w.window_end) in times or (w.key, w.window_end + 5.0) in times
