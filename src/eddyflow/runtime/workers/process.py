"""Starting, watching and stopping the worker processes of one attempt.

Workers are *forked* from the calling process once the attempt's plan is
built, when a fork is safe (:func:`fork_hazard`): the child has the plan
already, and a fork takes milliseconds. A fork from a process that runs an
event loop and threads keeps only the forking thread, so the child touches
nothing of its parent's loop: it clears the inherited signal wake-up
descriptor and runs its own event loop in a new thread (where no loop was
ever running), and leaves with ``os._exit`` (no atexit handler or
finaliser of the parent's objects runs twice).

Where a fork is not safe (this process has run RocksDB), each worker is a
new interpreter (``spawn.py``): it inherits only its sockets, and receives
the plan, pickled with cloudpickle, over its control link. Starting one
costs an interpreter and eddyflow's imports, a fork a few milliseconds
(``benchmarks/worker_startup.py`` measures both).

No worker outlives its caller: each asks the kernel to kill it when its
parent dies (``PR_SET_PDEATHSIG``; Linux), and each reads its control
link, which ends when the caller's end closes, however the caller ends.
:meth:`WorkerProcesses.stop` kills and reaps every worker that is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import anyio

__all__ = ["JOB_HEADER", "WorkerProcesses", "WorkerSockets", "WorkersRefused", "die_with_parent",
           "fork_hazard"]

#: The length of a spawned worker's pickled job, which comes first on its
#: control link (``spawn.py`` reads it before the link carries messages).
JOB_HEADER = struct.Struct("!Q")
#: A worker someone else reaped (no wait status is negative).
_REAPED_ELSEWHERE = -1

_PR_SET_PDEATHSIG = 1


class WorkerSockets:
    """One worker's ends: its control link to the caller, and a data link
    to each other worker (by worker index)."""

    def __init__(self, control: socket.socket, peers: dict[int, socket.socket]) -> None:
        self.control = control
        self.peers = peers


class WorkersRefused(RuntimeError):
    """Why a job cannot run over worker processes here; a restart cannot change that."""

    retryable = False


def fork_hazard() -> str | None:
    """Why a fork of this process would leave its child stuck, or ``None``
    (workers are then spawned instead: ``spawn.py``).

    RocksDB runs flushes and compactions on a process-wide pool of
    background threads, started by the first database this process opened
    (a ``workers=1`` job with the RocksDB backend). A forked child inherits
    the pool without its threads, and its first flush would wait forever."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith("rocksdb:"):
            return ("this process has run RocksDB state itself, and RocksDB's background "
                    "threads do not survive a fork")
    return None


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when ``parent`` (its parent) dies;
    leave at once if it is dead already."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took
        os._exit(1)


