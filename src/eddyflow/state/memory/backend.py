"""The memory backend: each state a plain ``dict`` from key to value.

The built-in keyed operators spend most of their time in table look-ups and
a dict is the fastest mapping Python has, so the tables are dicts and the
bookkeeping that snapshots need is kept beside them: every write is recorded
in the table's :class:`~eddyflow.state.changes.Changes` (by the operators once
per batch, at C speed), which is what lets a snapshot write only what
changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eddyflow.state.abc import KeyedSnapshot, KeyedStateBackend, SnapshotTarget, StateBackend
from eddyflow.state.changes import Changes
from eddyflow.state.memory.snapshot import ChainPolicy, MemorySnapshotStrategy
from eddyflow.state.table import PLAIN, TableCapabilities

__all__ = ["MemoryKeyedStateBackend", "MemoryStateBackend"]


class MemoryKeyedStateBackend(KeyedStateBackend):
    def __init__(self, operator: str, key_groups: range, max_parallelism: int,
                 *, checkpointing: bool = False, policy: ChainPolicy | None = None) -> None:
        super().__init__(operator, key_groups, max_parallelism)
        self._tables: dict[str, dict[Any, Any]] = {}
        self._changes: dict[str, Changes] = {}
        self._track = checkpointing
        self._strategy = MemorySnapshotStrategy(self, policy or ChainPolicy())

    def _table(self, name: str) -> dict[Any, Any]:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = {}
            # Until a first snapshot is taken no keys are recorded: it is
            # full (so is any snapshot with no completed one before it).
            strategy = self._strategy
            self._changes[name] = Changes(self._track, strategy.budget,
                                          saturated=strategy.fresh)
        return table

    def capabilities(self, name: str) -> TableCapabilities:
        # Plain dicts: the hot paths index them directly.
        return PLAIN

    def changes(self, name: str) -> Changes:
        return self._changes[name]

    def tables(self) -> dict[str, dict[Any, Any]]:
        return dict(self._tables)

    def bulk_load(self, name: str, kind: str, entries: Mapping[Any, Any]) -> int:
        # One dict update, at C speed (restore's apply_entries costs a
        # Python call per entry).
        self._was_restored()
        self.declare(name, kind).update(entries)
        return len(entries)

    def entry_count(self) -> int:
        """How many entries the tables hold together."""
        return sum(map(len, self._tables.values()))

    def snapshot(self, target: SnapshotTarget) -> KeyedSnapshot:
        self._check_open()
        # Expired entries leave first, recorded as changes: a delta deletes them.
        self.expire_ttl()
        return self._strategy.snapshot(target, self._tables, self._changes)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._strategy.confirm(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._strategy.abort(checkpoint_id)


class MemoryStateBackend(StateBackend):
    """Keyed state in Python dicts on the heap.

    Snapshots are incremental: each checkpoint writes the keys changed since
    the checkpoint before it, as a delta over that checkpoint's files; after
    ``max_chain`` deltas, or once the deltas add up to ``max_delta_ratio``
    times the full snapshot they build on, the next one is full again.
    ``incremental=False`` writes a full snapshot every time."""

    def __init__(self, *, incremental: bool = True, max_chain: int = 10,
                 max_delta_ratio: float = 1.0) -> None:
        if max_chain < 0:
            raise ValueError(f"max_chain must be >= 0, got {max_chain}")
        if not max_delta_ratio > 0:
            raise ValueError(f"max_delta_ratio must be > 0, got {max_delta_ratio}")
        self.policy = ChainPolicy(max_chain if incremental else 0, float(max_delta_ratio))

    def create_keyed_backend(
        self, operator: str, subtask: int, key_groups: range, max_parallelism: int,
        *, checkpointing: bool = False,
    ) -> MemoryKeyedStateBackend:
        return MemoryKeyedStateBackend(operator, key_groups, max_parallelism,
                                       checkpointing=checkpointing, policy=self.policy)

    def __repr__(self) -> str:
        p = self.policy
        if p.max_chain == 0:
            return "MemoryStateBackend(incremental=False)"
        return f"MemoryStateBackend(max_chain={p.max_chain}, max_delta_ratio={p.max_delta_ratio})"
