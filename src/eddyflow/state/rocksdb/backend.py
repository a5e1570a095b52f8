"""The RocksDB backend: keyed state bigger than memory, in one local RocksDB
database per operator subtask (``rocksdict``), behind a bounded write cache
(:mod:`eddyflow.state.rocksdb.tables`), with incremental checkpoints
(:mod:`eddyflow.state.rocksdb.snapshot`).

The package by concern: ``instance`` the local folder and its lock,
``store`` the database's rows and the asynchronous half of a snapshot,
``sst`` writing changes as SST files, ``snapshot`` the snapshot strategy
and the upload, ``restore`` restoring from its own checkpoints, ``reader``
reading rows back, ``handle`` and ``kind`` its checkpoint handle and its
registration. This module holds the backend and its keyed backends: the
tables, and the synchronous half of a snapshot.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.errors import StateSerializationError
from eddyflow.state import forked
from eddyflow.state.abc import KeyedSnapshot, KeyedStateBackend, SnapshotTarget, StateBackend
from eddyflow.state.changes import Changes, Written
from eddyflow.state.format import DELETED
from eddyflow.state.registry import kind_of
from eddyflow.state.rocksdb.files import DbOptions
from eddyflow.state.rocksdb.handle import RocksDBStateHandle
from eddyflow.state.rocksdb.instance import LocalInstance, remove_stale
from eddyflow.state.rocksdb.keys import MAX_PARALLELISM, key_group_bounds
from eddyflow.state.rocksdb.reader import RocksStateView, read_rows
from eddyflow.state.rocksdb.restore import copy_key_groups, open_checkpointed
from eddyflow.state.rocksdb.snapshot import RocksSnapshotStrategy
from eddyflow.state.rocksdb.sst import (
    Part,
    capture,
    ingest_moved,
    write_sorted_sst,
    write_sst,
)
from eddyflow.state.rocksdb.store import Flush, Store
from eddyflow.state.rocksdb.tables import (
    ListTable,
    MapTable,
    Serializer,
    ValueTable,
    new_batch,
)
from eddyflow.state.table import TableCapabilities
from eddyflow.state.ttl import base_kind, has_ttl

__all__ = ["PickleSerializer", "RocksDBKeyedStateBackend", "RocksDBStateBackend"]

#: Up to this many changed keys a snapshot writes them at the barrier; above
#: it a forked child does: a fork copies the page tables of the whole heap,
#: so it pays only for more (``benchmarks/state.py``, the RocksDB rows).
_INLINE = 20000
#: At the end of the input, above this many changed keys (counted with
#: repeats) half of them are written by a forked child: about where writing
#: the rows costs what a fork does (see above).
_SPLIT = 100_000

#: What each kind of table offers (``state/table.py``).
_VALUE = TableCapabilities(preloads=True)
_ROWS = TableCapabilities(rows=True)


class PickleSerializer:
    """The default value serializer. ``dumps`` and ``loads`` are the C
    functions themselves, not methods around them: they run once per value
    written or read (a wrapper around them shows in ``benchmarks/state.py``)."""

    def __init__(self) -> None:
        self.dumps: Callable[[Any], bytes] = functools.partial(
            pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL)
        self.loads: Callable[[bytes], Any] = pickle.loads


AnyTable = ValueTable | MapTable | ListTable


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """The keyed state of one operator subtask in a local RocksDB database."""

    def __init__(self, factory: RocksDBStateBackend, operator: str, subtask: int,
                 key_groups: range, max_parallelism: int) -> None:
        if max_parallelism > MAX_PARALLELISM:
            raise ValueError(f"operator '{operator}': the RocksDB backend supports "
                             f"max_parallelism up to {MAX_PARALLELISM}, got {max_parallelism}")
        self._rtables: dict[str, AnyTable] = {}
        self._changes: dict[str, Changes] = {}
        self._loaders: list[ValueTable] = []
        super().__init__(operator, key_groups, max_parallelism)
        self.factory = factory
        self.subtask = subtask
        self._instance = LocalInstance(factory.path, f"{operator}-{subtask}-{uuid.uuid4().hex[:8]}")
        self._instance.open(factory.db_options)
        self._store = Store(self._instance, factory.serializer, operator)
        self._strategy = RocksSnapshotStrategy(self, factory.incremental)
        #: The database holds nothing the caches do not (a fresh start).
        self._fresh = True

    # The current key is loaded into every value table's cache when it is set:
    # the state handles then read the cache.
    @property
    def current_key(self) -> Any:
        return self._current_key

    @current_key.setter
    def current_key(self, key: Any) -> None:
        self._current_key = key
        for t in self._loaders:
            t.load_one(key)

    def _table(self, name: str) -> Any:
        table = self._rtables.get(name)
        if table is not None:
            return table
        kind = base_kind(self._kinds.get(name, "value"))
        limit = self.factory.cache_size
        mp = self.max_parallelism
        changes = self._changes[name] = Changes(True)
        if kind == "map":
            table = MapTable(self._store, name, mp, limit)
        elif kind == "list":
            table = ListTable(self._store, name, mp, limit)
        else:
            table = ValueTable(self._store, name, mp, changes, limit, self._fresh)
            self._loaders.append(table)
        self._rtables[name] = table
        return table

    def capabilities(self, name: str) -> TableCapabilities:
        # A value table caches the database and loads a batch's keys at
        # once; a map or list state is rows.
        return _VALUE if isinstance(self._table(name), ValueTable) else _ROWS

    def changes(self, name: str) -> Changes:
        return self._changes[name]

    def flush(self) -> int:
        """Write every table's pending changes with one ``WriteBatch``."""
        self._check_open()
        batch = new_batch()
        n = sum(t.flush_into(batch) for t in self._rtables.values())
        if n:
            self._store.write(batch)
        return n

    def tables(self) -> dict[str, Mapping[Any, Any]]:
        """Read-only views of the state as the database holds it (pending
        changes are flushed first, unless a snapshot's checkpoint is being
        taken); they load nothing until read."""
        self._flush_unless_busy()
        loads = self.factory.serializer.loads
        return {name: RocksStateView(self._instance, name, kind, self.max_parallelism, loads)
                for name, kind in self._kinds.items()}

    def _flush_unless_busy(self) -> None:
        # Not while a snapshot's checkpoint is being taken: what is written
        # now would land in it.
        if not self._closed and not self._store.busy:
            self.flush()

    def entries(self) -> Iterator[tuple[str, int, Any, Any]]:
        self._flush_unless_busy()
        # read_rows gives (state, key group, ...), as entries() promises.
        yield from read_rows(self._instance.reader(), self._kinds, None,
                             self.factory.serializer.loads)

    def _stored_items(self, names: list[str]) -> Iterator[tuple[str, Any, Any]]:
        # One scan of the database for every state asked for (a view per
        # state would scan it once each); rows of other states are skipped
        # undecoded.
        self._flush_unless_busy()
        for name, _, key, stored in read_rows(self._instance.reader(), self._kinds, None,
                                              self.factory.serializer.loads, names=set(names)):
            yield name, key, stored

    def estimate_keys(self) -> int:
        n = self._instance.db.property_int_value("rocksdb.estimate-num-keys")
        return int(n or 0)

    # -- snapshots ---------------------------------------------------------

    def snapshot(self, target: SnapshotTarget) -> KeyedSnapshot:
        self._check_open()
        try:
            # Expired entries leave first, through the caches and overlays
            # that the synchronous half flushes: the checkpoint deletes them.
            self.expire_ttl()
            return self._strategy.snapshot(target)
        except StateSerializationError:
            self._store.unwritable = True
            raise

    def begin_snapshot(self, checkpoint_id: int, at_end: bool) -> Flush:
        """The synchronous half: the changes since the last snapshot are
        written, a few at once, many by a forked child (on a copy-on-write
        image of the caches as they are now, on another core) as an SST file
        that the asynchronous half ingests before it takes the checkpoint."""
        self._check_open()
        for older in list(self._store.inflight):
            # A snapshot in flight is abandoned (a final checkpoint subsumes
            # it): its changes are written by this one. But at the end of the
            # input nothing runs beside this snapshot: a child that is
            # writing most of the state is waited for and its file ingested,
            # and this one writes only what changed since.
            if at_end and older.work is not None and not older.abandoned:
                self._store.ingest_now(older)
            else:
                self.abandon(older)
        batch = new_batch()
        for t in self._rtables.values():
            if not isinstance(t, ValueTable):
                try:
                    t.flush_into(batch)
                except StateSerializationError as exc:
                    exc.verb, exc.checkpoint = "snapshot", checkpoint_id  # part of this one
                    raise
        # Distinct keys (their lists de-duplicated as they were recorded,
        # while that paid: see Changes): a few hot keys written a million
        # times are a few rows written at once, not a forked child's SST.
        size = sum(t.changes.count() for t in self._loaders)
        written = [(t, t.changes.take()) for t in self._loaders]
        folder = self._instance.folder
        sst = os.path.join(folder, f"ingest-{checkpoint_id}.sst")
        flush = Flush(checkpoint_id, os.path.join(folder, f"chk-{checkpoint_id}"), None, sst,
                       written)
        dumps = self.factory.serializer.dumps
        if size <= _INLINE:
            # Few: their values are taken now (immutable ones by reference,
            # the others pickled: what user code changes in place after the
            # barrier must not reach the checkpoint); their rows are made and
            # written by the worker thread that takes the checkpoint (rows
            # made at the barrier would stop the loop: benchmarks/state.py).
            flush.deferred = [(t, *capture(t, w, dumps, self.operator, checkpoint_id))
                              for t, w in written]
        elif not at_end and forked.ENABLED:
            flush.work = forked.start(functools.partial(
                write_sst, sst, self._parts(written, False, size), dumps, self.operator,
                checkpoint_id))
        else:
            # Many, and nothing runs beside: a sorted SST file written here
            # and ingested costs a fraction of a WriteBatch's memtable
            # inserts, and half of it is written by a forked child on the
            # other core, which is idle now (the end-of-input rows of
            # benchmarks/state.py measure both).
            parts = self._parts(written, at_end, size)
            if any(p.whole for p in parts):
                flush.cleared = [key_group_bounds(self.key_groups)]
            mine = os.path.join(folder, f"ingest-{checkpoint_id}-0.sst")
            share = (0, 1)
            if forked.ENABLED and size > _SPLIT:
                share = (0, 2)
                flush.work = forked.start(functools.partial(
                    write_sst, sst, parts, dumps, self.operator, checkpoint_id, (1, 2)))
            try:
                if write_sst(mine, parts, dumps, self.operator, checkpoint_id, share):
                    flush.inline.append(mine)
            except BaseException:
                if flush.work is not None:
                    flush.work.cancel()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(mine)
                raise
        self._store.write(batch)
        self._store.inflight.append(flush)
        return flush

    def _parts(self, written: list[tuple[ValueTable, Written]], at_end: bool, size: int
               ) -> list[Part]:
        """What each value table writes. At the end of the input, a table
        that holds every key of the only state, when at least as many
        writes were recorded as it has keys (nearly every key changed,
        typically), is written whole: its keys and values are read in the
        table's own order, where the keys written would be de-duplicated
        through a set and each value looked up (a cache miss each: see the
        end-of-input rows of ``benchmarks/state.py``), and its other rows are
        deleted by one range
        tombstone. Only at the end: a periodic checkpoint would grow by the
        keys that did not change, and its cost runs on another core."""
        whole = (at_end and len(self._kinds) == 1 and len(written) == 1
                 and written[0][0].complete and size >= len(written[0][0]))
        return [Part(t, t.rows, w, whole) for t, w in written]

    async def finish_snapshot(self, flush: Flush) -> None:
        """The asynchronous half's work on the database: ``flush``'s changes
        in, the RocksDB checkpoint taken (``Store.finish``)."""
        await self._store.finish(flush)

    def abandon(self, flush: Flush) -> None:
        """A snapshot that will not complete (``Store.abandon``)."""
        self._store.abandon(flush)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._strategy.confirm(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._strategy.abort(checkpoint_id)

    # -- restore -----------------------------------------------------------

    def restore(self, kinds: Mapping[str, str],
                entries: Iterable[tuple[str, Any, Any]]) -> int:
        """Entries of another backend's checkpoint, through the caches."""
        self._was_restored()
        for name, kind in kinds.items():
            self.declare(name, kind)
        self._not_fresh()
        n = 0
        for name, key, value in entries:
            table = self._table(name)
            if isinstance(table, ValueTable):
                if value is DELETED:
                    table.remove(key)
                else:
                    table.replace(key, value)
            elif value is DELETED:
                table.pop(key, None)
            else:
                table[key] = value
            n += 1
            if n % 65536 == 0:
                self._flush_and_forget()
        self._flush_and_forget()
        return n

    def bulk_load(self, name: str, kind: str, entries: Mapping[Any, Any]) -> int:
        """A value state's entries as one sorted SST file, ingested (a
        fraction of what the same rows cost through the caches and write
        batches: the bootstrap rows of ``benchmarks/offline.py``); other
        kinds through :meth:`restore`."""
        if base_kind(kind) in ("map", "list") or has_ttl(kind) or not entries:
            return super().bulk_load(name, kind, entries)
        self._was_restored()
        self.declare(name, kind)
        self._not_fresh()
        path = os.path.join(self._instance.folder, f"bulk-{name}.sst")
        n = write_sorted_sst(path, name, self.max_parallelism, entries,
                             self.factory.serializer.dumps, self.operator)
        with self._store.lock:
            ingest_moved(self._instance.db, path)
        return n

    def _flush_and_forget(self) -> None:
        """Write what the caches hold and empty them (a restore must not
        keep the whole state in memory)."""
        self.flush()
        for t in self._loaders:
            t.clear()
            t.known.clear()

    def restore_from(self, root: str, kinds: Mapping[str, str],
                     handles: list[KeyedStateHandle]) -> int:
        self._was_restored()
        for name, kind in kinds.items():
            self.declare(name, kind)
        mine = [h for h in handles if isinstance(h, RocksDBStateHandle)]
        if len(handles) == 1 and len(mine) == 1 and mine[0].key_groups == self.key_groups:
            return self._restore_same(root, mine[0])
        n = 0
        for h in handles:
            if isinstance(h, RocksDBStateHandle):
                for name, kind in h.kinds.items():
                    self.declare(name, kind)
                self._not_fresh()
                n += copy_key_groups(root, h, self.key_groups, self._instance, self._store)
            else:
                n += self.restore(h.kinds, ((name, key, value) for _, name, key, value
                                            in kind_of(h).read(
                                                root, h, key_groups=self.key_groups,
                                                max_parallelism=self.max_parallelism)))
        return n

    def _restore_same(self, root: str, handle: RocksDBStateHandle) -> int:
        """The database of the checkpoint, as it was."""
        open_checkpointed(root, handle, self._instance, self.factory.db_options)
        for name, kind in handle.kinds.items():
            self.declare(name, kind)
        self._not_fresh()
        if self.factory.incremental:
            self._strategy.restored(root, handle.sst_files())
        return handle.entries

    def _not_fresh(self) -> None:
        self._fresh = False
        for t in self._loaders:
            t.complete = False
            t.filter = None  # the database holds keys it never saw

    def close(self) -> None:
        if self._closed:
            return
        try:
            if not self._store.unwritable:
                self._flush_unless_busy()
        finally:
            super().close()
            # A snapshot still in flight (its job is being cancelled, or
            # failed) needs the database until it ends: it is closed then.
            self._store.closed = True
            self._store.close_when_idle()


class RocksDBStateBackend(StateBackend):
    """Keyed state in RocksDB (``rocksdict``) under ``path``, with
    incremental checkpoints (``incremental=False``: every checkpoint holds a
    full copy).

    ``cache_size``: entries each state keeps in its write cache (values
    loaded or written since the last flush; changes are flushed at every
    checkpoint and whenever the cache is full). ``block_cache_bytes`` and
    ``write_buffer_bytes`` bound RocksDB's own memory (a block cache shared
    by the backend's databases; each database's memtable size).
    ``serializer``: an object with ``dumps(obj) -> bytes`` and
    ``loads(bytes)``, pickle by default."""

    def __init__(self, path: str | os.PathLike[str], incremental: bool = True, *,
                 cache_size: int = 100_000, block_cache_bytes: int = 64 << 20,
                 write_buffer_bytes: int = 32 << 20,
                 serializer: Serializer | None = None) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size}")
        self.path = os.path.abspath(os.fspath(path))
        self.incremental = bool(incremental)
        self.cache_size = int(cache_size)
        self.db_options = DbOptions(int(block_cache_bytes), int(write_buffer_bytes))
        self.serializer: Serializer = serializer or PickleSerializer()
        self._swept = False

    def create_keyed_backend(
        self, operator: str, subtask: int, key_groups: range, max_parallelism: int,
        *, checkpointing: bool = False,
    ) -> RocksDBKeyedStateBackend:
        if not self._swept:
            self._swept = True
            remove_stale(self.path)
        return RocksDBKeyedStateBackend(self, operator, subtask, key_groups, max_parallelism)

    def __repr__(self) -> str:
        return f"RocksDBStateBackend({self.path!r}, incremental={self.incremental})"
