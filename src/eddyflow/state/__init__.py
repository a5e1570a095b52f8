"""Keyed state: the state handles user functions see, and the backends that
hold them. Knows nothing of tasks or channels: a backend is told the key
groups it owns and the current key, and is asked for snapshots.

``abc`` holds the protocol every backend implements (the two halves of a
snapshot included); ``memory/`` is the in-memory backend; ``format`` the
keyed-state file format; ``shared`` the reference counts of files shared by
incremental checkpoints; ``storage`` and ``writer`` the checkpoint folder and
the process that writes into it.
"""

from eddyflow.state.abc import KeyedStateBackend, StateBackend
from eddyflow.state.handles import ListState, MapState, ReducingState, ValueState
from eddyflow.state.memory import MemoryKeyedStateBackend, MemoryStateBackend

__all__ = [
    "KeyedStateBackend",
    "ListState",
    "MapState",
    "MemoryKeyedStateBackend",
    "MemoryStateBackend",
    "ReducingState",
    "StateBackend",
    "ValueState",
]
