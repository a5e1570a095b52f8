"""Recovery with RocksDB state: a damaged or missing shared SST file is found
before anything is restored, named in a warning, and an older checkpoint
that does not reference it is used instead; the counts come out exact."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace

import eddyflow as ef

N = 3000
RECORDS = [(f"k{i % 300}", i) for i in range(N)]
FINAL = dict(Counter(k for k, _ in RECORDS))


def env_for(tmp: Path, attempts: int) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.set_state_backend(ef.RocksDBStateBackend(tmp / "rocks"))
    env.enable_checkpointing(0.01, tmp / "chk", retained=4)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=attempts, delay=0))
    return env


def job(env: ef.StreamEnvironment, failing: Any) -> None:
    ds = env.from_collection(RECORDS).name("src").map(Pace(8)).name("pace").set_parallelism(1)
    ds = ds.map(failing).name("failing").set_parallelism(1)
    ds.key_by(0).count().name("count").sink_to(ef.ListSink()).name("sink")


def run(env: ef.StreamEnvironment, restore: str | None = None) -> ef.JobResult:
    async def go() -> ef.JobResult:
        return await asyncio.wait_for(env.execute_async("rocks", restore=restore), 120)
    return asyncio.run(go())


def sst_paths(info: ef.CheckpointInfo) -> set[str]:
    return {f["path"] for f in info.metadata["files"] if f["path"].endswith(".sst")}


@pytest.mark.parametrize("damage", ["flipped", "missing"])
def test_a_damaged_shared_sst_falls_back_to_an_older_checkpoint(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    env = env_for(tmp_path, attempts=0)
    job(env, ef.testing.FailingMap(after=2500))
    with pytest.raises(ef.JobFailed):
        run(env)
    infos = ef.list_checkpoints(tmp_path / "chk")
    assert len(infos) >= 2, [i.id for i in infos]
    latest, older = infos[-1], infos[:-1]
    # A file only the latest checkpoint references.
    only_latest = sst_paths(latest) - set().union(*map(sst_paths, older))
    assert only_latest, "the latest checkpoint wrote no SST file of its own"
    victim = sorted(only_latest)[0]
    path = tmp_path / "chk" / victim
    if damage == "missing":
        os.unlink(path)
    else:
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            f.write(b"\xff\x00\xff")
    env = env_for(tmp_path, attempts=0)
    job(env, lambda r: r)
    with caplog.at_level(logging.WARNING, logger="eddyflow"):
        result = run(env, restore="latest")
    assert any(victim in r.getMessage() and f"checkpoint {latest.id}" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert result.state("count") == FINAL
    # It resumed from an older checkpoint's source position.
    position = int(older[-1].operators["src"]["subtasks"]["0"]["source"]["slice-0"])
    assert result.records_out["src"] == N - position


def test_retained_checkpoints_each_restore_exactly(tmp_path: Path) -> None:
    env = env_for(tmp_path, attempts=0)
    job(env, ef.testing.FailingMap(after=2800))
    with pytest.raises(ef.JobFailed):
        run(env)
    infos = ef.list_checkpoints(tmp_path / "chk")
    assert len(infos) == 4  # retained
    referenced = {f["path"] for i in infos for f in i.metadata["files"]}
    shared = {f"shared/{n}" for n in os.listdir(tmp_path / "chk" / "shared")}
    assert shared == {p for p in referenced if p.startswith("shared/")}
    for info in infos:
        env = env_for(tmp_path / f"again-{info.id}", attempts=0)
        job(env, lambda r: r)
        result = run(env, restore=info.path)
        assert result.state("count") == FINAL
