"""Cyclic jobs (``iterate``/``close_with``) over worker processes.

The loop's keyed body crosses between the workers, and so does its
back-edge when it is rebalanced (a keyed back-edge at the body's
parallelism and key goes back to the head subtask of the same worker), so
records go round the loop through both processes, and the loop ends only
when the caller has found it empty in every worker
(``runtime/workers/termination.py``). Each job is compared with what a
failure-free run gives: the committed ``ListSink`` records (a per-key
running count of the records that left the loop) and the final keyed state
(passes per key round the loop). Failures are real: a ``FailingMap`` in
the loop body, SIGKILL of a worker at random moments, and a checkpoint with
records in flight round the loop (its back-edge log) restored with one and
with three workers. After every test no child process of this one is left.

Each scenario runs in a fresh process (``in_clean_process``), as in
``test_workers.py``: a process that has run RocksDB itself cannot fork workers.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_support import mode_options
from sigkill_support import (
    WorkerKiller,
    in_clean_process,
    no_process_left_behind,  # noqa: F401 - the autouse fixture
    seed,
)

import eddyflow as ef

KEYS = 12




def key0(r: Any) -> Any:
    return r[0]


def countdown(r: tuple[int, int, int]) -> tuple[int, int, int]:
    return (r[0], r[1], r[2] - 1)


def count_passes(r: Any, s: int | None) -> tuple[Any, int]:
    return r, (s or 0) + 1


def again(r: tuple[int, int, int]) -> bool:
    return r[2] > 0


def leaves(r: tuple[int, int, int]) -> bool:
    return r[2] <= 0


class Busy:
    """Identity map spinning ``seconds`` per record (a loop that works)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, r: Any) -> Any:
        until = time.perf_counter() + self.seconds
        while time.perf_counter() < until:
            pass
        return r


def run(records: int, rounds: int, *, workers: int, directory: Path | None = None,
        backend: ef.StateBackend | None = None, failing: Any = None, restarts: int = 0,
        restore: str | None = None, busy: float = 0.0, feedback: str = "keyed",
        sink: ef.ListSink | None = None, feedback_memory: int | None = None,
        mode: str = "exactly_once",
        ) -> tuple[Counter[Any], dict[Any, Any], ef.JobResult]:
    """``records`` records ``(key, id, rounds)`` go ``rounds`` times round a
    loop with a keyed count of passes in it; each that leaves adds to a
    per-key count, which the sink gets."""
    env = ef.StreamEnvironment(parallelism=2, batch_size=16, workers=workers)
    if directory is not None:
        env.enable_checkpointing(interval=0.02, directory=str(directory), retained=1000,
                                 **mode_options(mode))
    if backend is not None:
        env.set_state_backend(backend)
    if restarts:
        env.set_restart_strategy(ef.FixedDelayRestart(attempts=restarts, delay=0.05))
    if feedback_memory is not None:
        # (No public setting: records a feedback channel keeps before spilling.)
        config = dataclasses.replace(env._runtime_config(), feedback_memory=feedback_memory)
        env._runtime_config = lambda: config  # type: ignore[method-assign]
    sink = sink if sink is not None else ef.ListSink()
    src = env.from_collection([(i % KEYS, i, rounds) for i in range(records)]).name("src")
    loop = src.iterate().name("head")
    body = loop.key_by(key0).map_with_state(count_passes).name("passes")
    if busy:
        body = body.map(Busy(busy)).name("busy")
    if failing is not None:
        body = body.map(failing).name("failing")
    body = body.map(countdown).name("countdown")
    back = body.filter(again).name("again")
    loop.close_with(back.key_by(key0) if feedback == "keyed" else back.rebalance())
    body.filter(leaves).name("out").key_by(key0).count().name("finished").sink_to(sink)
    result = env.execute("loop over workers", restore=restore)
    return Counter(sink.results), dict(result.state("passes")), result


def expected(records: int, rounds: int) -> tuple[Counter[Any], dict[Any, Any]]:
    per_key = Counter(i % KEYS for i in range(records))
    out = Counter((k, c) for k, n in per_key.items() for c in range(1, n + 1))
    return out, {k: n * rounds for k, n in per_key.items()}


def same_as_one_process(workers: int, feedback: str) -> None:
    out, passes, result = run(3_000, 7, workers=workers, feedback=feedback)
    assert (out, passes) == expected(3_000, 7)
    assert result.records_in["passes"] == 3_000 * 7


@pytest.mark.parametrize(("workers", "feedback"), [(2, "keyed"), (3, "keyed"),
                                                   (2, "rebalance")])
def test_a_loop_over_workers_gives_what_one_process_gives(workers: int, feedback: str) -> None:
    in_clean_process(same_as_one_process, workers, feedback)


def few_records_end() -> None:
    # A loop of three records ends as soon as it is empty (no idle wait:
    # the run would hang without the end, as no timer ends a loop).
    for workers in (2, 3):
        out, passes, _ = run(3, 2, workers=workers)
        assert (out, passes) == expected(3, 2)


def test_a_loop_of_a_few_records_over_workers_ends() -> None:
    in_clean_process(few_records_end)


