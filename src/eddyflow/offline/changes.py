"""The keyed-state changes between two checkpoints of one checkpoint
directory (``read_changes``): Spark's ``readChangeFeed`` for eddyflow.

What the rows mean. ``read_changes(spark, dir, start=a, end=b)`` gives, per
(operator, state, key), at most one row: ``upsert`` with the key's value at
``b``, or ``delete``; applying the rows to the state of checkpoint ``a``
(an upsert sets the entry, a delete removes it) gives the state of ``b``,
and every entry that differs between ``a`` and ``b`` has its row. It is the
*net* change over ``(a, b]``, not one row per checkpoint in between
(``checkpoint`` is ``b`` in every row: the checkpoint the value is from);
for the changes checkpoint by checkpoint, read consecutive pairs.

Where the rows come from, subtask by subtask of the end checkpoint (the plan,
:func:`plan_changes`, is made on the driver from the two metadata files):

* Same files in both (nothing was written): nothing is read.
* Memory backend (a backend whose registration gives ``delta_files``,
  ``state/registry.py``), the end's chain of files extending the start's
  (same key groups, the start's files a prefix of the end's): only the delta
  files added after ``a`` are read — each holds the keys written since the file
  before it, with their values, and the keys deleted — and the last write
  of each key wins. So the cost follows what changed, not the state's size.
  Reading only those files, a key written between ``a`` and ``b`` that ends
  with the value it had at ``a`` shows as an upsert of that same value,
  and a key created and deleted between them as a delete; ``exact=True``
  leaves those out, comparing with ``a``'s values (it reads ``a``'s state
  of those subtasks too: a join, as below).
* Otherwise — a RocksDB checkpoint (rocksdict cannot read an SST file on
  its own: it offers no table reader, and ingesting refuses the files a
  database wrote, so the changed rows of the new SST files cannot be
  listed without opening the whole database), a chain that was cut (a new
  full file), or a rescaled pair (the start at another parallelism) — a
  distributed diff: both states of the subtask's key groups are read (each
  file verified) and full-outer joined by (operator, state, key),
  partitioned by key group (never by Python's ``hash``), values compared
  by ``==`` (or, failing that, by their pickled bytes: a NaN equals itself).

Values are shown as :func:`~eddyflow.offline.readers.read_state` shows them
(a state with a time-to-live without its write times), with typed key and
value columns where they are simple (``as_text=True``: text). How many
bytes the plan reads, against the end checkpoint's whole keyed state, is
logged at INFO and is :attr:`ChangesPlan.bytes_read`.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.handles import StateFile
from eddyflow.checkpoint.storage import CheckpointStorage, FileHandle
from eddyflow.offline.checkpoint import (
    CheckpointRef,
    KeyedFile,
    keyed_files,
    open_checkpoint,
    read_keyed_file,
)
from eddyflow.offline.shipping import ship_to_executors
from eddyflow.state.format import DELETED, read_state_file
from eddyflow.state.registry import kind_of
from eddyflow.state.ttl import ABSENT, has_ttl, unwrap

__all__ = ["ChangesPlan", "DeltaUnit", "DiffUnit", "plan_changes", "read_changes"]

log = logging.getLogger("eddyflow.offline")

UPSERT = "upsert"
DELETE = "delete"


@dataclass(frozen=True)
class DeltaUnit:
    """One subtask whose end chain extends its start chain: ``files``, the
    delta files added after the start, are all that is read (and ``start``,
    the subtask at the start, only for ``exact``)."""

    operator: str
    end: KeyedFile
    files: tuple[StateFile, ...]
    start: KeyedFile | None = None

    @property
    def handles(self) -> list[FileHandle]:
        read = [f.handle for f in self.files]
        if self.start is not None:
            read += _handles(self.start)
        return read


@dataclass(frozen=True)
class DiffUnit:
    """Key groups compared by a diff: the end's and the start's subtasks
    holding them, both read whole (within ``groups``: ``None``, all)."""

    operator: str
    end: tuple[KeyedFile, ...]
    start: tuple[KeyedFile, ...]
    groups: tuple[range, ...] | None

    @property
    def handles(self) -> list[FileHandle]:
        return [h for kf in (*self.end, *self.start) for h in _handles(kf)]


@dataclass(frozen=True)
class ChangesPlan:
    """What :func:`read_changes` reads for a pair of checkpoints."""

    start: int
    end: int
    deltas: tuple[DeltaUnit, ...]
    diffs: tuple[DiffUnit, ...]
    #: Subtasks whose state files are the same in both: not read.
    unchanged: int
    #: The end checkpoint's keyed state (of the operators asked for), bytes.
    full_bytes: int
    exact: bool = False
    #: The two checkpoints, verified once by the plan (what to ship follows
    #: from them: either may hold RocksDB state, since a restore can switch).
    checkpoints: tuple[CheckpointRef, ...] = ()

    @property
    def units(self) -> list[DeltaUnit | DiffUnit]:
        return [*self.deltas, *self.diffs]

    @property
    def bytes_read(self) -> int:
        """Bytes of the files the plan reads (each once per unit)."""
        return sum(h.size for u in self.units for h in u.handles)

    @property
    def files_read(self) -> list[str]:
        """The files the plan reads (relative to the directory)."""
        return sorted({h.path for u in self.units for h in u.handles})

    def describe(self) -> str:
        return (f"changes {self.start} -> {self.end}: {self.unchanged} subtask(s) unchanged, "
                f"{len(self.deltas)} from delta files, {len(self.diffs)} by diff; reading "
                f"{self.bytes_read:,} bytes of {self.full_bytes:,} (the end checkpoint's "
                f"keyed state)")


def _handles(kf: KeyedFile) -> list[FileHandle]:
    return kf.handle.file_handles()


def _same_state(a: KeyedFile, b: KeyedFile) -> bool:
    """Both hold the same entries (as their backend's registration tells):
    nothing to read."""
    return (a.handle.backend == b.handle.backend
            and kind_of(a.handle).same_state(a.handle, b.handle))


def _extension(a: KeyedFile, b: KeyedFile) -> tuple[StateFile, ...] | None:
    """The delta files that hold every change from ``a`` to ``b``, if their
    backend's registration has such files (the memory backend, when ``b``'s
    chain extends ``a``'s)."""
    if a.handle.backend != b.handle.backend:
        return None
    return kind_of(a.handle).delta_files(a.handle, b.handle)


def _minus(r: range, cover: Iterable[range]) -> list[range]:
    """The parts of ``r`` outside every range of ``cover``."""
    parts = [r]
    for c in cover:
        out = []
        for p in parts:
            if p.start < c.start:
                out.append(range(p.start, min(p.stop, c.start)))
            if p.stop > c.stop:
                out.append(range(max(p.start, c.stop), p.stop))
        parts = [p for p in out if len(p)]
    return parts


def _overlaps(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def _keyed_operators(ref: CheckpointRef) -> set[str]:
    return {uid for uid, op in ref.meta.operators.items()
            if any(p.keyed is not None for p in op.subtasks.values())}


def _plan_operator(op: str, a_files: list[KeyedFile], b_files: list[KeyedFile], exact: bool,
                   deltas: list[DeltaUnit], diffs: list[DiffUnit]) -> int:
    """Plan one operator's units; returns how many subtasks are unchanged."""
    if any(kf.key_groups is None for kf in (*a_files, *b_files)):
        # Key groups unknown (metadata format 1): one diff of it all.
        diffs.append(DiffUnit(op, tuple(b_files), tuple(a_files), None))
        return 0
    unchanged = 0
    for kb in b_files:
        rb = kb.key_groups
        assert rb is not None
        twin = next((ka for ka in a_files if ka.key_groups == rb), None)
        if twin is not None:
            if _same_state(twin, kb):
                unchanged += 1
                continue
            new = _extension(twin, kb)
            if new is not None:
                deltas.append(DeltaUnit(op, kb, new, twin if exact else None))
                continue
        start = tuple(ka for ka in a_files if _overlaps(ka.key_groups or rb, rb))
        diffs.append(DiffUnit(op, (kb,), start, (rb,)))
    # Key groups the start held and the end has no subtask for (an operator
    # gone, or its state with it): all deleted.
    covered = [kb.key_groups or range(0) for kb in b_files]
    for ka in a_files:
        ra = ka.key_groups
        assert ra is not None
        left = _minus(ra, covered)
        if left:
            diffs.append(DiffUnit(op, (), (ka,), tuple(left)))
    return unchanged


def plan_changes(directory: str | os.PathLike[str], start: int, end: int,
                 operator: str | None = None, *, exact: bool = False) -> ChangesPlan:
    """Which files :func:`read_changes` reads, and how (see the module
    docstring); on the driver, from the two checkpoints' metadata only."""
    if start >= end:
        raise ValueError(f"read_changes: start ({start}) must come before end ({end})")
    a = open_checkpoint(directory, start)
    b = open_checkpoint(directory, end)
    if a.meta.max_parallelism != b.meta.max_parallelism:
        raise ValueError(
            f"read_changes: checkpoints {start} and {end} of {a.root!r} have different "
            f"max parallelism ({a.meta.max_parallelism}, {b.meta.max_parallelism}): their "
            "key groups do not compare")
    ops = sorted(_keyed_operators(a) | _keyed_operators(b))
    if operator is not None:
        if operator not in ops:
            raise KeyError(f"checkpoints {start} and {end} have no keyed state of operator "
                           f"{operator!r}; they have {ops}")
        ops = [operator]
    deltas: list[DeltaUnit] = []
    diffs: list[DiffUnit] = []
    unchanged = 0
    full = 0
    for op in ops:
        a_files = keyed_files(a, op) if op in _keyed_operators(a) else []
        b_files = keyed_files(b, op) if op in _keyed_operators(b) else []
        full += sum(h.size for kf in b_files for h in _handles(kf))
        unchanged += _plan_operator(op, a_files, b_files, exact, deltas, diffs)
    return ChangesPlan(start, end, tuple(deltas), tuple(diffs), unchanged, full, exact,
                       (a, b))


# -- on the executors ---------------------------------------------------------------


def _user_value(kinds: Any, name: str, value: Any) -> Any:
    """A stored value as user code reads it (``ABSENT``: nothing visible)."""
    kind = kinds.get(name, "value")
    return unwrap(kind, value) if has_ttl(kind) else value


def _delta_entries(unit: DeltaUnit) -> dict[tuple[str, Any], tuple[int, Any]]:
    """The last write of each key in the unit's delta files, each file
    verified: ``(state, key) -> (key group, value or DELETED)``."""
    kf = unit.end
    storage = CheckpointStorage(kf.root)
    owner = kf.key_groups
    last: dict[tuple[str, Any], tuple[int, Any]] = {}
    for f in unit.files:
        storage.verify_file(f.handle)
        for kg, name, key, value in read_state_file(kf.root, f, owner=owner,
                                                    max_parallelism=kf.max_parallelism,
                                                    with_groups=True):
            last[(name, key)] = (kg, value)
    return last


def _delta_rows(unit: DeltaUnit) -> Iterator[tuple[int, str, str, Any, Any]]:
    """``(key group, change, state, key, value)`` of a delta unit, not
    compared with the start."""
    kinds = unit.end.kinds
    for (name, key), (kg, value) in _delta_entries(unit).items():
        if value is not DELETED:
            value = _user_value(kinds, name, value)
        if value is DELETED or value is ABSENT:
            yield kg, DELETE, name, key, None
        else:
            yield kg, UPSERT, name, key, value


_JoinKey = tuple[int, str, str, Any]  # key group, operator, state, key


def _delta_sides(unit: DeltaUnit) -> Iterator[tuple[_JoinKey, tuple[Any, ...]]]:
    """A delta unit's writes, and the start's entries of its subtask, for
    the join (``exact``): a start entry no write touches is unchanged."""
    op = unit.operator
    for kg, change, name, key, value in _delta_rows(unit):
        yield (kg, op, name, key), ("b", DELETED if change == DELETE else value)
    assert unit.start is not None
    yield from _start_side(unit.start, op, None, missing_deletes=False)


def _start_side(kf: KeyedFile, op: str, groups: tuple[range, ...] | None, *,
                missing_deletes: bool) -> Iterator[tuple[_JoinKey, tuple[Any, ...]]]:
    for kg, name, key, value in _read(kf, groups):
        value = _user_value(kf.kinds, name, value)
        if value is not ABSENT:
            yield (kg, op, name, key), ("a", value, missing_deletes)


def _read(kf: KeyedFile, groups: tuple[range, ...] | None
          ) -> Iterator[tuple[int, str, Any, Any]]:
    """A subtask's entries (its files verified) in ``groups``."""
    if groups is None:
        yield from read_keyed_file(kf)
        return
    span = range(min(g.start for g in groups), max(g.stop for g in groups))
    for kg, name, key, value in read_keyed_file(kf, span):
        if any(kg in g for g in groups):
            yield kg, name, key, value


def _diff_sides(unit: DiffUnit) -> Iterator[tuple[_JoinKey, tuple[Any, ...]]]:
    op = unit.operator
    for kf in unit.end:
        for kg, name, key, value in _read(kf, unit.groups):
            value = _user_value(kf.kinds, name, value)
            if value is not ABSENT:
                yield (kg, op, name, key), ("b", value)
    for kf in unit.start:
        yield from _start_side(kf, op, unit.groups, missing_deletes=True)


def _sides(unit: DeltaUnit | DiffUnit) -> Iterator[tuple[_JoinKey, tuple[Any, ...]]]:
    return _delta_sides(unit) if isinstance(unit, DeltaUnit) else _diff_sides(unit)


def _key_group_of(k: _JoinKey) -> int:
    return k[0]


def same_value(x: Any, y: Any) -> bool:
    """Whether two values of one entry are the same: ``==``, or (a NaN, or
    a value whose ``==`` fails) the same pickled bytes."""
    try:
        if bool(x == y):
            return True
    except Exception:
        pass
    try:
        return pickle.dumps(x, pickle.HIGHEST_PROTOCOL) == pickle.dumps(y, pickle.HIGHEST_PROTOCOL)
    except Exception:
        return False


def _compare(item: tuple[_JoinKey, Iterable[tuple[Any, ...]]]
             ) -> Iterator[tuple[int, str, str, str, Any, Any]]:
    """``(key group, change, operator, state, key, value)`` of one joined
    key, if it changed."""
    (kg, op, name, key), sides = item
    start: Any = ABSENT
    end: Any = None  # no write: an ("a", ..., missing_deletes) decides
    missing_deletes = False
    for side in sides:
        if side[0] == "a":
            start, missing_deletes = side[1], side[2]
        else:
            end = side
    if end is None:
        if start is not ABSENT and missing_deletes:
            yield kg, DELETE, op, name, key, None
        return
    value = end[1]
    if value is DELETED:
        if start is not ABSENT:
            yield kg, DELETE, op, name, key, None
    elif start is ABSENT or not same_value(start, value):
        yield kg, UPSERT, op, name, key, value


def _direct(unit: DeltaUnit) -> Iterator[tuple[int, str, str, str, Any, Any]]:
    for kg, change, name, key, value in _delta_rows(unit):
        yield kg, change, unit.operator, name, key, value


def _row(checkpoint: int, r: tuple[int, str, str, str, Any, Any]) -> tuple[Any, ...]:
    kg, change, op, name, key, value = r
    return checkpoint, change, op, kg, key, name, value


# -- on the driver ------------------------------------------------------------------


def read_changes(spark: Any, directory: str | os.PathLike[str], start: int, end: int,
                 operator: str | None = None, *, exact: bool = False,
                 as_text: bool = False) -> Any:
    """The keyed-state changes between checkpoints ``start`` and ``end`` of
    checkpoint directory ``directory`` (both retained), of ``operator``
    only if given: ``checkpoint, change, operator, key_group, key, state,
    value`` with ``change`` ``"upsert"`` or ``"delete"`` (``value`` null).
    See the module docstring for what the rows are and what is read."""
    from pyspark.sql import types as T

    from eddyflow.offline.typed import Column, frame

    plan = plan_changes(directory, start, end, operator, exact=exact)
    log.info("read_changes: %s", plan.describe())
    for ref in plan.checkpoints:
        ship_to_executors(spark, checkpoint=ref)
    sc = spark.sparkContext
    parts = []
    direct = [u for u in plan.deltas if u.start is None]
    if direct:
        parts.append(sc.parallelize(direct, len(direct)).flatMap(_direct))
    joined: list[DeltaUnit | DiffUnit] = [*(u for u in plan.deltas if u.start is not None),
                                          *plan.diffs]
    if joined:
        n = max(sc.defaultParallelism, len(joined))
        parts.append(sc.parallelize(joined, len(joined)).flatMap(_sides)
                     .groupByKey(n, partitionFunc=_key_group_of).flatMap(_compare))
    rows = (sc.union(parts) if len(parts) > 1 else parts[0] if parts else sc.emptyRDD())
    rows = rows.map(functools.partial(_row, plan.end))
    return frame(spark, rows, [
        Column("checkpoint", T.LongType(), False),
        Column("change", T.StringType(), False),
        Column("operator", T.StringType(), False),
        Column("key_group", T.IntegerType(), False),
        Column("key"),
        Column("state", T.StringType(), False),
        Column("value"),
    ], as_text=as_text)
