"""One job per checkpoint folder: an ``fcntl`` lock on ``<dir>/_lock``.

Two jobs writing ``chk-<n>`` into one folder overwrite each other's
checkpoints and, through the sinks, each other's output. A job holds an
exclusive ``flock`` on the folder's lock file for its whole life; a second
job is refused with the holder's pid. The kernel drops the lock when its
holder dies (SIGKILL included), so a stale lock file is simply taken over.

The lock belongs to the open file: processes forked while a job runs
(snapshot children) close their inherited copy at once, so that an orphaned
child can never keep a dead job's folder locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
import weakref
from types import TracebackType

from eddyflow.checkpoint.layout import CheckpointLayout
from eddyflow.errors import CheckpointFolderInUse

__all__ = ["FolderLock"]

log = logging.getLogger("eddyflow.checkpoint.listing")

#: Descriptors of the locks this process holds, closed in forked children.
_held: weakref.WeakSet[FolderLock] = weakref.WeakSet()


def _close_in_child() -> None:
    for lock in list(_held):
        if lock._fd is not None:
            with contextlib.suppress(OSError):
                os.close(lock._fd)
            lock._fd = None


os.register_at_fork(after_in_child=_close_in_child)


def _holder(path: str) -> dict[str, object]:
    try:
        with open(path, encoding="utf-8") as f:
            found = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _describe(holder: dict[str, object]) -> str:
    pid = holder.get("pid")
    if pid is None:
        return "another process"
    job = holder.get("job")
    return f"process {pid}" + (f" (job {job!r})" if job else "")


class FolderLock:
    """The exclusive lock of a checkpoint folder, held from :meth:`acquire`
    to :meth:`release` (or the end of a ``with`` block)."""

    def __init__(self, folder: str | os.PathLike[str], job: str = "") -> None:
        layout = CheckpointLayout(folder)
        self.folder = layout.root
        self.path = layout.lock
        self.job = job
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> FolderLock:
        """Take the lock or raise :class:`CheckpointFolderInUse` naming the
        process that holds it."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path}: already held by this FolderLock")
        os.makedirs(self.folder, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _holder(self.path)
            raise CheckpointFolderInUse(
                f"checkpoint folder {self.folder} is in use by {_describe(holder)}: "
                "one job per checkpoint folder (stop that job, or give this one "
                "another directory)", pid=_int_or_none(holder.get("pid")),
            ) from None
        except BaseException:
            os.close(fd)
            raise
        previous = _holder(self.path)
        if previous.get("pid") not in (None, os.getpid()):
            # Whoever wrote it is gone: the kernel released their lock.
            log.info("checkpoint folder %s: taking over the lock of %s, which is gone",
                     self.folder, _describe(previous))
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "job": self.job, "since": time.time()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        self._fd = fd
        _held.add(self)
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        _held.discard(self)
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no pid left behind to mislead a reader
        os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None
