"""State backends: the factory a job is configured with, and the per-subtask
keyed store it creates.

A keyed backend holds named *tables* (one per declared state) mapping a key
to its value, plus the *current key* that the state handles read. The
in-memory tables are plain dicts, because the built-in keyed operators spend
most of their time in table look-ups and a dict is the fastest mapping Python
has; the RocksDB backend will hand out tables with the same mapping methods
(``get``, ``__setitem__``, ``pop``, ``__contains__``, ``items``, ``__len__``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from eddyflow.keygroups import key_group_for

if TYPE_CHECKING:
    from eddyflow.state.snapshot import Layouts

__all__ = ["KeyedStateBackend", "MemoryKeyedStateBackend", "MemoryStateBackend", "StateBackend"]

StateTable = dict[Any, Any]


class KeyedStateBackend(ABC):
    """The keyed state of one operator subtask."""

    def __init__(self, operator: str, key_groups: range, max_parallelism: int) -> None:
        self.operator = operator
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        self.current_key: Any = None
        self._kinds: dict[str, str] = {}
        # Keys whose mutable value (list, dict) was copied since the last
        # freeze: a frozen snapshot shares the value objects of the live
        # table, so the first in-place change after a freeze must copy.
        self.fresh: dict[str, set[Any]] = {}
        # Each table's keys by key group, kept from one snapshot to the next
        # so that only new keys are hashed and placed when state is written.
        self.layouts: Layouts = {}

    def declare(self, name: str, kind: str) -> StateTable:
        """The table of state ``name``; one name, one kind of state."""
        known = self._kinds.setdefault(name, kind)
        if known != kind:
            raise ValueError(
                f"operator '{self.operator}': state '{name}' is already declared as {known} "
                f"state, not {kind} state"
            )
        self.fresh.setdefault(name, set())
        return self._table(name)

    @property
    def kinds(self) -> dict[str, str]:
        """State name -> kind (value, list, map, reducing)."""
        return dict(self._kinds)

    def freeze(self) -> dict[str, tuple[str, dict[Any, Any]]]:
        """The synchronous phase of a snapshot: a consistent view of every
        table that later writes do not change. Shallow copies are enough,
        because values are either immutable or copied on their first
        in-place change after this call (see ``fresh``)."""
        frozen = {name: (self._kinds[name], dict(table)) for name, table in self.tables().items()}
        for keys in self.fresh.values():
            keys.clear()
        return frozen

    def restore(self, kinds: dict[str, str], entries: Iterable[tuple[str, Any, Any]]) -> int:
        """Load ``(state, key, value)`` entries from a snapshot; returns how many."""
        n = 0
        for name, kind in kinds.items():
            self.declare(name, kind)
        for name, key, value in entries:
            self._table(name)[key] = value
            n += 1
        return n

    @abstractmethod
    def _table(self, name: str) -> StateTable: ...

    @abstractmethod
    def tables(self) -> dict[str, StateTable]:
        """Every declared table by name (for snapshots and inspection)."""

    def entries(self) -> Iterator[tuple[str, int, Any, Any]]:
        """Every ``(state name, key group, key, value)``, for snapshots and tests."""
        mp = self.max_parallelism
        for name, table in self.tables().items():
            for key, value in table.items():
                yield name, key_group_for(key, mp), key, value

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (files, handles); the memory backend has none."""


class MemoryKeyedStateBackend(KeyedStateBackend):
    def __init__(self, operator: str, key_groups: range, max_parallelism: int) -> None:
        super().__init__(operator, key_groups, max_parallelism)
        self._tables: dict[str, StateTable] = {}

    def _table(self, name: str) -> StateTable:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = {}
        return table

    def tables(self) -> dict[str, StateTable]:
        return dict(self._tables)


class StateBackend(ABC):
    """What ``env.set_state_backend`` takes: a factory of keyed backends."""

    @abstractmethod
    def create_keyed_backend(
        self, operator: str, subtask: int, key_groups: range, max_parallelism: int
    ) -> KeyedStateBackend: ...


class MemoryStateBackend(StateBackend):
    """Keyed state in Python dicts on the heap."""

    def create_keyed_backend(
        self, operator: str, subtask: int, key_groups: range, max_parallelism: int
    ) -> KeyedStateBackend:
        return MemoryKeyedStateBackend(operator, key_groups, max_parallelism)

    def __repr__(self) -> str:
        return "MemoryStateBackend()"
