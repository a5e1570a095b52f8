"""The tables of the RocksDB backend: a bounded write cache in front of the
database, flushed with one ``WriteBatch``.

*Value* state (also reducing state, and the built-in ``count``, ``sum``,
``reduce``, ``map_with_state`` operators) is a :class:`ValueTable`: a
``dict`` subclass that *is* the cache, so the operators' per-record
``get``/``__setitem__``/``pop`` run at C speed with no RocksDB round-trip.
Keys are brought into the cache a batch at a time (:meth:`ValueTable.load`,
one multi-get) before the operator looks at them, and the keys written are
the table's :class:`~eddyflow.state.abc.Changes`, as in the memory backend:
at a flush the cache's value of each written key is put, or deleted when the
cache no longer holds it. The cache is *authoritative* for every key it has
loaded (present, or known absent); a fresh, empty database needs no reads at
all until the cache is first evicted. From then on, a
:class:`~eddyflow.state.rocksdb.filter.KeyFilter` of every key the table may
have written answers for the keys seen for the first time, which are not
read (keys that rarely repeat, a dedup by event id: nearly every key of a
batch), and a flush writes its rows in key order.

*Map* state is stored a row per map entry and *list* state a row per
element (an 8-byte sequence number after the key), so a key with a large map
or list costs what changes: :class:`MapTable` and :class:`ListTable` keep an
overlay of pending changes and read the rest from the database.

Whatever is flushed is serialised at the flush; a snapshot flushes at the
barrier, so it records the bytes of the state as it was then.
"""

from __future__ import annotations

import collections
import itertools
import struct
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any, Protocol, cast

from eddyflow.state.changes import Changes, Written, written_keys
from eddyflow.state.rocksdb.filter import KeyFilter
from eddyflow.state.rocksdb.keys import StatePrefix, decode_key, encode_key, sort_order
from eddyflow.state.serialization import raise_state_error
from eddyflow.values import SCALARS

__all__ = ["MISSING", "ListTable", "MapTable", "Pickled", "RowStore", "Serializer", "ValueTable",
           "dump_all", "dump_rows", "put_raws", "put_rows"]

_MISSING: Any = object()
#: The value of a key written and then removed.
MISSING: Any = _MISSING
_GONE: Any = object()
_SEQ = struct.Struct(">Q")
#: Above every row of a key: after its value row, its map entries (a map
#: key's encoding starts with a tag below 7) and its list rows (a sequence
#: number's first byte is far below 0xff).
_AFTER = b"\xff"
#: Where a value that cannot be serialized was going, outside a snapshot.
_WHERE = "in RocksDB"
#: From this many rows a flush puts them in key order: RocksDB inserts
#: sorted keys into its memtable at half the cost of keys in hash order
#: (measured: 0.9 against 1.9 us a row, sorting included, for 50k-row
#: batches into a database of 1M rows), and below it sorting costs more
#: than it saves.
_SORTED_WRITE = 1024


class Serializer(Protocol):
    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class RowStore(Protocol):
    """What the tables need of their backend's database."""

    serializer: Serializer
    #: The operator whose state this is (named in errors).
    operator: str
    #: A write failed (a value that cannot be serialized): the job is
    #: failing, and a flush at close would only fail the same way again.
    unwritable: bool

    @property
    def busy(self) -> bool:
        """A snapshot's checkpoint of the database is not taken yet: nothing
        may be written to it (the caches may outgrow their bound meanwhile)."""

    def get(self, row: bytes) -> bytes | None: ...

    def get_many(self, rows: list[bytes]) -> list[bytes | None]: ...

    def scan(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]: ...

    def last_row(self, lower: bytes, upper: bytes) -> bytes | None: ...

    def write(self, batch: Batch) -> None: ...


class Batch(Protocol):
    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def delete_range(self, begin: bytes, end: bytes) -> None: ...


