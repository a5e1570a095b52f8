"""RocksDB checkpoints offline: ``read_state`` and ``validate`` read them on
the executors like the memory backend's files, and a damaged SST file is
refused naming it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import eddyflow as ef
from eddyflow.jobfile import build_environment
from eddyflow.offline import read_state, validate
from eddyflow.testing import arm, disarm_all


def run_rocks(tmp: Path, job: Path) -> ef.JobResult:
    env, _ = build_environment(job, parallelism=2)
    env.set_state_backend(ef.RocksDBStateBackend(tmp / "rocks"))
    env.enable_checkpointing(interval=0.02, directory=tmp / "chk", retained=5)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=5, delay=0.0))
    try:
        arm("snapshot.async_write", after=3)
        return env.execute(job.stem)
    finally:
        disarm_all()


JOB = Path(__file__).parent / "jobs" / "paced_running_sum.py"


def test_rocksdb_checkpoints_read_and_validate_on_spark(spark: Any, in_tmp: Path) -> None:
    # The paced job takes several checkpoints before its third asynchronous
    # write fails it, whatever the machine's speed.
    result = run_rocks(in_tmp, JOB)
    infos = ef.list_checkpoints(in_tmp / "chk")
    assert result.restarts >= 1 and len(infos) >= 2
    final = infos[-1]
    assert all(p["keyed"]["backend"] == "rocksdb"
               for p in final.operators["running-sum"]["subtasks"].values())
    rows = {r["key"]: int(r["value"])
            for r in read_state(spark, final.path, operator="running-sum").collect()}
    assert rows == dict(result.state("running-sum"))
    for info in (infos[0], final):  # one restored-from and the final one
        report = validate(spark, info.path, job=JOB)
        assert report.ok, (info.id, report.first_mismatches(5))
        assert report.compared > 0

    sst = next(f for f in final.metadata["files"] if f["path"].endswith(".sst"))
    with open(os.path.join(in_tmp / "chk", sst["path"]), "r+b") as f:
        f.seek(int(sst["size"]) // 2)
        f.write(b"\x00garbage\x00")
    with pytest.raises(Exception, match=os.path.basename(sst["path"])):
        read_state(spark, final.path, operator="running-sum").collect()
