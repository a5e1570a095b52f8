"""Crash recovery of a whole process running a *loop*: SIGKILL, then restore.

The companion of ``test_sigkill.py`` for cyclic jobs. The job
(``jobs/sigkill_loop_job.py``: ``from_log -> iterate -> step -> feedback
keyed back to the head / exit -> key_by -> map_with_state -> FileSink``,
parallelism 2, a checkpoint every 50 ms) runs in a child process under
``python -m eddyflow.cli.main run JOB --restore latest``. Every log record
``[key, seq, n, rounds]`` goes round the loop ``rounds`` times (one Collatz
step on ``n`` per round, with some busy work) before it leaves it, so at any
moment many records are in flight round the loop, and a checkpoint of the
loop holds them in its head's back-edge log (the records that came back
round the loop between the head's snapshot and the barrier's return).

The test kills the process with SIGKILL — no cleanup, no ``finally``, no
flush — several times at random moments, each time starting it again with
``--restore latest``, and finally lets it run to completion. A kill loses
everything since the last completed checkpoint, including the records that
were round the loop; the restore must bring exactly those back from the
back-edge log. The committed output (the ``part-*`` files of the sink's
folder) must then be exactly what a failure-free run produces:

* every record ``(key, seq)`` committed exactly once — no duplicates,
  nothing missing, nothing unexpected — with its value after ``rounds``
  Collatz steps, computed here in plain Python;
* for every key, the running counts of its committed records are exactly
  ``1..N`` and each running sum is the previous one plus the record's value
  (the order in which a key's records leave the loop depends on timing, so
  this, not a fixed sequence, is what a correct run guarantees), and the
  last count and sum are the key's true ones.

The test also checks that it tested what it claims: at least one kill came
after the run had completed a checkpoint of its own, and at least one run
was restored from a checkpoint whose back-edge log is non-empty (its
``_metadata``: ``operators["head"]["subtasks"][s]["backedge"]["records"]``),
so records in flight round the loop did have to survive a SIGKILL.

No periodic checkpoint is triggered once a source has finished, so the job
is sized so that the log is still being read for most of the run: records
go round the loop only a few times, and the head reads its regular input
and its back-edges in turn.

Kill moments alternate between two kinds, both drawn from a seeded random
generator (``EF_SIGKILL_SEED`` overrides the seed): a random delay after the
process starts, and a short random delay after the run has completed a
checkpoint of its own. Nothing asserts on timing: a run that finishes before
its kill simply ends the killing early.
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
)

import eddyflow as ef

JOB = Path(__file__).parent / "jobs" / "sigkill_loop_job.py"
HEAD = "head"  # the loop head's name in the job (its uid in checkpoints)
PARTITIONS = 4

Output = tuple[str, int, int, int, int]  # key, seq, value, running count, running sum


@dataclass
class KillLog:
    """What happened to each run, for assertions and failure messages."""

    kills: int = 0
    effective: int = 0  # kills of a live run that had completed a checkpoint of its own
    loop_restores: int = 0  # kills whose restore point holds records in flight round the loop
    finished_early: int = 0  # runs that completed before their kill came
    events: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.kills} kills ({self.effective} after a checkpoint of that run, "
                f"{self.loop_restores} leaving a non-empty back-edge log to restore), "
                f"{self.finished_early} runs finished before their kill; "
                + "; ".join(self.events))


def collatz(n: int) -> int:
    return n // 2 if n % 2 == 0 else 3 * n + 1


def fill_log(path: Path, records: int, keys: int, max_rounds: int) -> list[list[Any]]:
    """Write ``records`` records ``[key, seq, n, rounds]`` (``rounds`` in
    ``1..max_rounds``); key ``k{j}`` lives in partition ``j % PARTITIONS``.
    Returns every record."""
    written: list[list[Any]] = []
    with ef.Log(path, PARTITIONS) as log:
        for seq in range(records):
            j = (seq * 7919) % keys  # every key, in a scrambled order
            record = [f"k{j}", seq, 1 + (seq * 104_729) % 1000, 1 + (seq * 31 + j) % max_rounds]
            log.append(record, partition=j % PARTITIONS)
            written.append(record)
    return written


def expected_output(records: list[list[Any]]
                    ) -> tuple[dict[tuple[str, int], int], dict[str, tuple[int, int]]]:
    """Each record's value after its rounds of the loop, by ``(key, seq)``,
    and each key's final (count, sum)."""
    values: dict[tuple[str, int], int] = {}
    final: dict[str, tuple[int, int]] = {}
    for key, seq, n, rounds in records:
        for _ in range(rounds):
            n = collatz(n)
        values[(key, seq)] = n
        count, total = final.get(key, (0, 0))
        final[key] = (count + 1, total + n)
    return values, final


def committed_output(folder: Path) -> list[Output]:
    """Every record of the committed ``part-*`` files (nothing else counts)."""
    out: list[Output] = []
    for path in sorted(folder.iterdir()):
        if not path.name.startswith("part-"):
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            key, seq, value, count, total = json.loads(line)
            out.append((key, seq, value, count, total))
    return out


