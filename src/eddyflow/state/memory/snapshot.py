"""Incremental snapshots of the memory backend.

Synchronous half (at the barrier): take each table's record of the keys
written since the last snapshot (a swap, O(number of tables)), decide
between a delta and a full snapshot, and ``fork()`` (:mod:`eddyflow.state.forked`).
Asynchronous half: the child, on a copy-on-write image of the heap as it
was at the barrier, looks the changed keys up (or takes every entry, for a
full snapshot), groups them by key group, pickles them into one file under
a temporary name in the storage's ``shared/`` folder and exits; the job's
writer process then makes the file durable under its name (fsync, rename).
So the event loop's cost of a checkpoint does not grow with the state, and
no in-place change that user code makes after the barrier can reach the
checkpoint. A snapshot whose encoding is expected to take at most
``_INLINE_SECONDS`` is cheaper to pickle at the barrier than a fork
(serialised at capture: isolated just the same); the job's writer process
writes its bytes. The expectation is the snapshot's entries times this
backend's measured time per entry (see ``_Pace``).

A snapshot's files form a *chain*: the last full file, then the deltas
written since, applied in order on restore (a delta holds the keys written,
with their values, and the keys deleted). The chain a delta builds on is
that of the last checkpoint this backend knows to be *complete*: the changes
of a checkpoint that was aborted, or is still in flight, are written again
by the next delta, so a chain never depends on a file that no completed
checkpoint references. The chain is cut (the next snapshot is full) once it
holds ``max_chain`` deltas or its deltas add up to ``max_delta_ratio`` times
its full file, bounding both restore time and the bytes kept on disk.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

from eddyflow.checkpoint.handles import StateFile
from eddyflow.checkpoint.layout import CheckpointLayout
from eddyflow.checkpoint.storage import CheckpointStorage, FileHandle
from eddyflow.state import forked
from eddyflow.state.abc import KeyedSnapshot, SnapshotTarget
from eddyflow.state.changes import Changes, Written, written_keys
from eddyflow.state.format import encode_chunks
from eddyflow.state.memory.handle import MemoryStateHandle
from eddyflow.state.serialization import state_error
from eddyflow.values import SCALARS

if TYPE_CHECKING:
    from eddyflow.state.memory.backend import MemoryKeyedStateBackend

__all__ = ["ChainPolicy", "MemorySnapshotStrategy", "shared_file_name"]

#: A snapshot expected to encode within this many seconds is encoded at the
#: barrier; a longer one by a forked child. A fork costs the parent far more
#: than the ``fork()`` call (1-4 ms): while the child lives, every page the
#: parent writes to (a reference count is enough) is copied first, which
#: slowed the parent's processing to 0.15-0.7x of its speed in a
#: measurement (see ``_Pace``), and the child takes a core of its own.
#: Forked snapshots of a state of a few thousand entries cost
#: benchmarks/overhead.py most of its throughput loss; encoded inline, a
#: snapshot costs its encoding and nothing else.
_INLINE_SECONDS = 0.01
#: A snapshot is full when the keys written since the last one are at least
#: this fraction of the entries (distinct keys, see ``Changes.count``): about
#: where a delta starts to cost more to encode than every entry (measured on
#: 1M keys: full 151 ms; a delta of 10% 77 ms, 20% 157 ms, 30% 213 ms, 50%
#: 363 ms: a delta unions the recorded keys and looks each up, a cache miss
#: each, where a full snapshot walks the table in order).
_FULL_ABOVE = 0.2
#: Below this size a full file is "small": deltas over it do not cut the chain
#: by the ratio rule alone (a growing state would write a full every time).
_SMALL = 1 << 20


@dataclass(frozen=True)
class ChainPolicy:
    max_chain: int = 10
    max_delta_ratio: float = 1.0


@dataclass(frozen=True)
class _Chain:
    files: tuple[StateFile, ...]
    base_bytes: int  # the full file's size
    delta_bytes: int  # the deltas' sizes, added up

    def cut(self, policy: ChainPolicy) -> bool:
        deltas = len(self.files) - 1
        if deltas >= policy.max_chain:
            return True
        return self.delta_bytes > policy.max_delta_ratio * max(self.base_bytes, _SMALL)


def shared_file_name(target: SnapshotTarget, operator: str, full: bool) -> str:
    """A snapshot file's path relative to the storage root: unique per
    operator, subtask, run and checkpoint."""
    kind = "full" if full else "delta"
    return CheckpointLayout.shared_prefix(target.checkpoint_id, operator, target.subtask,
                                          target.run_id) + f".{kind}"


class _Pace:
    """The measured time it takes to encode an entry of this backend's
    state (pickling an int-to-int table costs ~45 ns an entry, a table of
    small objects 250-500 ns: one constant would be wrong by 10x for one of
    them). Each encoding, at the barrier or in a forked child, updates it
    (an exponential average). Until one is measured it is the slow case's,
    so a large first snapshot forks."""

    #: The first guess, seconds per entry: a table of small objects.
    INITIAL = 500e-9
    #: Weight of the newest measurement.
    WEIGHT = 0.5

    def __init__(self) -> None:
        self.per_entry = self.INITIAL

    def expected(self, entries: int) -> float:
        """Seconds to encode ``entries`` entries, expected."""
        return entries * self.per_entry

    def measured(self, entries: int, seconds: float) -> None:
        """One encoding of ``entries`` took ``seconds``."""
        if entries > 0 and seconds > 0:
            self.per_entry += self.WEIGHT * (seconds / entries - self.per_entry)


class MemorySnapshotStrategy:
    """Both halves of the memory backend's snapshots, and its chain."""

    def __init__(self, backend: MemoryKeyedStateBackend, policy: ChainPolicy) -> None:
        self.backend = backend
        self.policy = policy
        self._confirmed: _Chain | None = None
        self._pending: dict[int, _Chain] = {}
        self._taken = 0
        self._pace = _Pace()
        # Keys written since the confirmed chain, per snapshot taken since
        # (with how many; None: too many to have been recorded): a delta
        # writes them all, so a chain never needs an unconfirmed file.
        self._unconfirmed: list[tuple[int, dict[str, Written], int | None]] = []

    @property
    def fresh(self) -> bool:
        """No key recorded now would be read: no snapshot was taken yet
        (the first one is full) or every snapshot is full."""
        return self._taken == 0 or self.policy.max_chain == 0

    def budget(self) -> float:
        """How many keys a table may record before its next snapshot is
        surely full (see :class:`~eddyflow.state.abc.Changes`): as many as
        a fifth of the entries, the bound above which this strategy writes a full
        snapshot rather than a delta."""
        return _FULL_ABOVE * self.backend.entry_count()

    def snapshot(self, target: SnapshotTarget, tables: dict[str, dict[Any, Any]],
                 changes: Mapping[str, Changes]) -> KeyedSnapshot:
        sizes = {name: ch.count() for name, ch in changes.items()}
        taken = {name: ch.take_written() for name, ch in changes.items()}
        self._taken += 1
        if self.fresh:
            for ch in changes.values():
                ch.saturate()
        written = {name: w for name, w in taken.items() if w is not None}
        # A table that stopped recording: the next snapshot that needs its
        # keys (a delta over a chain older than this one) is full instead.
        count = None if len(written) < len(taken) else sum(sizes.values())
        self._unconfirmed.append((target.checkpoint_id, written, count))
        base = self._confirmed
        full = base is None or base.cut(self.policy)
        backend = self.backend
        kinds = backend.kinds
        entries = sum(map(len, tables.values()))
        key_sets: list[dict[str, Written]] = []
        size = entries
        if not full:
            # Keys recorded since the confirmed chain (distinct per snapshot,
            # see Changes.count; a key written in two snapshots' intervals
            # counts twice: an upper bound of what a delta would hold).
            counts = [n for _, _, n in self._unconfirmed]
            changed = None if None in counts else sum(n for n in counts if n is not None)
            if changed == 0:
                # Nothing changed since the confirmed chain: it is this snapshot.
                assert base is not None
                return _Snapshot(self, target, kinds, entries, None, base, full=False)
            if changed is not None and changed < _FULL_ABOVE * entries:
                key_sets = [w for _, w, _ in self._unconfirmed]
                size = changed
            else:
                # A delta of most keys costs more than everything: its keys
                # are looked up one by one, in the order they were written
                # (a cache miss each: measured 2.5 s for 730k of 1M keys),
                # where a full snapshot copies the table's arrays in order
                # (0.6 s for all 1M), and its bytes are nearly as many.
                full = True
        rel = shared_file_name(target, backend.operator, full)
        mp = backend.max_parallelism
        cheap = self._pace.expected(size) <= _INLINE_SECONDS
        if target.at_end and not cheap:
            # Nothing else runs: a fork would cost more, and its child would
            # not run beside any processing. Encoded here, straight into the
            # file (never all in memory at once, nor copied through the
            # writer's pipe: 65 ms of 18 MB for 1M keys), then sealed.
            t0 = time.perf_counter()
            streamed = _encode_to_file(target.storage, rel, dict(tables), key_sets, full, mp,
                                       backend.operator, target.checkpoint_id)
            self._pace.measured(size, time.perf_counter() - t0)
            return _Snapshot(self, target, kinds, entries, None, None if full else base, full,
                             streamed=streamed)
        if cheap or not forked.ENABLED:
            # Small: serialised here, at the barrier (cheaper than a fork),
            # and written by the job's writer process.
            t0 = time.perf_counter()
            encoded = _encode(dict(tables), key_sets, full, mp, backend.operator,
                              target.checkpoint_id)
            self._pace.measured(size, time.perf_counter() - t0)
            return _Snapshot(self, target, kinds, entries, None, None if full else base, full,
                             (rel, encoded))
        work = forked.start(functools.partial(
            _encode_in_child, target.storage, rel, dict(tables), key_sets, full, mp,
            backend.operator, target.checkpoint_id))
        return _Snapshot(self, target, kinds, entries, work, None if full else base, full,
                         size=size)

    def record(self, checkpoint_id: int, chain: _Chain) -> None:
        self._pending[checkpoint_id] = chain

    def confirm(self, checkpoint_id: int) -> None:
        chain = self._pending.get(checkpoint_id)
        if chain is None:
            return  # not one of this backend's snapshots (taken before a restore)
        self._confirmed = chain
        self._pending = {n: c for n, c in self._pending.items() if n > checkpoint_id}
        self._unconfirmed = [u for u in self._unconfirmed if u[0] > checkpoint_id]

    def abort(self, checkpoint_id: int) -> None:
        # Its keys stay in _unconfirmed: the next delta writes them again.
        self._pending.pop(checkpoint_id, None)

    def encoded_in_child(self, entries: int, seconds: float) -> None:
        """A forked child encoded ``entries`` entries in ``seconds``."""
        self._pace.measured(entries, seconds)


