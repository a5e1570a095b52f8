"""State time-to-live in the backends: how an entry with a TTL is stored,
which entries a reader may see, and the index that drops expired entries
without scanning the state (``ctx.value_state(name, ttl=ef.StateTtl(s))``;
the rule itself is :class:`eddyflow.state.ttl.StateTtl`'s).

Stored form. An entry of a state with a TTL is stored with the time it was
written, as Flink's ``TtlValue``: a value or reducing state's value is the
tuple ``(written_at, value)``, a map state's entry value is ``(written_at,
value)`` (each map entry its own time), a list state's element is
``(written_at, element)`` (each element its own time). The time is the
job's processing time (the operator's clock), read when the entry is
written (``update``/``put``/``add``); reads do not refresh it (Flink's
``OnCreateAndWrite``). Because the write time is part of the stored value,
it survives checkpoints, restores at another parallelism and restores into
the other backend exactly; and because it is the write time (not the
expiry time), a restored job may change the TTL's duration: its entries
then expire ``seconds`` (the new ones) after they were written.

Kinds. A state with a TTL has a kind of its own: ``"value+ttl"``,
``"list+ttl"``, ``"map+ttl"``, ``"reducing+ttl"``; it is what the
checkpoint's metadata records. So a state checkpointed without a TTL and
declared with one (or the reverse) is found by the kind check every restore
makes, and refused naming the operator and the state (as Flink's
``StateMigrationException``), rather than read as values of the wrong shape.

Expiry index. Reads never return an expired entry (they check its time),
but an expired entry also has to leave the state, and above all the
checkpoints, without a scan of the whole state at every checkpoint: a
snapshot must cost what changed, not what the state holds. So each state
with a TTL keeps an :class:`ExpiryIndex` beside its table: a heap of
``(written_at, seq, entry id)`` (the entry id is the key, or ``(key, map
key)`` for map state) and a dict of the one time each entry id is indexed
at. A write pushes only when its entry is not indexed yet (or, the clock
having gone back, indexed at a later time); an entry rewritten later keeps
its earlier heap item, which, when it comes due, finds the entry's real
(later) time in the state and is pushed again at it. So the heap holds at
most one live item per entry written within the last TTL, a write costs a
dict look-up, and :meth:`ExpiryIndex.expire` looks at the entries whose
earliest possible expiry has come and nothing else. The keyed backends call
it at the synchronous phase of every snapshot, the removals being recorded
as changes like any write (so incremental snapshots delete those entries),
and the process operator after every batch (so a job without checkpoints
does not keep expired state either). After a restore the index is rebuilt
from the state (once, as timers are: ``runtime/time/timers.py``).

What is invisible is decided by the stored times alone, never by the index:
the index only decides when an entry is looked at again, so an index that
lags (a heap item for an entry rewritten since) costs a look-up, never a
wrong answer.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, cast

from eddyflow.checks import positive
from eddyflow.state.table import PreloadingTable, TableCapabilities

__all__ = [
    "ABSENT",
    "ExpiryIndex",
    "StateTtl",
    "VisibleView",
    "base_kind",
    "has_ttl",
    "ttl_clash",
    "ttl_kind",
    "unwrap",
    "visible",
]

_SUFFIX = "+ttl"
#: No value: an entry that is absent, or expired.
ABSENT: Any = object()


@dataclass(frozen=True)
class StateTtl:
    """``ctx.value_state("seen", ttl=ef.StateTtl(3600.0))``: entries expire
    ``seconds`` after they were last written; expired entries are never
    returned and are dropped from snapshots."""

    seconds: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", positive("StateTtl", "seconds", self.seconds))

    def expires_at(self, written_at: float) -> float:
        """The time from which an entry written at ``written_at`` is expired."""
        return written_at + self.seconds

    def expired(self, written_at: float, now: float) -> bool:
        """Whether an entry written at ``written_at`` is expired at ``now``."""
        return written_at + self.seconds <= now


def ttl_kind(kind: str) -> str:
    """The kind of a ``kind`` state with a TTL (``"value"`` -> ``"value+ttl"``)."""
    return kind + _SUFFIX


def has_ttl(kind: str) -> bool:
    return kind.endswith(_SUFFIX)


def base_kind(kind: str) -> str:
    """What a state of ``kind`` holds per key, TTL or not: value, list, map, reducing."""
    return kind[:-len(_SUFFIX)] if kind.endswith(_SUFFIX) else kind


def ttl_clash(name: str, stored: str, declared: str, ttl: StateTtl | None) -> str | None:
    """The sentence for a state stored as ``stored`` and declared as
    ``declared`` that differ in their TTL only; ``None`` if they differ otherwise."""
    if base_kind(stored) != base_kind(declared) or has_ttl(stored) == has_ttl(declared):
        return None
    kind = base_kind(stored)
    if has_ttl(stored):
        return (f"the checkpoint holds its state '{name}' ({kind} state) with a time-to-live, "
                f"the job declares it without one")
    with_ttl = f"StateTtl({ttl.seconds!r})" if ttl is not None else "a time-to-live"
    return (f"the checkpoint holds its state '{name}' ({kind} state) without a time-to-live, "
            f"the job declares it with {with_ttl}")


def unwrap(kind: str, value: Any) -> Any:
    """The user's value of a stored value of a ``kind`` state: the write
    times taken out (a state without a TTL is returned as it is)."""
    return visible(kind, value, None, 0.0)


def visible(kind: str, value: Any, ttl: StateTtl | None, now: float) -> Any:
    """What a reader sees of the stored ``value`` of a ``kind`` state at
    ``now``: the write times taken out and, given ``ttl``, expired entries
    (map entries, list elements) left out; :data:`ABSENT` when nothing is
    left. Without ``ttl`` (unknown: a restored state the job does not
    declare) nothing is left out."""
    if not has_ttl(kind):
        return value
    base = base_kind(kind)
    if base == "map":
        m = {mk: v for mk, (at, v) in value.items()
             if ttl is None or not ttl.expired(at, now)}
        return m if m else ABSENT
    if base == "list":
        items = [v for at, v in value if ttl is None or not ttl.expired(at, now)]
        return items if items else ABSENT
    at, v = value
    return ABSENT if ttl is not None and ttl.expired(at, now) else v


class VisibleView(Mapping[Any, Any]):
    """A state with a TTL as its readers see it (``JobResult.state``): the
    stored ``table`` read on demand through :func:`visible` at ``now``."""

    def __init__(self, table: Mapping[Any, Any], kind: str, ttl: StateTtl | None,
                 now: float) -> None:
        self._table = table
        self._kind = kind
        self._ttl = ttl
        self._now = now

    def _visible(self, value: Any) -> Any:
        return visible(self._kind, value, self._ttl, self._now)

    def __getitem__(self, key: Any) -> Any:
        v = self._visible(self._table[key])
        if v is ABSENT:
            raise KeyError(key)
        return v

    def _items(self) -> Iterator[tuple[Any, Any]]:
        for key, stored in self._table.items():
            v = self._visible(stored)
            if v is not ABSENT:
                yield key, v

    def __iter__(self) -> Iterator[Any]:
        for key, _ in self._items():
            yield key

    def __len__(self) -> int:
        return sum(1 for _ in self._items())

    def items(self) -> Any:
        return list(self._items())

    def __repr__(self) -> str:
        # (Not its length: that reads the whole state.)
        return f"<{self._kind} state with {self._ttl!r}, as of {self._now}>"


def _earliest(stamped: Iterable[tuple[float, Any]]) -> float | None:
    return min((at for at, _ in stamped), default=None)


class ExpiryIndex:
    """Which entries of one state with a TTL may have expired, by time (see
    the module docstring). ``table`` is the state's table, with the
    ``capabilities`` its backend declares (a map or list state may be stored
    as rows, a table may load keys before they are read); ``changes`` where
    a removal is recorded."""

    def __init__(self, name: str, kind: str, ttl: StateTtl, now: Callable[[], float],
                 table: MutableMapping[Any, Any], changes: Any,
                 capabilities: TableCapabilities) -> None:
        self.name = name
        self.kind = base_kind(kind)
        self.ttl = ttl
        self.now = now
        self._table = table
        self._changes = changes
        self._rows: Any = table if capabilities.rows else None
        self._load: Callable[[Any], None] | None = (
            cast(PreloadingTable, table).load_one if capabilities.preloads else None)
        self._heap: list[tuple[float, int, Any]] = []
        #: entry id -> the time its heap item has (one live item per id).
        self._indexed: dict[Any, float] = {}
        self._seq = itertools.count()
        #: The state may hold entries the heap does not know (restored):
        #: :meth:`rebuild` before the next :meth:`expire`.
        self.stale = False
        #: Entries looked at and entries dropped, for tests and metrics.
        self.examined = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._indexed)

    def written(self, entry: Any, at: float) -> None:
        """Entry ``entry`` was written at ``at`` (the handles' hot path: a
        dict look-up, and a push only for an entry not indexed yet)."""
        s = self._indexed.get(entry)
        if s is None or at < s:
            heapq.heappush(self._heap, (at, next(self._seq), entry))
            self._indexed[entry] = at

    def expire(self, now: float | None = None) -> int:
        """Remove every entry expired at ``now`` (the clock's, by default)
        from the state, looking only at the entries due; how many were
        removed."""
        if self.stale:
            raise RuntimeError(f"state '{self.name}': its expiry index is not rebuilt")
        if now is None:
            now = self.now()
        heap, indexed, ttl = self._heap, self._indexed, self.ttl
        pop, push = heapq.heappop, heapq.heappush
        dropped = 0
        while heap and ttl.expired(heap[0][0], now):
            at, _, entry = pop(heap)
            if indexed.get(entry) != at:
                continue  # an older item of an entry indexed again since
            del indexed[entry]
            self.examined += 1
            earliest, removed = self._check(entry, now)
            dropped += removed
            if earliest is not None:
                # Rewritten since it was indexed: due again at its real time.
                push(heap, (earliest, next(self._seq), entry))
                indexed[entry] = earliest
        self.dropped += dropped
        return dropped

    def rebuild(self, items: Iterable[tuple[Any, Any]]) -> int:
        """Index every entry of ``items``, the state's ``(key, stored
        value)`` pairs (after a restore); entries indexed already stay
        (written since: the union covers the state). Returns how many
        entries were found."""
        n = sum(self.index_stored(key, stored) for key, stored in items)
        self.stale = False
        return n

    def index_stored(self, key: Any, stored: Any) -> int:
        """Index the entries of ``key``'s stored value; how many."""
        note = self.written
        if self.kind == "map":
            for mk, (at, _) in stored.items():
                note((key, mk), at)
            return len(stored)
        if self.kind == "list":
            earliest = _earliest(stored)
            if earliest is None:
                return 0
            note(key, earliest)
            return 1
        note(key, stored[0])
        return 1

    # -- one entry -----------------------------------------------------------

    def _record(self, key: Any) -> None:
        written = self._changes.keys
        if written is not None:
            written[key] = None

    def _check(self, entry: Any, now: float) -> tuple[float | None, int]:
        """Look entry ``entry`` up: remove what of it expired at ``now``.
        Returns the earliest write time of what is left (``None``: nothing)
        and how many entries (elements) were removed."""
        if self.kind == "map":
            return self._check_map(entry, now)
        if self.kind == "list":
            return self._check_list(entry, now)
        table = self._table
        if self._load is not None:
            self._load(entry)  # RocksDB: bring the key into the value cache
        stored = table.get(entry, ABSENT)
        if stored is ABSENT:
            return None, 0  # removed since
        if not self.ttl.expired(stored[0], now):
            return stored[0], 0
        table.pop(entry, None)
        self._record(entry)
        return None, 1

    def _check_map(self, entry: Any, now: float) -> tuple[float | None, int]:
        key, mk = entry
        rows = self._rows
        if rows is not None:
            stored = rows.get_entry(key, mk, ABSENT, lend=False)
            if stored is ABSENT:
                return None, 0
            if not self.ttl.expired(stored[0], now):
                return stored[0], 0
            rows.remove_entry(key, mk)
            return None, 1
        m = self._table.get(key)
        if m is None:
            return None, 0
        stored = m.get(mk, ABSENT)
        if stored is ABSENT:
            return None, 0
        if not self.ttl.expired(stored[0], now):
            return stored[0], 0
        del m[mk]
        if not m:
            self._table.pop(key, None)
        self._record(key)
        return None, 1

    def _check_list(self, key: Any, now: float) -> tuple[float | None, int]:
        # A list is rewritten without its expired elements: the memory
        # backend writes a key's whole value anyway, and a list is one
        # value per key in Flink too (its RocksDB compaction filter
        # rewrites it). The cost is the key's list, not the state.
        rows = self._rows
        stored = rows.elements(key) if rows is not None else self._table.get(key)
        if not stored:
            return None, 0
        expired = self.ttl.expired
        kept = [e for e in stored if not expired(e[0], now)]
        removed = len(stored) - len(kept)
        if removed:
            if rows is not None:
                if kept:
                    rows[key] = kept
                else:
                    del rows[key]
            else:
                if kept:
                    self._table[key] = kept
                else:
                    self._table.pop(key, None)
                self._record(key)
        return _earliest(kept), removed
