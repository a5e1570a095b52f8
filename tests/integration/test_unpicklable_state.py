"""A value the runtime must pickle and cannot (issue 13).

Keyed state that holds a lambda or an instance of a local class fails the
job at its first snapshot with a message naming the operator, the state,
the key and the checkpoint, on both state backends; restarting cannot help
(the same code makes the same value again), so the restart strategy is not
consulted: the job fails after its first attempt, with the
:class:`ef.errors.StateSerializationError` as the root cause. A record of a
loop that cannot be pickled into a back-edge log is named the same way.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace, StateBackendFactory

import eddyflow as ef
from eddyflow.errors import StateSerializationError


class Remember(ef.KeyedProcessFunction):
    """Keeps a lambda per key in value state ``seen``; counts its opens (one
    per subtask per attempt of the job)."""

    opens = 0

    def open(self, ctx: ef.RuntimeContext) -> None:
        type(self).opens += 1
        self.seen = ctx.value_state("seen")

    def process(self, value: Any, ctx: Any) -> Any:
        self.seen.value = lambda: value  # a local object: pickle refuses it
        yield value


def _failing_job(tmp_path: Path, backend: StateBackendFactory, parallelism: int = 1
                 ) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment(parallelism=parallelism)
    # Cache every key (RocksDB): the value is first pickled by a snapshot,
    # not by an eviction from the write cache.
    backend.use(env, tmp_path, cache_size=100_000)
    env.enable_checkpointing(interval=0.05, directory=tmp_path / "chk")
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0.0))
    (env.from_collection([f"key{i % 7}" for i in range(300)]).map(Pace(10)).name("pace")
     .key_by(lambda r: r).process(Remember()).name("dedup")
     .sink_to(ef.ListSink()))
    return env


@pytest.mark.parametrize("parallelism", [1, 2])
def test_unpicklable_keyed_value_fails_at_once_naming_operator_state_key_and_checkpoint(
        tmp_path: Path, state_backend: StateBackendFactory, parallelism: int,
        caplog: pytest.LogCaptureFixture) -> None:
    Remember.opens = 0
    env = _failing_job(tmp_path, state_backend, parallelism)
    with caplog.at_level(logging.WARNING, logger="eddyflow"), \
            pytest.raises(ef.JobFailed) as info:
        env.execute("remember")
    e = info.value
    msg = str(e)
    assert "\n" not in msg
    assert re.search(r"cannot snapshot keyed state 'seen' of operator 'dedup' for key "
                     r"'key\d' in checkpoint \d+: Can't pickle local object "
                     r"'Remember\.process\.<locals>\.<lambda>'", msg), msg
    assert e.operator == "dedup" and e.subtask in range(parallelism)
    cause = e.__cause__
    assert isinstance(cause, StateSerializationError)
    assert (cause.operator, cause.state) == ("dedup", "seen")
    assert cause.key is not None and re.fullmatch(r"'key\d'", cause.key)
    assert isinstance(cause.checkpoint, int) and cause.checkpoint >= 1
    assert not cause.retryable
    # One attempt: no restart was tried (3 were allowed).
    assert Remember.opens == parallelism
    assert not [r for r in caplog.records if "restart" in r.getMessage()]
    assert not getattr(e, "__notes__", [])


def test_a_retryable_failure_still_restarts(tmp_path: Path) -> None:
    # The restart strategy is skipped only for failures a restart cannot
    # get past: an injected failure is retried as before.
    env = ef.StreamEnvironment()
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0.0))
    sink = ef.ListSink()
    env.from_collection(range(10)).map(ef.testing.FailingMap(after=5)).sink_to(sink)
    result = env.execute()
    assert result.restarts == 1
    assert sorted(sink.results) == list(range(10))


def test_unpicklable_record_in_a_back_edge_log_names_the_loop_head(tmp_path: Path) -> None:
    # Records round a loop carry a local class instance. A checkpoint taken
    # while they circulate logs them at the loop head (DESIGN.md §3): that
    # pickles them, and fails naming the record, the head and the checkpoint.
    class Payload:
        pass

    def step(r: tuple[int, Any]) -> tuple[int, Any]:
        return r[0] - 1, r[1]

    env = ef.StreamEnvironment()
    env.enable_checkpointing(interval=0.02, directory=tmp_path / "chk")
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=2, delay=0.0))
    loop = (env.from_collection(range(200)).map(Pace(1, 0.001)).name("pace")
            .map(lambda n: (300, Payload())).name("enter").iterate().name("head"))
    stepped = loop.map(step).name("step")
    loop.close_with(stepped.filter(lambda r: r[0] > 0).name("again"))
    stepped.filter(lambda r: r[0] == 0).map(lambda r: r[0]).sink_to(ef.ListSink())
    with pytest.raises(ef.JobFailed) as info:
        env.execute("loop")
    msg = str(info.value)
    assert re.search(r"operator 'head' \(subtask 1 of 1\) raised StateSerializationError: "
                     r"cannot snapshot back-edge record \(\d+, <.*Payload object at 0x\w+>\) "
                     r"of operator 'head' in checkpoint \d+: Can't pickle local object "
                     r"'test_.*<locals>\.Payload'", msg), msg
    assert isinstance(info.value.__cause__, StateSerializationError)
    assert "restarted" not in " ".join(getattr(info.value, "__notes__", []))