class _Snapshot(KeyedSnapshot):
    def __init__(self, strategy: MemorySnapshotStrategy, target: SnapshotTarget,
                 kinds: dict[str, str], entries: int, work: forked.ChildWork | None,
                 base: _Chain | None, full: bool,
                 encoded: tuple[str, _Encoded | None] | None = None,
                 streamed: _Streamed | None = None, size: int = 0) -> None:
        self.encoded = encoded
        self.size = size  # the entries a forked child encodes
        self.streamed = streamed
        self.strategy = strategy
        self.target = target
        self.kinds = kinds
        self.entries = entries
        self.work = work
        self.base = base
        self.full = full

    async def write(self) -> MemoryStateHandle:
        base = self.base
        files = base.files if base is not None else ()
        base_bytes = base.base_bytes if base is not None else 0
        delta_bytes = base.delta_bytes if base is not None else 0
        new: frozenset[str] = frozenset()
        written: _Written | None = None
        if self.encoded is not None:
            rel, encoded = self.encoded
            self.encoded = None
            if encoded is not None:
                chunks, index = encoded
                h = await self.target.storage.write_file(rel, chunks)
                written = (h.path, h.size, h.sha256, index)
        if self.work is not None:
            # The child encoded the file under a temporary name and exited;
            # the writer process seals it (fsync, rename), so the child's
            # life (and the copy-on-write faults it costs this process)
            # does not last an fsync longer.
            done: _InChild | None = await self.work.result()
            self.work = None
            if done is not None:
                rel, tmp, index, seconds = done
                self.streamed = (rel, tmp, index)
                self.strategy.encoded_in_child(self.size, seconds)
        if self.streamed is not None:
            rel, tmp, index = self.streamed
            try:
                h = await self.target.storage.seal(rel, tmp)
            except BaseException:
                _remove(tmp)
                raise
            finally:
                self.streamed = None
            written = (h.path, h.size, h.sha256, index)
        if written is not None:
            path, size, sha, index = written
            files = (*files, StateFile(FileHandle(path, size, sha), index, self.full,
                                       grouped=False))
            new = frozenset({path})
            if self.full:
                base_bytes = size
            else:
                delta_bytes += size
        self.strategy.record(self.target.checkpoint_id, _Chain(files, base_bytes, delta_bytes))
        backend = self.strategy.backend
        return MemoryStateHandle(self.kinds, self.entries, backend.key_groups, files,
                                 new_files=new)

    def cancel(self) -> None:
        if self.work is not None:
            self.work.cancel()
            self.work = None
        if self.streamed is not None:
            _remove(self.streamed[1])
            self.streamed = None


