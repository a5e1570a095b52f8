"""Testing helpers: ``FailingMap``, ``ManualClock`` (processing
time that moves only on ``advance``) and the fault-injection points.

``FailingMap`` is an identity function that raises :class:`InjectedFailure`
after a number of records; it counts across restarts (the object outlives
the attempts of an in-process job), so ``times=1`` fails exactly once. Its
counts live in a shared memory-mapped file, so that they also hold across
the worker processes of a job with ``workers`` > 1 (forked from the
caller, or spawned and handed the object pickled, anew at each restart).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import tempfile
import weakref
from typing import Any

from eddyflow.runtime.faults import FAULT_POINTS, InjectedFailure, arm, disarm_all
from eddyflow.runtime.time.clock import ManualClock

__all__ = ["FAULT_POINTS", "FailingMap", "InjectedFailure", "ManualClock", "arm", "disarm_all"]


class FailingMap:
    """Identity map that fails on its ``after``-th, ``2*after``-th, …
    record seen in total, ``times`` times at most."""

    def __init__(self, after: int, times: int = 1) -> None:
        if after < 1 or times < 0:
            raise ValueError(f"FailingMap needs after >= 1 and times >= 0, got {after}, {times}")
        self.after = after
        self.times = times
        # [records seen, failures], in a file every worker process maps
        # (inherited by a fork, opened by name by a spawned worker).
        fd, self._path = tempfile.mkstemp(prefix="eddyflow-failingmap-")
        os.ftruncate(fd, 16)
        os.close(fd)
        weakref.finalize(self, _remove_if_mine, self._path, os.getpid())
        self._map()

    def _map(self) -> None:
        with open(self._path, "r+b") as f:
            self._counts = memoryview(mmap.mmap(f.fileno(), 16)).cast("q")

    def __getstate__(self) -> dict[str, Any]:
        return {"after": self.after, "times": self.times, "_path": self._path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._map()

    @property
    def seen(self) -> int:
        """Records seen in total (every subtask, attempt and worker)."""
        return int(self._counts[0])

    @property
    def failures(self) -> int:
        """Failures injected so far."""
        return int(self._counts[1])

    def __call__(self, record: Any) -> Any:
        counts = self._counts
        # Counted without the lock: a worker process killed while holding
        # it (the others are, when one fails) would stop every later
        # attempt at its first record. Across processes a count may be lost
        # to a race, so a failure may come a record or two late.
        counts[0] += 1
        seen = counts[0]
        fail = False
        # Claiming a failure is atomic (``times`` failures, never more): under
        # a lock of the file, held only for that, that a process killed
        # holding it releases. (Opened here: processes forked with one open
        # file would share its lock.)
        if counts[1] < self.times and seen >= self.after * (counts[1] + 1):
            with open(self._path, "rb") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                failures = counts[1]
                fail = failures < self.times and seen >= self.after * (failures + 1)
                if fail:
                    counts[1] = failures + 1
        if fail:
            raise InjectedFailure(
                f"FailingMap: injected failure {counts[1]} of {self.times} "
                f"after {seen} records"
            )
        return record

    def __deepcopy__(self, memo: dict[int, Any]) -> FailingMap:
        return self  # shared across subtasks and restarts on purpose

    def __repr__(self) -> str:
        return f"FailingMap(after={self.after}, times={self.times}, failures={self.failures})"


def _remove_if_mine(path: str, creator: int) -> None:
    if os.getpid() == creator:  # (not a worker's copy)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
