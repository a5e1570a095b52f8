"""One job per checkpoint folder, end to end: a second job on the folder of
a running one (another process, or the same event loop) is refused with the
holder's pid before it writes anything; after the holder is SIGKILLed its
stale lock is taken over and the job resumes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path

import anyio
import pytest
from job_support import Pace
from sigkill_support import (
    RUN_TIMEOUT,
    JobProcess,
    latest_checkpoint,
    wait_for_checkpoint_after,
    wait_for_writer_helpers_to_exit,
)

import eddyflow as ef

JOB = Path(__file__).parent / "jobs" / "sigkill_job.py"


def small_job(chk: Path) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment()
    env.enable_checkpointing(0.05, chk)
    env.from_collection(range(100)).map(Pace(every=10, seconds=0.01)).sink_to(ef.ListSink())
    return env


def test_second_process_refused_and_stale_lock_taken_over(tmp_path: Path) -> None:
    log, out, chk = tmp_path / "log", tmp_path / "out", tmp_path / "chk"
    records = 4_000
    with ef.Log(log, 4) as lg:
        for seq in range(records):
            lg.append([f"k{seq % 50}", seq, 1], partition=(seq % 50) % 4)
    job = JobProcess(JOB, tmp_path, log, out, chk, slow=2.0)
    proc, stderr_path = job.start()
    try:
        assert wait_for_checkpoint_after(proc, chk, 0), stderr_path.read_text()
        with pytest.raises(ef.CheckpointFolderInUse, match=f"in use by process {proc.pid} "):
            small_job(chk).execute("intruder")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not wait_for_writer_helpers_to_exit(proc.pid)
    assert json.loads((chk / "_lock").read_text())["pid"] == proc.pid  # stale
    assert latest_checkpoint(chk) >= 1
    proc, stderr_path = job.start()  # --restore latest: takes the stale lock over
    rc = proc.wait(timeout=RUN_TIMEOUT)
    assert rc == 0, stderr_path.read_text()
    got: Counter[tuple[str, int]] = Counter()
    for name in os.listdir(out):
        if name.startswith("part-"):
            for line in (out / name).read_text().splitlines():
                got[tuple(json.loads(line)[:2])] += 1
    assert len(got) == records and set(got.values()) == {1}


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