_Encoded = tuple[list[bytes], dict[str, tuple[int, int]]]
#: A file encoded under a temporary name: (its path relative to the storage
#: root, the temporary file's absolute path, its frame index).
_Streamed = tuple[str, str, dict[str, tuple[int, int]]]
#: What a forked child answers: :data:`_Streamed` and its encoding's seconds.
_InChild = tuple[str, str, dict[str, tuple[int, int]], float]
_ABSENT: Any = object()
_Written = tuple[str, int, str, dict[str, tuple[int, int]]]


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _encode_in_child(storage: CheckpointStorage, rel: str, tables: dict[str, dict[Any, Any]],
                     key_sets: list[dict[str, Written]], full: bool, max_parallelism: int,
                     operator: str, checkpoint: int) -> _InChild | None:
    """The forked child's work: encode (see :func:`_encode`) straight into
    a temporary file next to ``rel``, for the parent to seal; ``None`` when
    there is nothing to write. Also how long the encoding took. (Streamed:
    the child's private memory does not grow by the encoded snapshot, nor
    by a copy of it.)"""
    t0 = time.perf_counter()
    streamed = _encode_to_file(storage, rel, tables, key_sets, full, max_parallelism,
                               operator, checkpoint)
    if streamed is None:
        return None
    rel, tmp, index = streamed
    return rel, tmp, index, time.perf_counter() - t0


