"""The state backend protocol: what a task and the keyed operators may ask of
keyed state, whatever holds it (``memory/``, ``rocksdb/``).

As Flink's ``SnapshotStrategy``, the backend owns both halves of its
snapshot: :meth:`KeyedStateBackend.snapshot` is the *synchronous* half,
taken at the barrier and cheap (it never costs what the whole state costs),
and returns a :class:`KeyedSnapshot` whose :meth:`KeyedSnapshot.write` is the
*asynchronous* half, awaited while records flow. What a snapshot records is
the state as it was at the barrier, whatever user code does to the objects
afterwards. The result, a :class:`~eddyflow.checkpoint.handles.KeyedStateHandle`
of the backend's own class, is what the checkpoint metadata says of one
operator subtask's keyed state: the files it needs, possibly shared with
earlier checkpoints (incremental snapshots).

Operators see state as *tables* (``state/table.py``), one per declared
state, with the capabilities the backend declares for each. Every write to
a table must be recorded in its :class:`~eddyflow.state.changes.Changes`
(the keys written since the last snapshot), so that a snapshot can cost
what changed rather than what the state holds. A backend is made known to
the rest of eddyflow by its registration (``state/registry.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, cast

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.keygroups import key_group_for
from eddyflow.state.changes import Changes
from eddyflow.state.format import apply_entries
from eddyflow.state.registry import kind_of
from eddyflow.state.table import TableCapabilities
from eddyflow.state.ttl import ABSENT as _ABSENT
from eddyflow.state.ttl import ExpiryIndex, StateTtl, VisibleView, has_ttl, visible

__all__ = [
    "KeyedSnapshot",
    "KeyedStateBackend",
    "SnapshotAbandoned",
    "SnapshotTarget",
    "StateBackend",
]


@dataclass(frozen=True)
class SnapshotTarget:
    """Where a snapshot's files go: the checkpoint storage (new files under
    its ``shared/`` folder, named so that no two subtasks, checkpoints or
    runs collide) and the checkpoint's id."""

    storage: CheckpointStorage
    checkpoint_id: int
    run_id: str
    subtask: int
    #: Every task of the job has finished: nothing runs beside the snapshot
    #: (a backend may do its work inline rather than beside the processing).
    at_end: bool = False

    @property
    def root(self) -> str:
        return self.storage.root


class SnapshotAbandoned(OSError):
    """A snapshot whose write cannot finish because the backend gave it up
    for a later one that subsumes it (a subtask's final snapshot at the end
    of its input writes what the abandoned one would have). The checkpoint
    it was for cannot complete; the task declines that checkpoint and goes
    on, as Flink's tasks decline a checkpoint whose snapshot failed."""


class KeyedSnapshot(ABC):
    """A snapshot whose synchronous half is taken; :meth:`write` is the
    asynchronous half."""

    @abstractmethod
    async def write(self) -> KeyedStateHandle:
        """Make the snapshot durable; its handle for the checkpoint metadata."""

    def cancel(self) -> None:  # noqa: B027 - optional hook
        """The checkpoint is abandoned before :meth:`write` completed."""


