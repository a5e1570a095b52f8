"""Work on a copy-on-write image of the process: ``fork()`` at the barrier,
let the child serialize and write what the snapshot needs, await its answer.

Why: on one Python thread, a snapshot that pickles the state it covers takes
that time from processing, and a snapshot that does not pickle at once must
guard every object it has not yet written against user code that mutates it
in place. A forked child has neither problem: it sees the memory exactly as
it was at the fork, whatever the parent does afterwards (the kernel copies a
page the parent writes to), and it runs on another core. The parent's cost is
the fork itself (measured: 3.5 ms at 185 MB of heap) plus a page fault for
each page it writes while the child lives. Redis's background saves work the
same way.

The child runs only ``fn`` and the write of its pickled result to a pipe,
then leaves with ``os._exit`` (no ``atexit``, no flush of buffers it shares
with the parent, no finalizers); it dies with its parent (``PR_SET_PDEATHSIG``
on Linux), and it ignores the terminal's ^C, which is the parent's to handle.
Where ``fork`` is not available, or ``EDDYFLOW_SNAPSHOT_FORK=0`` is set, the
work runs inline, at the barrier.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import os
import pickle
import signal
import sys
import warnings
from collections.abc import Callable
from typing import Any

from eddyflow.errors import EddyflowError

__all__ = ["ENABLED", "ChildWork", "start"]

#: ``EDDYFLOW_SNAPSHOT_FORK=0`` runs snapshot work inline (no child process).
ENABLED = hasattr(os, "fork") and os.environ.get("EDDYFLOW_SNAPSHOT_FORK", "1") != "0"

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the call above
        os._exit(1)


class ChildWork:
    """``fn()`` running in a forked child (or done already, inline)."""

    def __init__(self, pid: int | None, fd: int | None, result: Any = None,
                 error: str | None = None, exception: EddyflowError | None = None) -> None:
        self._pid = pid
        self._fd = fd
        self._result = result
        self._error = error
        self._exception = exception
        self._reading = False
        self._exited = False

    async def result(self) -> Any:
        """``fn``'s return value; ``OSError`` if it raised (its message says
        what) or the child died; the exception itself if it was one of
        eddyflow's own (a :class:`~eddyflow.errors.StateSerializationError`
        must reach the restart loop as what it is: not worth a retry)."""
        if self._fd is not None:
            self._reading = True
            try:
                data = await _read_all(self._fd)
            finally:
                self._reading = False
                self._reap()
            try:
                status, value = pickle.loads(data)
            except Exception:
                status, value = "error", "the snapshot process died without an answer"
            if status == "ok":
                self._result = value
            elif status == "raise" and isinstance(value, EddyflowError):
                self._exception = value
            else:
                self._error = str(value)
        if self._exception is not None:
            raise self._exception
        if self._error is not None:
            raise OSError(self._error)
        return self._result

    def cancel(self) -> None:
        """Stop the child (if it still runs) and reap it; if :meth:`result`
        is waiting for it, that wait ends with an ``OSError`` and reaps."""
        if self._pid is not None and not self._exited:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
        if not self._reading:
            self._reap()

    def wait_exit(self) -> None:
        """Block until the child has exited (its answer stays readable):
        for a caller that learns the outcome from the files it wrote."""
        if self._pid is not None and not self._exited:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self._pid, 0)
            self._exited = True

    def _reap(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        pid, self._pid = self._pid, None
        if pid is not None:
            if not self._exited:  # (once reaped, the pid may be another's)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            _unfreeze()

    def __del__(self) -> None:
        # A snapshot dropped unawaited (its job failed): no zombie, no fd.
        if self._pid is not None or self._fd is not None:
            self.cancel()


_children = 0
#: How the collector was kept off while children live: "freeze", "disable",
#: or "" (it was disabled already: nothing to do).
_held = ""


def _freeze() -> None:
    """While a child lives, keep the parent's collector off the objects
    that existed at the fork: a full collection writes into the header of
    every container it visits, and each page it writes to is copied for the
    child's sake (Instagram's reason for ``gc.freeze``).

    ``gc.freeze`` it is, unless the program froze objects of its own (a
    pre-forking server does, for the same reason): ``gc.unfreeze`` cannot
    tell theirs from ours and would hand them all back to the collector, so
    then collection is paused instead (``gc.disable``) until the last child
    is reaped; and if the program disabled the collector, it stays so."""
    global _children, _held
    if _children == 0:
        if not gc.isenabled():
            _held = ""
        elif gc.get_freeze_count() == 0:
            gc.freeze()
            _held = "freeze"
        else:
            gc.disable()
            _held = "disable"
    _children += 1


def _unfreeze() -> None:
    global _children, _held
    _children -= 1
    if _children == 0:
        if _held == "freeze":
            gc.unfreeze()
        elif _held == "disable":
            gc.enable()
        _held = ""


def start(fn: Callable[[], Any]) -> ChildWork:
    """Run ``fn`` in a forked child; inline if forking is off."""
    if not ENABLED:
        try:
            return ChildWork(None, None, result=fn())
        except EddyflowError as exc:
            return ChildWork(None, None, exception=exc)
        except Exception as exc:
            return ChildWork(None, None, error=f"{type(exc).__name__}: {exc}")
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork() with threads: the child runs only fn.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid != 0:
        _freeze()
    if pid == 0:  # the child
        try:
            os.close(read_fd)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(-1)
            gc.disable()  # a collection would touch (and copy) every container's page
            _die_with_parent(parent)
            try:
                answer = pickle.dumps(("ok", fn()), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as exc:  # reported to the parent
                answer = _error_answer(exc)
            view = memoryview(answer)
            while view:
                view = view[os.write(write_fd, view):]
        finally:
            os._exit(0)
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    return ChildWork(pid, read_fd)


def _error_answer(exc: BaseException) -> bytes:
    """The child's report of ``exc``: eddyflow's own errors as themselves
    (pickled: their type decides what the parent does), others as text."""
    if isinstance(exc, EddyflowError):
        with contextlib.suppress(Exception):  # else reported as text, below
            return pickle.dumps(("raise", exc), protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))


async def _read_all(fd: int) -> bytes:
    """Everything until EOF from non-blocking pipe ``fd``, without blocking the loop."""
    loop = asyncio.get_running_loop()
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()

            def wake(ready: asyncio.Future[None] = ready) -> None:
                if not ready.done():
                    ready.set_result(None)

            loop.add_reader(fd, wake)
            try:
                await ready
            finally:
                loop.remove_reader(fd)
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
