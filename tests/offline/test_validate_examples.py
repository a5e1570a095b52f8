"""``validate`` on the two event-time examples, ``examples/sessions.py``
(session windows over a ``Log`` of out-of-order clicks, with late data) and
``examples/fraud_timeout.py`` (a ``KeyedProcessFunction`` with event-time
timers): every retained mid-run checkpoint of a run with failures validates,
and input altered before a checkpoint's position fails it, naming the key
the change touches and no other.

Both examples run small (a few minutes of clicks, a few hundred payments)
with checkpoints every 20 ms so that several complete while windows are open
and timers pending. Validating every retained sessions checkpoint and the
command line's run is slow-marked; the default suite validates one sessions
checkpoint before and after altering its input, and every fraud one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import env_for, run_with_failures

import eddyflow as ef
from eddyflow.offline import validate

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = ROOT / "examples" / "sessions.py"
FRAUD = ROOT / "examples" / "fraud_timeout.py"
SRC = Path(ef.__file__).resolve().parents[1]


def _mid_run(chk: Path) -> list[ef.CheckpointInfo]:
    infos = [i for i in ef.list_checkpoints(chk) if not i.final]
    assert infos, f"no checkpoint was taken mid-run: {ef.list_checkpoints(chk)}"
    return infos


def _check_ok(spark: Any, info: ef.CheckpointInfo, job: Path, operator: str) -> None:
    report = validate(spark, info.path, job=job)
    assert report.ok, (f"checkpoint {info.id}: {report.mismatch_count} mismatches, e.g. "
                       f"{report.first_mismatches(5)}; unreplayed {report.unreplayed}")
    assert operator in report.operators and report.compared > 0, report.operators


# -- sessions ---------------------------------------------------------------------------


def _run_sessions(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[ef.CheckpointInfo]:
    env_for(monkeypatch, SESSIONS_LOG=str(tmp / "clicks"), SESSIONS_OUTPUT=str(tmp / "out"),
            SESSIONS_LATE_OUTPUT=str(tmp / "late"), SESSIONS_CHECKPOINTS=str(tmp / "unused"),
            SESSIONS_MINUTES="4")
    # Checkpoint writes in-process: the writer's helper process takes about
    # a second to start on a loaded machine, as long as this run.
    monkeypatch.setattr("eddyflow.checkpoint.writer.ENABLED", False)
    result = run_with_failures(SESSIONS, tmp / "chk", interval=0.02, retained=3,
                               faults=(("snapshot.async_write", 2),))
    assert result.restarts >= 1
    return _mid_run(tmp / "chk")


@pytest.mark.slow
def test_every_retained_mid_run_checkpoint_of_the_sessions_example_validates(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    infos = _run_sessions(in_tmp, monkeypatch)
    for info in infos:
        _check_ok(spark, info, SESSIONS, "sessions")
    # The command line says the same, with its exit code.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-m", "eddyflow.cli.main", "validate", str(infos[-1].path),
         "--job", str(SESSIONS), "--master", "local[2]"],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_click_altered_before_the_checkpoint_fails_the_sessions_example_naming_its_user(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mid = _run_sessions(in_tmp, monkeypatch)[-1]
    _check_ok(spark, mid, SESSIONS, "sessions")  # as it was: consistent
    positions = mid.operators["clicks"]["subtasks"]
    # The last click the checkpoint's source had read in partition 1: its
    # session is open at the checkpoint's watermark (it ends 30 s after the
    # click, the watermark is 5 s behind the partition's latest click).
    position = int(positions["1"]["source"]["1"])  # subtask 1 reads partition 1
    assert position > 100, positions
    path = in_tmp / "clicks" / "partition-1.jsonl"
    lines = path.read_text().splitlines()
    click = json.loads(lines[position - 1])
    click["page"] = "/altered"  # not one of the example's pages: the session's page set changes
    lines[position - 1] = json.dumps(click)
    path.write_text("\n".join(lines) + "\n")

    report = validate(spark, mid.path, job=SESSIONS)
    assert not report.ok
    assert {r[2] for r in report.mismatches.collect()} == {click["user"]}


# -- fraud timeout ----------------------------------------------------------------------


PAYMENTS = 20_000  # enough for checkpoints to complete while it runs

ALTERED_JOB = '''\
"""examples/fraud_timeout.py with one event changed: {what}."""
import importlib.util

spec = importlib.util.spec_from_file_location("fraud_timeout", {path!r})
fraud = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fraud)
original = fraud.generate_events


def altered(*args, **kwargs):
    events = original(*args, **kwargs)
    events[{index}] = {{**events[{index}], {change}}}
    return events


fraud.generate_events = altered
build = fraud.build
'''


def _run_fraud(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[ef.CheckpointInfo]:
    env_for(monkeypatch, FRAUD_OUTPUT=str(tmp / "alerts"), FRAUD_CHECKPOINTS=str(tmp / "unused"),
            FRAUD_PAYMENTS=str(PAYMENTS))
    monkeypatch.setattr("eddyflow.checkpoint.writer.ENABLED", False)
    result = run_with_failures(FRAUD, tmp / "chk", interval=0.02, retained=3,
                               faults=(("snapshot.async_write", 1),))
    assert result.restarts >= 1
    return _mid_run(tmp / "chk")


def test_mid_run_checkpoints_of_the_fraud_example_validate_and_an_altered_event_fails(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    infos = _run_fraud(in_tmp, monkeypatch)
    for info in infos:
        _check_ok(spark, info, FRAUD, "confirmation-timeout")

    # An authorisation the checkpoint's source had read, moved to another
    # card: both cards' pending payments (or timers) differ.
    mid = infos[-1]
    position = int(mid.operators["payments"]["subtasks"]["0"]["source"]["slice-0"])
    assert position > 50
    sys.path.insert(0, str(FRAUD.parent))
    try:
        import fraud_timeout
    finally:
        sys.path.remove(str(FRAUD.parent))
    events = fraud_timeout.generate_events(PAYMENTS)
    index = next(i for i in range(position - 1, -1, -1) if events[i]["kind"] == "auth")
    old_card = events[index]["card"]
    job = in_tmp / "fraud_altered.py"
    job.write_text(ALTERED_JOB.format(what=f"event {index} goes to card-zz", path=str(FRAUD),
                                      index=index, change='"card": "card-zz"'))
    report = validate(spark, mid.path, job=job)
    assert not report.ok
    keys = {r[2] for r in report.mismatches.collect()}
    assert "card-zz" in keys and keys <= {"card-zz", old_card}
