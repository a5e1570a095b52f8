"""The runtime: tasks (one coroutine per chained subtask), batched channels
with in-band control events, record writers (partitioners), operators, and
the job runner that wires them under one anyio task group.
"""

from eddyflow.runtime.job import JobRunner

__all__ = ["JobRunner"]
