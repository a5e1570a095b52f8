"""Keyed state: the state handles user functions see, and the backends that
hold them. Knows nothing of tasks or channels: a backend is told the key
groups it owns and the current key, and is asked for snapshots.

``abc`` holds the protocol every backend implements (the two halves of a
snapshot included); ``memory/`` is the in-memory backend, ``rocksdb/`` the
RocksDB one (``rocksdict`` is imported when it is first used); ``format`` the
keyed-state file format; ``shared`` the reference counts of files shared by
incremental checkpoints; ``storage`` and ``writer`` the checkpoint folder and
the process that writes into it; ``metadata`` the typed model of a
checkpoint's ``_metadata``.
"""

from eddyflow.state.abc import KeyedStateBackend, StateBackend
from eddyflow.state.handles import ListState, MapState, ReducingState, ValueState
from eddyflow.state.memory import MemoryKeyedStateBackend, MemoryStateBackend
from eddyflow.state.rocksdb import RocksDBStateBackend

__all__ = [
    "KeyedStateBackend",
    "ListState",
    "MapState",
    "MemoryKeyedStateBackend",
    "MemoryStateBackend",
    "ReducingState",
    "RocksDBStateBackend",
    "StateBackend",
    "ValueState",
]
