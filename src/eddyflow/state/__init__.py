"""Keyed state: the state handles user functions see, and the backends that
hold them. Knows nothing of tasks or channels: a backend is told the key
groups it owns and the current key, nothing more.
"""

from eddyflow.state.backend import KeyedStateBackend, MemoryStateBackend, StateBackend
from eddyflow.state.handles import ListState, MapState, ReducingState, ValueState

__all__ = [
    "KeyedStateBackend",
    "ListState",
    "MapState",
    "MemoryStateBackend",
    "ReducingState",
    "StateBackend",
    "ValueState",
]
