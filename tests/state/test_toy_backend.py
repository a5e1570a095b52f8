"""A backend is its module plus one registration (docs/extending/state-backend.md):
the toy of ``toy_backend.py`` touches no eddyflow file, and a job with
checkpoints runs on it, fails, restores from its checkpoint with exact
counts; its checkpoint restores on a new run, into another backend too, and
the offline reader reads it."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace, keyed_backends
from toy_backend import ToyStateBackend, ToyStateHandle

import eddyflow as ef
from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.offline.checkpoint import keyed_files, open_checkpoint, read_keyed_file
from eddyflow.state import registry

N = 3000
RECORDS = [(f"k{i % 300}", i) for i in range(N)]
FINAL = dict(Counter(k for k, _ in RECORDS))


def env_for(tmp: Path, backend: ef.StateBackend, attempts: int) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.set_state_backend(backend)
    env.enable_checkpointing(0.01, tmp / "chk", retained=4)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=attempts, delay=0))
    return env


def job(env: ef.StreamEnvironment, failing: Any) -> None:
    ds = env.from_collection(RECORDS).name("src").map(Pace(8)).name("pace").set_parallelism(1)
    ds = ds.map(failing).name("failing").set_parallelism(1)
    ds.key_by(0).count().name("count").sink_to(ef.ListSink()).name("sink")


def run(env: ef.StreamEnvironment, restore: str | None = None) -> ef.JobResult:
    async def go() -> ef.JobResult:
        return await asyncio.wait_for(env.execute_async("toy", restore=restore), 120)
    return asyncio.run(go())


def test_the_toy_is_registered_by_its_own_module() -> None:
    kind = registry.kind_named("toy")
    assert kind.handle_type is ToyStateHandle
    assert registry.kind_of_backend(ToyStateBackend()) is kind
    handle = ToyStateHandle({"count": "value"}, 0, range(0, 4))
    assert KeyedStateHandle.from_json(handle.to_json()) == handle


def test_a_job_on_the_toy_fails_and_restores_from_its_checkpoint(tmp_path: Path) -> None:
    failing = ef.testing.FailingMap(after=2000)
    env = env_for(tmp_path, ToyStateBackend(), attempts=1)
    job(env, failing)
    result = run(env)
    assert failing.failures == 1 and result.restarts == 1
    assert result.state("count") == FINAL  # exactly once across the restore
    infos = ef.list_checkpoints(tmp_path / "chk")
    assert infos and all(keyed_backends(i, "count") == {"toy"} for i in infos)


@pytest.mark.parametrize("into", ["toy", "memory"])
def test_a_toy_checkpoint_restores_on_a_new_run(tmp_path: Path, into: str) -> None:
    env = env_for(tmp_path, ToyStateBackend(), attempts=0)
    job(env, ef.testing.FailingMap(after=2000))
    with pytest.raises(ef.JobFailed):
        run(env)
    latest = ef.list_checkpoints(tmp_path / "chk")[-1]
    assert keyed_backends(latest, "count") == {"toy"}
    # The offline reader reads it through the registration (files verified).
    ref = open_checkpoint(latest.path)
    counted = {key: value for kf in keyed_files(ref, "count")
               for _, name, key, value in read_keyed_file(kf) if name == "count"}
    assert counted and all(0 < v <= FINAL[k] for k, v in counted.items())
    backend = ToyStateBackend() if into == "toy" else ef.MemoryStateBackend()
    env = env_for(tmp_path, backend, attempts=0)
    job(env, lambda r: r)
    result = run(env, restore="latest")
    assert result.state("count") == FINAL
