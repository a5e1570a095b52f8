"""What the SIGKILL tests share: running a job file in a child process under
`eddyflow run --restore latest`, watching its checkpoint folder, killing
worker processes of this one (:class:`WorkerKiller`), running a scenario in
a fresh process (:func:`in_clean_process`) and asserting that a test leaves
no child process behind (the ``no_process_left_behind`` fixture, imported
by the worker tests)."""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

import eddyflow as ef

SRC = Path(ef.__file__).resolve().parents[1]  # the eddyflow under test, for the child
HERE = Path(__file__).parent  # the test support modules, for the child
RUN_TIMEOUT = 300.0  # the last, uninterrupted run: generous on a loaded machine
CHECKPOINT_WAIT = 60.0  # longest wait for a run's first checkpoint before killing anyway


def latest_checkpoint(directory: Path) -> int:
    """Id of the newest completed checkpoint (0 if none)."""
    done = ef.list_checkpoints(directory) if directory.exists() else []
    return max((c.id for c in done), default=0)


class JobProcess:
    """Starts the job file under the CLI with ``--restore latest``, with the
    state backend that the variables ``backend`` (``StateBackendFactory.
    child_env``) name; the memory backend without them."""

    def __init__(self, job: Path, tmp: Path, log: Path, out: Path, chk: Path, slow: float,
                 backend: Mapping[str, str] | None = None) -> None:
        self.job = job
        self.tmp = tmp
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("EF_SIGKILL_BACKEND", "EF_SIGKILL_ROCKSDB"))}
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.env.update(EF_SIGKILL_LOG=str(log), EF_SIGKILL_OUT=str(out),
                        EF_SIGKILL_CHK=str(chk), EF_SIGKILL_INTERVAL="0.05",
                        EF_SIGKILL_SLOW=str(slow))
        self.env.update(backend or {})
        self.env.pop("EF_SIGKILL_PARALLELISM", None)  # -p 2 decides
        self.runs = 0
        #: More options of ``eddyflow run`` (``--workers 2``).
        self.args: list[str] = []

    def start(self) -> tuple[subprocess.Popen[bytes], Path]:
        self.runs += 1
        # A file, not a pipe: nobody reads a pipe while the child runs, and a
        # full pipe would block it.
        stderr_path = self.tmp / f"run-{self.runs}.stderr"
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "eddyflow.cli.main", "run", str(self.job),
                 "-p", "2", "--restore", "latest", *self.args],
                env=self.env, stdout=subprocess.DEVNULL, stderr=stderr,
            )
        return proc, stderr_path


def wait_for_checkpoint_after(proc: subprocess.Popen[bytes], chk: Path, after: int) -> bool:
    """Poll until a checkpoint newer than ``after`` completes (True) or the
    process ends (False); give up waiting after CHECKPOINT_WAIT seconds."""
    deadline = time.monotonic() + CHECKPOINT_WAIT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if latest_checkpoint(chk) > after:
            return True
        time.sleep(0.01)
    return False


def seed(default: int) -> int:
    return int(os.environ.get("EF_SIGKILL_SEED", default))


def writer_helpers_of(pid: int) -> list[int]:
    """Pids of checkpoint writer processes started by process ``pid`` (their
    command line names the writer script and their parent's pid)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"writer_main.py") for a in argv) and str(pid).encode() in argv:
            found.append(int(entry))
    return found


def wait_for_writer_helpers_to_exit(pid: int, timeout: float = 10.0) -> list[int]:
    """Wait until no writer process of ``pid`` is left; returns those left."""
    deadline = time.monotonic() + timeout
    while (left := writer_helpers_of(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def children_of(pid: int) -> list[int]:
    """Pids of the live child processes of process ``pid`` (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != b"Z":
            found.append(int(entry))
    return found


def wait_for_exit(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` is alive (a zombie counts as gone); those left."""
    deadline = time.monotonic() + timeout

    def alive() -> list[int]:
        left = []
        for p in pids:
            try:
                with open(f"/proc/{p}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rindex(b")") + 2:].split()[0] != b"Z":
                left.append(p)
        return left

    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


class WorkerKiller:
    """While its ``with`` block runs a job over worker processes (children
    of this process), kills one worker (kill -9) ``times`` times, each a
    random moment (drawn from ``rng``) after a checkpoint into ``chk`` of
    its generation of workers; the next kill waits for the next generation.
    The block gets the list of kills made (``"pid P after checkpoint N"``),
    which the test checks once the job has ended."""

    def __init__(self, chk: Path, rng: random.Random, times: int = 2) -> None:
        self.chk = chk
        self.rng = rng
        self.times = times
        self.kills: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._kill)

    def _kill(self) -> None:
        me, chk, rng = os.getpid(), self.chk, self.rng
        killed: set[int] = set()
        while len(self.kills) < self.times and not self._stop.is_set():
            workers = [p for p in children_of(me) if p not in killed]
            before = latest_checkpoint(chk)
            if len(workers) < 2 or before == 0:
                time.sleep(0.005)
                continue
            deadline = time.monotonic() + 5.0
            while latest_checkpoint(chk) == before and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.1))
            victim = rng.choice(workers)
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.update(workers)  # the next kill waits for the next generation
            self.kills.append(f"pid {victim} after checkpoint {latest_checkpoint(chk)}")

    def __enter__(self) -> list[str]:
        self._thread.start()
        return self.kills

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Fails a test that leaves a child process of this one running."""
    before = set(children_of(os.getpid()))
    yield
    left = wait_for_exit([p for p in children_of(os.getpid()) if p not in before], 5.0)
    assert not left, f"child processes left behind: {left}"


def in_clean_process(fn: Any, *args: Any) -> None:
    """``fn(*args)`` (a module-level function of a test module) in a new
    Python process; its failure (traceback) fails the test, and so does a
    child process it leaves behind. (Workers are forked: a process that
    ran RocksDB itself spawns them instead, which the scenarios choose.)"""
    code = ("import importlib, pickle, sys\n"
            "module, name, args = pickle.load(sys.stdin.buffer)\n"
            "getattr(importlib.import_module(module), name)(*args)\n"
            "from sigkill_support import children_of, wait_for_exit\n"
            "import os\n"
            "left = wait_for_exit(children_of(os.getpid()))\n"
            "assert not left, f'worker processes left behind: {left}'\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), *filter(None, [
        os.environ.get("PYTHONPATH")])])
    what = pickle.dumps((fn.__module__, fn.__name__, args))
    proc = subprocess.run([sys.executable, "-c", code], input=what, capture_output=True,
                          env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
