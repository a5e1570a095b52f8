"""The state backend protocol: what a task and the keyed operators may ask of
keyed state, whatever holds it (``memory/``, ``rocksdb/``).

As Flink's ``SnapshotStrategy``, the backend owns both halves of its
snapshot: :meth:`KeyedStateBackend.snapshot` is the *synchronous* half,
taken at the barrier and cheap (it never costs what the whole state costs),
and returns a :class:`KeyedSnapshot` whose :meth:`KeyedSnapshot.write` is the
*asynchronous* half, awaited while records flow. What a snapshot records is
the state as it was at the barrier, whatever user code does to the objects
afterwards. The result, a :class:`KeyedStateHandle`, is what the checkpoint
metadata says of one operator subtask's keyed state: the files it needs,
possibly shared with earlier checkpoints (incremental snapshots).

Operators see state as *tables*, one per declared state: mappings from key
to value with ``get``, ``__setitem__``, ``pop``, ``__contains__``, ``items``
and ``__len__``. Every write to a table must be recorded in its
:class:`Changes` (the keys written since the last snapshot), so that a
snapshot can cost what changed rather than what the state holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from eddyflow.checkpoint.storage import CheckpointStorage, FileHandle
from eddyflow.keygroups import key_group_for
from eddyflow.state.format import apply_entries, read_state_file
from eddyflow.state.ttl import ABSENT as _ABSENT
from eddyflow.state.ttl import ExpiryIndex, StateTtl, VisibleView, has_ttl, visible

__all__ = [
    "Changes",
    "KeyedSnapshot",
    "KeyedStateBackend",
    "KeyedStateHandle",
    "SnapshotAbandoned",
    "SnapshotTarget",
    "StateBackend",
    "StateFile",
    "Written",
    "written_keys",
]


#: What a table's :class:`Changes` held at a snapshot: keys written one by
#: one, and collections of keys written batch by batch (lists as recorded,
#: and sets of the ones already de-duplicated).
Written = tuple[dict[Any, Any], list[Collection[Any]]]


def written_keys(written: Written) -> set[Any]:
    """Every key of ``written``, once each (in no particular order: a set is
    built four times faster than an ordered dict of the same keys, measured
    on 3M writes of 1M keys, and no reader needs the order)."""
    one_by_one, batches = written
    keys: set[Any] = set(one_by_one)
    for batch in batches:
        keys.update(batch)
    return keys


class Changes:
    """The keys of one table written since the last snapshot.

    Two records, both replaced (never cleared) at each snapshot: ``keys``, a
    dict (its values mean nothing) for writes one at a time (the state
    handles), ``None`` when nothing needs to know (no checkpointing, or
    :attr:`saturated`); and whole lists of keys (:meth:`add_batch`) for the
    keyed operators, which record a batch's keys with one list built at C
    speed instead of a hash insert per record (measured: a ``dict.update``
    per batch was 30% of a keyed sum's time at 1M keys, every insert a cache
    miss). The snapshot unions them, off the event loop.

    What the snapshot decides from is how many *distinct* keys were written
    (:meth:`count`): a few hot keys written a million times are a small
    delta. So the lists are de-duplicated into a set (``set.update`` per
    list, at C speed) every ``dedup_every`` keys recorded, as long as that
    pays: a key written again is a hash look-up of a key in the cache, a
    small fraction of what the keyed operator spent on it. When a fold finds
    mostly new keys (uniform keys over a large state, each insert a cache
    miss) de-duplicating stops until the next snapshot, and the lists are
    counted as they are (an upper bound; a Zipf law of exponent 1 over 300k
    keys is still counted exactly, one of 0.8 is not): one fold of
    ``dedup_every`` keys per interval is the price of finding out (see
    ``benchmarks/state.py --scenarios hot-keys`` and the uniform ``sum``
    rows). Past ``fold`` keys in lists (a long interval), the lists are
    folded into the set to bound their memory, a slice per batch recorded.

    A backend whose next snapshot will not use the keys once there are too
    many of them (the memory backend writes every entry once a fifth of
    them changed) passes ``budget``: once more distinct keys than
    ``budget()`` says were recorded (as far as :meth:`__len__` knows),
    recording stops (:attr:`saturated`, ``keys`` is ``None``) until
    :meth:`take_written`. Recording a key costs a cache miss for each key of
    a batch and another to free it (measured: 0.15 s of a 3 s keyed sum over
    1M keys), for keys nobody would read."""

    __slots__ = ("_batched", "_batches", "_budget", "_cap", "_dedup", "_seen", "keys",
                 "saturated")

    fold = 1 << 22
    #: Keys folded per batch recorded once past ``fold`` (~20 ms of work).
    fold_step = 1 << 16
    #: Keys recorded between two de-duplications (~1 ms of work at worst).
    dedup_every = 1 << 13

    def __init__(self, track: bool, budget: Callable[[], float] | None = None,
                 *, saturated: bool = False) -> None:
        self.keys: dict[Any, Any] | None = {} if track else None
        self._batches: list[Collection[Any]] = []
        self._batched = 0
        #: Keys of the lists folded so far, each once.
        self._seen: set[Any] = set()
        #: De-duplicating pays in this interval (written keys repeat).
        self._dedup = True
        self._budget = budget
        #: Recording stopped: the keys written since the last snapshot are not known.
        self.saturated = False
        self._cap: float = self.fold
        self._reset_cap()
        if track and saturated:
            self.saturate()

    def add_batch(self, keys: Collection[Any]) -> None:
        """Record the keys of a batch as written (call only while tracking)."""
        self._batches.append(keys)
        self._batched += len(keys)
        if self._batched > self._cap:
            self._overflow()

    def _overflow(self) -> None:
        if self._dedup:
            self._dedup_all()
        budget = self._budget
        limit = budget() if budget is not None else None
        if limit is not None and len(self) > limit:
            self.saturate()
            return
        cap: float = self.dedup_every if self._dedup else self.fold
        if limit is not None:
            # The budget grew with the table: look again when the lists
            # would reach it.
            cap = min(cap, max(0.0, limit - (len(self) - self._batched)))
        self._cap = cap
        if self._dedup:
            return
        if self._batched <= self.fold:
            return
        # Fold the oldest batches, up to ``fold_step`` keys: called again at
        # each batch recorded while past ``fold``, so that a long interval's
        # keys are folded a slice at a time between batches, never in one
        # stop of the loop (measured: 4.2M keys folded at once took 1.43 s,
        # the longest gap in a RocksDB running sum's output, whose periodic
        # checkpoint after the load took 5.5 s and held back the next one).
        seen = self._seen
        batches = self._batches
        folded = taken = 0
        while taken < len(batches) and folded < self.fold_step:
            batch = batches[taken]
            seen.update(batch)
            folded += len(batch)
            taken += 1
        del batches[:taken]
        self._batched -= folded

    def _dedup_all(self) -> None:
        """Fold every list into the set; stop de-duplicating until the next
        snapshot if most of their keys were new (it would not pay)."""
        seen = self._seen
        before, folded = len(seen), self._batched
        for batch in self._batches:
            seen.update(batch)
        self._batches = []
        self._batched = 0
        # (Judged on enough keys: a few new keys say nothing of the interval.)
        if folded >= self.dedup_every // 2 and (len(seen) - before) * 4 > folded * 3:
            self._dedup = False

    def count(self) -> int:
        """How many distinct keys were recorded: exact while de-duplicating
        pays (the lists not folded yet, fewer than ``dedup_every`` keys, are
        folded now), else an upper bound (a key in two lists counts twice).
        What a snapshot decides on, before :meth:`take_written`."""
        if self._dedup and self._batched:
            self._dedup_all()
        return len(self)

    def saturate(self) -> None:
        """Stop recording (while tracking): the next snapshot will not read
        the keys."""
        if self.keys is None and not self.saturated:
            return  # not tracking
        self.keys = None
        self._batches = []
        self._batched = 0
        self._seen = set()
        self.saturated = True

    def put_back(self, written: Written) -> None:
        """Record the keys of ``written`` (taken earlier) as written again,
        by reference: a snapshot that was to write them was abandoned
        (de-duplicating them here cost 0.4 s for 700k keys at the end of a
        1M-key running sum, and the next snapshot de-duplicates anyway)."""
        keys = self.keys
        assert keys is not None
        one_by_one, batches = written
        keys.update(one_by_one)
        for batch in batches:
            self.add_batch(batch)

    def __len__(self) -> int:
        """How many keys were recorded (a key in two lists, or written one by
        one and in a list, may count twice; see :meth:`count`)."""
        return ((len(self.keys) if self.keys is not None else 0) + len(self._seen)
                + self._batched)

    def take(self) -> Written:
        """The keys written so far; recording starts over. Not for a
        record with a ``budget`` (see :meth:`take_written`)."""
        if self.saturated:
            raise RuntimeError("the written keys are not known (saturated): use take_written")
        keys, batches, seen = self.keys, self._batches, self._seen
        if keys is None:
            return {}, []
        self.keys = {}
        self._batches = []
        self._batched = 0
        self._seen = set()
        self._dedup = True
        self._reset_cap()
        return keys, ([seen, *batches] if seen else batches)

    def take_written(self) -> Written | None:
        """The keys written so far, or ``None`` if recording had stopped
        (:attr:`saturated`); recording starts over either way."""
        if self.saturated:
            self.saturated = False
            self.keys = {}
            self._dedup = True
            self._reset_cap()
            return None
        return self.take()

    def _reset_cap(self) -> None:
        # How many batched keys to hold before de-duplicating them, or
        # asking the budget again.
        cap = min(self.fold, self.dedup_every)
        self._cap = cap if self._budget is None else min(cap, self._budget())


@dataclass(frozen=True)
class StateFile:
    """One file of a keyed-state snapshot: where it is (relative to the
    checkpoint storage root), its checksum, its frame index, whether its
    frames are by key group (``grouped``) and whether it is a full snapshot
    or a delta over the file before it (see ``state/format.py``)."""

    handle: FileHandle
    index: Mapping[str, tuple[int, int]]
    full: bool
    grouped: bool = True

    def to_json(self) -> dict[str, Any]:
        return {**self.handle.to_json(), "index": {k: list(v) for k, v in self.index.items()},
                "full": self.full, "grouped": self.grouped}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> StateFile:
        return StateFile(FileHandle.from_json(dict(d)),
                         {str(k): (int(v[0]), int(v[1])) for k, v in d["index"].items()},
                         bool(d.get("full", True)), bool(d.get("grouped", True)))

    def entries(self, root: str, *, key_groups: range | None = None, owner: range | None = None,
                max_parallelism: int = 0, with_groups: bool = False
                ) -> Iterator[tuple[int, str, Any, Any]]:
        """``(key_group, state, key, value)`` of this file, in the order they
        apply (see ``state.format.read_state_file``)."""
        return read_state_file(root, self.handle.path, self.index, self.grouped,
                               key_groups=key_groups, owner=owner,
                               max_parallelism=max_parallelism, with_groups=with_groups)


@dataclass(frozen=True)
class KeyedStateHandle:
    """One operator subtask's keyed state in a checkpoint: its backend, the
    kinds of its states, how many entries it held, the key groups it owned,
    and its files in the order they apply (a full snapshot, then deltas)."""

    backend: str
    kinds: Mapping[str, str]
    entries: int
    key_groups: range
    files: tuple[StateFile, ...] = ()
    #: Files this checkpoint wrote (the others were written by earlier ones).
    new_files: frozenset[str] = field(default_factory=frozenset)
    #: A RocksDB checkpoint's files: (its name in the database folder, where
    #: the checkpoint storage holds it).
    db_files: tuple[tuple[str, FileHandle], ...] = ()

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "backend": self.backend, "kinds": dict(self.kinds), "entries": self.entries,
            "key_groups": [self.key_groups.start, self.key_groups.stop],
            "files": [f.to_json() for f in self.files]}
        if self.db_files:
            d["db_files"] = [[name, h.to_json()] for name, h in self.db_files]
        return d

    def file_handles(self) -> list[FileHandle]:
        """Every file this state needs, for the checkpoint's file list."""
        return [f.handle for f in self.files] + [h for _, h in self.db_files]

    def read(self, root: str, *, key_groups: range | None = None, max_parallelism: int = 0,
             with_groups: bool = False) -> Iterator[tuple[int, str, Any, Any]]:
        """``(key_group, state, key, value)`` of the entries in ``key_groups``
        (all when ``None``), whatever backend wrote them; a memory
        snapshot's deltas in the order they apply (deletions as ``DELETED``);
        key groups are ``-1`` unless known or ``with_groups``."""
        if self.backend == "rocksdb":
            from eddyflow.state.rocksdb.reader import read_handle

            for name, kg, key, value in read_handle(root, self, key_groups):
                yield kg, name, key, value
            return
        owner = self.key_groups if len(self.key_groups) else None
        for f in self.files:
            yield from f.entries(root, key_groups=key_groups, owner=owner,
                                 max_parallelism=max_parallelism, with_groups=with_groups)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> KeyedStateHandle:
        if "file" in d:  # metadata format 1: one full file per subtask
            files: tuple[StateFile, ...] = (StateFile.from_json({**d["file"],
                                                                 "index": d["index"]}),)
            groups = range(0, 0)
        else:
            files = tuple(StateFile.from_json(f) for f in d["files"])
            start, stop = d["key_groups"]
            groups = range(int(start), int(stop))
        db_files = tuple((str(name), FileHandle.from_json(dict(h)))
                         for name, h in d.get("db_files", ()))
        return KeyedStateHandle(str(d.get("backend", "memory")), dict(d["kinds"]),
                                int(d.get("entries", 0)), groups, files, db_files=db_files)


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
            index = ExpiryIndex(name, kind, ttl, now, self._table(name), self.changes(name))
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
            if isinstance(table, dict):
                seen = ((k, visible(kind, v, ttl, now)) for k, v in table.items())
                out[name] = {k: v for k, v in seen if v is not _ABSENT}
            else:
                out[name] = VisibleView(table, kind, ttl, now)
        return out

    @abstractmethod
    def _table(self, name: str) -> MutableMapping[Any, Any]: ...

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
        them (any backend's)."""
        mp = self.max_parallelism
        entries = ((name, key, value) for h in handles
                   for _, name, key, value in h.read(root, key_groups=self.key_groups,
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
