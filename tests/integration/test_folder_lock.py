"""One job per checkpoint folder, end to end: a second job on the folder of
a running one (another process, or the same event loop) is refused with the
holder's pid before it writes anything; after the holder is SIGKILLed its
stale lock is taken over and the job resumes, exactly once. The process
holds still on request (jobs/held_job.py), so that it is alive when the
second job tries, whatever the machine's load."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anyio
import pytest
from job_support import Pace
from sigkill_support import (
    RUN_TIMEOUT,
    SRC,
    latest_checkpoint,
    wait_for_checkpoint_after,
    wait_for_writer_helpers_to_exit,
)

import eddyflow as ef

JOB = Path(__file__).parent / "jobs" / "held_job.py"
N = 200_000  # held_job.N


def small_job(chk: Path) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment()
    env.enable_checkpointing(0.05, chk)
    env.from_collection(range(100)).map(Pace(every=10, seconds=0.01)).sink_to(ef.ListSink())
    return env


def start_held(tmp: Path, run: int) -> tuple[subprocess.Popen[bytes], Path]:
    path = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, EF_HELD_FILE=str(tmp / "hold"), EF_HELD_CHK=str(tmp / "chk"),
               EF_HELD_OUT=str(tmp / "out"), PYTHONPATH=path)
    stderr_path = tmp / f"run-{run}.stderr"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "eddyflow.cli.main", "run", str(JOB),
                                 "--restore", "latest"],
                                env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    return proc, stderr_path


def test_second_process_refused_and_stale_lock_taken_over(tmp_path: Path) -> None:
    chk, out = tmp_path / "chk", tmp_path / "out"
    (tmp_path / "hold").touch()  # the job holds still after 500 records
    proc, stderr_path = start_held(tmp_path, 1)
    try:
        assert wait_for_checkpoint_after(proc, chk, 0), stderr_path.read_text()
        assert proc.poll() is None, stderr_path.read_text()
        with pytest.raises(ef.CheckpointFolderInUse, match=f"in use by process {proc.pid} "):
            small_job(chk).execute("intruder")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not wait_for_writer_helpers_to_exit(proc.pid)
    assert json.loads((chk / "_lock").read_text())["pid"] == proc.pid  # stale
    assert latest_checkpoint(chk) >= 1
    (tmp_path / "hold").unlink()
    proc, stderr_path = start_held(tmp_path, 2)  # --restore latest: takes the lock over
    rc = proc.wait(timeout=RUN_TIMEOUT)
    assert rc == 0, stderr_path.read_text()
    got: Counter[tuple[int, int]] = Counter()
    for name in os.listdir(out):
        if name.startswith("part-"):
            for line in (out / name).read_text().splitlines():
                key, count = json.loads(line)
                got[(key, count)] += 1
    assert got == Counter((k, c) for k in range(10) for c in range(1, N // 10 + 1))


def test_two_executions_in_one_loop_on_one_folder(tmp_path: Path) -> None:
    chk = tmp_path / "chk"

    async def both() -> None:
        first = asyncio.ensure_future(small_job(chk).execute_async("first"))
        await asyncio.sleep(0)  # it takes the lock before its first await
        assert (chk / "_lock").read_text()
        with pytest.raises(ef.CheckpointFolderInUse, match=f"process {os.getpid()}"):
            await small_job(chk).execute_async("second")
        await first
        await small_job(chk).execute_async("third")  # released at the end

    anyio.run(both)
