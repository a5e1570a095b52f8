"""Crash recovery of the session-window example: SIGKILL at random moments.

``examples/sessions.py`` (a Log of out-of-order clicks -> event-time session
windows per user with allowed lateness and a late-data side output -> two
FileSinks) runs in a child process under ``python -m eddyflow.cli.main run
examples/sessions.py -p 2 --restore latest``, with a checkpoint every 50 ms,
as ``test_sigkill.py`` runs its job: killed with SIGKILL several times at
random moments (a random delay after the start, or a short random delay
after the run completed a checkpoint of its own), each time started again,
and finally run to completion. The first run also writes the example's log
(into a side folder renamed into place, so a kill there leaves none).

A kill loses the window state, the timers and the watermarks since the last
checkpoint, and the restored run sees the rest of the clicks under other
watermark timing. So the committed output is compared with what *any*
correct run commits (``sessions_reference.py``, plain Python from the log,
as the example's docstring explains): no row committed twice, every final
session committed with its complete counts, no row that no prefix of a
user's clicks gives, and every click far beyond the allowed lateness once,
in the late output (or as a one-click session when a watermark lagged) —
and nothing else in the late output. The sessions' last rows then equal the
failure-free result exactly.

``EF_SIGKILL_SEED`` overrides the seeds of the kill moments.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sessions_reference as ref
from job_support import StateBackendFactory, keyed_backends
from sigkill_support import (
    RUN_TIMEOUT,
    JobProcess,
    latest_checkpoint,
    seed,
    wait_for_checkpoint_after,
    wait_for_writer_helpers_to_exit,
)

import eddyflow as ef
from eddyflow.jobfile import load_job

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sessions.py"


@dataclass
class KillLog:
    kills: int = 0
    effective: int = 0  # kills of a live run that had completed a checkpoint of its own
    finished_early: int = 0
    events: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.kills} kills ({self.effective} after a checkpoint of that run), "
                f"{self.finished_early} runs finished before their kill; "
                + "; ".join(self.events))


def kill_and_restart(tmp: Path, backend: StateBackendFactory, *, minutes: float, kills: int,
                     seed: int) -> None:
    rng = random.Random(seed)
    log, out, late, chk = tmp / "clicks", tmp / "sessions", tmp / "late", tmp / "chk"
    job = JobProcess(EXAMPLE, tmp, log, out, chk, 0.0)
    job.env.update(SESSIONS_LOG=str(log), SESSIONS_OUTPUT=str(out),
                   SESSIONS_LATE_OUTPUT=str(late), SESSIONS_CHECKPOINTS=str(chk),
                   SESSIONS_CHECKPOINT_INTERVAL="0.05", SESSIONS_MINUTES=str(minutes))
    job.env.pop("SESSIONS_ROCKSDB", None)
    if backend.rocksdb:
        job.env["SESSIONS_ROCKSDB"] = str(tmp / "rocks")
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
            assert rc == 0, (f"run {job.runs} failed with exit code {rc} ({context}):\n"
                             f"{stderr_path.read_text(errors='replace')}")
            history.finished_early += 1
            history.events.append(f"run {job.runs} finished before its kill ({how})")
            break
        at_kill = latest_checkpoint(chk)
        os.kill(proc.pid, signal.SIGKILL)  # not reaped yet: the pid is still this child's
        rc = proc.wait()
        if rc == 0:  # it finished between the poll and the kill
            history.finished_early += 1
            history.events.append(f"run {job.runs} finished just before its kill ({how})")
            break
        assert rc == -signal.SIGKILL, (f"run {job.runs}: exit code {rc}, expected SIGKILL "
                                       f"({context}):\n{stderr_path.read_text(errors='replace')}")
        left = wait_for_writer_helpers_to_exit(proc.pid)
        assert not left, f"run {job.runs}: writer processes {left} outlived their job ({context})"
        history.kills += 1
        if at_kill > before:
            history.effective += 1
        history.events.append(f"run {job.runs} killed {how}, checkpoints {before}->{at_kill}")

    proc, stderr_path = job.start()  # the last run: no kill, to completion
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the final run did not finish in {RUN_TIMEOUT} s ({context}); "
                    f"{history.summary()}")
    assert rc == 0, (f"the final run failed with exit code {rc} ({context}):\n"
                     f"{stderr_path.read_text(errors='replace')}")
    context = f"({context}; {history.summary()})"
    assert history.effective >= 1, f"no kill interrupted a run after a checkpoint {context}"
    assert keyed_backends(ef.list_checkpoints(chk)[-1], "sessions") == {backend.name}, context
    assert not (tmp / "clicks.partial").exists()

    module = load_job(EXAMPLE)  # its constants: partitions, gap, lateness
    clicks = ef.Log(log, partitions=module.PARTITIONS)
    exp = ref.expected([list(clicks.read(p)) for p in range(module.PARTITIONS)],
                       gap=module.GAP, max_delay=module.MAX_DELAY,
                       lateness=module.ALLOWED_LATENESS)
    assert exp.clicks == sum(map(len, module.generate_clicks(minutes))), context
    outcome = ref.check(exp, ref.read_committed(out), ref.read_committed(late),
                        gap=module.GAP, context=context)
    print(f"{outcome.rows:,} session rows and {outcome.late} late clicks committed exactly "
          f"once after {context}")


def test_sigkill_sessions_example_at_random_moments_then_restore_latest(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    # Enough clicks for the runs to outlast their kills (the window operator
    # got about 4x faster: 12 minutes of clicks ran out before the second kill).
    kill_and_restart(tmp_path, state_backend, minutes=40, kills=6, seed=seed(14))


@pytest.mark.slow
def test_sigkill_sessions_example_soak_many_kills_more_data(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    kill_and_restart(tmp_path, state_backend, minutes=90, kills=16, seed=seed(1414))