def backedge_records(directory: Path, checkpoint_id: int) -> int | None:
    """Records in the loop head's back-edge logs of a checkpoint, read from
    its ``_metadata``; ``None`` if it has no back-edge log (a final
    checkpoint, taken when the loop was empty)."""
    meta = json.loads((directory / f"chk-{checkpoint_id}" / "_metadata").read_text())
    logs = [part["backedge"]["records"] for part in meta["operators"][HEAD]["subtasks"].values()
            if "backedge" in part]
    return sum(logs) if logs else None


def check_output(got: list[Output], values: dict[tuple[str, int], int],
                 final: dict[str, tuple[int, int]], context: str) -> None:
    """The committed output is exactly once and its running aggregates exact."""
    ids = collections.Counter((key, seq) for key, seq, *_ in got)
    duplicates = sorted(r for r, n in ids.items() if n > 1)
    assert not duplicates, (f"{len(duplicates)} records committed more than once, e.g. "
                            f"{[r for r in got if (r[0], r[1]) in set(duplicates[:3])]} "
                            f"({context})")
    unexpected = sorted(ids.keys() - values.keys())
    assert not unexpected, (f"{len(unexpected)} committed records a failure-free run does not "
                            f"produce, e.g. {unexpected[:5]} ({context})")
    missing = sorted(values.keys() - ids.keys())
    assert not missing, (f"{len(missing)} records never committed, e.g. {missing[:5]} "
                         f"({context})")
    wrong = [r for r in got if r[2] != values[(r[0], r[1])]]
    assert not wrong, (f"{len(wrong)} records left the loop with a wrong value, e.g. "
                       f"{wrong[:5]} ({context})")
    assert len(got) == len(values)

    by_key: dict[str, list[Output]] = collections.defaultdict(list)
    for r in got:
        by_key[r[0]].append(r)
    assert by_key.keys() == final.keys()
    for key, recs in by_key.items():
        recs.sort(key=lambda r: r[3])
        counts = [r[3] for r in recs]
        assert counts == list(range(1, len(recs) + 1)), (
            f"key {key}: running counts are not 1..{len(recs)}, got {counts[:20]}... "
            f"({context})")
        total = 0
        for r in recs:
            total += r[2]
            assert r[4] == total, (f"key {key}: running sum {r[4]} at count {r[3]}, the "
                                   f"values so far add up to {total}; record {r} ({context})")
        assert (recs[-1][3], recs[-1][4]) == final[key], (
            f"key {key}: final committed (count, sum) {recs[-1][3:]} != {final[key]} "
            f"({context})")


def kill_and_restart(tmp: Path, backend: StateBackendFactory, *, records: int, keys: int,
                     max_rounds: int, kills: int, slow: float, seed: int,
                     workers: int = 1) -> None:
    rng = random.Random(seed)
    log, out, chk = tmp / "log", tmp / "out", tmp / "chk"
    written = fill_log(log, records, keys, max_rounds)
    values, final = expected_output(written)
    job = JobProcess(JOB, tmp, log, out, chk, slow, backend.child_env(tmp))
    if workers > 1:
        job.args = ["--workers", str(workers)]
    history = KillLog()
    context = f"seed {seed}, {backend.name} backend"

    for k in range(kills):
        before = latest_checkpoint(chk)
        proc, stderr_path = job.start()
        if k % 2 == 0:
            delay = rng.uniform(0.2, 2.0)
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
        # Nor do its workers outlive it (they die with their caller).
        left = wait_for_exit(workers_of_run)
        assert not left, f"run {job.runs}: worker processes {left} outlived their caller"
        # The process is dead: the checkpoint folder no longer changes, and
        # its newest checkpoint is what the next run restores.
        at_kill = latest_checkpoint(chk)
        history.kills += 1
        if at_kill > before:
            history.effective += 1
        logged = backedge_records(chk, at_kill) if at_kill else None
        if logged:
            history.loop_restores += 1
        history.events.append(f"run {job.runs} killed {how}, checkpoints {before}->{at_kill} "
                              f"(back-edge log: {logged})")

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
    # progress after it had checkpointed, and a restore that had to bring
    # back records in flight round the loop.
    assert history.effective >= 1, f"no kill interrupted a run after a checkpoint ({context})"
    assert history.loop_restores >= 1, (
        f"no kill left a checkpoint with a non-empty back-edge log to restore ({context})")

    check_output(committed_output(out), values, final, context)
    print(f"{len(values):,} records committed exactly once after {context}")


def test_sigkill_loop_at_random_moments_then_restore_latest_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    kill_and_restart(tmp_path, state_backend, records=400_000, keys=500, max_rounds=4,
                     kills=10, slow=0.004, seed=seed(7))


def test_sigkill_of_the_caller_of_a_loop_over_two_workers_then_restore_latest_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    """``eddyflow run --workers 2``: the loop's keyed feedback crosses
    between the workers; the calling process (its coordinator, which ends
    the loop) is killed, its workers die with it, and the next run restores
    the back-edge logs the workers wrote."""
    kill_and_restart(tmp_path, state_backend, records=400_000, keys=500, max_rounds=4,
                     kills=6, slow=0.004, seed=seed(2929), workers=2)


@pytest.mark.slow
def test_sigkill_loop_soak_many_kills_more_data(tmp_path: Path,
                                                state_backend: StateBackendFactory) -> None:
    kill_and_restart(tmp_path, state_backend, records=800_000, keys=5_000, max_rounds=4,
                     kills=24, slow=0.004, seed=seed(2015))
