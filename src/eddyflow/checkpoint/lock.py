"""One job per checkpoint folder: an ``fcntl`` lock on ``<dir>/_lock``
(:class:`FolderLock`, on the one ``flock`` implementation, :class:`FileLock`).

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

__all__ = ["FileLock", "FolderLock"]

log = logging.getLogger("eddyflow.checkpoint.listing")

#: The locks this process holds, their descriptors closed in forked children.
_held: weakref.WeakSet[FileLock] = weakref.WeakSet()


def _close_in_child() -> None:
    for lock in list(_held):
        lock.forget()


os.register_at_fork(after_in_child=_close_in_child)


class FileLock:
    """An exclusive ``flock`` on the file ``path`` (created if missing), held
    from :meth:`try_acquire` to :meth:`release`, or until this process dies.
    A process forked while it is held closes its copy of the descriptor at
    once: the lock stays this process's alone. What a checkpoint folder's
    :class:`FolderLock` and a RocksDB backend's local folder are locked
    with."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """This object holds the lock."""
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; whether it was taken."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path}: already held by this FileLock")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _held.add(self)
        return True

    def write(self, record: bytes) -> None:
        """Replace the lock file's content with ``record`` (held only)."""
        assert self._fd is not None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, record, 0)

    def release(self, *, clear: bool = False) -> None:
        """Release the lock (``clear``: empty the file first)."""
        fd, self._fd = self._fd, None
        _held.discard(self)
        if fd is None:
            return
        if clear:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor releases the flock

    def forget(self) -> None:
        """Close this process's descriptor without touching the lock (in a
        forked child: the parent's copy keeps it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


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
        self._lock = FileLock(self.path)

    @property
    def held(self) -> bool:
        return self._lock.held

    def acquire(self) -> FolderLock:
        """Take the lock or raise :class:`CheckpointFolderInUse` naming the
        process that holds it."""
        if self._lock.held:
            raise RuntimeError(f"{self.path}: already held by this FolderLock")
        os.makedirs(self.folder, exist_ok=True)
        if not self._lock.try_acquire():
            holder = _holder(self.path)
            raise CheckpointFolderInUse(
                f"checkpoint folder {self.folder} is in use by {_describe(holder)}: "
                "one job per checkpoint folder (stop that job, or give this one "
                "another directory)", pid=_int_or_none(holder.get("pid")),
            )
        previous = _holder(self.path)
        if previous.get("pid") not in (None, os.getpid()):
            # Whoever wrote it is gone: the kernel released their lock.
            log.info("checkpoint folder %s: taking over the lock of %s, which is gone",
                     self.folder, _describe(previous))
        self._lock.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "job": self.job, "since": time.time()}).encode())
        return self

    def release(self) -> None:
        """Release the lock (no pid is left behind to mislead a reader)."""
        self._lock.release(clear=True)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None
