"""One job per checkpoint folder (checkpoint/lock.py): the second is refused
with the holder's pid; the lock of a killed process is taken over; a forked
child never keeps it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import eddyflow as ef
from eddyflow.checkpoint.lock import FolderLock

SRC = Path(ef.__file__).resolve().parents[1]


def test_second_lock_is_refused_naming_the_holder(tmp_path: Path) -> None:
    with FolderLock(tmp_path, "first"):
        with pytest.raises(ef.CheckpointFolderInUse) as refused:
            FolderLock(tmp_path, "second").acquire()
        assert refused.value.pid == os.getpid()
        assert f"process {os.getpid()} (job 'first')" in str(refused.value)
        assert str(tmp_path) in str(refused.value)
    with FolderLock(tmp_path, "second") as again:  # released: free again
        assert again.held


def test_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    lock = FolderLock(tmp_path, "parent").acquire()
    ready, signal_ready = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (past the fork hooks) outlives the parent's hold
        os.write(signal_ready, b"x")
        time.sleep(5)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"x"
        lock.release()
        with FolderLock(tmp_path, "next"):
            pass
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready)
        os.close(signal_ready)


HOLD = """
import sys, time
from eddyflow.checkpoint.lock import FolderLock
FolderLock(sys.argv[1], "holder").acquire()
print("locked", flush=True)
time.sleep(60)
"""


def test_stale_lock_of_a_killed_process_is_taken_over(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)],
                            stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"locked"
        with pytest.raises(ef.CheckpointFolderInUse, match=f"process {proc.pid} "):
            FolderLock(tmp_path).acquire()
    finally:
        proc.kill()
        proc.wait()
    with caplog.at_level(logging.INFO, logger="eddyflow.checkpoint.listing"), \
            FolderLock(tmp_path, "after") as lock:
        assert lock.held
    assert any(f"process {proc.pid}" in r.getMessage() and "gone" in r.getMessage()
               for r in caplog.records)