class ValueTable(dict[Any, Any]):
    """Key -> value, the cache of one state (see the module docstring)."""

    def __init__(self, store: RowStore, name: str, max_parallelism: int, changes: Changes,
                 limit: int, complete: bool) -> None:
        super().__init__()
        self.store = store
        self.rows = StatePrefix(name, max_parallelism)
        self.changes = changes
        self.limit = limit
        #: Nothing exists in the database that the cache does not hold.
        self.complete = complete
        #: Keys the cache lacks but knows (unless ``complete``): read and
        #: found absent, or removed since. A key the cache holds is known
        #: (it was loaded before it was written).
        self.known: set[Any] = set()
        #: Every key the database may hold, once the table is no longer
        #: ``complete`` (``None``: unknown, after a restore; then every key
        #: the cache lacks is read).
        self.filter: KeyFilter | None = None

    def needs_keys(self) -> bool:
        """Whether ``load`` would use the keys it is given: not while the
        cache holds everything there is and has room (then a caller saves
        computing a batch's keys: a key function call per record, 1/4 of a
        1M-key running sum's time on a fresh database, py-spy)."""
        return not self.complete or (len(self) > self.limit and not self.store.busy)

    def load(self, keys: Iterable[Any]) -> None:
        """Bring ``keys`` into the cache (one multi-get for those it lacks)."""
        if self.complete:
            if len(self) <= self.limit or self.store.busy:
                return
            self.evict()
        if not isinstance(keys, list):
            keys = list(keys)
        # Evict first: what is missing is decided on what stays. (Keys are
        # not de-duplicated: a key twice in the batch is looked up twice,
        # cheaper than a dict of every batch's keys.)
        if len(self) + len(self.known) + len(keys) > self.limit and not self.store.busy:
            self.evict()
        filt = self.filter
        if filt is not None:
            # A key the filter has never seen is neither cached nor known
            # nor in the database: nothing to do for it, once the filter has
            # learnt it (the operator is about to write it). Asked first, so
            # that a key seen for the first time costs no lookup in the
            # cache: py-spy, 3M distinct keys, 7% of the run looking keys
            # up in the known set before the filter.
            keys = list(itertools.compress(keys, filt.test_and_add(keys)))
            if not keys:
                return
        known = self.known
        missing = list(itertools.filterfalse(
            known.__contains__, itertools.filterfalse(self.__contains__, keys)))
        if not missing:
            return
        known.update(missing)
        raws = self.store.get_many(self.rows.prefixes(missing))
        loads = self.store.serializer.loads
        for k, raw in zip(missing, raws, strict=True):
            if raw is not None:
                dict.__setitem__(self, k, loads(raw))

    def load_one(self, key: Any) -> None:
        if self.complete:
            # Nothing to read, but the cache must stay bounded all the same.
            if len(self) <= self.limit or self.store.busy:
                return
            self.evict()
        if key in self or key in self.known:
            return
        if len(self) + len(self.known) >= self.limit and not self.store.busy:
            self.evict()
        filt = self.filter
        if filt is not None and not filt.test_and_add_one(key):
            return
        self.known.add(key)
        raw = self.store.get(self.rows.prefix(key))
        if raw is not None:
            dict.__setitem__(self, key, self.store.serializer.loads(raw))

    # Removing a key keeps it known (absent), so that a later load does not
    # read back what the database still holds of it. Only removals pay (a
    # Python call); reads and writes stay dict's own. Removals go through
    # ``pop``: ``del table[key]`` is not overridden (it would not see the
    # key known), because ``__delitem__`` shares its C slot with
    # ``__setitem__``: overriding it sends every ``table[key] = value``
    # through a Python-level lookup, twice the cost of a store (py-spy on
    # benchmarks/state.py's RocksDB word count: the store line took 15% of
    # the run against 1% with a plain dict). ``test_rocksdb_new_keys``
    # checks that no removal resurrects a value.
    def pop(self, key: Any, *default: Any) -> Any:
        if not self.complete:
            self.known.add(key)
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        item = dict.popitem(self)
        if not self.complete:
            self.known.add(item[0])
        return item

    def flush_into(self, batch: Batch) -> int:
        """Put (or delete) every key written since the last flush into
        ``batch``; returns how many."""
        return self.write_into(batch, self.changes.take())

    def write_into(self, batch: Batch, written: Written) -> int:
        keys = list(written_keys(written))
        return self._write_rows(batch, keys, list(map(self.get, keys, itertools.repeat(_MISSING))))

    def _write_whole(self, batch: Batch) -> int:
        """Put every cached entry into ``batch``, and delete every known key
        the cache lacks: a superset of what was written since the table was
        last emptied (each written key is cached, or was removed since and
        so is known), read in the dict's own order instead of looking each
        written key up (py-spy: de-duplicating the written keys and looking
        them up was 14% of a count over 3M distinct keys)."""
        gone = list(itertools.filterfalse(self.__contains__, self.known))
        return self._write_rows(batch, [*self, *gone],
                                [*self.values(), *itertools.repeat(_MISSING, len(gone))])

    def _write_rows(self, batch: Batch, keys: list[Any], values: list[Any]) -> int:
        """Put each of ``keys`` (distinct) with its value (``MISSING``:
        delete it) into ``batch``, in key order."""
        if not keys:
            return 0
        dumps = self.store.serializer.dumps
        try:
            raws = dump_rows(values, dumps)
        except Exception as exc:
            self.store.unwritable = True
            raise_state_error(exc, ((k, v) for k, v in zip(keys, values, strict=True)
                                    if v is not MISSING),
                              operator=self.store.operator, state=self.rows.name,
                              where=_WHERE, dumps=dumps)
        rows = self.rows.prefixes(keys)
        if len(rows) >= _SORTED_WRITE:
            order = sort_order(rows)
            rows = list(map(rows.__getitem__, order))
            raws = list(map(raws.__getitem__, order))
        put_raws(batch, rows, raws)
        return len(rows)

    def rewrite(self, written: Written) -> None:
        """Record ``written`` as written again (a snapshot that was to write
        them was abandoned)."""
        self.changes.put_back(written)

    def evict(self) -> None:
        """Write what changed and empty the cache.

        All of it, not the older half: dropping keys one by one was a hash
        lookup a key, and remembering the rest as known another (py-spy:
        15% of a count over 3M distinct keys, where no key is read again),
        while emptying a dict never looks a key up. A key that is read often
        is read back once per fill of the cache either way (the older half
        held it only as long)."""
        batch = new_batch()
        written = self.changes.take()
        one_by_one, batches = written
        # Write the whole cache when it is mostly written anyway (new keys:
        # all of it); not while complete, whose removals were not noted.
        whole = (not self.complete
                 and len(one_by_one) + sum(map(len, batches)) >= len(self))
        if self._write_whole(batch) if whole else self.write_into(batch, written):
            self.store.write(batch)
        if self.complete:
            # The database holds what the cache holds now (the flush wrote
            # it): the filter starts from those keys, and learns every key
            # loaded from now on (a key is loaded before it is written).
            self.filter = KeyFilter(2 * len(self))
            self.filter.add_many(list(self))
        self.clear()
        self.known = set()
        self.complete = False

    def replace(self, key: Any, value: Any) -> None:
        """Set ``key`` (a restore's entry), recorded as written."""
        if self.filter is not None:
            self.filter.test_and_add_one(key)
        self[key] = value
        written = self.changes.keys
        assert written is not None
        written[key] = None

    def remove(self, key: Any) -> None:
        self.pop(key, None)
        written = self.changes.keys
        assert written is not None
        written[key] = None


