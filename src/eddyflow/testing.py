"""Testing helpers: ``FailingMap``, ``ManualClock`` (processing
time that moves only on ``advance``) and the fault-injection points.

``FailingMap`` is an identity function that raises :class:`InjectedFailure`
after a number of records; it counts across restarts (the object outlives
the attempts of an in-process job), so ``times=1`` fails exactly once.
"""

from __future__ import annotations

import threading
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
        self.seen = 0
        self.failures = 0
        self._lock = threading.Lock()

    def __call__(self, record: Any) -> Any:
        with self._lock:
            self.seen += 1
            fail = self.failures < self.times and self.seen >= self.after * (self.failures + 1)
            if fail:
                self.failures += 1
        if fail:
            raise InjectedFailure(
                f"FailingMap: injected failure {self.failures} of {self.times} "
                f"after {self.seen} records"
            )
        return record

    def __deepcopy__(self, memo: dict[int, Any]) -> FailingMap:
        return self  # shared across subtasks and restarts on purpose

    def __repr__(self) -> str:
        return f"FailingMap(after={self.after}, times={self.times}, failures={self.failures})"