class WorkerProcesses:
    """``count`` workers, each running ``main(index, sockets)`` (its exit
    code) on a fresh thread and event loop: forked, or, given the job
    pickled (``spawned``, see ``spawn.py``), new interpreters that load it
    and run its ``main`` there."""

    def __init__(self, count: int, main: Callable[[int, WorkerSockets], int],
                 spawned: bytes | None = None) -> None:
        self.count = count
        self.main = main
        self.spawned = spawned
        self.pids: list[int] = []
        self.controls: list[socket.socket] = []
        self._status: dict[int, int] = {}
        self._popen: dict[int, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        """Start the workers; the caller keeps the other end of each control link."""
        mine: list[socket.socket] = []
        theirs: list[WorkerSockets] = []
        for _ in range(self.count):
            a, b = socket.socketpair()
            mine.append(a)
            theirs.append(WorkerSockets(b, {}))
        for i in range(self.count):
            for j in range(i + 1, self.count):
                a, b = socket.socketpair()
                theirs[i].peers[j] = a
                theirs[j].peers[i] = b
        everything = [*mine, *(s for w in theirs for s in (w.control, *w.peers.values()))]
        parent = os.getpid()
        env = None
        if self.spawned is not None:
            # Spawned workers salt str and bytes hashes alike, as forked ones
            # inherit one salt: user functions that use hash() (a key of their
            # own making, an order of a set of strings) agree across workers.
            env = dict(os.environ)
            env.setdefault("PYTHONHASHSEED", str(secrets.randbelow(2**32 - 1) + 1))
        try:
            for index in range(self.count):
                if env is not None:
                    popen = _spawn(parent, index, theirs[index], env)
                    self._popen[popen.pid] = popen
                    self.pids.append(popen.pid)
                    continue
                pid = os.fork()
                if pid == 0:  # the worker
                    own = theirs[index]
                    keep = {own.control.fileno(), *(s.fileno() for s in own.peers.values())}
                    for s in everything:
                        if s.fileno() not in keep:
                            s.close()
                    self._run_child(parent, index, own)
                self.pids.append(pid)
        finally:
            for w in theirs:
                w.control.close()
                for s in w.peers.values():
                    s.close()
            self.controls = mine

    async def send_job(self) -> None:
        """Send each spawned worker the pickled job (nothing to send to a
        forked one), all at once: each reads it once its interpreter is up."""
        job = self.spawned
        if job is None:
            return
        loop = asyncio.get_running_loop()
        frame = JOB_HEADER.pack(len(job)) + job

        async def send(sock: socket.socket) -> None:
            sock.setblocking(False)
            # A worker that died before reading it: its link reports that.
            with contextlib.suppress(OSError):
                await loop.sock_sendall(sock, frame)

        async with anyio.create_task_group() as tg:
            for sock in self.controls:
                tg.start_soon(send, sock)

    def _run_child(self, parent: int, index: int, own: WorkerSockets) -> None:
        code = 70
        try:
            die_with_parent(parent)
            # What the worker inherited stays out of its garbage collections:
            # a collection that traverses an inherited object writes to its
            # page, and the page is copied (the whole parent heap, once).
            gc.freeze()
            signal.set_wakeup_fd(-1)  # the parent loop's: not ours
            # Interrupting the job is the caller's: it stops the workers.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            result: list[int] = []

            def run() -> None:
                result.append(self.main(index, own))

            thread = threading.Thread(target=run, name=f"eddyflow-worker-{index}")
            thread.start()
            thread.join()
            code = result[0] if result else 70
        except BaseException:  # nothing may escape a forked child
            code = 70
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def _poll(self, pid: int, block: bool) -> int | None:
        """Reap ``pid`` if it ended (waiting for it if ``block``): its wait
        status, or ``None`` while it runs."""
        popen = self._popen.get(pid)
        if popen is not None:  # (reaped through its Popen, which must know)
            code = popen.wait() if block else popen.poll()
            if code is None:
                return None
            # Popen's return code as a wait status: -N is signal N.
            return -code if code < 0 else code << 8
        try:
            got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return _REAPED_ELSEWHERE
        return None if got == 0 else status

    def exit_status(self, index: int) -> str | None:
        """How worker ``index`` ended (``None``: it has not yet)."""
        pid = self.pids[index]
        status = self._status.get(pid)
        if status is None:
            status = self._poll(pid, block=False)
            if status is None:
                return None
            self._status[pid] = status
        if status == _REAPED_ELSEWHERE:
            return "ended"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return f"was killed by signal {sig} ({signal.Signals(sig).name})"
        return f"exited with code {os.WEXITSTATUS(status)}"

    async def wait_status(self, index: int, within: float) -> str:
        """How worker ``index`` ended, waiting up to ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            status = self.exit_status(index)
            if status is not None:
                return status
            if time.monotonic() >= deadline:
                return "closed its link to the caller"
            await anyio.sleep(0.005)

    async def stop(self, grace: float) -> None:
        """Give every worker ``grace`` seconds to leave, then kill those
        still running, and reap them all: none is left behind."""
        deadline = time.monotonic() + grace
        # (Polled: a child's exit has no event on the loop without a
        # SIGCHLD handler, which belongs to the embedding program.)
        for index in range(len(self.pids)):
            await self.wait_status(index, max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        """Kill every worker still running and reap them all."""
        for index, pid in enumerate(self.pids):
            if self.exit_status(index) is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                status = self._poll(pid, block=True)
                assert status is not None
                self._status[pid] = status
        for s in self.controls:
            s.close()


def _spawn(parent: int, index: int, own: WorkerSockets,
           env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Worker ``index`` as a new interpreter with this one's module path,
    holding only its sockets (at the same descriptor numbers)."""
    peers = ",".join(f"{w}:{s.fileno()}" for w, s in own.peers.items())
    code = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
            "from eddyflow.runtime.workers.spawn import worker_main; worker_main(sys.argv[2:])")
    fds = (own.control.fileno(), *(s.fileno() for s in own.peers.values()))
    return subprocess.Popen(
        [sys.executable, "-c", code, json.dumps([p for p in sys.path if isinstance(p, str)]),
         str(parent), str(index), str(own.control.fileno()), peers],
        stdin=subprocess.DEVNULL, pass_fds=fds, close_fds=True, env=env)