class Pickled:
    """A value serialised already (a mutable one, at the barrier)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def put_rows(batch: Batch, rows: list[bytes], values: list[Any],
             dumps: Callable[[Any], bytes]) -> None:
    """Each row with its value into ``batch``: ``MISSING`` deletes it, a
    :class:`Pickled` value goes as it is."""
    put, delete = batch.put, batch.delete
    for row, v in zip(rows, values, strict=True):
        if v is MISSING:
            delete(row)
        else:
            put(row, v.data if type(v) is Pickled else dumps(v))


def dump_rows(values: list[Any], dumps: Callable[[Any], bytes]) -> list[bytes | None]:
    """The bytes of each value, ``None`` for ``MISSING`` (a deletion)."""
    # (By identity: a value's own __eq__ is not to be trusted.)
    if id(MISSING) not in map(id, values):
        raws: list[bytes | None] = list(dump_all(values, dumps))
        return raws
    return [None if v is MISSING else dumps(v) for v in values]


def put_raws(batch: Batch, rows: list[bytes], raws: list[bytes | None]) -> None:
    """Each row into ``batch`` with its bytes; ``None`` deletes it."""
    if None not in raws:
        # Only puts (new keys, counts): a row at a time in C.
        collections.deque(map(batch.put, rows, cast(list[bytes], raws)), maxlen=0)
        return
    put, delete = batch.put, batch.delete
    for row, raw in zip(rows, raws, strict=True):
        if raw is None:
            delete(row)
        else:
            put(row, raw)


def dump_all(values: list[Any], dumps: Callable[[Any], bytes]) -> list[bytes]:
    """``dumps`` of every value. Counts and sums repeat a few small ints
    over many keys: when every value is an ``int`` or a ``str`` and they
    are mostly repeats, each distinct one is serialized once (values of
    one exact type that are equal are indistinguishable, so their bytes
    are the same; measured: 0.02 s against 0.14 s for 500k counts)."""
    if len(values) > 64 and set(map(type, values)) <= _MEMOISED:
        distinct = set(values)
        if len(distinct) * 4 <= len(values):
            done = {v: dumps(v) for v in distinct}
            return list(map(done.__getitem__, values))
    return list(map(dumps, values))


#: Value types whose serialized bytes :func:`dump_all` reuses by value.
_MEMOISED = frozenset({int, str})


def new_batch() -> Batch:
    from rocksdict import WriteBatch

    batch: Batch = WriteBatch(raw_mode=True)
    return batch


class _RowTable(MutableMapping[Any, Any]):
    """Common ground of map and list tables: a pending overlay per key."""

    def __init__(self, store: RowStore, name: str, max_parallelism: int, limit: int) -> None:
        self.store = store
        self.rows = StatePrefix(name, max_parallelism)
        self.limit = limit
        self._cleared: set[Any] = set()
        #: Writes since the last flush (an upper bound of the pending rows:
        #: counted as they happen, since summing the overlay at every write
        #: made n writes cost n^2).
        self._writes = 0

    def _scan(self, key: Any) -> Iterator[tuple[bytes, bytes]]:
        p = self.rows.prefix(key)
        n = len(p)
        for row, raw in self.store.scan(p, p + _AFTER):
            yield row[n:], raw

    def _pending_size(self) -> int:
        return self._writes + len(self._cleared)

    def flush_into(self, batch: Batch) -> int:
        raise NotImplementedError

    def maybe_flush(self) -> None:
        if self._pending_size() > self.limit and not self.store.busy:
            batch = new_batch()
            self.flush_into(batch)
            self.store.write(batch)

    # The whole-value view (restore, inspection): key -> dict or list.
    def __iter__(self) -> Iterator[Any]:
        raise TypeError("iterate a RocksDB table through its backend's views")

    def __len__(self) -> int:
        raise TypeError("count a RocksDB table through its backend's views")


class MapTable(_RowTable):
    """Key -> {map key: value}, a row per map entry."""

    def __init__(self, store: RowStore, name: str, max_parallelism: int, limit: int) -> None:
        super().__init__(store, name, max_parallelism, limit)
        self._pending: dict[Any, dict[Any, Any]] = {}

    def lend(self, key: Any, mk: Any, v: Any) -> Any:
        """``v``, the value of entry ``mk`` of ``key``, goes to user code:
        if it can be changed in place, it is written again at the next flush."""
        if type(v) not in SCALARS:
            self._pending.setdefault(key, {})[mk] = v
            self._writes += 1
        return v

    def get_entry(self, key: Any, mk: Any, default: Any = None, *, lend: bool = True) -> Any:
        """The value of entry ``mk`` of ``key``'s map; ``lend=False``: the
        caller lends (or does not hand out) what it gets (see :meth:`lend`)."""
        p = self._pending.get(key)
        if p is not None:
            v = p.get(mk, _MISSING)
            if v is not _MISSING:
                return default if v is _GONE else v
        if key in self._cleared:
            return default
        raw = self.store.get(self.rows.prefix(key) + encode_key(mk))
        if raw is None:
            return default
        v = self.store.serializer.loads(raw)
        return self.lend(key, mk, v) if lend else v

    def put_entry(self, key: Any, mk: Any, v: Any) -> None:
        encode_key(mk)  # reject a map key RocksDB cannot store, now
        self._pending.setdefault(key, {})[mk] = v
        self._writes += 1
        self.maybe_flush()

    def remove_entry(self, key: Any, mk: Any) -> None:
        self._pending.setdefault(key, {})[mk] = _GONE
        self._writes += 1

    def entries(self, key: Any, *, lend: bool = True) -> dict[Any, Any]:
        """Every entry of ``key``'s map (mutable values count as written,
        unless ``lend=False``: see :meth:`get_entry`)."""
        out: dict[Any, Any] = {}
        if key not in self._cleared:
            loads = self.store.serializer.loads
            for rest, raw in self._scan(key):
                if rest:
                    mk, _ = decode_key(rest)
                    out[mk] = loads(raw)
        for mk, v in self._pending.get(key, {}).items():
            if v is _GONE:
                out.pop(mk, None)
            else:
                out[mk] = v
        if lend:
            for mk, v in out.items():
                self.lend(key, mk, v)
        return out

    def clear_key(self, key: Any) -> None:
        self._pending.pop(key, None)
        self._cleared.add(key)

    def flush_into(self, batch: Batch) -> int:
        n = 0
        for key in self._cleared:
            p = self.rows.prefix(key)
            batch.delete_range(p, p + _AFTER)
            n += 1
        dumps = self.store.serializer.dumps
        try:
            for key, entries in self._pending.items():
                p = self.rows.prefix(key)
                for mk, v in entries.items():
                    row = p + encode_key(mk)
                    if v is _GONE:
                        batch.delete(row)
                    else:
                        batch.put(row, dumps(v))
                    n += 1
        except Exception as exc:
            self.store.unwritable = True
            raise_state_error(exc, ((k, v) for k, entries in self._pending.items()
                                    for v in entries.values() if v is not _GONE),
                              operator=self.store.operator, state=self.rows.name,
                              where=_WHERE, dumps=dumps)
        self._cleared = set()
        self._pending = {}
        self._writes = 0
        return n

    def __getitem__(self, key: Any) -> dict[Any, Any]:
        out = self.entries(key)
        if not out:
            raise KeyError(key)
        return out

    def __setitem__(self, key: Any, value: dict[Any, Any]) -> None:
        self.clear_key(key)
        entries = self._pending[key] = dict(value)
        self._writes += len(entries)
        self.maybe_flush()

    def __delitem__(self, key: Any) -> None:
        self.clear_key(key)


class ListTable(_RowTable):
    """Key -> [elements], a row per element: appending writes one row."""

    def __init__(self, store: RowStore, name: str, max_parallelism: int, limit: int) -> None:
        super().__init__(store, name, max_parallelism, limit)
        #: key -> elements appended since the last flush (after the stored
        #: ones, or instead of them when the key is in ``_cleared``)
        self._pending: dict[Any, list[Any]] = {}

    def elements(self, key: Any) -> list[Any]:
        out: list[Any] = []
        if key not in self._cleared:
            loads = self.store.serializer.loads
            out = [loads(raw) for rest, raw in self._scan(key) if rest]
        out.extend(self._pending.get(key, ()))
        return out

    def append(self, key: Any, items: Iterable[Any]) -> None:
        pending = self._pending.setdefault(key, [])
        before = len(pending)
        pending.extend(items)
        self._writes += len(pending) - before
        self.maybe_flush()

    def clear_key(self, key: Any) -> None:
        self._pending.pop(key, None)
        self._cleared.add(key)

    def flush_into(self, batch: Batch) -> int:
        n = 0
        dumps = self.store.serializer.dumps
        for key in self._cleared:
            p = self.rows.prefix(key)
            batch.delete_range(p, p + _AFTER)
            n += 1
        try:
            for key, items in self._pending.items():
                if not items:
                    continue
                p = self.rows.prefix(key)
                seq = 0
                if key not in self._cleared:
                    last = self.store.last_row(p, p + _AFTER)
                    if last is not None and len(last) == len(p) + _SEQ.size:
                        seq = _SEQ.unpack_from(last, len(p))[0] + 1
                for i, v in enumerate(items, seq):
                    batch.put(p + _SEQ.pack(i), dumps(v))
                    n += 1
        except Exception as exc:
            self.store.unwritable = True
            raise_state_error(exc, ((k, v) for k, items in self._pending.items() for v in items),
                              operator=self.store.operator, state=self.rows.name,
                              where=_WHERE, dumps=dumps)
        self._cleared = set()
        self._pending = {}
        self._writes = 0
        return n

    def __getitem__(self, key: Any) -> list[Any]:
        out = self.elements(key)
        if not out:
            raise KeyError(key)
        return out

    def __setitem__(self, key: Any, value: Iterable[Any]) -> None:
        self.clear_key(key)
        elements = self._pending[key] = list(value)
        self._writes += len(elements)
        self.maybe_flush()

    def __delitem__(self, key: Any) -> None:
        self.clear_key(key)