def restarts_every_worker(tmp_path: Path, backend: str, mode: str = "exactly_once") -> None:
    from job_support import StateBackendFactory

    failing = ef.testing.FailingMap(after=15_000, times=2)
    out, passes, result = run(4_000, 12, workers=2, directory=tmp_path / "chk",
                              failing=failing, restarts=3, feedback="rebalance",
                              backend=StateBackendFactory(backend).make(tmp_path),
                              busy=2e-6 if mode != "exactly_once" else 0.0, mode=mode)
    assert failing.failures == 2
    assert result.restarts == 2
    assert (out, passes) == expected(4_000, 12)
    done = ef.list_checkpoints(tmp_path / "chk")
    # Checkpoints held records in flight round the loop (back-edge logs).
    assert any(logged_in(c) for c in done)
    if mode != "exactly_once":
        # ... and on the loop's channels between workers (channel state).
        assert any(channel_state_in(c) for c in done), "no checkpoint held channel state"


def channel_state_in(info: ef.CheckpointInfo) -> int:
    """Records in flight on regular channels (unaligned) that ``info`` holds."""
    from test_workers_unaligned import channel_state

    return channel_state(Path(info.path).parent, info.id, 2)[1]


@pytest.mark.parametrize("mode", ["exactly_once", "unaligned", "aligned_timeout"])
def test_failures_in_a_loop_over_workers_restart_them_exactly_once(
        tmp_path: Path, state_backend: Any, mode: str) -> None:
    in_clean_process(restarts_every_worker, tmp_path, state_backend.name, mode)


def spilling_feedback(tmp_path: Path) -> None:
    failing = ef.testing.FailingMap(after=10_000, times=1)
    out, passes, result = run(3_000, 8, workers=2, directory=tmp_path / "chk",
                              failing=failing, restarts=2, feedback_memory=2,
                              feedback="rebalance")
    assert result.restarts == 1
    assert (out, passes) == expected(3_000, 8)


def test_back_edges_between_workers_spill_to_disk_and_recover_exactly_once(
        tmp_path: Path) -> None:
    """A feedback memory of 2 records: the head's end of each back-edge (fed
    from the other worker too) spills nearly every batch, barriers and logged
    records included, and a restart restores the loop exactly."""
    in_clean_process(spilling_feedback, tmp_path)


def logged_in(info: ef.CheckpointInfo) -> int:
    """Records of the back-edge logs of checkpoint ``info``."""
    head = info.metadata["operators"]["head"]["subtasks"]
    return sum(int(p.get("backedge", {}).get("records", 0)) for p in head.values())


def test_sigkill_of_a_worker_of_a_loop_at_random_moments_fails_over_exactly_once(
        tmp_path: Path) -> None:
    in_clean_process(killed_twice, tmp_path)


def killed_twice(tmp_path: Path) -> None:
    """A worker is killed twice (kill -9), each time a random moment after a
    checkpoint of its generation of workers: the job restarts them all from
    its latest checkpoint (re-injecting its back-edge logs), and the output
    and state are the failure-free ones."""
    rng = random.Random(seed(2929))
    chk = tmp_path / "chk"
    with WorkerKiller(chk, rng) as kills:
        out, passes, result = run(6_000, 20, workers=2, directory=chk, restarts=5,
                                  busy=20e-6)
    assert len(kills) == 2, f"the job ended after {kills}"
    assert result.restarts == 2, kills
    assert (out, passes) == expected(6_000, 20), kills


class FailWithRecordsInFlight:
    """Identity map that fails (every time) once the latest completed
    checkpoint in ``directory`` holds records of the back-edge logs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.calls = 0

    def __call__(self, r: Any) -> Any:
        self.calls += 1
        if self.calls % 50 == 0:
            done = ef.list_checkpoints(self.directory) if self.directory.exists() else []
            if done and not done[-1].final and logged_in(done[-1]):
                raise ef.testing.InjectedFailure(f"after checkpoint {done[-1].id}")
        return r


def restores_with_one_and_three(tmp_path: Path, mode: str = "exactly_once") -> None:
    chk = tmp_path / "chk"
    first = ef.ListSink()  # what the failed run committed
    with pytest.raises(ef.JobFailed, match="InjectedFailure"):
        run(4_000, 12, workers=2, directory=chk, sink=first, feedback="rebalance",
            failing=FailWithRecordsInFlight(chk), mode=mode)
    latest = ef.list_checkpoints(chk)[-1]
    assert logged_in(latest) > 0, "the checkpoint to restore holds no records in flight"
    want_out, want_passes = expected(4_000, 12)
    for workers in (1, 3):
        copy = tmp_path / f"chk-{workers}"
        shutil.copytree(chk, copy)
        out, passes, _ = run(4_000, 12, workers=workers, directory=copy, restore="latest",
                             feedback="rebalance", mode=mode)
        assert passes == want_passes
        # The failed run committed the output up to the restored checkpoint.
        assert Counter(first.results) + out == want_out


@pytest.mark.parametrize("mode", ["exactly_once", "unaligned"])
def test_a_loop_checkpoint_of_two_workers_restores_with_one_and_with_three(
        tmp_path: Path, mode: str) -> None:
    in_clean_process(restores_with_one_and_three, tmp_path, mode)
