"""Operators as they run inside a task: each turns an input batch into an
output batch with list operations, so per-record work is a C-level loop
wherever the operator allows it (``map``, ``filter``, ``flat_map``) and a
tight Python loop over a dict where it keeps keyed state.

The *specs* (``MapSpec`` …) are the payloads of the logical graph's nodes:
plain descriptions that the runtime instantiates once per subtask and that
offline jobs can read to replay a job.

Failure location: when ``process`` raises, the task asks the operator which
input record failed (``failed_index``); keyed operators know it from their
loop, pure operators find it by re-running the batch record by record.

Event time: a batch whose records have timestamps goes through
``process_ts(batch, timestamps)``, which returns the outputs with theirs
(one-to-one operators keep the list, ``filter`` compresses it, ``flat_map``
repeats each input's timestamp for each of its outputs, a process function's
outputs take the timestamp of the record, or timer, that made them); a batch
without goes through ``process`` alone, as before event time existed. When
the task's watermark advances it calls ``on_watermark`` on each operator of
the chain, in order (see ``runtime/time/valve.py``).
"""

from __future__ import annotations

import copy
import itertools
import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.connectors.sink import Sink, SinkWriter
from eddyflow.errors import IncompatibleCheckpoint
from eddyflow.functions import KeyedProcessFunction, RuntimeContext
from eddyflow.keygroups import check_key, key_group_range
from eddyflow.runtime.exchange.events import timestamped
from eddyflow.runtime.time.clock import WALL_CLOCK, Clock
from eddyflow.runtime.time.timers import EVENT_TIME, PROCESSING_TIME, TimerService
from eddyflow.state.abc import KeyedSnapshot, KeyedStateBackend, SnapshotTarget, StateBackend
from eddyflow.state.changes import Changes
from eddyflow.state.ttl import ttl_clash

__all__ = [
    "FilterSpec",
    "FlatMapSpec",
    "IterationHeadSpec",
    "KeyedCountSpec",
    "KeyedProcessSpec",
    "KeyedReduceSpec",
    "KeyedSumSpec",
    "MapSpec",
    "MapWithStateSpec",
    "Operator",
    "OperatorContext",
    "OperatorSnapshot",
    "SinkSpec",
    "SourceSpec",
]

_MISSING: Any = object()


_key_of = operator.itemgetter(0)


@dataclass(frozen=True)
class OperatorContext:
    """Where one operator instance runs."""

    uid: str
    subtask: int
    parallelism: int
    max_parallelism: int
    state_backend: StateBackend
    #: Snapshots will be taken: keyed state records what changes.
    checkpointing: bool = False
    #: Processing time (``env.set_clock``).
    clock: Clock = WALL_CLOCK

    def keyed_backend(self) -> KeyedStateBackend:
        groups = key_group_range(self.subtask, self.max_parallelism, self.parallelism)
        return self.state_backend.create_keyed_backend(
            self.uid, self.subtask, groups, self.max_parallelism,
            checkpointing=self.checkpointing,
        )


@dataclass
class OperatorSnapshot:
    """The synchronous-phase result of one operator's snapshot."""

    #: Keyed state, its asynchronous half still to run.
    keyed: KeyedSnapshot | None = None
    #: Prepared, not yet committed sink transactions.
    committables: list[Any] = field(default_factory=list)


