"""The keyed state handles of the API (``ValueState``, ``ListState``,
``MapState``, ``ReducingState``): views of one table, scoped to the current
key of their backend.

Every write goes back through ``table[key] = ...`` even when the value was
mutated in place, so that a backend whose table serialises values (RocksDB)
sees each change, and is recorded in the table's ``Changes`` so that the
next incremental snapshot writes it. A read that hands user code a mutable
object (a dict, a list, an object of its own) is recorded too: code that
changes such a value in place and never writes it back still changed the
state, and the heap (which the memory backend keeps) holds the change.

A RocksDB map or list table stores an entry or an element per row; the
handles then change it an entry or an element at a time (``self._rows``).

Snapshots need no copy-on-write here: the memory backend's snapshot reads a
copy-on-write image of the process taken at the barrier (``state/forked.py``).

A state declared with a time-to-live gets a handle of its own
(``TtlValueState`` ...): a subclass that stores each value, map entry or
list element with its write time, hides the expired ones and tells the
state's expiry index what it wrote (``state/ttl.py``). The handles of states
without a TTL are left as they were: only the states that ask for a TTL pay
for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar, cast

from eddyflow.state.abc import KeyedStateBackend
from eddyflow.state.changes import Changes
from eddyflow.state.ttl import ExpiryIndex, StateTtl, ttl_kind
from eddyflow.values import SCALARS

__all__ = ["ListState", "MapState", "ReducingState", "TtlListState", "TtlMapState",
           "TtlReducingState", "TtlValueState", "ValueState"]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

_MISSING: Any = object()


class _Handle:
    __slots__ = ("_backend", "_changes", "_rows", "_table", "name")

    def __init__(self, backend: KeyedStateBackend, name: str, kind: str) -> None:
        self._backend = backend
        self._table = backend.declare(name, kind)
        self._changes: Changes = backend.changes(name)
        self.name = name
        # A table of rows (RocksDB's map and list states) is changed an entry
        # or an element at a time.
        self._rows: Any = self._table if backend.capabilities(name).rows else None

    def _put(self, key: Any, value: Any) -> None:
        self._table[key] = value
        written = self._changes.keys
        if written is not None:
            written[key] = None

    def _lent(self, key: Any, value: Any) -> Any:
        """``value`` (of ``key``) goes to user code: if it can be changed in
        place, count it as written."""
        if type(value) not in SCALARS:
            written = self._changes.keys
            if written is not None:
                written[key] = None
        return value

    def clear(self) -> None:
        """Forget the current key's value."""
        key = self._backend.current_key
        if self._rows is not None:
            self._rows.clear_key(key)
            return
        if self._table.pop(key, _MISSING) is not _MISSING:
            written = self._changes.keys
            if written is not None:
                written[key] = None


class ValueState(_Handle, Generic[T]):
    """One value per key; ``default`` when the key has none."""

    __slots__ = ("_default",)

    def __init__(self, backend: KeyedStateBackend, name: str, default: T | None = None) -> None:
        super().__init__(backend, name, "value")
        self._default = default

    @property
    def value(self) -> T:
        key = self._backend.current_key
        v = self._table.get(key, _MISSING)
        if v is _MISSING:
            return cast(T, self._default)
        return cast(T, self._lent(key, v))

    @value.setter
    def value(self, v: T) -> None:
        self._put(self._backend.current_key, v)

    def update(self, v: T) -> None:
        self._put(self._backend.current_key, v)


class ListState(_Handle, Generic[T]):
    """A list per key."""

    __slots__ = ()

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        super().__init__(backend, name, "list")

    def get(self) -> list[T]:
        if self._rows is not None:
            return cast(list[T], self._rows.elements(self._backend.current_key))
        return list(self._table.get(self._backend.current_key, ()))

    def __iter__(self) -> Iterator[T]:
        return iter(self.get())

    def add(self, v: T) -> None:
        key = self._backend.current_key
        if self._rows is not None:
            self._rows.append(key, (v,))
            return
        items = self._table.get(key)
        if items is None:
            items = [v]
        else:
            items.append(v)
        self._put(key, items)

    def add_all(self, vs: Iterable[T]) -> None:
        key = self._backend.current_key
        if self._rows is not None:
            self._rows.append(key, list(vs))
            return
        items = self._table.get(key)
        if items is None:
            items = list(vs)
        else:
            items.extend(vs)
        if items:
            self._put(key, items)

    def update(self, vs: Iterable[T]) -> None:
        items = list(vs)
        if self._rows is not None:
            self._rows[self._backend.current_key] = items
            return
        if items:
            self._put(self._backend.current_key, items)
        else:
            self.clear()


