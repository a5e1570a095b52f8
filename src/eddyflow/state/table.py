"""What operators and state handles may ask of a backend's tables.

Every table (one per declared state) is a :class:`StateTable`: a mapping
from key to value. A backend declares, per table, what more it offers
(:class:`TableCapabilities`, from ``KeyedStateBackend.capabilities``), and
callers read those once, when they open, never per record: the memory
backend's tables are plain dicts that the hot paths index directly, a
RocksDB value table loads a batch's keys in one round-trip
(:class:`PreloadingTable`), a RocksDB map or list state is stored as rows
(:class:`RowTable`). A table declaring nothing is used through the mapping
methods alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["PLAIN", "PreloadingTable", "RowTable", "StateTable", "TableCapabilities"]


class StateTable(Protocol):
    """One state's entries, key -> value (a map state's value a ``dict``, a
    list state's a ``list``). Every write is recorded by the writer in the
    table's ``Changes`` (``state/changes.py``)."""

    def get(self, key: Any, default: Any = None, /) -> Any:
        """The value of ``key``, or ``default``."""

    def __getitem__(self, key: Any, /) -> Any: ...

    def __setitem__(self, key: Any, value: Any, /) -> None: ...

    def pop(self, key: Any, /, *default: Any) -> Any:
        """Remove ``key``; its value (or ``default``). The one way to
        remove a key: ``del table[key]`` is not part of the protocol, since
        a table that caches a store must remember what was removed, and a
        dict subclass cannot override ``__delitem__`` without slowing every
        store (``state/rocksdb/tables.py``, ``ValueTable.pop``)."""

    def __contains__(self, key: object, /) -> bool: ...

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...

    def items(self) -> Any:
        """Every ``(key, value)``."""


class PreloadingTable(StateTable, Protocol):
    """A table that caches a store: the keys about to be read are loaded
    first, a batch in one round-trip."""

    def needs_keys(self) -> bool:
        """Whether loading can find anything the cache does not hold."""

    def load(self, keys: Iterable[Any]) -> None:
        """Load ``keys`` into the cache before they are read."""

    def load_one(self, key: Any) -> None:
        """Load ``key`` into the cache before it is read."""


class RowTable(StateTable, Protocol):
    """A map or list state stored as a row per map entry or list element,
    changed an entry or an element at a time (the state handles use these
    methods rather than read and write a whole dict or list)."""

    def __delitem__(self, key: Any, /) -> None:
        """Remove every entry or element of ``key`` (its rows)."""

    def entries(self, key: Any, *, lend: bool = True) -> Any:
        """A map state's entries of ``key``, a dict."""

    def get_entry(self, key: Any, mk: Any, default: Any = None, *, lend: bool = True) -> Any:
        """One map entry of ``key``."""

    def put_entry(self, key: Any, mk: Any, v: Any) -> None:
        """Set one map entry of ``key``."""

    def remove_entry(self, key: Any, mk: Any) -> None:
        """Remove one map entry of ``key``."""

    def lend(self, key: Any, mk: Any, v: Any) -> Any:
        """``v`` of map entry ``mk`` of ``key`` goes to user code."""

    def elements(self, key: Any) -> list[Any]:
        """A list state's elements of ``key``."""

    def append(self, key: Any, items: Iterable[Any]) -> None:
        """Append ``items`` to the list of ``key``."""

    def clear_key(self, key: Any) -> None:
        """Remove every row of ``key``."""


@dataclass(frozen=True)
class TableCapabilities:
    """What a backend declares of one of its tables."""

    #: The table is a builtin ``dict`` holding every entry on the heap:
    #: callers may index it directly (and record their writes in its
    #: ``Changes``) and copy it as it is.
    plain_dict: bool = False
    #: The table is a :class:`PreloadingTable`.
    preloads: bool = False
    #: The table is a :class:`RowTable` (a map or list state stored as rows);
    #: otherwise a map or list state is one whole value per key.
    rows: bool = False


#: The capabilities of a plain ``dict`` table (the memory backend's).
PLAIN = TableCapabilities(plain_dict=True)
