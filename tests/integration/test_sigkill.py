"""Crash recovery of a whole process: SIGKILL at random moments, then restore.

The job (``jobs/sigkill_job.py``: ``from_log -> key_by -> map_with_state ->
FileSink``, parallelism 2, a checkpoint every 50 ms) runs in a child process
under ``python -m eddyflow.cli.main run JOB --restore latest``. The test
kills that process with SIGKILL — no cleanup, no ``finally``, no flush —
several times at random moments, each time starting it again with
``--restore latest``, and finally lets it run to completion. Then the
committed output (the ``part-*`` files of the sink's folder) must be exactly
what a failure-free computation produces: every expected record exactly once,
no duplicates, nothing missing, and every key's last committed running count
and sum equal to the true ones.

Every key's records live in one log partition, so each output record
``[key, seq, count, sum]`` is deterministic and the expected output is
computed here in plain Python, independently of eddyflow.

Kill moments alternate between two kinds, both drawn from a seeded random
generator (``EF_SIGKILL_SEED`` overrides the seed): a random delay after the
process starts (which may land during start-up, during a checkpoint, between
pre-commit and commit, ...), and a short random delay after the run has
completed a checkpoint of its own — so that, whatever the machine's load,
kills do interrupt runs that had made progress. Nothing asserts on timing:
a run that finishes before its kill simply ends the killing early.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from job_support import StateBackendFactory, keyed_backends
from sigkill_support import (
    RUN_TIMEOUT,
    JobProcess,
    children_of,
    latest_checkpoint,
    seed,
    wait_for_checkpoint_after,
    wait_for_exit,
    wait_for_writer_helpers_to_exit,
    writer_helpers_of,
)

import eddyflow as ef

JOB = Path(__file__).parent / "jobs" / "sigkill_job.py"
PARTITIONS = 4

Output = tuple[str, int, int, int]


@dataclass
class KillLog:
    """What happened to each run, for assertions and failure messages."""

    kills: int = 0
    effective: int = 0  # kills of a live run that had completed a checkpoint of its own
    finished_early: int = 0  # runs that completed before their kill came
    with_writer: int = 0  # killed runs whose checkpoint writer process was running
    events: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.kills} kills ({self.effective} after a checkpoint of that run), "
                f"{self.finished_early} runs finished before their kill; "
                + "; ".join(self.events))


def fill_log(path: Path, records: int, keys: int) -> list[list[Any]]:
    """Write ``records`` records ``[key, seq, value]``; key ``k{j}`` lives in
    partition ``j % PARTITIONS``. Returns the partitions' records in order."""
    parts: list[list[Any]] = [[] for _ in range(PARTITIONS)]
    with ef.Log(path, PARTITIONS) as log:
        for seq in range(records):
            j = (seq * 7919) % keys  # every key, in a scrambled order
            p = j % PARTITIONS
            record = [f"k{j}", seq, seq % 13]
            log.append(record, partition=p)
            parts[p].append(record)
    return parts


def expected_output(parts: list[list[Any]]) -> tuple[list[Output], dict[str, tuple[int, int]]]:
    """The failure-free output and each key's final (count, sum)."""
    state: dict[str, tuple[int, int]] = {}
    out: list[Output] = []
    for records in parts:
        for key, seq, value in records:
            count, total = state.get(key, (0, 0))
            count, total = count + 1, total + value
            state[key] = (count, total)
            out.append((key, seq, count, total))
    return out, state


def committed_output(folder: Path) -> list[Output]:
    """Every record of the committed ``part-*`` files (nothing else counts)."""
    out: list[Output] = []
    for path in sorted(folder.iterdir()):
        if not path.name.startswith("part-"):
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            key, seq, count, total = json.loads(line)
            out.append((key, seq, count, total))
    return out


