"""The RocksDB backend: keyed state bigger than memory, in one local RocksDB
database per operator subtask (``rocksdict``), behind a bounded write cache
(:mod:`eddyflow.state.rocksdb.tables`), with incremental checkpoints
(:mod:`eddyflow.state.rocksdb.snapshot`).

Local layout, under the backend's ``path``: a folder per keyed backend
instance (``<operator>-<subtask>-<random>/``, holding ``db/`` and the local
RocksDB checkpoints ``chk-<n>/`` until they are uploaded) and a lock file
beside it, ``flock``-ed while the instance lives. The local database is
only a working copy: recovery always starts from a checkpoint. An instance's
folder goes when nothing refers to it any more (its backend, and the
``JobResult`` views that read the final state); folders whose lock nobody
holds (a killed process's) are removed when the next backend starts.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import itertools
import logging
import os
import pickle
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import anyio

from eddyflow.errors import StateSerializationError
from eddyflow.state import forked
from eddyflow.state.abc import (
    Changes,
    KeyedSnapshot,
    KeyedStateBackend,
    KeyedStateHandle,
    SnapshotAbandoned,
    SnapshotTarget,
    StateBackend,
    Written,
    written_keys,
)
from eddyflow.state.format import DELETED
from eddyflow.state.rocksdb.files import DbOptions, materialise, open_db, scan
from eddyflow.state.rocksdb.keys import (
    MAX_PARALLELISM,
    StatePrefix,
    key_group_bounds,
    sort_order,
)
from eddyflow.state.rocksdb.reader import assemble, read_rows
from eddyflow.state.rocksdb.snapshot import RocksSnapshotStrategy
from eddyflow.state.rocksdb.tables import (
    MISSING,
    Batch,
    ListTable,
    MapTable,
    Pickled,
    Serializer,
    ValueTable,
    dump_all,
    new_batch,
    put_rows,
)
from eddyflow.state.serialization import raise_state_error, state_error
from eddyflow.state.ttl import base_kind, has_ttl
from eddyflow.values import SCALARS

__all__ = ["PickleSerializer", "RocksDBKeyedStateBackend", "RocksDBStateBackend"]

log = logging.getLogger("eddyflow.state")

_STALE_AFTER = 60.0  # seconds: a lock file younger than this may be being set up
#: Up to this many changed keys a snapshot writes them at the barrier; above
#: it a forked child does. Measured with 1M keys cached: 10k keys inline
#: took 47-190 ms on a loaded 2-vCPU machine, a fork 40-136 ms (it copies
#: the page tables of the whole heap), so forking pays only for more.
_INLINE = 20000
#: At the end of the input, above this many changed keys (counted with
#: repeats) half of them are written by a forked child: a fork costs 40-136 ms
#: with 1M keys cached (see above), writing 50k rows about as much.
_SPLIT = 100_000
_IMMUTABLE = SCALARS | {type(MISSING)}


class PickleSerializer:
    """The default value serializer. ``dumps`` and ``loads`` are the C
    functions themselves, not methods around them: they run once per value
    written or read (a wrapper was 0.4 s of a 1M-key snapshot)."""

    def __init__(self) -> None:
        self.dumps: Callable[[Any], bytes] = functools.partial(
            pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL)
        self.loads: Callable[[bytes], Any] = pickle.loads


class _Instance:
    """One keyed backend's local folder and lock; removed when unreferenced."""

    def __init__(self, root: str, name: str) -> None:
        os.makedirs(root, exist_ok=True)
        self.folder = os.path.join(root, name)
        lock = self.folder + ".lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.makedirs(self.folder)
        self.db_path = os.path.join(self.folder, "db")
        self.db: Any = None
        self._reader: Any = None
        self._finalizer = weakref.finalize(self, _remove_instance, self.folder, lock, fd,
                                           self._handles)

    @property
    def _handles(self) -> list[Any]:
        # The finalizer may not refer to self: the open databases live in a list.
        h: list[Any] = self.__dict__.setdefault("_open", [])
        return h

    def open(self, options: DbOptions) -> Any:
        self.db = open_db(self.db_path, options)
        self._handles.append(self.db)
        return self.db

    def reader(self) -> Any:
        """The database, read-only, once the backend closed it."""
        if self.db is not None:
            return self.db
        if self._reader is None:
            self._reader = open_db(self.db_path, read_only=True)
            self._handles.append(self._reader)
        return self._reader

    def close_db(self) -> None:
        if self.db is not None:
            self.db.close()
            self._handles.remove(self.db)
            self.db = None


