"""Crash recovery of the two-input operators: SIGKILL at random moments.

``jobs/two_input_job.py`` (a keyed co-process function with timers and a
side output, an interval join, a window join and a keyed broadcast function
reading broadcast state in its timers, over three event-time sources) runs
in a child process under ``python -m eddyflow.cli.main run JOB -p 2
--restore latest`` with a checkpoint every 50 ms, and is killed with
SIGKILL several times at random moments (as in ``test_sigkill.py``: a
random delay after the start, or a short one after the run completed a
checkpoint of its own), each time started again, and finally run to
completion. The committed output must equal, as a multiset, that of a
failure-free run of the same job in this process: every record exactly once.

``EF_SIGKILL_SEED`` overrides the seed of the kill moments.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from job_support import StateBackendFactory, keyed_backends, watched
from sigkill_support import (
    RUN_TIMEOUT,
    JobProcess,
    latest_checkpoint,
    seed,
    wait_for_checkpoint_after,
    wait_for_writer_helpers_to_exit,
)

import eddyflow as ef

JOBS = Path(__file__).parent / "jobs"
JOB = JOBS / "two_input_job.py"
sys.path.insert(0, str(JOBS))
import two_input_job  # noqa: E402


def committed(folder: Path) -> Counter[str]:
    return Counter(json.loads(line) for part in sorted(folder.glob("part-*"))
                   for line in part.read_text().splitlines())


# One pairing in the fast suite, every pairing in `make test-all` (the
# RocksDB session run alone takes minutes of repeated kills).
@pytest.mark.parametrize("backend_name, windows", [
    ("memory", "tumbling"),
    pytest.param("rocksdb", "tumbling", marks=pytest.mark.slow),
    pytest.param("memory", "session", marks=pytest.mark.slow),
    pytest.param("rocksdb", "session", marks=pytest.mark.slow),
])
def test_sigkill_of_two_input_operators_then_restore_latest_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory, windows: str) -> None:
    records = 6000
    env = ef.StreamEnvironment(parallelism=2)
    ref = ef.ListSink()
    two_input_job.build_job(env, ref, n=records, windows=windows)
    watched(env.execute_async("reference"), 300)
    want = Counter(ref.results)

    rng = random.Random(seed(11))
    out, chk = tmp_path / "out", tmp_path / "chk"
    job = JobProcess(JOB, tmp_path, tmp_path / "unused-log", out, chk, 0.0,
                     state_backend.child_env(tmp_path))
    job.env.update(EF_TWO_RECORDS=str(records), EF_TWO_WINDOWS=windows, EF_SIGKILL_SLOW="0.5")
    effective = 0
    events: list[str] = []
    for k in range(6):
        before = latest_checkpoint(chk)
        proc, stderr_path = job.start()
        if k % 2 == 0:
            time.sleep(rng.uniform(0.3, 1.5))
        else:
            wait_for_checkpoint_after(proc, chk, before)
            time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is not None:
            rc = proc.wait()
            assert rc == 0, stderr_path.read_text(errors="replace")
            events.append(f"run {job.runs} finished before its kill")
            break
        at_kill = latest_checkpoint(chk)
        os.kill(proc.pid, signal.SIGKILL)
        rc = proc.wait()
        if rc == 0:
            break
        assert rc == -signal.SIGKILL, stderr_path.read_text(errors="replace")
        assert not wait_for_writer_helpers_to_exit(proc.pid)
        effective += at_kill > before
        events.append(f"run {job.runs} killed, checkpoints {before}->{at_kill}")
    proc, stderr_path = job.start()
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the final run did not finish in {RUN_TIMEOUT} s; {events}")
    assert rc == 0, stderr_path.read_text(errors="replace")
    context = f"{state_backend.name}, {windows}: {'; '.join(events)}"
    assert effective >= 1, f"no kill interrupted a run after a checkpoint ({context})"
    last = ef.list_checkpoints(chk)[-1]
    for uid in ("co", "ij", "wj", "bc"):
        assert keyed_backends(last, uid) == {state_backend.name}, (uid, context)
    got = committed(out)
    assert got == want, (f"lost {list((want - got).elements())[:3]}, extra "
                         f"{list((got - want).elements())[:3]} ({context})")
    print(f"{sum(got.values()):,} records committed exactly once after {context}")
