"""The RocksDB state backend (``ef.RocksDBStateBackend``): keyed state in
a local RocksDB database per operator subtask, with incremental checkpoints.

``backend`` holds the backend and its keyed backends, ``tables`` the write
caches the operators and state handles see, ``keys`` the row layout,
``snapshot`` the incremental snapshot strategy, ``files`` moving database
files to and from checkpoint storage, ``reader`` reading rows back.
"""

from eddyflow.state.rocksdb.backend import (
    PickleSerializer,
    RocksDBKeyedStateBackend,
    RocksDBStateBackend,
)

__all__ = ["PickleSerializer", "RocksDBKeyedStateBackend", "RocksDBStateBackend"]