class Operator:
    """One operator of a chain, for one subtask."""

    #: One output per input, in order: an output index is its input's index.
    one_to_one = False
    #: No state and no side effects: safe to re-run to locate a failure.
    pure = False
    #: Holds keyed state (restored by key group).
    keyed = False
    #: Sets its records' timestamps and generates watermarks of its own (the
    #: watermarks from upstream stop here).
    assigns_timestamps = False
    #: Has processing-time work (timers): the task asks it
    #: ``next_processing_time`` and calls ``on_processing_time``.
    uses_clock = False

    def __init__(self, ctx: OperatorContext) -> None:
        self.ctx = ctx
        self.uid = ctx.uid
        self.records_in = 0
        self.records_out = 0
        self.failed_index: int | None = None
        #: The failure was raised by the key selector, not the operator's function.
        self.key_failed = False
        #: This operator's event time: the last watermark it was given (it
        #: only moves forward). A record with timestamp ``t < watermark`` is late
        #: (``windowing/watermarks.py`` states the rule).
        self.watermark = -math.inf

    def open(self) -> None:
        """Prepare for the first batch (state, user ``open``)."""

    def process(self, batch: list[Any]) -> list[Any]:
        raise NotImplementedError

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        """``process`` for records with timestamps: the outputs and theirs.
        One-to-one operators keep the input's; others may return a
        :class:`~eddyflow.runtime.exchange.events.RecordBatch` that carries its own
        (else their outputs have none)."""
        out = self.process(batch)
        if self.one_to_one:
            return out, timestamps
        return out, getattr(out, "timestamps", None)

    def next_processing_time(self) -> float | None:
        """When ``on_processing_time`` has work next (``uses_clock`` operators)."""
        return None

    def on_processing_time(self, now: float) -> list[Any]:
        """Processing time reached ``now``: fire what is due."""
        return []

    def on_watermark(self, watermark: float) -> list[Any]:
        """The watermark reached ``watermark`` (already set on
        ``self.watermark``): fire what it completes (event-time timers,
        windows). Outputs flow through the rest of the chain before it gets
        the watermark; a ``RecordBatch`` with ``timestamps`` gives them theirs."""
        return []

    def locate_failure(self, batch: list[Any]) -> int | None:
        """The index of the input record ``process`` failed on, if known."""
        return self.failed_index

    def output_counts(self, batch: list[Any]) -> list[int] | None:
        """How many outputs each input yields; ``None`` if it cannot be
        recomputed without side effects. Used to trace a failing record back
        through the operators before it."""
        if self.one_to_one:
            return [1] * len(batch)
        return None

    def end_input(self) -> list[Any]:
        """The input is exhausted: anything left to emit."""
        return []

    def close(self) -> None:
        """Release resources; called once, also after a failure."""

    def abort(self) -> None:
        """The job is failing: discard uncommitted work."""

    # -- checkpoints -------------------------------------------------------

    def snapshot(self, checkpoint_id: int, target: SnapshotTarget | None = None
                 ) -> OperatorSnapshot | None:
        """The synchronous phase of checkpoint ``checkpoint_id``: cheap, and
        consistent with every record before the barrier and none after.
        ``target``: where keyed state goes (``None``: no checkpoint storage,
        keyed state is not snapshotted)."""
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is durable (its metadata is written)."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete."""

    def restore_keyed(self, root: str, kinds: dict[str, str],
                      handles: list[KeyedStateHandle]) -> None:
        raise TypeError(f"operator '{self.uid}' has no keyed state to restore")


# -- stateless ---------------------------------------------------------------


class _PureOperator(Operator):
    pure = True

    def __init__(self, ctx: OperatorContext, fn: Callable[[Any], Any]) -> None:
        super().__init__(ctx)
        self.fn = fn

    def locate_failure(self, batch: list[Any]) -> int | None:
        for i, r in enumerate(batch):
            try:
                self.process([r])
            except Exception:
                return i
        return None  # not reproducible: the function is not deterministic

    def output_counts(self, batch: list[Any]) -> list[int] | None:
        return [len(self.process([r])) for r in batch]


class _Map(_PureOperator):
    one_to_one = True

    def process(self, batch: list[Any]) -> list[Any]:
        return list(map(self.fn, batch))


class _Filter(_PureOperator):
    def process(self, batch: list[Any]) -> list[Any]:
        return list(filter(self.fn, batch))

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        # The predicate once per record; both lists kept by its answers.
        keep = list(map(self.fn, batch))
        kept = list(itertools.compress(batch, keep))
        if timestamps is None:
            return kept, None
        return kept, list(itertools.compress(timestamps, keep))


class _FlatMap(_PureOperator):
    def process(self, batch: list[Any]) -> list[Any]:
        return list(itertools.chain.from_iterable(map(self.fn, batch)))

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        parts = [list(p) for p in map(self.fn, batch)]
        out = list(itertools.chain.from_iterable(parts))
        if timestamps is None:
            return out, None
        # Each output takes its input's timestamp (the output_counts idea).
        return out, [t for t, p in zip(timestamps, parts, strict=True) for _ in p]


