"""``eddyflow validate``: exit 0 when consistent, 1 with a table of the
mismatches, 2 on usage errors (CLI in-process, on the shared session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, run_with_failures
from tamper import change_one_drop_one, rewrite_state

import eddyflow as ef
from eddyflow.cli.main import main

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
