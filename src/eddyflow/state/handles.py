"""The keyed state handles of the API (``ValueState``, ``ListState``,
``MapState``, ``ReducingState``): views of one table, scoped to the current
key of their backend.

Every write goes back through ``table[key] = ...`` even when the value was
mutated in place, so that a backend whose table serialises values (RocksDB)
sees each change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar, cast

from eddyflow.state.backend import KeyedStateBackend

__all__ = ["ListState", "MapState", "ReducingState", "ValueState"]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

_MISSING: Any = object()


class _Handle:
    __slots__ = ("_backend", "_fresh", "_table", "name")

    def __init__(self, backend: KeyedStateBackend, name: str, kind: str) -> None:
        self._backend = backend
        self._table = backend.declare(name, kind)
        self._fresh = backend.fresh[name]
        self.name = name

    def _key(self) -> Any:
        return self._backend.current_key

    def clear(self) -> None:
        """Forget the current key's value."""
        self._table.pop(self._backend.current_key, None)


class ValueState(_Handle, Generic[T]):
    """One value per key; ``default`` when the key has none."""

    __slots__ = ("_default",)

    def __init__(self, backend: KeyedStateBackend, name: str, default: T | None = None) -> None:
        super().__init__(backend, name, "value")
        self._default = default

    @property
    def value(self) -> T:
        return cast(T, self._table.get(self._backend.current_key, self._default))

    @value.setter
    def value(self, v: T) -> None:
        self._table[self._backend.current_key] = v

    def update(self, v: T) -> None:
        self._table[self._backend.current_key] = v


class ListState(_Handle, Generic[T]):
    """A list per key."""

    __slots__ = ()

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        super().__init__(backend, name, "list")

    def get(self) -> list[T]:
        return list(self._table.get(self._backend.current_key, ()))

    def __iter__(self) -> Iterator[T]:
        return iter(self.get())

    def _mutable(self, key: Any) -> list[T]:
        items = self._table.get(key)
        if items is None:
            items = []
        elif key not in self._fresh:
            items = list(items)  # a snapshot may still hold the old list
        self._fresh.add(key)
        return items

    def add(self, v: T) -> None:
        key = self._backend.current_key
        items = self._mutable(key)
        items.append(v)
        self._table[key] = items

    def add_all(self, vs: Iterable[T]) -> None:
        key = self._backend.current_key
        items = self._mutable(key)
        items.extend(vs)
        if items:
            self._table[key] = items

    def update(self, vs: Iterable[T]) -> None:
        items = list(vs)
        if items:
            self._table[self._backend.current_key] = items
        else:
            self.clear()


class MapState(_Handle, Generic[K, V]):
    """A dict per key."""

    __slots__ = ()

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        super().__init__(backend, name, "map")

    def _map(self) -> dict[K, V]:
        return self._table.get(self._backend.current_key) or {}

    def get(self, k: K, default: V | None = None) -> V | None:
        return self._map().get(k, default)

    def _mutable(self, key: Any) -> dict[K, V]:
        m = self._table.get(key)
        if m is None:
            m = {}
        elif key not in self._fresh:
            m = dict(m)  # a snapshot may still hold the old dict
        self._fresh.add(key)
        return m

    def put(self, k: K, v: V) -> None:
        key = self._backend.current_key
        m = self._mutable(key)
        m[k] = v
        self._table[key] = m

    def __contains__(self, k: object) -> bool:
        return k in self._map()

    def remove(self, k: K) -> None:
        key = self._backend.current_key
        m = self._table.get(key)
        if m is not None and k in m:
            m = self._mutable(key)
            del m[k]
            if m:
                self._table[key] = m
            else:
                del self._table[key]

    def items(self) -> list[tuple[K, V]]:
        return list(self._map().items())

    def keys(self) -> list[K]:
        return list(self._map().keys())

    def values(self) -> list[V]:
        return list(self._map().values())

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
        value: T | None = self._table.get(self._backend.current_key)
        return value

    def add(self, v: T) -> None:
        key = self._backend.current_key
        old = self._table.get(key, _MISSING)
        self._table[key] = v if old is _MISSING else self._fn(old, v)
