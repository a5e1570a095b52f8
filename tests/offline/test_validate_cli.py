"""``eddyflow validate``: exit 0 when consistent, 1 with a table of the
mismatches, 2 on usage errors and damaged checkpoints, each error one line
of eddyflow's own, not Spark's Java and Python (CLI in-process, on the
shared session)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, run_with_failures
from tamper import change_one_drop_one, garble_state_file, rewrite_state

import eddyflow as ef
from eddyflow.cli.main import main
from eddyflow.jobfile import build_environment

JOB = str(EXAMPLES / "running_sum.py")


def test_exit_codes_and_mismatch_table(spark: Any, in_tmp: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNNING_SUM_EVENTS", "20000")
    # Narrower than the message: it must stay on one line whatever the
    # terminal's width or the length of the temporary path in it.
    monkeypatch.setenv("COLUMNS", "100")
    run_with_failures(EXAMPLES / "running_sum.py", in_tmp / "chk", interval=1.0)
    runner = CliRunner()

    ok = runner.invoke(main, ["validate", str(in_tmp / "chk"), "--job", JOB])
    assert ok.exit_code == 0, ok.output
    assert "consistent" in ok.output and "20,000 source records replayed" in ok.output

    final = ef.list_checkpoints(in_tmp / "chk")[-1]
    rewrite_state(final.path, "running-sum",
                  change_one_drop_one("state", "sensor-07", "sensor-31"))
    bad = runner.invoke(main, ["validate", str(in_tmp / "chk"), "--job", JOB,
                               "--checkpoint", str(final.id)])
    assert bad.exit_code == 1, bad.output
    assert "2 mismatching state entries" in bad.output
    assert "sensor-07" in bad.output and "sensor-31" in bad.output
    assert "NOT consistent" in bad.output
    assert spark.sparkContext._jsc is not None  # the shared session is still up


@pytest.mark.parametrize("args, message", [
    (["validate", "no-such-dir", "--job", JOB], "is not a directory"),
    (["validate", ".", "--job", "no-such-job.py"], "does not exist"),
    (["validate", "."], "Missing option '--job'"),
    (["validate", ".", "--job", JOB], "no completed checkpoint"),
])
def test_usage_errors_exit_2_without_starting_spark(args: list[str], message: str,
                                                    in_tmp: Path) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def _small_run(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> ef.CheckpointInfo:
    monkeypatch.setenv("RUNNING_SUM_EVENTS", "2000")
    env, _ = build_environment(JOB, parallelism=1)
    env.enable_checkpointing(interval=10.0, directory=in_tmp / "chk")
    env.execute("running-sum")
    return ef.list_checkpoints(in_tmp / "chk")[-1]  # the final one


def _one_error_line(result: Any) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and "java" not in result.output.lower()
    return str(lines[0])


def test_damaged_checkpoint_exits_2_with_its_own_message_before_spark(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Verified on the driver: named at once, Spark never started (no
    # session fixture here: a session would be created if it were).
    final = _small_run(in_tmp, monkeypatch)
    keyed = final.meta.operators["running-sum"].subtasks[0].keyed
    assert keyed is not None
    state = os.path.join(os.path.dirname(final.path), keyed.file_handles()[-1].path)
    data = bytearray(Path(state).read_bytes())
    data[-1] ^= 0xFF
    Path(state).write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["validate", str(in_tmp / "chk"), "--job", JOB])
    assert _one_error_line(result) == (f"error: checkpoint {final.id} of {in_tmp / 'chk'} "
                                       f"cannot be validated: {state}: checksum mismatch")

    meta = os.path.join(final.path, "_metadata")
    Path(meta).write_bytes(Path(meta).read_bytes()[:100])  # truncated
    result = CliRunner().invoke(main, ["validate", str(in_tmp / "chk"), "--job", JOB])
    line = _one_error_line(result)
    # The latest checkpoint is the one validated, damaged or not: not an
    # older one instead.
    assert line.startswith(f"error: checkpoint {final.id} of {in_tmp / 'chk'} cannot be "
                           f"validated: {meta}: unreadable: ")


def test_an_executors_error_arrives_as_eddyflows_own_message(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A state file that verifies but cannot be read (re-signed after the
    # damage): only an executor finds out. Its CheckpointCorrupted is found
    # inside Spark's PythonException and reported as itself.
    final = _small_run(in_tmp, monkeypatch)
    path = garble_state_file(final.path, "running-sum")
    result = CliRunner().invoke(main, ["validate", str(in_tmp / "chk"), "--job", JOB])
    line = _one_error_line(result)
    assert line.startswith(f"error: checkpoint {final.id} of {in_tmp / 'chk'} is damaged: "
                           f"{path}: "), line
    assert "unreadable" in line
    assert spark.sparkContext._jsc is not None  # the shared session is still up