class _Identity(Operator):
    one_to_one = True
    pure = True

    def process(self, batch: list[Any]) -> list[Any]:
        return batch


@dataclass(frozen=True)
class IterationHeadSpec:
    """The head of a loop (``ds.iterate()``): passes on both the records that
    enter the loop and those fed back by ``close_with``."""

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _Identity(ctx)


@dataclass(frozen=True)
class MapSpec:
    fn: Callable[[Any], Any]

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _Map(ctx, self.fn)


@dataclass(frozen=True)
class FilterSpec:
    fn: Callable[[Any], Any]

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _Filter(ctx, self.fn)


@dataclass(frozen=True)
class FlatMapSpec:
    fn: Callable[[Any], Iterable[Any]]

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _FlatMap(ctx, self.fn)


# -- keyed -------------------------------------------------------------------


class _Keyed(Operator):
    keyed = True

    def _failed(self, batch: list[Any], index: int, exc: Exception, key: Any) -> None:
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


class _Count(_Keyed):
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
            self._failed(batch, len(out), exc, k)
            raise
        self._record(out)
        return out


class _Reduce(_Keyed):
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
            self._failed(batch, len(out), exc, k)
            raise
        self._record(out)
        return out


class _Sum(_Keyed):
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
            self._failed(batch, len(out), exc, k)
            raise
        self._record(out)
        return out


class _MapWithState(_Keyed):
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
            self._failed(batch, len(out), exc, k)
            raise
        finally:
            if seen and self.changes.keys is not None:
                self.changes.add_batch(seen)
        return out


class _Process(_Keyed):
    uses_clock = True

    def __init__(self, ctx: OperatorContext, key_fn: Callable[[Any], Any],
                 fn: KeyedProcessFunction) -> None:
        super().__init__(ctx, key_fn)
        self.fn = fn
        self.rctx: RuntimeContext | None = None
        self.timers: TimerService | None = None

    def open(self) -> None:
        backend = self.backend = self.ctx.keyed_backend()
        c = self.ctx
        self.rctx = RuntimeContext(c.uid, c.subtask, c.parallelism, c.max_parallelism, backend,
                                   c.clock.now)
        self.timers = TimerService(backend, c.clock.now, lambda: self.watermark)
        self.rctx.timer_service = self.timers
        self.fn.open(self.rctx)

    def process(self, batch: list[Any]) -> list[Any]:
        return self.process_ts(batch, None)[0]

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        kf, proc, ctx = self.key_fn, self.fn.process, self.rctx
        backend = self.backend
        assert backend is not None and ctx is not None
        out: list[Any] = []
        extend = out.extend
        stamps: list[Any] | None = None if timestamps is None else []
        i = 0
        k: Any = None
        try:
            for i, r in enumerate(batch):
                k = kf(r)
                check_key(k)
                backend.current_key = k
                if stamps is not None:
                    assert timestamps is not None
                    t = ctx.timestamp = timestamps[i]
                    n = len(out)
                    res = proc(r, ctx)
                    if res is not None:
                        extend(res)
                        # Outputs take the timestamp of the record that made them.
                        stamps.extend([t] * (len(out) - n))
                else:
                    res = proc(r, ctx)
                    if res is not None:
                        extend(res)
        except Exception as exc:
            self._failed(batch, i, exc, k)
            raise
        finally:
            ctx.timestamp = None
        if backend.has_ttl:
            # Expired state leaves between batches too (not only at
            # snapshots): a job without checkpoints does not keep it. It
            # costs what expired (state/ttl.py).
            backend.expire_ttl()
        return out, stamps

    def _fire(self, domain: str, until: float, stamp: bool) -> list[Any]:
        """Run ``on_timer`` for every timer of ``domain`` due at ``until``."""
        timers, ctx = self.timers, self.rctx
        assert timers is not None and ctx is not None
        on_timer = self.fn.on_timer
        out: list[Any] = []
        stamps: list[Any] = []
        try:
            for t, _ in timers.pop_due(domain, until):
                ctx.timestamp = t
                n = len(out)
                res = on_timer(t, ctx)
                if res is not None:
                    out.extend(res)
                    stamps.extend([t if stamp else None] * (len(out) - n))
        finally:
            ctx.timestamp = None
        # Event-time timer outputs carry the timer's time, processing-time
        # ones none (as Flink).
        return timestamped(out, stamps) if out else out

    def on_watermark(self, watermark: float) -> list[Any]:
        return self._fire(EVENT_TIME, watermark, True)

    def next_processing_time(self) -> float | None:
        return None if self.timers is None else self.timers.next_time(PROCESSING_TIME)

    def on_processing_time(self, now: float) -> list[Any]:
        return self._fire(PROCESSING_TIME, now, False)

    def restore_keyed(self, root: str, kinds: dict[str, str],
                      handles: list[KeyedStateHandle]) -> None:
        super().restore_keyed(root, kinds, handles)
        assert self.timers is not None
        self.timers.rebuild()

    def close(self) -> None:
        try:
            self.fn.close()
        finally:
            super().close()


