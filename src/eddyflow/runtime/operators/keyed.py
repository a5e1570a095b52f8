"""Keyed operators: ``KeyedOperator``, the base of every operator that holds
keyed state (its backend, prefetching, snapshots, restore checks), and the
running aggregates ``count``, ``reduce``, ``sum`` and ``map_with_state``.

Whether an operator is keyed has one source: its spec is a ``KeyedSpec``,
whose ``instantiate`` returns a ``KeyedOperator``. ``DataStream`` marks the
graph node keyed from the spec (so the plan checks its parallelism), and
the offline evaluation replays the specs that are ``KeyedSpec`` by key.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.errors import IncompatibleCheckpoint
from eddyflow.keygroups import check_key
from eddyflow.runtime.operators.base import Operator, OperatorContext, OperatorSnapshot
from eddyflow.state.abc import KeyedStateBackend, SnapshotTarget
from eddyflow.state.changes import Changes
from eddyflow.state.ttl import ttl_clash

__all__ = [
    "KeyedCountSpec",
    "KeyedOperator",
    "KeyedReduceSpec",
    "KeyedSpec",
    "KeyedSumSpec",
    "MapWithStateSpec",
]

_MISSING: Any = object()


_key_of = operator.itemgetter(0)


@dataclass(frozen=True)
class KeyedSpec(ABC):
    """The spec of an operator that holds keyed state, partitioned by
    ``key_fn``: the one place that says an operator is keyed."""

    key_fn: Callable[[Any], Any]

    @abstractmethod
    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        """The keyed operator of the subtask ``ctx`` describes."""


class KeyedOperator(Operator):
    """An operator with keyed state: a keyed backend for its subtask's key
    groups, the key selector, and where a failing batch failed."""

    keyed = True

    def record_failure(self, batch: list[Any], index: int, exc: Exception, key: Any) -> None:
        """Record where a batch failed; name an unhashable key for what it is."""
        self.failed_index = index
        if index < len(batch):
            try:
                self.key_fn(batch[index])
            except Exception:
                self.key_failed = True
        if isinstance(exc, TypeError):
            check_key(key)  # raises UnsupportedKeyError for a list, dict, set …

    state_name = "value"
    state_kind = "value"

    def _record(self, out: list[tuple[Any, Any]]) -> None:
        """Record the keys of ``(key, new value)`` outputs as written: one
        list built at C speed per batch (see ``Changes``)."""
        changes = self.changes
        if changes.keys is not None and out:
            changes.add_batch(list(map(_key_of, out)))

    def __init__(self, ctx: OperatorContext, key_fn: Callable[[Any], Any]) -> None:
        super().__init__(ctx)
        self.key_fn = key_fn
        self.backend: KeyedStateBackend | None = None
        self.table: Any = {}
        # Where writes to the table are recorded; read its ``keys`` per batch.
        self.changes = Changes(False)
        self._load: Callable[[Any], None] | None = None
        self._needs_keys: Callable[[], bool] | None = None

    def open(self) -> None:
        self.backend = self.ctx.keyed_backend()
        self.table = self.backend.declare(self.state_name, self.state_kind)
        self.changes = self.backend.changes(self.state_name)
        # A table that caches a database (RocksDB) loads a batch's keys in
        # one round-trip before the loop looks them up.
        preloads = self.backend.capabilities(self.state_name).preloads
        self._load = self.table.load if preloads else None
        self._needs_keys = self.table.needs_keys if preloads else None

    def _prefetch(self, batch: list[Any]) -> None:
        load = self._load
        if load is None:
            return
        needs_keys = self._needs_keys
        if needs_keys is not None and not needs_keys():
            return
        kf = self.key_fn
        keys = []
        try:
            for r in batch:
                keys.append(kf(r))
            load(keys)
        except Exception:
            # The loop meets the failing record (or key) and reports it; the
            # keys before it must be loaded all the same.
            for k in keys:
                try:
                    load((k,))
                except Exception:
                    break

    def close(self) -> None:
        # The backend stays reachable: JobResult.state reads it after the run.
        if self.backend is not None:
            self.backend.close()

    def snapshot(self, checkpoint_id: int, target: SnapshotTarget | None = None
                 ) -> OperatorSnapshot | None:
        if target is None:
            return None
        assert self.backend is not None
        return OperatorSnapshot(keyed=self.backend.snapshot(target))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.backend is not None:
            self.backend.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self.backend is not None:
            self.backend.notify_checkpoint_aborted(checkpoint_id)

    def restore_keyed(self, root: str, kinds: dict[str, str],
                      handles: list[KeyedStateHandle]) -> None:
        assert self.backend is not None
        # The states ``open`` declared are known only now (a process
        # function declares its own): a checkpointed state of the same name
        # but another kind cannot be read as the declared one. Say so, not
        # "already declared".
        # A time-to-live switched on or off is such a clash too: a state
        # with a TTL has a kind of its own, its values stored with their
        # write times (state/ttl.py), as Flink refuses it
        # (StateMigrationException). Changing the TTL's duration is not: the
        # stored write times hold under any duration.
        declared = self.backend.kinds
        clash: list[str] = []
        ttl_switched = False
        for name, kind in sorted(kinds.items()):
            wanted = declared.get(name, kind)
            if wanted == kind:
                continue
            sentence = ttl_clash(name, kind, wanted, self.backend.ttl_of(name))
            ttl_switched |= sentence is not None
            clash.append(sentence or f"the checkpoint holds its state '{name}' as {kind} "
                                     f"state, the job declares it as {wanted} state")
        if clash:
            advice = ("a state of another kind needs a name of its own" if not ttl_switched
                      else "a state cannot gain or lose its time-to-live across a restore, "
                      "its stored values differ: keep its TTL setting, or give it a new name")
            raise IncompatibleCheckpoint(
                f"cannot restore operator '{self.uid}': " + "; ".join(clash)
                + f" ({advice})", problems=tuple(clash))
        self.backend.restore_from(root, kinds, handles)
        # The expiry indexes learn the restored entries now, not at the
        # first barrier.
        self.backend.rebuild_ttl()


class _Count(KeyedOperator):
    one_to_one = True
    state_name = "count"

    def process(self, batch: list[Any]) -> list[Any]:
        if self._load is not None:
            self._prefetch(batch)
        kf = self.key_fn
        table = self.table
        get = table.get
        out: list[Any] = []
        append = out.append
        k: Any = None
        try:
            for r in batch:
                k = kf(r)
                c = get(k)
                if c is None:
                    check_key(k)  # reject keys without a stable hash on first sight
                    c = 0
                c += 1
                table[k] = c
                append((k, c))
        except Exception as exc:
            self._record(out)
            self.record_failure(batch, len(out), exc, k)
            raise
        self._record(out)
        return out


class _Reduce(KeyedOperator):
    one_to_one = True
    state_name = "reduce"

    def __init__(self, ctx: OperatorContext, key_fn: Callable[[Any], Any],
                 fn: Callable[[Any, Any], Any]) -> None:
        super().__init__(ctx, key_fn)
        self.fn = fn

    def process(self, batch: list[Any]) -> list[Any]:
        if self._load is not None:
            self._prefetch(batch)
        kf, fn, table = self.key_fn, self.fn, self.table
        get = table.get
        out: list[Any] = []
        append = out.append
        k: Any = None
        try:
            for r in batch:
                k = kf(r)
                old = get(k, _MISSING)
                if old is _MISSING:
                    check_key(k)
                    v = r
                else:
                    v = fn(old, r)
                table[k] = v
                append((k, v))
        except Exception as exc:
            self._record(out)
            self.record_failure(batch, len(out), exc, k)
            raise
        self._record(out)
        return out


class _Sum(KeyedOperator):
    one_to_one = True
    state_name = "sum"

    def __init__(self, ctx: OperatorContext, key_fn: Callable[[Any], Any],
                 value_fn: Callable[[Any], Any]) -> None:
        super().__init__(ctx, key_fn)
        self.value_fn = value_fn

    def process(self, batch: list[Any]) -> list[Any]:
        if self._load is not None:
            self._prefetch(batch)
        kf, vf, table = self.key_fn, self.value_fn, self.table
        get = table.get
        out: list[Any] = []
        append = out.append
        k: Any = None
        try:
            for r in batch:
                k = kf(r)
                s = get(k, _MISSING)
                if s is _MISSING:
                    check_key(k)
                    s = vf(r)
                else:
                    s = s + vf(r)
                table[k] = s
                append((k, s))
        except Exception as exc:
            self._record(out)
            self.record_failure(batch, len(out), exc, k)
            raise
        self._record(out)
        return out


class _MapWithState(KeyedOperator):
    one_to_one = True
    state_name = "state"

    def __init__(self, ctx: OperatorContext, key_fn: Callable[[Any], Any],
                 fn: Callable[[Any, Any], tuple[Any, Any]]) -> None:
        super().__init__(ctx, key_fn)
        self.fn = fn

    def process(self, batch: list[Any]) -> list[Any]:
        if self._load is not None:
            self._prefetch(batch)
        kf, fn, table = self.key_fn, self.fn, self.table
        get = table.get
        out: list[Any] = []
        append = out.append
        k: Any = None
        # Keys are recorded before fn runs: it may change the old state in
        # place, and then fail.
        seen: list[Any] = []
        mark = seen.append
        try:
            for r in batch:
                k = kf(r)
                mark(k)
                old = get(k)
                if old is None:
                    check_key(k)
                result = fn(r, old)
                if type(result) is not tuple or len(result) != 2:
                    raise TypeError(
                        f"map_with_state function must return (output, new_state), "
                        f"got {result!r:.200}"
                    )
                output, new = result
                if new is None:
                    table.pop(k, None)
                else:
                    table[k] = new
                append(output)
        except Exception as exc:
            self.record_failure(batch, len(out), exc, k)
            raise
        finally:
            if seen and self.changes.keys is not None:
                self.changes.add_batch(seen)
        return out


@dataclass(frozen=True)
class KeyedCountSpec(KeyedSpec):
    """``key_by(...).count()``: each record's key with its running count."""

    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        return _Count(ctx, self.key_fn)


@dataclass(frozen=True)
class KeyedReduceSpec(KeyedSpec):
    """``key_by(...).reduce(fn)``: each record's key with its running reduction."""

    fn: Callable[[Any, Any], Any]

    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        return _Reduce(ctx, self.key_fn, self.fn)


@dataclass(frozen=True)
class KeyedSumSpec(KeyedSpec):
    """``key_by(...).sum(value_fn)``: each record's key with its running sum."""

    value_fn: Callable[[Any], Any]

    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        return _Sum(ctx, self.key_fn, self.value_fn)


@dataclass(frozen=True)
class MapWithStateSpec(KeyedSpec):
    """``key_by(...).map_with_state(fn)``: ``fn(record, state) -> (output,
    new state)``, one state per key (``None`` drops it)."""

    fn: Callable[[Any, Any], tuple[Any, Any]]

    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        return _MapWithState(ctx, self.key_fn, self.fn)
