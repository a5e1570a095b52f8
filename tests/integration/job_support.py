"""What several runtime tests share to run a job: an identity map that
paces it (so several checkpoints fall between the records of a small
input), a watchdog that fails the test when a job hangs, and the state
backends the exactly-once suites run against (``StateBackendFactory``; the
``backend_name`` and ``state_backend`` fixtures of ``tests/conftest.py`` are
parametrised over them)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

import eddyflow as ef


def watched(job: Coroutine[Any, Any, ef.JobResult], timeout: float) -> ef.JobResult:
    """Run ``job`` (an ``execute_async``); a hung job fails the test."""
    async def go() -> ef.JobResult:
        return await asyncio.wait_for(job, timeout)
    try:
        return asyncio.run(go())
    except TimeoutError:
        pytest.fail(f"the job hung: not finished after {timeout} s")


class Pace:
    """Identity map sleeping ``seconds`` every ``every`` records: keeps the
    source feeding the job long enough for several checkpoints (checkpoints
    stop once the sources have finished)."""

    def __init__(self, every: int, seconds: float = 0.001) -> None:
        self.every = every
        self.seconds = seconds
        self.n = 0

    def __call__(self, r: Any) -> Any:
        self.n += 1
        if self.n % self.every == 0:
            time.sleep(self.seconds)
        return r


def mode_options(mode: str) -> dict[str, Any]:
    """``enable_checkpointing`` options of a suite's mode: the API's modes,
    and "aligned_timeout" (exactly_once switching to unaligned after 5 ms)."""
    if mode == "aligned_timeout":
        return {"mode": "exactly_once", "aligned_timeout": 0.005}
    return {"mode": mode}


# -- the state backends the exactly-once suites run against ---------------------------

#: Names of the backends, the one list of them: the ``backend_name`` fixture
#: (``tests/conftest.py``) and the modules that parametrize over backends use
#: it, and the SIGKILL job files read one from ``EF_SIGKILL_BACKEND``.
BACKENDS = ("memory", "rocksdb")
#: Entries each RocksDB state caches in the suites' runs (unless a test
#: says otherwise): fewer than their jobs' keys, so the write cache is
#: flushed and emptied while records are processed and values are read back
#: from the database, not only at barriers and restores.
#: ``EF_TEST_ROCKSDB_CACHE`` overrides it (e.g. 100000: everything cached).
ROCKSDB_CACHE = int(os.environ.get("EF_TEST_ROCKSDB_CACHE", "4"))


class StateBackendFactory:
    """Makes the state backend of one of a test's runs: ``make(folder)``
    (or the factory itself, called). The memory backend ignores ``folder``;
    a RocksDB backend keeps its local databases under ``folder / "rocks"``,
    with ``options`` (``cache_size``, ``incremental``, ...) over the
    suites' defaults."""

    def __init__(self, name: str) -> None:
        if name not in BACKENDS:
            raise ValueError(f"unknown state backend {name!r}; one of {BACKENDS}")
        self.name = name

    @property
    def rocksdb(self) -> bool:
        return self.name == "rocksdb"

    def make(self, folder: Path, **options: Any) -> ef.StateBackend:
        if self.name == "memory":
            return ef.MemoryStateBackend()
        settings: dict[str, Any] = {"cache_size": ROCKSDB_CACHE, **options}
        return ef.RocksDBStateBackend(str(folder / "rocks"), **settings)

    __call__ = make

    def use(self, env: ef.StreamEnvironment, folder: Path, **options: Any
            ) -> ef.StreamEnvironment:
        """``env`` with the backend ``make(folder, **options)``."""
        return env.set_state_backend(self.make(folder, **options))

    def child_env(self, folder: Path, **options: Any) -> dict[str, str]:
        """The environment variables that make a job file run in a child
        process (``tests/integration/jobs/``) use this backend, as
        ``make(folder, **options)`` would make it (``cache_size`` is the only
        option they pass on)."""
        env = {"EF_SIGKILL_BACKEND": self.name}
        if self.rocksdb:
            env["EF_SIGKILL_ROCKSDB"] = str(folder / "rocks")
            env["EF_SIGKILL_ROCKSDB_CACHE"] = str(options.get("cache_size", ROCKSDB_CACHE))
        return env

    def __repr__(self) -> str:
        return f"StateBackendFactory({self.name!r})"


def keyed_backends(info: ef.CheckpointInfo, operator: str) -> set[str]:
    """The backends whose keyed state ``operator``'s subtasks wrote into the
    checkpoint ``info`` (its ``_metadata``): the backend under test reached
    the job."""
    return {part["keyed"]["backend"] for part in info.operators[operator]["subtasks"].values()
            if part.get("keyed")}


def read_parts(folder: Path) -> list[tuple[Any, ...]]:
    """The records committed to a ``FileSink`` folder (its ``part-*`` files
    only), each JSON list as a tuple."""
    out: list[tuple[Any, ...]] = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("part-"):
            with open(folder / name, encoding="utf-8") as f:
                out.extend(tuple(json.loads(line)) for line in f)
    return out
