"""The job that ``tests/integration/test_sigkill.py`` kills and restarts.

``from_log -> key_by(key) -> map_with_state(running count and sum) -> FileSink``.
Each log record is ``[key, seq, value]``; the stateful map emits
``[key, seq, count, sum]``, where ``count`` and ``sum`` run over the key's
records so far. The test writes every key's records into one partition, so a
key's records arrive in log order and each output record is deterministic:
a failure-free run and any number of crash-and-restore runs must commit the
very same set of records, each exactly once.

Settings come from environment variables, so the same file runs under
``eddyflow run`` (``--restore latest``) and directly:

* ``EF_SIGKILL_LOG``  the ``ef.Log`` folder to read (required)
* ``EF_SIGKILL_OUT``  the ``FileSink`` folder (required)
* ``EF_SIGKILL_CHK``  the checkpoint folder (required)
* ``EF_SIGKILL_INTERVAL``  checkpoint interval in seconds (default 0.05)
* ``EF_SIGKILL_PARALLELISM``  parallelism of every operator (default: the
  environment's, e.g. ``eddyflow run -p 2``)
* ``EF_SIGKILL_SLOW``  seconds of busy work per 1,000 records in the stateful
  map (default 0: full speed), to stretch the job on a fast machine
* ``EF_SIGKILL_BACKEND``  the state backend: ``memory`` (default) or
  ``rocksdb``, whose local databases go under ``EF_SIGKILL_ROCKSDB``, with
  ``EF_SIGKILL_ROCKSDB_CACHE`` entries in each state's write cache (default:
  the backend's)
* ``EF_SIGKILL_MODE``  the checkpoint mode (default ``exactly_once``)
* ``EF_SIGKILL_ALIGNED_TIMEOUT``  seconds after which an aligned checkpoint
  switches to unaligned (default: never)
* ``EF_SIGKILL_SINK_DELAY``  seconds a map before the sink sleeps per record
  (default 0: none); it runs at parallelism 1, behind an exchange, with small
  channels, so the job is back-pressured from its first second
* ``EF_SIGKILL_ASYNC``  seconds each call of a ``map_async`` (ordered,
  right after the source) sleeps (default 0: no such operator); its records
  in flight are in the checkpoints and are called again after a restore
* ``EF_SIGKILL_DEEP``  seconds a map in the middle of the job sleeps per
  record (default 0: no such map). The job is then ``from_log -> key_by ->
  parse -> key_by -> sleepy (parallelism 1) -> key_by -> running -> FileSink``:
  three exchanges with small channels, so that 'parse' is blocked on its
  output and the source on 'parse' when a barrier reaches them
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from sigkill_settings import setting, state_backend

import eddyflow as ef

State = tuple[int, int]


def make_step(slow: float) -> Any:
    """The stateful map: running count and sum per key (plus optional busy work)."""
    per_record = slow / 1000.0

    def step(record: list[Any], state: State | None) -> tuple[list[Any], State]:
        key, seq, value = record
        count, total = state if state is not None else (0, 0)
        count += 1
        total += value
        if per_record:
            until = time.perf_counter() + per_record
            while time.perf_counter() < until:
                pass
        return [key, seq, count, total], (count, total)

    return step


def first(record: list[Any]) -> Any:
    """The key of a log record."""
    return record[0]


def _setting(name: str) -> str:
    return setting(name, "sigkill_job")


def build(env: ef.StreamEnvironment) -> None:
    if "EF_SIGKILL_PARALLELISM" in os.environ:  # else the runner's (``eddyflow run -p``)
        env.parallelism = int(os.environ["EF_SIGKILL_PARALLELISM"])
    env.set_state_backend(state_backend("sigkill_job"))
    env.enable_checkpointing(
        interval=float(os.environ.get("EF_SIGKILL_INTERVAL", "0.05")),
        directory=_setting("EF_SIGKILL_CHK"),
        mode=os.environ.get("EF_SIGKILL_MODE", "exactly_once"),
        aligned_timeout=(float(os.environ["EF_SIGKILL_ALIGNED_TIMEOUT"])
                         if "EF_SIGKILL_ALIGNED_TIMEOUT" in os.environ else None),
    )
    slow = float(os.environ.get("EF_SIGKILL_SLOW", "0"))
    delay = float(os.environ.get("EF_SIGKILL_SINK_DELAY", "0"))
    deep = float(os.environ.get("EF_SIGKILL_DEEP", "0"))
    source = env.from_log(_setting("EF_SIGKILL_LOG"))
    latency = float(os.environ.get("EF_SIGKILL_ASYNC", "0"))
    if latency:
        # Forward from the source and in input order: each key's records
        # still reach the stateful map in log order.
        source = source.map_async(Lookup(latency), capacity=100, ordered=True).name("lookup")
    if deep:
        env.channel_capacity = 2
        # Each key's records stay in one subtask at every stage: in log order.
        parsed = source.key_by(first).map(parse).name("parse")
        source = parsed.key_by(first).map(Sleepy(deep)).name("sleepy").set_parallelism(1)
    out = source.key_by(first).map_with_state(make_step(slow)).name("running")
    if delay:
        env.channel_capacity = 2
        out = out.map(Sleepy(delay)).name("sleepy").set_parallelism(1)
    out.sink_to(ef.FileSink(_setting("EF_SIGKILL_OUT")))


def parse(record: list[Any]) -> list[Any]:
    """A new record of the same content (a stage of its own in the deep job)."""
    return list(record)


class Lookup:
    """A coroutine function: a copy of the record after ``latency`` seconds."""

    def __init__(self, latency: float) -> None:
        self.latency = latency

    async def __call__(self, record: list[Any]) -> list[Any]:
        await asyncio.sleep(self.latency)
        return list(record)


class Sleepy:
    """Identity, sleeping ``delay`` seconds per record: the bottleneck."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __call__(self, record: Any) -> Any:
        time.sleep(self.delay)
        return record


if __name__ == "__main__":
    environment = ef.StreamEnvironment()
    build(environment)
    print(environment.execute("sigkill", restore="latest"))
