"""Which worker process runs which task.

Subtask ``s`` of every chain runs on worker ``s % workers``. A forward
exchange connects subtask ``i`` to subtask ``i`` of a chain of the same
parallelism, so a forward pipeline stays inside one worker (its records are
never pickled); a keyed or rebalanced exchange of parallelism ``p`` spreads
its ``p`` subtasks, and so their contiguous key-group ranges, evenly over
the workers (Flink's slot sharing does the same: one slice of every
pipeline per slot).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from eddyflow.graph.plan import ExecutionPlan

__all__ = ["Placement", "resolve_workers"]


def resolve_workers(workers: int | str) -> int:
    """``workers`` as a count: ``"auto"`` is the CPU count; anything else
    must be a positive integer (one line names the setting otherwise)."""
    if workers == "auto":
        return max(1, os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer or 'auto', got {workers!r}")
    return workers


class Placement:
    """The worker of each task (``chain index``, ``subtask``) of a plan."""

    def __init__(self, plan: ExecutionPlan, workers: int) -> None:
        self.workers = workers
        self.worker_of: Mapping[tuple[int, int], int] = {
            (c.index, s): s % workers for c in plan.chains for s in range(c.parallelism)
        }

    def tasks_of(self, worker: int) -> list[tuple[int, int]]:
        """The tasks that run on ``worker``."""
        return [t for t, w in self.worker_of.items() if w == worker]
