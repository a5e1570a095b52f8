"""Incremental snapshots of the RocksDB backend, as Flink's
``RocksIncrementalSnapshotStrategy`` takes them.

Synchronous half (at the barrier): the tables' changes since the last
snapshot go into the database, with one ``WriteBatch`` when they are few,
or (many) through a forked child that writes them as a sorted SST file from
a copy-on-write image of the caches (``RocksDBKeyedStateBackend.begin_snapshot``).
Its cost follows what changed, not the size of the state, and most of it
runs on another core (at the end of the input, when nothing else runs, the
barrier writes half of the rows and the child the other half).

Asynchronous half: the files are ingested, the memtable flushed, and a
RocksDB checkpoint taken — a folder of hard links to the database's immutable
SST files plus copies of its small ``MANIFEST``/``CURRENT``/``OPTIONS`` files
(in a worker thread; until then nothing else is written to the database).
Then, in a worker thread too, every SST file
of the checkpoint that the last *completed* checkpoint already uploaded is
referenced again, not copied; the others are linked (or copied, across file
systems) into the storage's ``shared/`` folder as
``<operator>-<subtask>-<run>-<checkpoint>-<name>.sst``, a name no other
subtask, run or checkpoint can take; the small files go into the
checkpoint's own folder. Each new file's size and SHA-256 go into the handle
(and so into ``_metadata``). The files an aborted or unconfirmed checkpoint
uploaded are never built on: if they are not referenced by a completed
checkpoint, the coordinator's ``SharedStateRegistry`` deletes them.
``incremental=False`` uploads every file every time.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from eddyflow.checkpoint.durable import fsync_dir
from eddyflow.checkpoint.layout import CheckpointLayout
from eddyflow.checkpoint.storage import FileHandle
from eddyflow.state.abc import KeyedSnapshot, SnapshotTarget
from eddyflow.state.rocksdb.files import copy_verified, hash_file
from eddyflow.state.rocksdb.handle import RocksDBStateHandle

if TYPE_CHECKING:
    from eddyflow.state.rocksdb.backend import RocksDBKeyedStateBackend

__all__ = ["RocksSnapshotStrategy"]


class RocksSnapshotStrategy:
    def __init__(self, backend: RocksDBKeyedStateBackend, incremental: bool) -> None:
        self.backend = backend
        self.incremental = incremental
        #: SST name -> where the last completed checkpoint holds it.
        self.confirmed: dict[str, FileHandle] = {}
        #: The storage root ``confirmed`` is under when it came from a
        #: restore (``None``: this backend's own snapshots).
        self.confirmed_root: str | None = None
        self._pending: dict[int, dict[str, FileHandle]] = {}

    def restored(self, root: str, files: dict[str, FileHandle]) -> None:
        """The database was restored as it is in checkpoint storage ``root``:
        its SST files there may be referenced rather than uploaded again."""
        self.confirmed = files
        self.confirmed_root = os.path.abspath(root)

    def snapshot(self, target: SnapshotTarget) -> KeyedSnapshot:
        backend = self.backend
        flush = backend.begin_snapshot(target.checkpoint_id, target.at_end)
        # Files restored from another storage (a restore from another
        # folder's checkpoint, or a bootstrapped one) are not under this
        # checkpoint's root: its handles are relative to it, so they are
        # uploaded again, once.
        same = self.confirmed_root is None or self.confirmed_root == os.path.abspath(target.root)
        base = dict(self.confirmed) if self.incremental and same else {}
        return _RocksSnapshot(self, target, flush, base, backend.kinds, backend.estimate_keys())

    def record(self, checkpoint_id: int, files: dict[str, FileHandle]) -> None:
        self._pending[checkpoint_id] = {n: h for n, h in files.items() if n.endswith(".sst")}

    def confirm(self, checkpoint_id: int) -> None:
        files = self._pending.get(checkpoint_id)
        if files is None:
            return
        self.confirmed = files
        self.confirmed_root = None
        self._pending = {n: f for n, f in self._pending.items() if n > checkpoint_id}

    def abort(self, checkpoint_id: int) -> None:
        self._pending.pop(checkpoint_id, None)


class _RocksSnapshot(KeyedSnapshot):
    def __init__(self, strategy: RocksSnapshotStrategy, target: SnapshotTarget, flush: Any,
                 base: dict[str, FileHandle], kinds: dict[str, str], entries: int) -> None:
        self.strategy = strategy
        self.target = target
        self.flush = flush
        self.local: str = flush.local
        self.base = base
        self.kinds = kinds
        self.entries = entries
        self.cancelled = threading.Event()

    async def write(self) -> RocksDBStateHandle:
        backend = self.strategy.backend
        t = self.target
        shared = CheckpointLayout.shared_prefix(t.checkpoint_id, backend.operator, t.subtask,
                                                t.run_id) + "-"
        private = CheckpointLayout.subtask_prefix(t.checkpoint_id, backend.operator, t.subtask)
        try:
            await backend.finish_snapshot(self.flush)
            files, new = await anyio.to_thread.run_sync(
                _upload, self.local, t.root, self.base, shared, private, self.cancelled)
        finally:
            # The local checkpoint's links are not needed once uploaded (or not).
            shutil.rmtree(self.local, ignore_errors=True)
        self.strategy.record(t.checkpoint_id, files)
        return RocksDBStateHandle(self.kinds, self.entries, backend.key_groups,
                                  tuple(sorted(files.items())), new_files=new)

    def cancel(self) -> None:
        self.cancelled.set()
        self.strategy.backend.abandon(self.flush)


def _upload(local: str, root: str, base: Mapping[str, FileHandle], shared: str, private: str,
            cancelled: threading.Event) -> tuple[dict[str, FileHandle], frozenset[str]]:
    files: dict[str, FileHandle] = {}
    new: set[str] = set()
    folders: set[str] = set()
    for name in sorted(os.listdir(local)):
        if cancelled.is_set():
            # (An OSError: the task ignores it for an aborted checkpoint.)
            raise OSError(f"upload of {local} abandoned: its checkpoint was aborted")
        known = base.get(name)
        if known is not None:
            files[name] = known
            continue
        src = os.path.join(local, name)
        rel = (shared + name) if name.endswith(".sst") else (private + name)
        dst = os.path.join(root, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        folders.add(os.path.dirname(dst))
        files[name] = _put(src, dst, rel, linked=name.endswith(".sst"))
        new.add(rel)
    for folder in folders:
        fsync_dir(folder)
    return files, frozenset(new)


def _put(src: str, dst: str, rel: str, linked: bool) -> FileHandle:
    """``src`` at ``dst``: an SST file (immutable, synced by RocksDB when it
    was written) is hard-linked when it can be; anything else is copied and
    synced. Atomic either way: a partial file never has the final name."""
    tmp = f"{dst}.tmp-{os.getpid()}-{threading.get_ident()}"
    if linked:
        try:
            os.link(src, tmp)
        except OSError:
            linked = False
    if linked:
        size, sha = hash_file(tmp, sync=True)
    else:
        size, sha = copy_verified(src, tmp, sync=True)
    os.replace(tmp, dst)
    return FileHandle(rel, size, sha)