class KeyedStateBackend(ABC):
    """The keyed state of one operator subtask: named tables, the current key
    the state handles are scoped to, and snapshots of them."""

    def __init__(self, operator: str, key_groups: range, max_parallelism: int) -> None:
        self.operator = operator
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        self.current_key: Any = None
        self._kinds: dict[str, str] = {}
        self._closed = False
        #: The expiry index of each state with a TTL (``state/ttl.py``).
        self._ttl: dict[str, ExpiryIndex] = {}
        #: State was restored into this backend: a state with a TTL declared
        #: from now on holds entries its index must be rebuilt from.
        self._restored = False

    def declare(self, name: str, kind: str) -> MutableMapping[Any, Any]:
        """The table of state ``name``; one name, one kind of state."""
        known = self._kinds.setdefault(name, kind)
        if known != kind:
            raise ValueError(
                f"operator '{self.operator}': state '{name}' is already declared as {known} "
                f"state, not {kind} state"
            )
        return self._table(name)

    @property
    def kinds(self) -> dict[str, str]:
        """State name -> kind (value, list, map, reducing; ``+ttl`` for a
        state with a time-to-live, see ``state/ttl.py``)."""
        return dict(self._kinds)

    # -- time-to-live --------------------------------------------------------

    def expiry_index(self, name: str, kind: str, ttl: StateTtl,
                     now: Callable[[], float]) -> ExpiryIndex:
        """The expiry index of state ``name`` (a ``kind`` state with ``ttl``,
        declared first), made on its first handle; ``now`` is the job's
        processing-time clock. Two handles of one state must agree on its TTL."""
        index = self._ttl.get(name)
        if index is None:
            index = ExpiryIndex(name, kind, ttl, now, self._table(name), self.changes(name),
                                self.capabilities(name))
            # A state restored before its first handle was made: its
            # entries are indexed before the next expiry.
            index.stale = self._restored
            self._ttl[name] = index
        elif index.ttl != ttl:
            raise ValueError(f"operator '{self.operator}': state '{name}' is already declared "
                             f"with {index.ttl!r}, not {ttl!r}")
        return index

    def ttl_of(self, name: str) -> StateTtl | None:
        """The TTL state ``name`` is declared with, if any."""
        index = self._ttl.get(name)
        return None if index is None else index.ttl

    @property
    def has_ttl(self) -> bool:
        """Some state of this backend has a TTL."""
        return bool(self._ttl)

    def expire_ttl(self) -> int:
        """Remove the entries of every state with a TTL that have expired by
        now, looking only at those due (``ExpiryIndex``); how many. Called
        at the synchronous phase of every snapshot, before it takes the
        changes: what expired is deleted from the checkpoint as any removal."""
        if not self._ttl:
            return 0
        self.rebuild_ttl()
        return sum(index.expire() for index in self._ttl.values())

    def rebuild_ttl(self) -> int:
        """Index the entries restored into the states with a TTL (once after
        each restore; the operator calls it right after the restore, so that
        the first snapshot's barrier does not pay for it); how many."""
        stale = {index.name: index for index in self._ttl.values() if index.stale}
        if not stale:
            return 0
        n = 0
        for name, key, stored in self._stored_items(list(stale)):
            n += stale[name].index_stored(key, stored)
        for index in stale.values():
            index.stale = False
        return n

    def _stored_items(self, names: list[str]) -> Iterator[tuple[str, Any, Any]]:
        """``(state, key, stored value)`` of every key of the states ``names``."""
        tables = self.tables()
        for name in names:
            for key, stored in tables[name].items():
                yield name, key, stored

    def _was_restored(self) -> None:
        """Entries are being restored: the expiry indexes must learn them."""
        self._restored = True
        for index in self._ttl.values():
            index.stale = True

    def user_tables(self) -> dict[str, Mapping[Any, Any]]:
        """Every table as user code would read it now (``JobResult.state``):
        a state without a TTL as it is; one with a TTL without its write
        times and without what expired by now (a dict from a dict; a
        read-on-demand view of another table)."""
        out: dict[str, Mapping[Any, Any]] = {}
        for name, table in self.tables().items():
            kind = self._kinds.get(name, "value")
            if not has_ttl(kind):
                out[name] = table
                continue
            index = self._ttl.get(name)
            ttl = None if index is None else index.ttl
            now = 0.0 if index is None else index.now()
            if self.capabilities(name).plain_dict:
                seen = ((k, visible(kind, v, ttl, now)) for k, v in table.items())
                out[name] = {k: v for k, v in seen if v is not _ABSENT}
            else:
                out[name] = VisibleView(table, kind, ttl, now)
        return out

    @abstractmethod
    def _table(self, name: str) -> MutableMapping[Any, Any]: ...

    @abstractmethod
    def capabilities(self, name: str) -> TableCapabilities:
        """What table ``name`` offers besides the mapping methods (declare
        it first); read once by a caller, never per record."""

    def plain_table(self, name: str) -> dict[Any, Any] | None:
        """Table ``name`` (declare it first) if it is a plain ``dict``
        (``capabilities(name).plain_dict``), which a hot path may index
        directly, recording its writes in ``changes(name)``; else ``None``.
        Asked once, when the caller opens."""
        if not self.capabilities(name).plain_dict:
            return None
        return cast(dict[Any, Any], self._table(name))

    @abstractmethod
    def changes(self, name: str) -> Changes:
        """Where writes to table ``name`` are recorded (declare it first)."""

    @abstractmethod
    def tables(self) -> Mapping[str, Mapping[Any, Any]]:
        """Every declared table by name, for inspection (``JobResult.state``)."""

    @abstractmethod
    def snapshot(self, target: SnapshotTarget) -> KeyedSnapshot:
        """The synchronous half of a snapshot (see the module docstring)."""

    def restore(self, kinds: Mapping[str, str],
                entries: Iterable[tuple[str, Any, Any]]) -> int:
        """Load ``(state, key, value)`` entries of a checkpoint's files in
        the order they apply (``DELETED`` values remove); returns how many."""
        self._was_restored()
        for name, kind in kinds.items():
            self.declare(name, kind)
        return apply_entries(self._table, entries)

    def bulk_load(self, name: str, kind: str, entries: Mapping[Any, Any]) -> int:
        """Load ``entries`` (key -> value as the state stores it) into state
        ``name`` of kind ``kind`` of a backend that holds none of those keys
        yet (``offline.bootstrap`` loads each subtask this way before its
        snapshot); returns how many. Through :meth:`restore` here; backends
        override it with a faster path."""
        return self.restore({name: kind}, ((name, k, v) for k, v in entries.items()))

    def restore_from(self, root: str, kinds: Mapping[str, str],
                     handles: list[KeyedStateHandle]) -> int:
        """Declare the states ``kinds`` names and load those of this backend's
        key groups from the handles of the old subtasks that held some of
        them (any backend's, each read by its registration)."""
        mp = self.max_parallelism
        entries = ((name, key, value) for h in handles
                   for _, name, key, value in kind_of(h).read(root, h, key_groups=self.key_groups,
                                                              max_parallelism=mp))
        return self.restore(kinds, entries)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:  # noqa: B027
        """Checkpoint ``checkpoint_id`` is durable: what it wrote may be built on."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:  # noqa: B027
        """Checkpoint ``checkpoint_id`` will never complete."""

    def entries(self) -> Iterator[tuple[str, int, Any, Any]]:
        """Every ``(state name, key group, key, value)``, for tests and inspection."""
        mp = self.max_parallelism
        for name, table in self.tables().items():
            for key, value in table.items():
                yield name, key_group_for(key, mp), key, value

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"operator '{self.operator}': its keyed state backend is closed")

    def close(self) -> None:
        """Release resources; called once, after the last snapshot."""
        self._closed = True


class StateBackend(ABC):
    """What ``env.set_state_backend`` takes: a factory of keyed backends."""

    @abstractmethod
    def create_keyed_backend(
        self, operator: str, subtask: int, key_groups: range, max_parallelism: int,
        *, checkpointing: bool = False,
    ) -> KeyedStateBackend:
        """The keyed state of one operator subtask; ``checkpointing``: it will
        be snapshotted (so it records what changes)."""
