"""What the SIGKILL job files (``sigkill_job.py``, ``sigkill_loop_job.py``,
beside this one; a job file imports its neighbours) read from the
environment their test gives the child process: folders, and the state
backend (``job_support.StateBackendFactory.child_env``)."""

from __future__ import annotations

import os

import eddyflow as ef


def setting(name: str, job: str) -> str:
    """Environment variable ``name``, which ``job`` cannot run without."""
    try:
        return os.environ[name]
    except KeyError:
        raise RuntimeError(f"{job}: set the environment variable {name}") from None


def state_backend(job: str) -> ef.StateBackend:
    """The backend ``EF_SIGKILL_BACKEND`` names."""
    name = os.environ.get("EF_SIGKILL_BACKEND", "memory")
    if name == "memory":
        return ef.MemoryStateBackend()
    if name == "rocksdb":
        options = {}
        if "EF_SIGKILL_ROCKSDB_CACHE" in os.environ:
            options["cache_size"] = int(os.environ["EF_SIGKILL_ROCKSDB_CACHE"])
        return ef.RocksDBStateBackend(setting("EF_SIGKILL_ROCKSDB", job), **options)
    raise RuntimeError(f"{job}: EF_SIGKILL_BACKEND={name!r}: memory or rocksdb")