class MapState(_Handle, Generic[K, V]):
    """A dict per key."""

    __slots__ = ()

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        super().__init__(backend, name, "map")

    def _map(self) -> dict[K, V]:
        if self._rows is not None:
            return cast(dict[K, V], self._rows.entries(self._backend.current_key))
        return self._table.get(self._backend.current_key) or {}

    def get(self, k: K, default: V | None = None) -> V | None:
        key = self._backend.current_key
        if self._rows is not None:
            return cast(V | None, self._rows.get_entry(key, k, default))
        v = self._map().get(k, _MISSING)
        if v is _MISSING:
            return default
        return cast(V, self._lent(key, v))

    def put(self, k: K, v: V) -> None:
        key = self._backend.current_key
        if self._rows is not None:
            self._rows.put_entry(key, k, v)
            return
        m = self._table.get(key)
        if m is None:
            m = {}
        m[k] = v
        self._put(key, m)

    def __contains__(self, k: object) -> bool:
        if self._rows is not None:
            key = self._backend.current_key
            return self._rows.get_entry(key, k, _MISSING) is not _MISSING
        return k in self._map()

    def remove(self, k: K) -> None:
        key = self._backend.current_key
        if self._rows is not None:
            self._rows.remove_entry(key, k)
            return
        m = self._table.get(key)
        if m is not None and k in m:
            del m[k]
            if m:
                self._put(key, m)
            else:
                self.clear()

    def items(self) -> list[tuple[K, V]]:
        return [(k, self._lent(self._backend.current_key, v)) for k, v in self._map().items()]

    def keys(self) -> list[K]:
        return list(self._map().keys())

    def values(self) -> list[V]:
        return [self._lent(self._backend.current_key, v) for v in self._map().values()]

    def __len__(self) -> int:
        return len(self._map())

    def is_empty(self) -> bool:
        return not self._map()


class ReducingState(_Handle, Generic[T]):
    """A value per key folded with ``fn`` on every ``add``."""

    __slots__ = ("_fn",)

    def __init__(self, backend: KeyedStateBackend, name: str, fn: Callable[[T, T], T]) -> None:
        if not callable(fn):
            raise TypeError(f"reducing state '{name}': fn must be callable, got {fn!r}")
        super().__init__(backend, name, "reducing")
        self._fn = fn

    def get(self) -> T | None:
        key = self._backend.current_key
        value = self._table.get(key, _MISSING)
        if value is _MISSING:
            return None
        return cast(T, self._lent(key, value))

    def add(self, v: T) -> None:
        key = self._backend.current_key
        old = self._table.get(key, _MISSING)
        self._put(key, v if old is _MISSING else self._fn(old, v))


# -- states with a time-to-live ---------------------------------------------------------


def _expiry(backend: KeyedStateBackend, name: str, kind: str, ttl: StateTtl,
            now: Callable[[], float]) -> ExpiryIndex:
    """The expiry index a handle of state ``name`` with ``ttl`` writes to."""
    if not isinstance(ttl, StateTtl):
        raise TypeError(f"state '{name}': ttl must be an ef.StateTtl, got {ttl!r}")
    return backend.expiry_index(name, kind, ttl, now)


class TtlValueState(ValueState[T]):
    """A ``ValueState`` whose value expires ``ttl.seconds`` after it was
    last written (``default`` from then on). Stored as ``(written_at, value)``."""

    __slots__ = ("_index", "_now", "_ttl")

    def __init__(self, backend: KeyedStateBackend, name: str, default: T | None,
                 ttl: StateTtl, now: Callable[[], float]) -> None:
        _Handle.__init__(self, backend, name, ttl_kind("value"))
        self._default = default
        self._index = _expiry(backend, name, "value", ttl, now)
        self._ttl = ttl
        self._now = now

    @property
    def value(self) -> T:
        key = self._backend.current_key
        stored = self._table.get(key, _MISSING)
        if stored is _MISSING or self._ttl.expired(stored[0], self._now()):
            return cast(T, self._default)
        return cast(T, self._lent(key, stored[1]))

    @value.setter
    def value(self, v: T) -> None:
        self.update(v)

    def update(self, v: T) -> None:
        key = self._backend.current_key
        at = self._now()
        self._put(key, (at, v))
        self._index.written(key, at)


class TtlReducingState(ReducingState[T]):
    """A ``ReducingState`` whose value expires ``ttl.seconds`` after its
    last ``add``; an ``add`` to an expired value starts afresh from the
    value added. Stored as ``(written_at, value)``."""

    __slots__ = ("_index", "_now", "_ttl")

    def __init__(self, backend: KeyedStateBackend, name: str, fn: Callable[[T, T], T],
                 ttl: StateTtl, now: Callable[[], float]) -> None:
        if not callable(fn):
            raise TypeError(f"reducing state '{name}': fn must be callable, got {fn!r}")
        _Handle.__init__(self, backend, name, ttl_kind("reducing"))
        self._fn = fn
        self._index = _expiry(backend, name, "reducing", ttl, now)
        self._ttl = ttl
        self._now = now

    def get(self) -> T | None:
        key = self._backend.current_key
        stored = self._table.get(key, _MISSING)
        if stored is _MISSING or self._ttl.expired(stored[0], self._now()):
            return None
        return cast(T, self._lent(key, stored[1]))

    def add(self, v: T) -> None:
        key = self._backend.current_key
        at = self._now()
        stored = self._table.get(key, _MISSING)
        if stored is _MISSING or self._ttl.expired(stored[0], at):
            new = v
        else:
            new = self._fn(stored[1], v)
        self._put(key, (at, new))
        self._index.written(key, at)