def _remove_instance(folder: str, lock: str, fd: int, handles: list[Any]) -> None:
    for db in handles:
        with contextlib.suppress(Exception):
            db.close()
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock)
    os.close(fd)


def _remove_stale(root: str) -> None:
    """Folders of instances whose process is gone (their lock is free)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    now = time.time()
    for name in names:
        if not name.endswith(".lock"):
            continue
        lock = os.path.join(root, name)
        try:
            if now - os.stat(lock).st_mtime < _STALE_AFTER:
                continue
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        shutil.rmtree(lock[:-len(".lock")], ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)
        log.info("removed the local RocksDB folder of a finished process: %s", lock[:-5])


class _Store:
    """The rows of one database (see ``tables.RowStore``)."""

    def __init__(self, instance: _Instance, serializer: Serializer, operator: str) -> None:
        self.instance = instance
        self.serializer = serializer
        self.operator = operator
        #: See ``tables.RowStore.unwritable``.
        self.unwritable = False
        #: Snapshots whose RocksDB checkpoint is not taken yet.
        self.inflight: list[_Flush] = []
        #: Orders writes against a checkpoint taken in a worker thread.
        self.lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return bool(self.inflight)

    @property
    def db(self) -> Any:
        return self.instance.db

    def get(self, row: bytes) -> bytes | None:
        value: bytes | None = self.db.get(row)
        return value

    def get_many(self, rows: list[bytes]) -> list[bytes | None]:
        values: list[bytes | None] = self.db.get(rows)
        return values

    def scan(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        return scan(self.db, lower, upper)

    def last_row(self, lower: bytes, upper: bytes) -> bytes | None:
        it = self.db.iter()
        it.seek_for_prev(upper)
        while it.valid():
            row: bytes = it.key()
            if row < lower:
                return None
            if row < upper:
                return row
            it.prev()
        return None

    def write(self, batch: Batch) -> None:
        with self.lock:
            self.db.write(batch)


class _Flush:
    """A snapshot between its two halves: the changes the barrier wrote at
    once, and those a forked child writes as an SST file, to be ingested
    before the database's checkpoint is taken."""

    def __init__(self, checkpoint_id: int, local: str, work: forked.ChildWork | None,
                 sst: str, written: list[tuple[ValueTable, Written]]) -> None:
        self.checkpoint_id = checkpoint_id
        self.local = local
        self.work = work
        #: The child's SST file (if it has rows).
        self.sst = sst
        self.written = written
        #: SST files written at the barrier, by this process.
        self.inline: list[str] = []
        #: ``[lower, upper)`` ranges deleted before the files are ingested
        #: (a state written whole: its rows that the cache no longer has).
        self.cleared: list[tuple[bytes, bytes]] = []
        #: Values taken at the barrier, written by the checkpoint's thread.
        self.deferred: list[tuple[ValueTable, list[Any], list[Any]]] = []
        #: Its changes (SST files, or deferred values) are in the database.
        self.ingested = False
        self.done = False
        self.abandoned = False


class _Part(NamedTuple):
    """The rows one value table contributes to a snapshot's SST file."""

    table: ValueTable
    prefix: StatePrefix
    written: Written
    #: Every key the table holds, not only those written (see begin_snapshot).
    whole: bool


