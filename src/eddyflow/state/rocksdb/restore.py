"""Restoring a RocksDB backend from its own checkpoints' handles, without
decoding a row: the checkpoint's database itself when the subtask owns the
same key groups, or the rows of the key groups it owns copied from an old
subtask's database (one contiguous range each). A handle of another
backend is restored through the caches
(``RocksDBKeyedStateBackend.restore``)."""

from __future__ import annotations

import os
import shutil

from eddyflow.state.rocksdb.files import DbOptions, materialise, open_db, scan
from eddyflow.state.rocksdb.handle import RocksDBStateHandle
from eddyflow.state.rocksdb.instance import LocalInstance
from eddyflow.state.rocksdb.keys import key_group_bounds
from eddyflow.state.rocksdb.store import Store
from eddyflow.state.rocksdb.tables import new_batch

__all__ = ["copy_key_groups", "open_checkpointed"]

#: Rows copied per write batch.
_BATCH = 65536


def open_checkpointed(root: str, handle: RocksDBStateHandle, instance: LocalInstance,
                      options: DbOptions) -> None:
    """Make ``instance``'s database the one of the checkpoint (of storage
    ``root``), as it was: its files, copied and verified, then opened."""
    instance.close_db()
    materialise(root, dict(handle.db_files), instance.db_path)
    instance.open(options)


def copy_key_groups(root: str, handle: RocksDBStateHandle, key_groups: range,
                    instance: LocalInstance, store: Store) -> int:
    """Copy the rows of ``key_groups`` that ``handle`` holds into ``store``;
    how many. The old database is brought into a folder of ``instance`` and
    opened read-only, then removed."""
    start = max(key_groups.start, handle.key_groups.start)
    stop = min(key_groups.stop, handle.key_groups.stop)
    if start >= stop:
        return 0
    folder = os.path.join(instance.folder, "restore")
    materialise(root, dict(handle.db_files), folder)
    n = 0
    try:
        old = open_db(folder, read_only=True)
        try:
            batch = new_batch()
            for row, value in scan(old, *key_group_bounds(range(start, stop))):
                batch.put(row, value)
                n += 1
                if n % _BATCH == 0:
                    store.write(batch)
                    batch = new_batch()
            store.write(batch)
        finally:
            old.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return n
