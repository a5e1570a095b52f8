"""The loop job that ``tests/integration/test_sigkill_loop.py`` kills and restarts.

::

    from_log -> iterate ("head") -> step -+-> filter "again" -> key_by(key) -+
                   ^                      |                                  |
                   |                      +-> filter "done" -> key_by(key)   |
                   |                          -> map_with_state -> FileSink  |
                   +------------------- back-edge ---------------------------+

Each log record is ``[key, seq, n, rounds]``. Round the loop, ``step`` takes
one Collatz step on ``n`` (carrying on round 4-2-1 once it gets there) and
counts ``rounds`` down, with some busy work so the job runs for a while;
records with rounds left are fed back to the head, keyed by their key, and
the others leave the loop. So every record goes round the loop ``rounds``
times and leaves it as ``[key, seq, collatz^rounds(n), 0]``, whatever the
timing. The keyed stateful map after the loop keeps each key's running
count and sum of those final values and emits ``[key, seq, n, count, sum]``.

Records of one key leave the loop in an order that depends on timing (they
go round different numbers of times), so ``count`` and ``sum`` of a single
output record are not deterministic; but in every run each key's committed
records must carry the counts ``1..N`` exactly once, their sums must be the
running sums of the records' values in that order, and the last must be the
key's true count and total.

Settings come from environment variables, so the same file runs under
``eddyflow run`` (``--restore latest``) and directly:

* ``EF_SIGKILL_LOG``  the ``ef.Log`` folder to read (required)
* ``EF_SIGKILL_OUT``  the ``FileSink`` folder (required)
* ``EF_SIGKILL_CHK``  the checkpoint folder (required)
* ``EF_SIGKILL_INTERVAL``  checkpoint interval in seconds (default 0.05)
* ``EF_SIGKILL_RETAINED``  completed checkpoints kept on disk (default 3)
* ``EF_SIGKILL_PARALLELISM``  parallelism of every operator (default: the
  environment's, e.g. ``eddyflow run -p 2``)
* ``EF_SIGKILL_SLOW``  seconds of busy work per 1,000 steps round the loop
  (default 0: full speed), to stretch the job on a fast machine
* ``EF_SIGKILL_ASYNC``  seconds each step waits, as a ``map_async`` (at most
  100 steps in flight per subtask) instead of a ``map`` (default 0: a
  ``map``); the records in flight in it are in the checkpoints
* ``EF_SIGKILL_BACKEND``  the state backend: ``memory`` (default) or
  ``rocksdb``, whose local databases go under ``EF_SIGKILL_ROCKSDB``, with
  ``EF_SIGKILL_ROCKSDB_CACHE`` entries in each state's write cache (default:
  the backend's)
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from sigkill_settings import setting, state_backend

import eddyflow as ef

HEAD = "head"  # the loop head's name: its identity in checkpoints

State = tuple[int, int]


def collatz(n: int) -> int:
    """One Collatz step."""
    return n // 2 if n % 2 == 0 else 3 * n + 1


def make_step(slow: float) -> Any:
    """The loop body: one Collatz step and one round less (plus busy work)."""
    per_record = slow / 1000.0

    def step(record: list[Any]) -> list[Any]:
        key, seq, n, rounds = record
        if per_record:
            until = time.perf_counter() + per_record
            while time.perf_counter() < until:
                pass
        return [key, seq, collatz(n), rounds - 1]

    return step


class AsyncStep:
    """The loop body as a coroutine function: ``step`` after ``latency`` seconds."""

    def __init__(self, step: Any, latency: float) -> None:
        self.step = step
        self.latency = latency

    async def __call__(self, record: list[Any]) -> list[Any]:
        await asyncio.sleep(self.latency)
        result: list[Any] = self.step(record)
        return result


def first(record: list[Any]) -> Any:
    """The key of a record."""
    return record[0]


def again(record: list[Any]) -> bool:
    """Rounds left: go round the loop once more."""
    return bool(record[3] > 0)


def done(record: list[Any]) -> bool:
    """No rounds left: leave the loop."""
    return bool(record[3] <= 0)


def running(record: list[Any], state: State | None) -> tuple[list[Any], State]:
    """Each key's running count and sum of the values leaving the loop."""
    key, seq, n, _ = record
    count, total = state if state is not None else (0, 0)
    count += 1
    total += n
    return [key, seq, n, count, total], (count, total)


def _setting(name: str) -> str:
    return setting(name, "sigkill_loop_job")


def build(env: ef.StreamEnvironment) -> None:
    if "EF_SIGKILL_PARALLELISM" in os.environ:  # else the runner's (``eddyflow run -p``)
        env.parallelism = int(os.environ["EF_SIGKILL_PARALLELISM"])
    env.set_state_backend(state_backend("sigkill_loop_job"))
    env.enable_checkpointing(
        interval=float(os.environ.get("EF_SIGKILL_INTERVAL", "0.05")),
        directory=_setting("EF_SIGKILL_CHK"),
        retained=int(os.environ.get("EF_SIGKILL_RETAINED", "3")),
    )
    slow = float(os.environ.get("EF_SIGKILL_SLOW", "0"))
    loop = env.from_log(_setting("EF_SIGKILL_LOG")).name("log").iterate()
    loop.name(HEAD)  # names the iterate node just added: the loop head
    latency = float(os.environ.get("EF_SIGKILL_ASYNC", "0"))
    if latency:
        stepped = loop.map_async(AsyncStep(make_step(slow), latency), capacity=100,
                                 ordered=False).name("step")
    else:
        stepped = loop.map(make_step(slow)).name("step")
    loop.close_with(stepped.filter(again).name("again").key_by(first))
    (
        stepped.filter(done).name("done")
        .key_by(first)
        .map_with_state(running)
        .name("running")
        .sink_to(ef.FileSink(_setting("EF_SIGKILL_OUT")))
        .name("sink")
    )


if __name__ == "__main__":
    environment = ef.StreamEnvironment()
    build(environment)
    print(environment.execute("sigkill-loop", restore="latest"))
