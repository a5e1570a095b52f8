"""One local Spark session for every offline test (starting a JVM costs
seconds), one local standalone cluster for the tests that need a real one
(``standalone``), and helpers to run an example with checkpoints and
failures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import eddyflow as ef
from eddyflow.jobfile import build_environment
from eddyflow.testing import arm, disarm_all

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from eddyflow.offline import spark_session

    session = spark_session("local[2]", app_name="eddyflow-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def standalone() -> Iterator[Any]:
    """A Spark standalone master and two workers of one core each on
    127.0.0.1, whose executors run a bare Python (a venv with nothing
    installed): started once for the whole run, stopped at its end with
    every JVM it started."""
    pytest.importorskip("pyspark")
    from eddyflow.offline.standalone import bare_python, can_import, start_cluster

    python = bare_python()
    assert not can_import(python, "eddyflow"), f"{python} must not have eddyflow"
    cluster = start_cluster(workers=2, cores_per_worker=1, python=python)
    try:
        yield cluster
    finally:
        cluster.stop()
    assert cluster.leftover() == [], "the cluster left processes running"


def run_with_failures(job: Path, checkpoints: Path, *, interval: float = 0.02,
                      faults: tuple[tuple[str, int], ...] = (), retained: int = 5,
                      parallelism: int = 2, mode: str = "exactly_once") -> ef.JobResult:
    """Run ``job`` in-process with frequent checkpoints into ``checkpoints``,
    the named fault points armed (``(point, after)``), and restarts allowed."""
    env, _ = build_environment(job, parallelism=parallelism)
    env.enable_checkpointing(interval=interval, directory=checkpoints, retained=retained,
                             mode=mode)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=10, delay=0.0))
    try:
        for point, after in faults:
            arm(point, after=after)
        return env.execute(job.stem)
    finally:
        disarm_all()


@pytest.fixture()
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in ``tmp_path``: the examples write relative folders."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def env_for(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    assert all(os.environ[k] == v for k, v in values.items())