def _part_items(part: _Part, share: tuple[int, int]) -> tuple[list[Any], list[Any]]:
    """Share ``i`` of ``n`` of a part's keys and their values (``MISSING``:
    removed). The parent and a forked child each take their share of the
    same lists: both build them from the same image, in the same order."""
    table = part.table
    i, n = share
    if part.whole:
        size = -(-len(table) // n)
        start, stop = i * size, (i + 1) * size
        return (list(itertools.islice(table, start, stop)),
                list(itertools.islice(table.values(), start, stop)))
    keys = list(written_keys(part.written))
    if n > 1:
        size = -(-len(keys) // n)
        keys = keys[i * size:(i + 1) * size]
    return keys, list(map(table.get, keys, itertools.repeat(MISSING)))


def _write_sst(path: str, parts: list[_Part], dumps: Callable[[Any], bytes], operator: str,
               checkpoint: int, share: tuple[int, int] = (0, 1)) -> bool:
    """The rows of share ``i`` of ``n`` of ``parts``' keys, in order, as an
    SST file (``False``: there were none); in a forked child, or at the
    barrier. A value that cannot be serialized raises a
    :class:`~eddyflow.errors.StateSerializationError` naming ``operator``,
    its state and key, and ``checkpoint``.

    Every step runs a key at a time in C (``map``), none in Python bytecode
    (CPU for 500k string keys, a share of the end of a 1M-key running sum:
    row keys 0.2 s, values 0.1 s, pickling 0.02 s, order 0.16 s, gathering
    by it 0.12 s, the writer 0.21 s; sorting ``(row, value)`` tuples by a
    key function and writing them in a Python loop took 1.2 s for 1M keys
    for the order alone)."""
    from rocksdict import Options, SstFileWriter

    rows: list[bytes] = []
    values: list[Any] = []
    for part in parts:
        keys, vs = _part_items(part, share)
        rows += part.prefix.prefixes(keys)
        values += vs
    if not rows:
        return False
    # (By identity: a value's own __eq__ is not to be trusted.)
    gone = id(MISSING) in map(id, values)
    try:
        raws = ([None if v is MISSING else dumps(v) for v in values] if gone
                else dump_all(values, dumps))
    except Exception as exc:
        for part in parts:
            _check_values(exc, part, share, dumps, operator, checkpoint)
        raise
    order = sort_order(rows)
    rows = list(map(rows.__getitem__, order))
    raws = list(map(raws.__getitem__, order))
    writer = SstFileWriter(Options(raw_mode=True))
    partial = path + ".partial"
    writer.open(partial)
    if gone:
        for row, raw in zip(rows, raws, strict=True):
            if raw is None:
                del writer[row]
            else:
                writer[row] = raw
    else:
        collections.deque(map(writer.__setitem__, rows, raws), maxlen=0)
    writer.finish()
    os.replace(partial, path)  # its name says it is whole
    return True


def _check_values(exc: Exception, part: _Part, share: tuple[int, int],
                  dumps: Callable[[Any], bytes], operator: str, checkpoint: int) -> None:
    """After ``exc``: raise the error naming the key of ``part`` whose
    value cannot be serialized, if it holds one."""
    keys, values = _part_items(part, share)
    items = [(k, v) for k, v in zip(keys, values, strict=True) if v is not MISSING]
    error = state_error(exc, items, operator=operator, state=part.table.rows.name,
                        checkpoint=checkpoint, dumps=dumps)
    if error is not exc:
        raise error from exc


def _capture(table: ValueTable, written: Written, dumps: Callable[[Any], bytes],
             operator: str, checkpoint: int) -> tuple[list[Any], list[Any]]:
    """The keys in ``written`` and their values as they are now."""
    listed = list(written_keys(written))
    values = list(map(table.get, listed, itertools.repeat(MISSING)))
    if not set(map(type, values)) <= _IMMUTABLE:
        try:
            values = [v if type(v) in SCALARS or v is MISSING else Pickled(dumps(v))
                      for v in values]
        except Exception as exc:
            raise_state_error(exc, ((k, v) for k, v in zip(listed, values, strict=True)
                                    if v is not MISSING),
                              operator=operator, state=table.rows.name,
                              checkpoint=checkpoint, dumps=dumps)
    return listed, values


def _batch_of(deferred: list[tuple[ValueTable, list[Any], list[Any]]],
              dumps: Callable[[Any], bytes]) -> Batch:
    batch = new_batch()
    for table, keys, values in deferred:
        put_rows(batch, table.rows.prefixes(keys), values, dumps)
    return batch


def _ingest_moved(db: Any, path: str) -> None:
    """Ingest the SST file ``path`` into ``db``, moving it (a hard link:
    no copy; the file is RocksDB's afterwards)."""
    from rocksdict import IngestExternalFileOptions

    opts = IngestExternalFileOptions()
    opts.set_move_files(True)
    db.ingest_external_file([path], opts)


AnyTable = ValueTable | MapTable | ListTable


class RocksDBKeyedStateBackend(KeyedStateBackend):
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
        self._instance = _Instance(factory.path, f"{operator}-{subtask}-{uuid.uuid4().hex[:8]}")
        self._instance.open(factory.db_options)
        self._store = _Store(self._instance, factory.serializer, operator)
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

    def begin_snapshot(self, checkpoint_id: int, at_end: bool) -> _Flush:
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
                self._ingest_now(older)
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
        flush = _Flush(checkpoint_id, os.path.join(folder, f"chk-{checkpoint_id}"), None, sst,
                       written)
        dumps = self.factory.serializer.dumps
        if size <= _INLINE:
            # Few: their values are taken now (immutable ones by reference,
            # the others pickled: what user code changes in place after the
            # barrier must not reach the checkpoint); their rows are made and
            # written by the worker thread that takes the checkpoint
            # (measured: 10k rows cost 40-100 ms of the barrier).
            flush.deferred = [(t, *_capture(t, w, dumps, self.operator, checkpoint_id))
                              for t, w in written]
        elif not at_end and forked.ENABLED:
            flush.work = forked.start(functools.partial(
                _write_sst, sst, self._parts(written, False, size), dumps, self.operator,
                checkpoint_id))
        else:
            # Many, and nothing runs beside: a sorted SST file written here
            # and ingested costs a third of a WriteBatch's memtable inserts
            # (measured: 1.3 s of 4.9 for 464k keys), and half of it is
            # written by a forked child on the other core, which is idle
            # now (profiled: the end-of-input checkpoint of a 1M-key running
            # sum was 2.9 s of its 5.4 s, building rows a key at a time).
            parts = self._parts(written, at_end, size)
            if any(p.whole for p in parts):
                flush.cleared = [key_group_bounds(self.key_groups)]
            mine = os.path.join(folder, f"ingest-{checkpoint_id}-0.sst")
            share = (0, 1)
            if forked.ENABLED and size > _SPLIT:
                share = (0, 2)
                flush.work = forked.start(functools.partial(
                    _write_sst, sst, parts, dumps, self.operator, checkpoint_id, (1, 2)))
            try:
                if _write_sst(mine, parts, dumps, self.operator, checkpoint_id, share):
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
               ) -> list[_Part]:
        """What each value table writes. At the end of the input, a table
        that holds every key of the only state, when at least as many
        writes were recorded as it has keys (nearly every key changed,
        typically), is written whole: its keys and values are read in the
        table's own order, where the keys written would be de-duplicated
        through a set and each value looked up (a cache miss each: 0.7 of
        2.7 s for 1M keys), and its other rows are deleted by one range
        tombstone. Only at the end: a periodic checkpoint would grow by the
        keys that did not change, and its cost runs on another core."""
        whole = (at_end and len(self._kinds) == 1 and len(written) == 1
                 and written[0][0].complete and size >= len(written[0][0]))
        return [_Part(t, t.rows, w, whole) for t, w in written]

    def _ingest(self, flush: _Flush, child: bool) -> None:
        """Put ``flush``'s changes into the database (under the store's
        lock): its cleared ranges, then its files, each on its own (the
        parent's and the child's files may overlap in key range; their rows
        never do)."""
        db = self._instance.db
        if flush.cleared:
            batch = new_batch()
            for lower, upper in flush.cleared:
                batch.delete_range(lower, upper)
            db.write(batch)
        for f in [*flush.inline, *([flush.sst] if child else [])]:
            _ingest_moved(db, f)
        flush.ingested = True

    def _ingest_now(self, flush: _Flush) -> None:
        assert flush.work is not None
        flush.work.wait_exit()
        if not os.path.exists(flush.sst):
            self.abandon(flush)  # it failed, or had nothing: its keys are rewritten
            return
        with self._store.lock:
            if flush.abandoned or flush.ingested:
                return
            self._ingest(flush, True)

    async def finish_snapshot(self, flush: _Flush) -> None:
        """The child's file ingested, the RocksDB checkpoint taken (in a
        worker thread: RocksDB releases the GIL while it flushes)."""
        child = False
        if flush.work is not None:
            try:
                child = bool(await flush.work.result())
            except BaseException as exc:
                if isinstance(exc, StateSerializationError):
                    self._store.unwritable = True
                self.abandon(flush)
                raise
        await anyio.to_thread.run_sync(self._checkpoint, flush, child)

    def _checkpoint(self, flush: _Flush, child: bool) -> None:
        from rocksdict import Checkpoint

        store = self._store
        with store.lock:
            if flush.abandoned:
                raise SnapshotAbandoned(f"operator '{self.operator}': snapshot "
                                        f"{flush.checkpoint_id} was abandoned")
            db = self._instance.db
            if flush.deferred and not flush.ingested:
                db.write(_batch_of(flush.deferred, self.factory.serializer.dumps))
                flush.ingested = True
            if not flush.ingested:
                self._ingest(flush, child)
            db.flush()
            shutil.rmtree(flush.local, ignore_errors=True)
            Checkpoint(db).create_checkpoint(flush.local)
            flush.done = True
            store.inflight.remove(flush)
        self._close_when_idle()

    def abandon(self, flush: _Flush) -> None:
        """A snapshot that will not complete: its child stops, and the
        changes it was to write are written by the next flush."""
        store = self._store
        with store.lock:
            if flush.done or flush.abandoned:
                return
            flush.abandoned = True
            if flush.work is not None:
                flush.work.cancel()
            if not flush.ingested:  # its changes are not in the database
                for t, w in flush.written:
                    t.rewrite(w)
            for f in (flush.sst, *flush.inline):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f)
            store.inflight.remove(flush)
        self._close_when_idle()

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
        """A value state's entries as one sorted SST file, ingested (a third
        of what the same rows cost through the caches and write batches:
        measured 2.9 against 8.2 s for 500k string keys); other kinds
        through :meth:`restore`."""
        if base_kind(kind) in ("map", "list") or has_ttl(kind) or not entries:
            return super().bulk_load(name, kind, entries)
        from rocksdict import Options, SstFileWriter

        self._was_restored()
        self.declare(name, kind)
        self._not_fresh()
        keys = list(entries)
        rows = StatePrefix(name, self.max_parallelism).prefixes(keys)
        order = sort_order(rows)
        dumps = self.factory.serializer.dumps
        path = os.path.join(self._instance.folder, f"bulk-{name}.sst")
        writer = SstFileWriter(Options(raw_mode=True))
        writer.open(path)
        try:
            for i in order:
                writer[rows[i]] = dumps(entries[keys[i]])
        except Exception as exc:
            raise_state_error(exc, entries.items(), operator=self.operator, state=name,
                              dumps=dumps)
        writer.finish()
        with self._store.lock:
            _ingest_moved(self._instance.db, path)
        return len(keys)

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
        mine = [h for h in handles if h.backend == "rocksdb"]
        if len(handles) == 1 and len(mine) == 1 and mine[0].key_groups == self.key_groups:
            return self._restore_same(root, mine[0])
        n = 0
        for h in handles:
            if h.backend == "rocksdb":
                n += self._restore_range(root, h)
            else:
                n += self.restore(h.kinds, ((name, key, value) for _, name, key, value
                                            in h.read(root, key_groups=self.key_groups,
                                                      max_parallelism=self.max_parallelism)))
        return n

    def _restore_same(self, root: str, handle: KeyedStateHandle) -> int:
        """The database of the checkpoint, as it was: its files, opened."""
        inst = self._instance
        inst.close_db()
        materialise(root, dict(handle.db_files), inst.db_path)
        inst.open(self.factory.db_options)
        for name, kind in handle.kinds.items():
            self.declare(name, kind)
        self._not_fresh()
        if self.factory.incremental:
            self._strategy.restored(root, {n: h for n, h in handle.db_files
                                           if n.endswith(".sst")})
        return handle.entries

    def _restore_range(self, root: str, handle: KeyedStateHandle) -> int:
        """The rows of the key groups this subtask owns, copied from an old
        subtask's database (one contiguous range: no row is decoded)."""
        for name, kind in handle.kinds.items():
            self.declare(name, kind)
        self._not_fresh()
        start = max(self.key_groups.start, handle.key_groups.start)
        stop = min(self.key_groups.stop, handle.key_groups.stop)
        if start >= stop:
            return 0
        folder = os.path.join(self._instance.folder, "restore")
        materialise(root, dict(handle.db_files), folder)
        n = 0
        try:
            old = open_db(folder, read_only=True)
            try:
                batch = new_batch()
                for row, value in scan(old, *key_group_bounds(range(start, stop))):
                    batch.put(row, value)
                    n += 1
                    if n % 65536 == 0:
                        self._store.write(batch)
                        batch = new_batch()
                self._store.write(batch)
            finally:
                old.close()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return n

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
            self._close_when_idle()

    def _close_when_idle(self) -> None:
        with self._store.lock:
            if self._closed and not self._store.inflight:
                self._instance.close_db()