class TtlListState(ListState[T]):
    """A ``ListState`` whose elements each expire ``ttl.seconds`` after
    they were added. Stored as a list of ``(written_at, element)``."""

    __slots__ = ("_index", "_now", "_ttl")

    def __init__(self, backend: KeyedStateBackend, name: str, ttl: StateTtl,
                 now: Callable[[], float]) -> None:
        _Handle.__init__(self, backend, name, ttl_kind("list"))
        self._index = _expiry(backend, name, "list", ttl, now)
        self._ttl = ttl
        self._now = now

    def get(self) -> list[T]:
        key = self._backend.current_key
        stored = (self._rows.elements(key) if self._rows is not None
                  else self._table.get(key, ()))
        now = self._now()
        expired = self._ttl.expired
        return [v for at, v in stored if not expired(at, now)]

    def add(self, v: T) -> None:
        self.add_all((v,))

    def add_all(self, vs: Iterable[T]) -> None:
        key = self._backend.current_key
        at = self._now()
        stamped = [(at, v) for v in vs]
        if not stamped:
            return
        if self._rows is not None:
            self._rows.append(key, stamped)
        else:
            items = self._table.get(key)
            if items is None:
                items = stamped
            else:
                items.extend(stamped)
            self._put(key, items)
        self._index.written(key, at)

    def update(self, vs: Iterable[T]) -> None:
        key = self._backend.current_key
        at = self._now()
        stamped = [(at, v) for v in vs]
        if self._rows is not None:
            self._rows[key] = stamped
        elif stamped:
            self._put(key, stamped)
        else:
            self.clear()
        if stamped:
            self._index.written(key, at)


class TtlMapState(MapState[K, V]):
    """A ``MapState`` whose entries each expire ``ttl.seconds`` after they
    were last put. Stored as ``{map key: (written_at, value)}``."""

    __slots__ = ("_index", "_now", "_ttl")

    def __init__(self, backend: KeyedStateBackend, name: str, ttl: StateTtl,
                 now: Callable[[], float]) -> None:
        _Handle.__init__(self, backend, name, ttl_kind("map"))
        self._index = _expiry(backend, name, "map", ttl, now)
        self._ttl = ttl
        self._now = now

    def _entry(self, key: Any, k: Any) -> Any:
        """The stored ``(written_at, value)`` of live entry ``k``, or ``_MISSING``."""
        if self._rows is not None:
            stored = self._rows.get_entry(key, k, _MISSING, lend=False)
        else:
            m = self._table.get(key)
            stored = _MISSING if m is None else m.get(k, _MISSING)
        if stored is _MISSING or self._ttl.expired(stored[0], self._now()):
            return _MISSING
        return stored

    def _live(self, key: Any) -> dict[Any, tuple[float, Any]]:
        """The live entries of ``key``'s map, stored form (nothing lent)."""
        stored = (self._rows.entries(key, lend=False) if self._rows is not None
                  else self._table.get(key) or {})
        now = self._now()
        expired = self._ttl.expired
        return {k: e for k, e in stored.items() if not expired(e[0], now)}

    def _lend_entry(self, key: Any, k: Any, stored: tuple[float, Any]) -> Any:
        """The value of entry ``k``, going to user code: counted as written
        if it can be changed in place (with its write time unchanged: a
        read does not refresh it)."""
        v = stored[1]
        if type(v) not in SCALARS:
            if self._rows is not None:
                self._rows.lend(key, k, stored)
            else:
                self._lent(key, v)
        return v

    def get(self, k: K, default: V | None = None) -> V | None:
        key = self._backend.current_key
        stored = self._entry(key, k)
        if stored is _MISSING:
            return default
        return cast(V, self._lend_entry(key, k, stored))

    def put(self, k: K, v: V) -> None:
        key = self._backend.current_key
        at = self._now()
        if self._rows is not None:
            self._rows.put_entry(key, k, (at, v))
        else:
            m = self._table.get(key)
            if m is None:
                m = {}
            m[k] = (at, v)
            self._put(key, m)
        self._index.written((key, k), at)

    def __contains__(self, k: object) -> bool:
        return self._entry(self._backend.current_key, k) is not _MISSING

    def items(self) -> list[tuple[K, V]]:
        key = self._backend.current_key
        return [(k, self._lend_entry(key, k, e)) for k, e in self._live(key).items()]

    def keys(self) -> list[K]:
        return list(self._live(self._backend.current_key))

    def values(self) -> list[V]:
        key = self._backend.current_key
        return [self._lend_entry(key, k, e) for k, e in self._live(key).items()]

    def __len__(self) -> int:
        return len(self._live(self._backend.current_key))

    def is_empty(self) -> bool:
        return not self._live(self._backend.current_key)
