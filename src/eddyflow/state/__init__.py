"""Keyed state: the state handles user functions see, and the backends that
hold them. Knows nothing of tasks or channels: a backend is told the key
groups it owns and the current key, and is asked for snapshots.

``abc`` holds the protocol every backend implements (the two halves of a
snapshot included), ``table`` what its tables offer, ``changes`` the record
of what was written since the last snapshot, ``registry`` the backends known
by name; ``memory/`` is the in-memory backend, ``rocksdb/`` the RocksDB one
(``rocksdict`` is imported when it is first used), each registered when its
package is imported; ``format`` the keyed-state file format; ``handles`` and
``ttl`` the state handles and time-to-live. The checkpoint storage the
backends write into, and the generic handles its metadata holds, are
``eddyflow.checkpoint``'s.
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