@dataclass(frozen=True)
class KeyedCountSpec:
    key_fn: Callable[[Any], Any]

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _Count(ctx, self.key_fn)


@dataclass(frozen=True)
class KeyedReduceSpec:
    key_fn: Callable[[Any], Any]
    fn: Callable[[Any, Any], Any]

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _Reduce(ctx, self.key_fn, self.fn)


@dataclass(frozen=True)
class KeyedSumSpec:
    key_fn: Callable[[Any], Any]
    value_fn: Callable[[Any], Any]

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _Sum(ctx, self.key_fn, self.value_fn)


@dataclass(frozen=True)
class MapWithStateSpec:
    key_fn: Callable[[Any], Any]
    fn: Callable[[Any, Any], tuple[Any, Any]]

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _MapWithState(ctx, self.key_fn, self.fn)


@dataclass(frozen=True)
class KeyedProcessSpec:
    key_fn: Callable[[Any], Any]
    fn: KeyedProcessFunction

    def instantiate(self, ctx: OperatorContext) -> Operator:
        try:
            fn = copy.deepcopy(self.fn)
        except Exception as exc:
            raise TypeError(
                f"operator '{ctx.uid}': {type(self.fn).__name__} must be copyable "
                f"(one copy per subtask): {exc}"
            ) from exc
        return _Process(ctx, self.key_fn, fn)


# -- sources and sinks ---------------------------------------------------------


@dataclass(frozen=True)
class SourceSpec:
    """A source node's payload; the task reads it, no operator is made."""

    source: Any  # eddyflow.connectors.Source


class _SinkOperator(Operator):
    """Two-phase commit (docs/connectors.md, Writing a sink): the barrier prepares the pending
    transaction; the coordinator commits what a completed checkpoint
    recorded. A prepared transaction whose checkpoint was aborted stays
    pending and rides along with the next checkpoint."""

    def __init__(self, ctx: OperatorContext, sink: Sink) -> None:
        super().__init__(ctx)
        self.sink = sink
        self.writer: SinkWriter | None = None
        self.pending: list[Any] = []
        self._recorded: dict[int, list[Any]] = {}

    def open(self) -> None:
        self.writer = self.sink.create_writer(self.ctx.subtask, self.ctx.parallelism)

    def process(self, batch: list[Any]) -> list[Any]:
        assert self.writer is not None
        self.writer.write(batch)
        return []

    def snapshot(self, checkpoint_id: int, target: SnapshotTarget | None = None
                 ) -> OperatorSnapshot | None:
        assert self.writer is not None
        committable = self.writer.prepare_commit(checkpoint_id)
        if committable is not None:
            self.pending.append(committable)
        self._recorded[checkpoint_id] = list(self.pending)
        return OperatorSnapshot(committables=list(self.pending))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done: list[Any] = []
        for n in [n for n in self._recorded if n <= checkpoint_id]:
            done.extend(self._recorded.pop(n))
        if done:
            self.pending = [c for c in self.pending if c not in done]

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


@dataclass(frozen=True)
class SinkSpec:
    sink: Sink

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _SinkOperator(ctx, self.sink)