def _encode_to_file(storage: CheckpointStorage, rel: str, tables: dict[str, dict[Any, Any]],
                    key_sets: list[dict[str, Written]], full: bool, max_parallelism: int,
                    operator: str, checkpoint: int) -> _Streamed | None:
    """:func:`_encode` into a new temporary file next to ``rel``, for
    :meth:`~eddyflow.checkpoint.storage.CheckpointStorage.seal`; ``None`` (and no
    file) when there is nothing to write."""
    tmp, out = storage.open_temp(rel)
    try:
        with out:
            encoded = _encode(tables, key_sets, full, max_parallelism, operator, checkpoint,
                              out)
    except BaseException:
        _remove(tmp)
        raise
    if encoded is None:
        _remove(tmp)
        return None
    return rel, tmp, encoded[1]


def _encode(tables: dict[str, dict[Any, Any]], key_sets: list[dict[str, Written]],
            full: bool, max_parallelism: int, operator: str, checkpoint: int,
            out: BinaryIO | None = None) -> _Encoded | None:
    """A snapshot's frames (ungrouped: see ``state/format.py``): every entry
    of ``tables`` (``full``), or the entries of the keys in ``key_sets``
    (written: their value; gone: deleted). ``None`` when there is nothing
    to write. A value that cannot be pickled raises a
    :class:`~eddyflow.errors.StateSerializationError` naming ``operator``,
    its state and key, and ``checkpoint``."""
    columns: list[tuple[str, list[Any], list[Any], list[Any]]] = []
    whole: list[tuple[str, dict[Any, Any]]] = []
    for name, table in tables.items():
        if full:
            if not table:
                continue
            if set(map(type, table.values())) <= SCALARS:
                whole.append((name, table))
            else:
                columns.append((name, list(table), list(table.values()), []))
            continue
        keys: set[Any] = set()
        for written in key_sets:
            w = written.get(name)
            if w is not None:
                keys.update(written_keys(w))
        if not keys:
            continue
        # One look-up per key (each a likely cache miss): the value, or absent.
        values = list(map(table.get, keys, itertools.repeat(_ABSENT)))
        # (By identity: a value's own __eq__ is not to be trusted.)
        if id(_ABSENT) in map(id, values):
            present, kept, deleted = [], [], []
            for k, v in zip(keys, values, strict=True):
                if v is _ABSENT:
                    deleted.append(k)
                else:
                    present.append(k)
                    kept.append(v)
            columns.append((name, present, kept, deleted))
        else:
            columns.append((name, list(keys), values, []))
    if not columns and not whole:
        return None
    try:
        return encode_chunks(columns, whole, out)
    except Exception as exc:
        raise _unpicklable(exc, columns, whole, operator, checkpoint) from exc


def _unpicklable(exc: Exception, columns: list[tuple[str, list[Any], list[Any], list[Any]]],
                 whole: list[tuple[str, dict[Any, Any]]], operator: str, checkpoint: int
                 ) -> BaseException:
    """Name the operator, state and key whose value cannot be written (or
    ``exc`` itself if every value pickles on its own)."""
    for name, keys, values, _ in columns:
        error = state_error(exc, zip(keys, values, strict=True), operator=operator,
                            state=name, checkpoint=checkpoint)
        if error is not exc:
            return error
    for name, table in whole:
        error = state_error(exc, table.items(), operator=operator, state=name,
                            checkpoint=checkpoint)
        if error is not exc:
            return error
    return exc
