"""The RocksDB state backend (``ef.RocksDBStateBackend``): keyed state in
a local RocksDB database per operator subtask, with incremental checkpoints.

``backend`` holds the backend and its keyed backends, ``tables`` the write
caches the operators and state handles see, ``keys`` the row layout,
``instance`` the local folder and its lock, ``store`` the database's rows
and the asynchronous half of a snapshot, ``sst`` SST files, ``snapshot`` the
incremental snapshot strategy, ``restore`` restoring from its own
checkpoints, ``files`` moving database files to and from checkpoint
storage, ``reader`` reading rows back, ``handle`` its checkpoint handle and
``kind`` its registration (``state/registry.py``), made here.
"""

from eddyflow.state.registry import register
from eddyflow.state.rocksdb.backend import (
    PickleSerializer,
    RocksDBKeyedStateBackend,
    RocksDBStateBackend,
)
from eddyflow.state.rocksdb.handle import RocksDBStateHandle
from eddyflow.state.rocksdb.kind import RocksDBKind

register(RocksDBKind())

__all__ = ["PickleSerializer", "RocksDBKeyedStateBackend", "RocksDBStateBackend",
           "RocksDBStateHandle"]