def kill_and_restart(tmp: Path, backend: StateBackendFactory, *, records: int, keys: int,
                     kills: int, slow: float, seed: int,
                     settings: dict[str, str] | None = None, workers: int = 1) -> None:
    rng = random.Random(seed)
    log, out, chk = tmp / "log", tmp / "out", tmp / "chk"
    parts = fill_log(log, records, keys)
    expected, final = expected_output(parts)
    job = JobProcess(JOB, tmp, log, out, chk, slow, backend.child_env(tmp))
    job.env.update(settings or {})
    if workers > 1:
        job.args = ["--workers", str(workers)]
    history = KillLog()
    context = f"seed {seed}, {backend.name} backend"

    for k in range(kills):
        before = latest_checkpoint(chk)
        proc, stderr_path = job.start()
        if k % 2 == 0:
            delay = rng.uniform(0.2, 1.5)
            time.sleep(delay)
            how = f"{delay:.2f}s after start"
        else:
            delay = rng.uniform(0.0, 0.3)
            wait_for_checkpoint_after(proc, chk, before)
            time.sleep(delay)
            how = f"{delay:.2f}s after its first checkpoint"
        if proc.poll() is not None:  # finished (or failed) before the kill
            rc = proc.wait()
            stderr = stderr_path.read_text(errors="replace")
            assert rc == 0, f"run {job.runs} failed with exit code {rc} ({context}):\n{stderr}"
            history.finished_early += 1
            history.events.append(f"run {job.runs} finished before its kill ({how})")
            break
        at_kill = latest_checkpoint(chk)
        if writer_helpers_of(proc.pid):
            history.with_writer += 1
        # With workers, the caller's children are its worker processes.
        workers_of_run = children_of(proc.pid) if workers > 1 else []
        os.kill(proc.pid, signal.SIGKILL)  # not reaped yet: the pid is still this child's
        rc = proc.wait()
        if rc == 0:  # it finished between the poll and the kill
            history.finished_early += 1
            history.events.append(f"run {job.runs} finished just before its kill ({how})")
            break
        assert rc == -signal.SIGKILL, (f"run {job.runs}: exit code {rc}, expected SIGKILL "
                                       f"({context}):\n{stderr_path.read_text(errors='replace')}")
        # Its checkpoint writer process must not outlive it (it would write
        # into the folder the next run uses).
        left = wait_for_writer_helpers_to_exit(proc.pid)
        assert not left, f"run {job.runs}: writer processes {left} outlived their job ({context})"
        # Nor its workers (they die with their caller).
        left = wait_for_exit(workers_of_run)
        assert not left, f"run {job.runs}: worker processes {left} outlived their caller"
        history.kills += 1
        if at_kill > before:
            history.effective += 1
        history.events.append(f"run {job.runs} killed {how}, checkpoints {before}->{at_kill}")

    # The last run: no kill, to completion.
    proc, stderr_path = job.start()
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the final run did not finish in {RUN_TIMEOUT} s ({context}); "
                    f"{history.summary()}")
    stderr = stderr_path.read_text(errors="replace")
    assert rc == 0, f"the final run failed with exit code {rc} ({context}):\n{stderr}"
    context += f"; {history.summary()}"
    # The runs kept their keyed state in the backend under test.
    assert keyed_backends(ef.list_checkpoints(chk)[-1], "running") == {backend.name}, context

    # The test must have shown something: a kill that destroyed a run's
    # progress after it had checkpointed (the machine's load cannot prevent
    # that, since every other kill waits for a checkpoint of its run).
    assert history.effective >= 1, f"no kill interrupted a run after a checkpoint ({context})"
    if workers == 1:  # workers write their state themselves, with no helper
        assert history.with_writer >= 1, f"no killed run had a writer process ({context})"

    got = committed_output(out)
    counts = collections.Counter(got)
    duplicates = sorted(r for r, n in counts.items() if n > 1)
    want = set(expected)
    missing = sorted(want - counts.keys())
    unexpected = sorted(counts.keys() - want)
    assert not duplicates, (f"{len(duplicates)} records committed more than once, "
                            f"e.g. {duplicates[:5]} ({context})")
    assert not unexpected, (f"{len(unexpected)} committed records a failure-free run does not "
                            f"produce, e.g. {unexpected[:5]} ({context})")
    assert not missing, (f"{len(missing)} records never committed, e.g. {missing[:5]} "
                         f"({context})")
    assert len(got) == len(expected) == records

    last: dict[str, tuple[int, int]] = {}
    for key, _seq, count, total in got:
        if count > last.get(key, (0, 0))[0]:
            last[key] = (count, total)
    assert last == final, f"final committed running counts differ ({context})"
    print(f"{len(got):,} records committed exactly once after {context}")


def test_sigkill_at_random_moments_then_restore_latest_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    kill_and_restart(tmp_path, state_backend, records=200_000, keys=500, kills=10, slow=0.01,
                     seed=seed(7))


def test_sigkill_of_the_caller_of_two_workers_then_restore_latest_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    """``eddyflow run --workers 2``: the calling process (its coordinator)
    is killed; its worker processes die with it, and the next run restores."""
    # (Twice the busy work of the one-process test: over two workers the
    # first run must still outlast its kill.)
    kill_and_restart(tmp_path, state_backend, records=200_000, keys=500, kills=6, slow=0.02,
                     seed=seed(23), workers=2)


def test_sigkill_under_back_pressure_with_unaligned_checkpoints_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    """A sleepy map before the sink back-pressures the job from its first
    second; checkpoints are unaligned, so they hold records in flight."""
    kill_and_restart(tmp_path, state_backend, records=40_000, keys=200, kills=6, slow=0.0,
                     seed=seed(11), settings={"EF_SIGKILL_MODE": "unaligned",
                                              "EF_SIGKILL_SINK_DELAY": "0.0001"})


def test_sigkill_of_a_deep_back_pressured_pipeline_with_unaligned_checkpoints_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    """The sleepy map in the middle, behind two exchanges and before a third:
    the tasks in front of it are blocked on their output when the barrier
    comes, take it there, and their queued output becomes channel state."""
    kill_and_restart(tmp_path, state_backend, records=30_000, keys=200, kills=6, slow=0.0,
                     seed=seed(13), settings={"EF_SIGKILL_MODE": "unaligned",
                                              "EF_SIGKILL_DEEP": "0.0001"})


def test_sigkill_of_a_deep_pipeline_with_an_aligned_timeout_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    """As above, the checkpoints aligned at first and switched to unaligned
    after a few milliseconds."""
    kill_and_restart(tmp_path, state_backend, records=30_000, keys=200, kills=6, slow=0.0,
                     seed=seed(17), settings={"EF_SIGKILL_MODE": "exactly_once",
                                              "EF_SIGKILL_ALIGNED_TIMEOUT": "0.005",
                                              "EF_SIGKILL_DEEP": "0.0001"})


@pytest.mark.slow
def test_sigkill_soak_many_kills_more_data(tmp_path: Path,
                                           state_backend: StateBackendFactory) -> None:
    kill_and_restart(tmp_path, state_backend, records=1_000_000, keys=5_000, kills=24,
                     slow=0.005, seed=seed(2015))