class RocksStateView(Mapping[Any, Any]):
    """One state of a RocksDB backend, read from its database on demand."""

    def __init__(self, instance: _Instance, name: str, kind: str, max_parallelism: int,
                 loads: Callable[[bytes], Any]) -> None:
        self._instance = instance
        self._loads = loads
        self._rows = StatePrefix(name, max_parallelism)
        self.name = name
        self.kind = kind
        self._len: int | None = None

    def _items(self) -> Iterator[tuple[Any, Any]]:
        db = self._instance.reader()
        for name, _, key, value in read_rows(db, {self.name: self.kind}, None, self._loads):
            if name == self.name:
                yield key, value

    def __getitem__(self, key: Any) -> Any:
        db = self._instance.reader()
        p = self._rows.prefix(key)
        if base_kind(self.kind) not in ("map", "list"):
            raw = db.get(p)
            if raw is None:
                raise KeyError(key)
            return self._loads(raw)
        rows = [(key, row[len(p):], self._loads(v)) for row, v in scan(db, p, p + b"\xff")]
        for _, value in assemble(self.kind, rows):
            return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        for key, _ in self._items():
            yield key

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self._items())
        return self._len

    def items(self) -> Any:
        return list(self._items())

    def __repr__(self) -> str:
        return f"<RocksDB state '{self.name}' ({self.kind})>"


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
            _remove_stale(self.path)
        return RocksDBKeyedStateBackend(self, operator, subtask, key_groups, max_parallelism)

    def __repr__(self) -> str:
        return f"RocksDBStateBackend({self.path!r}, incremental={self.incremental})"
