"""``read_state`` and ``validate`` on checkpoints of a job with a keyed
co-process function, an interval join, a window join and broadcast state
(``jobs/joined_events.py``), taken in a run with failures: their state
reads back as rows (join buffers, window contents, the broadcast state once
per entry), every retained checkpoint validates, and a checkpoint whose
input was altered before its position fails naming the keys it changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import util
from pathlib import Path
from typing import Any

import pytest
from conftest import env_for, run_with_failures

import eddyflow as ef
from eddyflow.offline import read_state, validate

JOB = Path(__file__).resolve().parent / "jobs" / "joined_events.py"
OPERATORS = {"co", "ij", "wj", "bc"}


def _run(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[ef.CheckpointInfo]:
    spec = util.spec_from_file_location("joined_events", JOB)
    assert spec is not None and spec.loader is not None
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_inputs(str(tmp / "in"))
    env_for(monkeypatch, EF_JOINED_INPUT=str(tmp / "in"))
    monkeypatch.setattr("eddyflow.checkpoint.writer.ENABLED", False)  # as the event-time tests
    result = run_with_failures(JOB, tmp / "chk", interval=0.02, retained=4,
                               faults=(("snapshot.async_write", 2),))
    assert result.restarts >= 1
    infos = ef.list_checkpoints(tmp / "chk")
    assert any(not i.final for i in infos), [(i.id, i.final) for i in infos]
    return infos


def test_every_retained_checkpoint_of_a_two_input_job_validates(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for info in _run(in_tmp, monkeypatch):
        report = validate(spark, info.path, job=JOB)
        assert report.ok, (f"checkpoint {info.id}: {report.mismatch_count} mismatches, e.g. "
                           f"{report.first_mismatches(5)}; unreplayed {report.unreplayed}")
        assert set(report.operators) >= OPERATORS and report.compared > 0
        assert report.unreplayed == {}


def test_read_state_gives_the_rows_of_joins_and_broadcast_state(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    infos = _run(in_tmp, monkeypatch)
    mid = next(i for i in infos if not i.final)
    rows = read_state(spark, mid.path).collect()
    states = {(r["operator"], r["state"]) for r in rows}
    assert {("co", "orders"), ("co", "payments"), ("co", "total"), ("bc", "rated"),
            ("bc", "rules")} <= states
    assert ("ij", "left") in states or ("ij", "right") in states  # buffers not yet expired
    assert any(op == "wj" for op, _ in states)  # open windows
    # The broadcast state: once per rule, whatever the parallelism.
    rules = [r for r in rows if (r["operator"], r["state"]) == ("bc", "rules")]
    keys = [json.loads(r["key"]) if isinstance(r["key"], str) else r["key"] for r in rules]
    assert len(keys) == len(set(keys)) and keys
    final = infos[-1]
    frows = read_state(spark, final.path).collect()
    n_rules = len((in_tmp / "in.rules").read_text().splitlines())
    assert sum(1 for r in frows if (r["operator"], r["state"]) == ("bc", "rules")) == n_rules


def test_two_input_job_input_altered_before_the_position_fails_naming_the_keys(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    infos = _run(in_tmp, monkeypatch)
    mid = next(i for i in infos if not i.final)
    position = int(mid.operators["orders"]["subtasks"]["0"]["source"]["slice-0"])
    assert position > 20
    path = in_tmp / "in.orders"
    lines = path.read_text().splitlines()
    at = position // 2  # read before the checkpoint
    record = json.loads(lines[at])
    old_key = record["k"]
    record["k"] = "zz"  # an order moves to a customer nobody else is
    lines[at] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")

    report = validate(spark, mid.path, job=JOB)
    assert not report.ok
    found = {(r[0], r[1], r[2]) for r in report.mismatches.collect()}
    assert {("co", "orders", "zz"), ("co", "orders", old_key), ("co", "total", "zz"),
            ("co", "total", old_key)} <= found
    # The broadcast function's timer (or its state, if the timer fired).
    assert any(op == "bc" and key == "zz" for op, _, key in found)
    assert {key for _, _, key in found} <= {"zz", old_key}


@pytest.mark.cluster
def test_cli_validates_a_two_input_job_on_the_cluster_and_names_the_altered_keys(
        standalone: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the standalone cluster (executors with a bare Python): the final
    checkpoint is consistent; after one order of the input moved to another
    customer, the mismatches name that customer and the new one."""
    _run(in_tmp, monkeypatch)
    src = str(Path(ef.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env = standalone.driver_env({**env, "PYTHONPATH": src})

    def cli() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "from eddyflow.cli.main import main; main()", "validate",
             str(in_tmp / "chk"), "--job", str(JOB), "--master", standalone.master_url,
             "--show", "50"],
            env=env, capture_output=True, text=True, timeout=600, check=False)

    done = cli()
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "consistent" in done.stdout + done.stderr
    path = in_tmp / "in.orders"
    lines = path.read_text().splitlines()
    record = json.loads(lines[40])
    old_key = record["k"]
    record["k"] = "zz"
    lines[40] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    done = cli()
    printed = done.stdout + done.stderr  # the report's table (on the console's stream)
    assert done.returncode == 1, printed[-4000:]
    assert "NOT consistent" in printed
    assert "│ zz " in printed and f"│ {old_key} " in printed
