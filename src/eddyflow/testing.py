"""Testing helpers: ``FailingMap``, ``ManualClock`` (processing
time that moves only on ``advance``) and the fault-injection points.

``FailingMap`` is an identity function that raises :class:`InjectedFailure`
after a number of records; it counts across restarts (the object outlives
the attempts of an in-process job), so ``times=1`` fails exactly once. Its
counts live in shared memory, so that they also hold across the worker
processes of a job with ``workers`` > 1 (forked from the caller, which
forks them anew at each restart).
"""

from __future__ import annotations

import multiprocessing
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
        # [records seen, failures]: shared with forked worker processes.
        self._counts = multiprocessing.RawArray("q", 2)
        self._lock = multiprocessing.Lock()

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
        # Claiming a failure is atomic (``times`` failures, never more); the
        # lock is held only for that, and not waited for forever.
        if (counts[1] < self.times and seen >= self.after * (counts[1] + 1)
                and self._lock.acquire(timeout=1.0)):
            try:
                failures = counts[1]
                fail = failures < self.times and seen >= self.after * (failures + 1)
                if fail:
                    counts[1] = failures + 1
            finally:
                self._lock.release()
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
