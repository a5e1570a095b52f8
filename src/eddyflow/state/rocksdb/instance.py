"""A RocksDB keyed backend's local folder and its lock.

Under the backend's ``path``, each keyed backend instance has a folder
(``<operator>-<subtask>-<random>/``, holding ``db/`` and the local RocksDB
checkpoints ``chk-<n>/`` until they are uploaded) and a lock file beside it
(``<folder>.lock``), ``flock``-ed (``checkpoint/lock.py``) while the
instance lives. The local database is only a working copy: recovery always
starts from a checkpoint. An instance's folder goes when nothing refers to
it any more (its backend, and the ``JobResult`` views that read the final
state); folders whose lock nobody holds (a killed process's) are removed
when the next backend starts (:func:`remove_stale`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import weakref
from typing import Any

from eddyflow.checkpoint.lock import FileLock
from eddyflow.state.rocksdb.files import DbOptions, open_db

__all__ = ["LocalInstance", "remove_stale"]

log = logging.getLogger("eddyflow.state")

_STALE_AFTER = 60.0  # seconds: a lock file younger than this may be being set up
_LOCK_SUFFIX = ".lock"


class LocalInstance:
    """One keyed backend's local folder and lock; removed when unreferenced."""

    def __init__(self, root: str, name: str) -> None:
        os.makedirs(root, exist_ok=True)
        self.folder = os.path.join(root, name)
        lock = FileLock(self.folder + _LOCK_SUFFIX)
        if not lock.try_acquire():
            raise RuntimeError(f"{lock.path}: the lock of a new RocksDB folder is held")
        os.makedirs(self.folder)
        self.db_path = os.path.join(self.folder, "db")
        self.db: Any = None
        self._reader: Any = None
        # The finalizer may not refer to self: the open databases live in a list.
        self._open: list[Any] = []
        self._finalizer = weakref.finalize(self, _remove_instance, self.folder, lock,
                                           self._open)

    def open(self, options: DbOptions) -> Any:
        """Open the database read-write (:attr:`db`)."""
        self.db = open_db(self.db_path, options)
        self._open.append(self.db)
        return self.db

    def reader(self) -> Any:
        """The database, read-only, once the backend closed it."""
        if self.db is not None:
            return self.db
        if self._reader is None:
            self._reader = open_db(self.db_path, read_only=True)
            self._open.append(self._reader)
        return self._reader

    def close_db(self) -> None:
        """Close the read-write database."""
        if self.db is not None:
            self.db.close()
            self._open.remove(self.db)
            self.db = None


def _remove_instance(folder: str, lock: FileLock, handles: list[Any]) -> None:
    for db in handles:
        with contextlib.suppress(Exception):
            db.close()
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock.path)
    lock.release()


def remove_stale(root: str) -> None:
    """Remove the folders of instances whose process is gone (their lock is
    free)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    now = time.time()
    for name in names:
        if not name.endswith(_LOCK_SUFFIX):
            continue
        lock = FileLock(os.path.join(root, name))
        try:
            if now - os.stat(lock.path).st_mtime < _STALE_AFTER:
                continue
            if not lock.try_acquire():
                continue
        except OSError:
            continue
        folder = lock.path[:-len(_LOCK_SUFFIX)]
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock.path)
        lock.release()
        log.info("removed the local RocksDB folder of a finished process: %s", folder)
