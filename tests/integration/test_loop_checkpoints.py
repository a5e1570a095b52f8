"""Checkpoints of cyclic jobs under injected failures (DESIGN.md §3, §4, §9).

ABS on a cyclic graph aligns barriers on the graph without its back-edges;
a loop head snapshots its state when the barrier arrives on its regular
inputs, forwards it, and logs every record that comes back on its back-edges
until the barrier returns round the loop. That log is the channel state of
the loop: on recovery it is re-injected into the head before anything else.
If it were lost, the records circulating at the checkpoint would vanish; if
it held too much, they would be counted twice.

(a) A property test. Hypothesis draws random cyclic jobs: a loop of 1-4
body operators among map, filter, a flat_map that sometimes doubles records,
a keyed stateful operator (order-insensitive: it counts records per key)
and a two-input one (a ``KeyedCoProcessFunction`` reading the body's even
keys on one input and its odd keys on the other, counting records per key
in state both inputs share), plus a mandatory step that decrements each record's remaining-rounds
counter, so every loop converges; optionally an inner loop nested in the
body; parallelism 1-3 per operator; feedback forward, keyed or rebalanced;
an optional keyed count or sum after the loop; a source of one split, two
even splits, or two splits of which one lags; records that are tuples, or
dicts or lists that the loop body changes in place (its steps decrement the
record's own counters, the keyed operator's state is a dict or list it
changes in place), so that a back-edge log, a state snapshot or a source
replay that kept references instead of the values at the barrier would
show. The checked run takes a
checkpoint every 5-50 ms, in ``exactly_once`` or ``synchronous`` mode, and
fails: a ``FailingMap`` in the loop body, a map that fails while a loop
head is recording its back-edge log, and/or one of the runtime's fault
points ("task.aligning", "snapshot.async_write",
"checkpoint.before_metadata", "sink.before_commit"). The committed output
(a multiset) and the final keyed state of every keyed operator must equal
those of a failure-free run without checkpoints, and every run must end (a
watchdog turns a hang into a failure).

(b) Deterministic tests that in-flight loop records survive: records go
round a loop for many rounds while the source still feeds it; once a
checkpoint whose back-edge log is non-empty has completed, the job fails.
Recovery in-process (a restart strategy) and across processes (``JobFailed``,
then ``execute(restore="latest")`` in a fresh environment) must produce the
exact output, and the checkpoint restored from must hold a non-empty
back-edge log whose records were re-injected; also at another parallelism,
with two back-edges into one head, with feedback spilling to disk, and for
connected components and shortest paths (order-dependent keyed state inside
the loop).

(c) Every periodic checkpoint of a loop job with identifiable records is
checked offline for consistency (source positions vs. committed output vs.
back-edge logs), and restoring from several of them must give the exact
output — with even source splits and with a lagging split, whose barriers
come back round the loop to a head subtask before its own barrier arrives.

The property test and the tests of (b) run once per state backend (the
``state_backend`` fixture): the checked runs keep their keyed state in the
memory backend or in RocksDB. For RocksDB the property test's case also
draws the write cache's size and whether checkpoints are incremental; its
reference run always uses the memory backend.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import json
import logging
import multiprocessing
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from job_support import Pace, StateBackendFactory, keyed_backends, mode_options, watched

import eddyflow as ef
from eddyflow.runtime import faults
from eddyflow.runtime import job as job_module
from eddyflow.runtime import task as task_module
from eddyflow.runtime.exchange.feedback import FeedbackChannel
from eddyflow.runtime.recovery.restore import RestoredCheckpoint
from eddyflow.runtime.workers.process import fork_hazard

# The property test's records: key, value, rounds left, inner rounds left, as a
# tuple, or as a dict or list (in SHAPES) that the loop body changes in place.
Record = tuple[int, ...] | dict[str, int] | list[int]
FIELDS = ("k", "v", "r", "i")  # a dict record's keys, in this order
F_KEY, F_VALUE, F_ROUNDS, F_INNER = range(4)  # field indexes
SHAPES = ("dict", "list", "tuple")  # mutable first: hypothesis draws them more often
MOD = 100_003
FAULT_POINTS = ("task.aligning", "snapshot.async_write",
                "checkpoint.before_metadata", "sink.before_commit")
TIMEOUT = 90.0  # a run takes about a second; a loaded machine may take several
PROPERTY_TIMEOUT = 20.0  # per run of a property example (each takes well under 2 s)


# -- the record functions (module level: deterministic and shared by both runs) ------


def key0(r: Any) -> Any:
    return r[0]


def identity(r: Any) -> Any:
    return r


# Shape-independent access. ``put`` changes a dict or list record in place
# (and returns it), a tuple is replaced. A function only changes a record it
# is the sole consumer of: the end of a loop body feeds both the feedback
# filter and the exit filter, other tasks, which get the same objects (in
# any order); so no one changes those objects afterwards: a path that goes on
# to change its records copies them first (``copy_record``: the feedback
# paths, the inner loop's exit), the outer loop's exit only reads them.


def make(shape: str, *values: int) -> Record:
    if shape == "dict":
        return dict(zip(FIELDS, values, strict=True))
    if shape == "list":
        return list(values)
    return tuple(values)


def like(r: Record, *values: int) -> Record:
    """A new record of ``r``'s shape."""
    return make("dict" if isinstance(r, dict) else "list" if isinstance(r, list) else "tuple",
                *values)


def get(r: Record, f: int) -> int:
    return r[FIELDS[f]] if isinstance(r, dict) else r[f]


def fields(r: Record) -> tuple[int, int, int, int]:
    if isinstance(r, dict):
        return r["k"], r["v"], r["r"], r["i"]
    return r[0], r[1], r[2], r[3]


def put(r: Record, *changes: tuple[int, int]) -> Record:
    """``r`` with fields changed: in place, unless it is a tuple."""
    if isinstance(r, tuple):
        t = list(r)
        for f, x in changes:
            t[f] = x
        return (t[0], t[1], t[2], t[3])
    if isinstance(r, dict):
        for f, x in changes:
            r[FIELDS[f]] = x
    else:
        for f, x in changes:
            r[f] = x
    return r


def canon(x: Any) -> Any:
    """Records and state values as (nested) tuples, for the comparison only."""
    if isinstance(x, dict):
        return tuple(canon(v) for v in x.values())  # insertion order: FIELDS
    if isinstance(x, list | tuple):
        return tuple(canon(v) for v in x)
    return x


def key_of(r: Record) -> int:
    return get(r, F_KEY)


def copy_record(r: Record) -> Record:
    return like(r, *fields(r))


def even_key(r: Record) -> bool:
    return key_of(r) % 2 == 0


def odd_key(r: Record) -> bool:
    return key_of(r) % 2 == 1


class CountBoth(ef.KeyedCoProcessFunction):
    """A two-input operator in the loop: both inputs count records per key
    into one state; records pass unchanged (order-insensitive)."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.n = ctx.value_state("n", default=0)

    def process1(self, value: Record, ctx: ef.RuntimeContext) -> Any:
        self.n.value += 1
        yield value

    def process2(self, value: Record, ctx: ef.RuntimeContext) -> Any:
        self.n.value += 1
        yield value


def f_map(r: Record) -> Record:
    k, v, _, _ = fields(r)
    return put(r, (F_VALUE, (v * 3 + k + 1) % MOD))


def f_filter(r: Record) -> bool:
    return (get(r, F_VALUE) * 7 + get(r, F_ROUNDS)) % 10 != 0


def f_flat_map(r: Record) -> list[Record]:
    k, v, n, i = fields(r)
    if (v + n) % 3 == 0:
        return [put(r, (F_VALUE, (v * 2 + 1) % MOD)), like(r, k, (v * 2 + 2) % MOD, n, i)]
    return [r]


def f_decrement(r: Record) -> Record:
    _, v, n, _ = fields(r)
    return put(r, (F_VALUE, (v + 11) % MOD), (F_ROUNDS, n - 1))


def again(r: Record) -> bool:
    return get(r, F_ROUNDS) > 0


def done(r: Record) -> bool:
    return get(r, F_ROUNDS) <= 0


Count = int | dict[str, int] | list[int]


def count_records(r: Record, s: Count | None) -> tuple[Record, Count]:
    """Keyed state inside the loop: how many records of the key passed. The
    output does not depend on the state, so arrival order does not matter.
    With a dict or list record the state is a dict or list, changed in place."""
    if isinstance(r, dict):
        if s is None:
            s = {"n": 0}
        assert isinstance(s, dict)
        s["n"] += 1
        return r, s
    if isinstance(r, list):
        if s is None:
            s = [0]
        assert isinstance(s, list)
        s[0] += 1
        return r, s
    assert s is None or isinstance(s, int)
    return r, (s or 0) + 1


def weight_of_key(r: Record) -> int:
    return key_of(r) % 5 + 1


def key_and_value(r: Record) -> Record:
    """A new record: the feedback filter reads the same object."""
    k, v = key_of(r), get(r, F_VALUE)
    if isinstance(r, dict):
        return {"k": k, "v": v}
    return [k, v] if isinstance(r, list) else (k, v)


def inner_again(r: Record) -> bool:
    return get(r, F_INNER) > 0


def inner_done(r: Record) -> bool:
    return get(r, F_INNER) <= 0


def inner_step(r: Record) -> Record:
    _, v, _, i = fields(r)
    return put(r, (F_VALUE, (v * 5 + 3) % MOD), (F_INNER, i - 1))


def make_enter_inner(rounds: int) -> Callable[[Record], Record]:
    def enter_inner(r: Record) -> Record:
        k, v, n, _ = fields(r)
        return put(r, (F_INNER, 1 + (k + v + n) % rounds))
    return enter_inner


# -- seeing inside the runtime (test-only introspection) ---------------------------


class Spy:
    """Records every task the runtime creates (to see whether a loop head is
    logging its back-edges) and every back-edge log a restore re-injects."""

    def __init__(self) -> None:
        self.tasks: list[Any] = []
        self.reinjected: list[tuple[int, str, int, int]] = []  # (chk, head, subtask, n)
        self.reinjected_batches: list[int] = []  # sizes of the batches re-injected
        self.reinjecting = False
        self.lock = threading.Lock()

    def logging_heads(self) -> int:
        return sum(1 for t in list(self.tasks) if t.barriers.log is not None)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    s = Spy()
    orig_init = task_module.Task.__init__
    orig_batches = RestoredCheckpoint.backedge_batches

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        s.tasks.append(self)

    def backedge_batches(self: RestoredCheckpoint, head_uid: str, subtask: int,
                         parallelism: int) -> list[Any]:
        out = orig_batches(self, head_uid, subtask, parallelism)
        s.reinjected.append((self.checkpoint_id, head_uid, subtask,
                             sum(len(records) for records, _ in out)))
        return out

    orig_reinject = job_module.reinject_backedge_logs
    orig_put = FeedbackChannel.put

    async def reinject(restored: RestoredCheckpoint, tasks: Any) -> None:
        s.reinjecting = True  # nothing else runs yet: the tasks start after
        try:
            await orig_reinject(restored, tasks)
        finally:
            s.reinjecting = False

    async def put(self: FeedbackChannel, item: Any, interrupt: Any = None) -> None:
        if s.reinjecting and isinstance(item, list):
            s.reinjected_batches.append(len(item))
        await orig_put(self, item, interrupt)

    monkeypatch.setattr(task_module.Task, "__init__", init)
    monkeypatch.setattr(RestoredCheckpoint, "backedge_batches", backedge_batches)
    monkeypatch.setattr(job_module, "reinject_backedge_logs", reinject)
    monkeypatch.setattr(FeedbackChannel, "put", put)
    return s


class FailWhileLogging:
    """Identity map that raises ``InjectedFailure`` (``times`` times, at most
    once per attempt of the job) when a loop head is recording a back-edge
    log, i.e. between a head's snapshot and its barrier's return round the
    loop."""

    def __init__(self, spy: Spy, times: int = 1, skip: int = 0) -> None:
        self.spy = spy
        self.times = times
        self.skip = skip  # logging moments to let pass first
        # Failures, in shared memory: counted across the worker processes
        # of a job over workers (forked, each seeing the heads it runs).
        self._failures = multiprocessing.RawValue("q", 0)
        self._claim = multiprocessing.Lock()
        self.seen_logging = 0
        self.failed_in: int = -1  # tasks created when it last failed: one failure an attempt
        self.lock = threading.Lock()

    @property
    def failures(self) -> int:
        return int(self._failures.value)

    def __call__(self, r: Any) -> Any:
        if self.failures >= self.times or not self.spy.logging_heads():
            return r
        with self.lock:
            if len(self.spy.tasks) == self.failed_in:
                return r  # failed in this attempt already
            self.seen_logging += 1
            if self.seen_logging <= self.skip:
                return r
            # (Not waited for forever: a worker killed holding it.)
            if not self._claim.acquire(timeout=1.0):
                return r
            try:
                if self._failures.value >= self.times:
                    return r
                self._failures.value += 1
            finally:
                self._claim.release()
            self.failed_in = len(self.spy.tasks)
        raise ef.testing.InjectedFailure("failure while a back-edge log is recorded")


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    faults.disarm_all()
    yield
    faults.disarm_all()


class _Restarts(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "restart" in msg:
            self.messages.append(msg)


def read_json_parts(folder: Path) -> list[Any]:
    """The records committed to a ``FileSink`` folder, as JSON decodes them."""
    out: list[Any] = []
    if not folder.exists():
        return out
    for name in sorted(os.listdir(folder)):
        if name.startswith("part-"):
            with open(folder / name, encoding="utf-8") as f:
                out.extend(json.loads(line) for line in f)
    return out


def read_parts(folder: Path) -> list[Any]:
    return [tuple(r) for r in read_json_parts(folder)]


def backedge_records_of(meta: dict[str, Any], head: str) -> int:
    return sum(int(p.get("backedge", {}).get("records", 0))
               for p in meta["operators"][head]["subtasks"].values())


def heads_of(meta: dict[str, Any]) -> list[str]:
    return [uid for uid, op in meta["operators"].items() if op["kind"] == "iterate"]


def logged_in(meta: dict[str, Any]) -> int:
    return sum(backedge_records_of(meta, h) for h in heads_of(meta))


# -- (a) the property test ---------------------------------------------------------


@dataclass(frozen=True)
class BodyOp:
    kind: str  # map | filter | flat_map | keyed | inner | co
    parallelism: int  # 0: that of the operator before


@dataclass(frozen=True)
class Case:
    n_records: int
    n_keys: int
    max_rounds: int
    source_parallelism: int
    lagging_source: bool  # two splits, the second read five times slower
    head_parallelism: int
    body: tuple[BodyOp, ...]
    decrement_at: int
    decrement_parallelism: int
    inner_rounds: int
    inner_keyed: bool
    feedback: str  # forward | keyed | rebalance
    after: str  # none | count | sum
    after_parallelism: int
    batch_size: int
    interval: float
    mode: str
    file_sink: bool
    fail_at: int | None  # position of a FailingMap in the body
    fail_fraction: float
    fail_times: int
    fail_while_logging: bool
    fault_point: str | None
    fault_after: int
    shape: str = "tuple"  # of the records: tuple | dict | list (changed in place)
    # The RocksDB backend's settings (None: the memory backend).
    cache_size: int | None = None  # entries in each state's write cache
    incremental: bool = True
    # Worker processes of the checked run (docs/concepts/workers.md).
    workers: int = 1


PAR = st.sampled_from([0, 0, 1, 2, 3])
# Fault points armed in the calling process: with workers, the others would
# be armed anew in each worker process of each attempt (forked after arming).
CALLER_FAULT_POINTS = ("checkpoint.before_metadata", "sink.before_commit")
UNALIGNED = ("unaligned", "aligned_timeout")
# RocksDB write caches: smaller than the keys of a subtask (flushed and
# emptied while records flow, values read back from the database), or all.
ROCKSDB_CACHES = (2, 8, 100_000)


@st.composite
def cases(draw: st.DrawFn, modes: tuple[str, ...], rocksdb: bool = False) -> Case:
    n_body = draw(st.integers(0, 3))
    kinds = draw(st.lists(st.sampled_from(["map", "filter", "flat_map", "keyed", "inner", "co"]),
                          min_size=n_body, max_size=n_body))
    # At most one doubling flat_map and one nested loop keep the work bounded.
    seen: set[str] = set()
    body = []
    for k in kinds:
        if k in ("flat_map", "inner") and k in seen:
            k = "map"
        seen.add(k)
        body.append(BodyOp(k, draw(PAR)))
    # A third of the checked runs over two worker processes, in every mode
    # (with RocksDB, run in this process by earlier examples, they are
    # spawned rather than forked: runtime/workers/spawn.py), with fault
    # points armed in this process only: one armed here would be armed anew
    # in each worker process of each attempt.
    workers = draw(st.sampled_from([1, 1, 2]))
    fail_at = draw(st.none() | st.integers(0, len(body)))
    fault_point = draw(st.none() | st.sampled_from(
        FAULT_POINTS if workers == 1 else CALLER_FAULT_POINTS))
    # FailWhileLogging watches the tasks through the spy, which patches
    # this process: forked workers inherit it, spawned ones (RocksDB ran
    # here) do not.
    fail_while_logging = draw(st.booleans()) and not (rocksdb and workers > 1)
    if fail_at is None and fault_point is None and not fail_while_logging:
        fail_at = draw(st.integers(0, len(body)))
    mode = draw(st.sampled_from(modes))
    return Case(
        n_records=draw(st.integers(150, 400)),
        n_keys=draw(st.integers(2, 25)),
        max_rounds=draw(st.integers(1, 5)),
        source_parallelism=draw(st.sampled_from([1, 1, 2])),
        lagging_source=draw(st.booleans()),
        head_parallelism=draw(st.integers(1, 3)),
        body=tuple(body),
        decrement_at=draw(st.integers(0, len(body))),
        decrement_parallelism=draw(PAR),
        inner_rounds=draw(st.integers(1, 3)),
        inner_keyed=draw(st.booleans()),
        feedback=draw(st.sampled_from(["forward", "keyed", "rebalance"])),
        after=draw(st.sampled_from(["none", "count", "sum"])),
        after_parallelism=draw(st.integers(1, 3)),
        batch_size=draw(st.integers(4, 32)),
        interval=draw(st.floats(0.005, 0.05)),
        mode=mode,
        file_sink=draw(st.sampled_from([False, False, True])),
        fail_at=fail_at,
        fail_fraction=draw(st.floats(0.05, 0.95)),
        fail_times=draw(st.integers(1, 2)),
        fail_while_logging=fail_while_logging,
        fault_point=fault_point,
        fault_after=draw(st.integers(0, 6)),
        shape=draw(st.sampled_from(SHAPES)),
        cache_size=draw(st.sampled_from(ROCKSDB_CACHES)) if rocksdb else None,
        incremental=draw(st.sampled_from([True, True, False])) if rocksdb else True,
        workers=workers,
    )


class LaggingSource(ef.Source):
    """Two splits of a list of records (even and odd indexes), four records
    a read; split 1 pauses five times longer per read than split 0, like a
    lagging partition: its barriers reach the loop later than split 0's.
    Like any replayable source it hands out new copies of its records: the
    loop changes dict and list records in place, and a replay from a
    position must read them as they were."""

    def __init__(self, records: list[Any]) -> None:
        self.records = records

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        assert parallelism == 2
        return _LaggingReader(self.records[subtask::2], 0.005 if subtask else 0.001)


class _LaggingReader(ef.SourceReader):
    def __init__(self, items: list[Any], delay: float) -> None:
        self.items = items
        self.delay = delay
        self.pos = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.pos >= len(self.items):
            return None
        await asyncio.sleep(self.delay)
        out = copy.deepcopy(self.items[self.pos:self.pos + 4])
        self.pos += len(out)
        return out

    def position(self) -> Any:
        return self.pos

    def seek(self, position: Any) -> None:
        self.pos = position


@dataclass
class Built:
    keyed_uids: list[str] = field(default_factory=list)
    heads: list[str] = field(default_factory=list)


def build(env: ef.StreamEnvironment, case: Case, sink: ef.Sink, *,
          failing: Callable[[Any], Any], logging_failure: Callable[[Any], Any],
          pace: Callable[[Any], Any], loop_pace: Callable[[Any], Any]) -> Built:
    out = Built()
    # New objects for every run: the loop changes them in place.
    records = [make(case.shape, i % case.n_keys, (i * 7919) % 10_007,
                    1 + (i * 31) % case.max_rounds, 0)
               for i in range(case.n_records)]
    if case.lagging_source:
        sp = 2
        ds = env.from_source(LaggingSource(records)).set_parallelism(sp)
    else:
        sp = case.source_parallelism
        ds = env.from_collection(records).set_parallelism(sp)
    ds = ds.map(pace).name("pace").set_parallelism(sp)
    hp = case.head_parallelism
    loop = ds.iterate().name("head").set_parallelism(hp)
    out.heads.append("head")
    current = hp
    mutable = case.shape != "tuple"
    ds = loop.map(loop_pace).name("loop-pace")  # chained to the head

    def par(p: int) -> int:
        nonlocal current
        current = p or current
        return current

    ops: list[tuple[str, int]] = [(op.kind, op.parallelism) for op in case.body]
    ops.insert(case.decrement_at, ("decrement", case.decrement_parallelism))
    if case.fail_at is not None:
        ops.insert(case.fail_at, ("fail", 0))
    if case.fail_while_logging:
        ops.insert(len(ops) // 2, ("fail-logging", 0))
    for i, (kind, p) in enumerate(ops):
        if kind == "map":
            ds = ds.map(f_map).set_parallelism(par(p))
        elif kind == "filter":
            ds = ds.filter(f_filter).set_parallelism(par(p))
        elif kind == "flat_map":
            ds = ds.flat_map(f_flat_map).set_parallelism(par(p))
        elif kind == "decrement":
            ds = ds.map(f_decrement).set_parallelism(par(p))
        elif kind == "fail":
            ds = ds.map(failing).name("failing").set_parallelism(par(p))
        elif kind == "fail-logging":
            ds = ds.map(logging_failure).name("failing-while-logging").set_parallelism(par(p))
        elif kind == "keyed":
            uid = f"state{i}"
            ds = ds.key_by(key_of).map_with_state(count_records).name(uid).set_parallelism(par(p))
            out.keyed_uids.append(uid)
        elif kind == "co":
            uid = f"co{i}"
            cp = par(p)
            evens = ds.filter(even_key).set_parallelism(cp).key_by(key_of)
            odds = ds.filter(odd_key).set_parallelism(cp).key_by(key_of)
            ds = evens.connect(odds).process(CountBoth()).name(uid).set_parallelism(cp)
            out.keyed_uids.append(uid)
        else:
            assert kind == "inner"
            ip = par(p)
            entered = ds.map(make_enter_inner(case.inner_rounds)).set_parallelism(ip)
            inner = entered.iterate().name(f"inner{i}").set_parallelism(ip)
            out.heads.append(f"inner{i}")
            stepped = inner.map(inner_step).set_parallelism(ip)
            back = stepped.filter(inner_again).set_parallelism(ip)
            if mutable:
                back = back.map(copy_record).set_parallelism(ip)
            inner.close_with(back.key_by(key_of) if case.inner_keyed else back)
            ds = stepped.filter(inner_done).set_parallelism(ip)
            if mutable:
                ds = ds.map(copy_record).set_parallelism(ip)
    feedback = ds.filter(again).set_parallelism(current)
    if mutable:
        feedback = feedback.map(copy_record).set_parallelism(current)
    if case.feedback == "keyed":
        loop.close_with(feedback.key_by(key_of))
    elif case.feedback == "rebalance":
        loop.close_with(feedback.rebalance())
    else:
        loop.close_with(feedback)
    exit_ = ds.filter(done).set_parallelism(current)
    ap = case.after_parallelism
    if case.after == "count":
        exit_ = exit_.key_by(key_of).count().name("after").set_parallelism(ap)
        out.keyed_uids.append("after")
    elif case.after == "sum":
        exit_ = exit_.key_by(key_of).sum(weight_of_key).name("after").set_parallelism(ap)
        out.keyed_uids.append("after")
    else:
        exit_ = exit_.map(key_and_value).set_parallelism(ap)
    exit_.sink_to(sink).set_parallelism(ap)
    return out


@dataclass
class Stats:
    examples: int = 0
    failed: int = 0
    checkpoints: int = 0
    logged_checkpoints: int = 0  # retained checkpoints with a non-empty back-edge log
    restores_reinjecting: int = 0  # restores that re-injected logged records
    fault_fired: int = 0
    logging_failures: int = 0
    mutable_failed: int = 0  # examples with dict or list records that failed
    over_workers: int = 0  # examples whose checked run ran over worker processes


def check_case(case: Case, workdir: Path, stats: Stats, spy: Spy,
               backend: StateBackendFactory) -> None:
    note(repr(case))
    stats.examples += 1

    # The reference: no checkpoints, no failures, the memory backend.
    env = ef.StreamEnvironment(parallelism=2, batch_size=case.batch_size)
    ref_sink = ef.ListSink()
    ref_built = build(env, case, ref_sink, failing=identity, logging_failure=identity,
                      pace=identity, loop_pace=identity)
    ref = watched(env.execute_async("reference"), PROPERTY_TIMEOUT)
    reference = [canon(r) for r in ref_sink.results]
    through_failing = ref.records_in.get("failing", 0)

    # The checked run. Earlier tests of this process may have run RocksDB
    # in it: then its workers are spawned, not forked (runtime/workers/
    # spawn.py), and a spawned worker cannot see the spy that a failure
    # while logging needs.
    os.makedirs(workdir)
    workers = case.workers if fork_hazard() is None or not case.fail_while_logging else 1
    stats.over_workers += workers > 1
    env = ef.StreamEnvironment(parallelism=2, batch_size=case.batch_size, workers=workers)
    env.enable_checkpointing(case.interval, workdir / "chk", retained=1000,
                             **mode_options(case.mode))
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=8, delay=0))
    if case.cache_size is not None:
        backend.use(env, workdir, cache_size=case.cache_size, incremental=case.incremental)
    else:
        backend.use(env, workdir)
    failing = ef.testing.FailingMap(
        after=max(1, int(case.fail_fraction * max(through_failing, 1))), times=case.fail_times)
    logging_failure = FailWhileLogging(spy, times=1)
    sink: ef.Sink = ef.FileSink(workdir / "out") if case.file_sink else ef.ListSink()
    spy.tasks.clear()
    spy.reinjected.clear()
    spy.reinjected_batches.clear()
    built = build(env, case, sink, failing=failing, logging_failure=logging_failure,
                  pace=Pace(max(1, case.batch_size // 2)), loop_pace=Pace(40, 0.0003))
    assert built.keyed_uids == ref_built.keyed_uids
    if case.fault_point is not None:
        ef.testing.arm(case.fault_point, after=case.fault_after, times=1)
    watcher = _Restarts()
    logger = logging.getLogger("eddyflow")
    logger.addHandler(watcher)
    try:
        result = watched(env.execute_async("checked"), PROPERTY_TIMEOUT)
    finally:
        logger.removeHandler(watcher)
        ef.testing.disarm_all()
    infos = ef.list_checkpoints(workdir / "chk")
    for uid in built.keyed_uids:  # kept by the backend under test
        assert keyed_backends(infos[-1], uid) == ({backend.name} if ref.state(uid) else set()), uid
    logged = [c.id for c in infos if logged_in(c.metadata)]
    reinjecting = {c for c, _, _, n in spy.reinjected if n}
    note(f"restarts={result.restarts} failing={failing!r} "
         f"logging failures={logging_failure.failures} checkpoints={result.completed_checkpoints} "
         f"logged={logged} reinjected from={sorted(reinjecting)} restart log={watcher.messages}")

    # Every restart was one of ours.
    assert len(watcher.messages) == result.restarts
    for msg in watcher.messages:
        assert "InjectedFailure" in msg or "injected failure" in msg \
            or "back-edge log is recorded" in msg, msg
    assert result.restarts <= (failing.failures + logging_failure.failures
                               + (case.fault_point is not None))
    if case.fail_at is not None and through_failing >= 1:
        assert failing.failures >= 1
        assert result.restarts >= 1
    stats.failed += result.restarts >= 1
    stats.mutable_failed += result.restarts >= 1 and case.shape != "tuple"
    stats.checkpoints += len(result.completed_checkpoints)
    stats.logged_checkpoints += len(logged)
    stats.restores_reinjecting += len(reinjecting)
    stats.logging_failures += logging_failure.failures
    if any(f"injected failure at {case.fault_point}" in m for m in watcher.messages):
        stats.fault_fired += 1
    assert result.completed_checkpoints, "at least the final checkpoint completes"

    # The output: exactly the reference's, as a multiset.
    if case.file_sink:
        got = [canon(r) for r in read_json_parts(workdir / "out")]
        leftovers = [n for n in os.listdir(workdir / "out") if not n.startswith("part-")] \
            if (workdir / "out").exists() else []
        assert leftovers == [], f"uncommitted files left behind: {leftovers}"
    else:
        assert isinstance(sink, ef.ListSink)
        got = [canon(r) for r in sink.results]
    want_c, got_c = Counter(reference), Counter(got)
    lost, dup = want_c - got_c, got_c - want_c
    assert not lost and not dup, (
        f"{sum(lost.values())} lost (e.g. {list(lost)[:5]}), "
        f"{sum(dup.values())} duplicated or wrong (e.g. {list(dup)[:5]})")

    # The final keyed state.
    for uid in built.keyed_uids:
        want = {k: canon(v) for k, v in ref.state(uid).items()}
        have = {k: canon(v) for k, v in result.state(uid).items()}
        assert have == want, f"{uid}: final state differs from the failure-free run"


def run_property(tmp_path: Path, spy: Spy, backend: StateBackendFactory, examples: int,
                 modes: tuple[str, ...], min_mutable_failed: float) -> Stats:
    stats = Stats()

    # No shrinking: a hung example costs PROPERTY_TIMEOUT per attempt; the
    # failing case is printed in full (``note``) for reproduction.
    @settings(max_examples=examples, deadline=None, derandomize=False,
              phases=[Phase.explicit, Phase.reuse, Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(case=cases(modes, rocksdb=backend.rocksdb))
    def prop(case: Case) -> None:
        check_case(case, tmp_path / f"ex{stats.examples}", stats, spy, backend)

    prop()
    assert stats.failed >= 0.5 * stats.examples, stats
    # Many of them with records and state that the loop changes in place.
    assert stats.mutable_failed >= min_mutable_failed * stats.examples, stats
    assert stats.checkpoints >= stats.examples, stats
    return stats


#: "aligned_timeout": exactly_once that switches to unaligned after 5 ms.
MODES = ("exactly_once", "synchronous", "unaligned", "aligned_timeout")


def test_loops_survive_random_failures(tmp_path: Path, spy: Spy,
                                      state_backend: StateBackendFactory) -> None:
    stats = run_property(tmp_path, spy, state_backend, examples=20, modes=MODES,
                         min_mutable_failed=0.15)
    # The runs did checkpoint loops with records in flight.
    assert stats.logged_checkpoints >= 1, stats


@pytest.mark.slow
def test_loops_survive_random_failures_soak(tmp_path: Path, spy: Spy,
                                           state_backend: StateBackendFactory) -> None:
    stats = run_property(tmp_path, spy, state_backend, examples=200, modes=MODES,
                         min_mutable_failed=0.3)
    assert stats.logged_checkpoints >= 0.2 * stats.examples, stats
    assert stats.restores_reinjecting >= 0.05 * stats.examples, stats
    assert stats.logging_failures >= 0.1 * stats.examples, stats
    assert stats.fault_fired >= 0.1 * stats.examples, stats
    assert stats.over_workers >= 0.1 * stats.examples, stats


# -- (b) in-flight loop records survive a failure ------------------------------------

ROUNDS = 30
N = 240
KEYS = 12


class FailAfterLoggedCheckpoint:
    """Identity map for the loop body: fails once, as soon as a completed
    periodic checkpoint in ``directory`` holds a non-empty back-edge log."""

    def __init__(self, directory: Path, head: str, times: int = 1) -> None:
        self.directory = directory
        self.head = head
        self.times = times
        self.failures = 0
        self.calls = 0
        self.failed_after: int | None = None  # the checkpoint seen before failing
        self.lock = threading.Lock()

    def __call__(self, r: Any) -> Any:
        with self.lock:
            if self.failures >= self.times:
                return r
            self.calls += 1
            if self.calls % 20:
                return r
            for c in reversed(ef.list_checkpoints(self.directory)):
                if not c.final and backedge_records_of(c.metadata, self.head) > 0:
                    self.failures += 1
                    self.failed_after = c.id
                    break
            else:
                return r
        raise ef.testing.InjectedFailure(f"failing after checkpoint {self.failed_after}")


def countdown(r: tuple[int, int, int]) -> tuple[int, int, int]:
    return (r[0], r[1], r[2] - 1)


def slow_in_loop(r: Any) -> Any:
    time.sleep(0.00005)
    return r


def count_passes(r: Any, s: int | None) -> tuple[Any, int]:
    return r, (s or 0) + 1


def in_flight_job(env: ef.StreamEnvironment, sink: ef.Sink,
                  failing: Callable[[Any], Any], *, two_back_edges: bool = False) -> None:
    """(key, id, rounds) records go ROUNDS times round a loop with a keyed
    counter of passes inside; the source keeps feeding the loop slowly.
    With ``two_back_edges`` the feedback is the union of two branches (even
    and odd ids, the odd ones rebalanced), so the head logs two back-edges."""
    records = [(i % KEYS, i, ROUNDS) for i in range(N)]
    src = env.from_collection(records).name("src").map(Pace(2, 0.002)).name("pace")
    loop = src.iterate().name("head")
    body = loop.map(slow_in_loop).name("slow")
    body = body.key_by(key0).map_with_state(count_passes).name("passes")
    body = body.map(failing).name("failing").map(countdown).name("countdown")
    if two_back_edges:
        even = body.filter(lambda r: r[2] > 0 and r[1] % 2 == 0).name("again-even")
        odd = body.filter(lambda r: r[2] > 0 and r[1] % 2 == 1).name("again-odd")
        loop.close_with(even.key_by(key0).union(odd.rebalance()))
    else:
        loop.close_with(body.filter(lambda r: r[2] > 0).name("again").key_by(key0))
    (body.filter(lambda r: r[2] <= 0).name("out")
        .key_by(key0).count().name("finished")
        .sink_to(sink).name("sink"))


def expected_output() -> Counter[tuple[int, int]]:
    per_key = Counter(i % KEYS for i in range(N))
    return Counter((k, c) for k, n in per_key.items() for c in range(1, n + 1))


def expected_passes() -> dict[int, int]:
    per_key = Counter(i % KEYS for i in range(N))
    return {k: n * ROUNDS for k, n in per_key.items()}


def check_restored_log(chk: Path, spy: Spy, failed_after: int | None) -> int:
    """The checkpoint restored from holds a non-empty back-edge log, and
    exactly its records were re-injected. Returns its id."""
    restored = {c for c, _, _, _ in spy.reinjected}
    assert len(restored) == 1, spy.reinjected
    (cid,) = restored
    assert failed_after is not None and cid >= failed_after
    meta = json.loads((chk / f"chk-{cid}" / "_metadata").read_text())
    assert not meta["final"]
    logged = backedge_records_of(meta, "head")
    assert logged > 0, f"checkpoint {cid} holds no back-edge records"
    assert sum(n for c, h, _, n in spy.reinjected if h == "head") == logged
    # Re-injected in batches of at most batch_size (8 in these jobs), not as one.
    assert sum(spy.reinjected_batches) == sum(n for _, _, _, n in spy.reinjected)
    assert spy.reinjected_batches and max(spy.reinjected_batches) <= 8, spy.reinjected_batches
    for s, part in meta["operators"]["head"]["subtasks"].items():
        if "backedge" in part:
            assert (chk / part["backedge"]["file"]["path"]).is_file(), s
    return cid


class CheckStamp(ef.KeyedProcessFunction):
    """Passes a ``(key, id, rounds)`` record on, failing unless it carries
    its own event timestamp, ``id`` (also after a restore: re-injected
    back-edge records must keep theirs)."""

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        if ctx.timestamp != float(value[1]):
            raise AssertionError(f"{value} arrived with timestamp {ctx.timestamp!r}")
        return [value]


def event_time_loop_job(env: ef.StreamEnvironment, sink: ef.Sink,
                        failing: Callable[[Any], Any]) -> None:
    """``in_flight_job``'s loop over records stamped with their id, a stamp
    check in the body, and event-time windows of ten ids after it."""
    records = [(i % KEYS, i, ROUNDS) for i in range(N)]
    strategy = ef.WatermarkStrategy.bounded_out_of_orderness(1000.0, lambda r: float(r[1]))
    src = (env.from_collection(records).name("src").map(Pace(2, 0.002)).name("pace")
           .assign_timestamps_and_watermarks(strategy).name("stamps"))
    loop = src.iterate().name("head")
    body = loop.key_by(key0).process(CheckStamp()).name("check")
    body = body.map(failing).name("failing").map(countdown).name("countdown")
    loop.close_with(body.filter(lambda r: r[2] > 0).name("again").key_by(key0))
    (body.filter(lambda r: r[2] <= 0).name("out")
        .key_by(key0).window(ef.TumblingEventTimeWindows(size=10.0)).count().name("windows")
        .sink_to(sink).name("sink"))


def test_back_edge_records_keep_their_timestamps_across_a_restore(
        tmp_path: Path, spy: Spy) -> None:
    chk = tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    env.enable_checkpointing(0.01, chk, retained=1000)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=1, delay=0))
    failing = FailAfterLoggedCheckpoint(chk, "head")
    sink = ef.ListSink()
    event_time_loop_job(env, sink, failing)
    result = watched(env.execute_async("event-time loop"), TIMEOUT)
    assert failing.failures == 1, "no checkpoint with records in flight round the loop completed"
    assert result.restarts == 1
    check_restored_log(chk, spy, failing.failed_after)
    want = Counter((i % KEYS, (i // 10) * 10.0) for i in range(N))
    got = Counter()
    for w in sink.results:
        got[(w.key, w.start)] += w.value
    assert got == want


@pytest.mark.parametrize(("parallelism", "mode", "two_back_edges"), [
    (1, "exactly_once", False),
    (2, "exactly_once", False),
    (1, "synchronous", False),
    (2, "synchronous", False),
    (2, "exactly_once", True),
    (1, "synchronous", True),
])
def test_in_flight_loop_records_survive_a_restart(parallelism: int, mode: str,
                                                 two_back_edges: bool, tmp_path: Path,
                                                 spy: Spy,
                                                 state_backend: StateBackendFactory) -> None:
    chk = tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=8)
    state_backend.use(env, tmp_path)
    env.enable_checkpointing(0.01, chk, mode=mode, retained=1000)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=1, delay=0))
    failing = FailAfterLoggedCheckpoint(chk, "head")
    sink = ef.ListSink()
    in_flight_job(env, sink, failing, two_back_edges=two_back_edges)
    if two_back_edges:
        assert len(env.plan().back_edges) == 2
    result = watched(env.execute_async("in-flight"), TIMEOUT)
    assert failing.failures == 1, "no checkpoint with records in flight round the loop completed"
    assert result.restarts == 1
    check_restored_log(chk, spy, failing.failed_after)
    assert Counter(sink.results) == expected_output()
    assert result.state("passes") == expected_passes()
    assert result.state("finished") == Counter(i % KEYS for i in range(N))


def test_failure_while_back_edge_log_is_recorded(tmp_path: Path, spy: Spy,
                                                 state_backend: StateBackendFactory) -> None:
    """A map in the loop body fails while a loop head is logging its
    back-edges (the checkpoint is in progress); twice, so that the second
    failure usually hits a run restored from a checkpoint."""
    chk = tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    state_backend.use(env, tmp_path)
    env.enable_checkpointing(0.01, chk, retained=1000)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0))
    failing = FailWhileLogging(spy, times=2, skip=50)
    sink = ef.ListSink()
    in_flight_job(env, sink, failing)
    result = watched(env.execute_async("fail-while-logging"), TIMEOUT)
    assert failing.failures == 2
    assert result.restarts == 2
    assert Counter(sink.results) == expected_output()
    assert result.state("passes") == expected_passes()


def test_async_write_failure_of_loop_heads(tmp_path: Path, spy: Spy,
                                           state_backend: StateBackendFactory) -> None:
    """``snapshot.async_write`` fails the writes of several checkpoints,
    loop heads' (written when the barrier has come back) among them."""
    chk = tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    state_backend.use(env, tmp_path)
    env.enable_checkpointing(0.01, chk, retained=1000)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=4, delay=0))
    sink = ef.ListSink()
    in_flight_job(env, sink, identity)
    ef.testing.arm("snapshot.async_write", after=25, times=3)
    result = watched(env.execute_async("async-write"), TIMEOUT)
    assert "snapshot.async_write" not in faults._armed, "the fault point did not fire 3 times"
    # (Writes of one checkpoint may fail together: one restart.)
    assert 1 <= result.restarts <= 3
    assert Counter(sink.results) == expected_output()
    assert result.state("passes") == expected_passes()


def test_restore_across_processes_from_checkpoint_with_in_flight_records(
        tmp_path: Path, spy: Spy, state_backend: StateBackendFactory) -> None:
    chk, out = tmp_path / "chk", tmp_path / "out"

    # First "process": fails after a checkpoint with records in flight; no restarts.
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    state_backend.use(env, tmp_path)
    env.enable_checkpointing(0.01, chk, retained=1000)
    failing = FailAfterLoggedCheckpoint(chk, "head")
    in_flight_job(env, ef.FileSink(out), failing)
    with pytest.raises(ef.JobFailed) as info:
        watched(env.execute_async("first"), TIMEOUT)
    assert isinstance(info.value.__cause__, ef.testing.InjectedFailure)
    assert failing.failures == 1
    committed_before = read_parts(out)
    assert Counter(committed_before) - expected_output() == Counter()  # nothing wrong so far

    # A fresh environment, as a new process would build it, restores the latest.
    spy.reinjected.clear()
    spy.reinjected_batches.clear()
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    state_backend.use(env, tmp_path)  # a new backend, as a new process would make
    env.enable_checkpointing(0.01, chk, retained=1000)
    in_flight_job(env, ef.FileSink(out), identity)
    latest = max(c.id for c in ef.list_checkpoints(chk))
    result = watched(env.execute_async("second", restore="latest"), TIMEOUT)
    cid = check_restored_log(chk, spy, failing.failed_after)
    assert cid == latest
    assert Counter(read_parts(out)) == expected_output()
    assert [n for n in os.listdir(out) if not n.startswith("part-")] == []
    # The state restored plus what the second run added is the whole job's.
    assert result.state("passes") == expected_passes()
    assert result.state("finished") == Counter(i % KEYS for i in range(N))


@pytest.mark.parametrize("new_parallelism", [1, 3])
def test_restore_loop_checkpoint_at_another_parallelism(
        new_parallelism: int, tmp_path: Path, spy: Spy,
        state_backend: StateBackendFactory) -> None:
    """Keyed state is re-partitioned by key group and the back-edge logs of
    the old head subtasks are dealt out to the new ones."""
    chk, out = tmp_path / "chk", tmp_path / "out"
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    state_backend.use(env, tmp_path)
    env.enable_checkpointing(0.01, chk, retained=1000)
    failing = FailAfterLoggedCheckpoint(chk, "head")
    in_flight_job(env, ef.FileSink(out), failing)
    with pytest.raises(ef.JobFailed):
        watched(env.execute_async("first"), TIMEOUT)
    assert failing.failures == 1

    spy.reinjected.clear()

    spy.reinjected_batches.clear()
    env = ef.StreamEnvironment(parallelism=new_parallelism, batch_size=8)
    state_backend.use(env, tmp_path)
    env.enable_checkpointing(0.01, chk, retained=1000)
    in_flight_job(env, ef.FileSink(out), identity)
    result = watched(env.execute_async("rescaled", restore="latest"), TIMEOUT)
    check_restored_log(chk, spy, failing.failed_after)
    assert Counter(read_parts(out)) == expected_output()
    assert result.state("passes") == expected_passes()
    assert result.state("finished") == Counter(i % KEYS for i in range(N))


# -- graph algorithms round a loop, with failures --------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load_example(name: str) -> Any:
    from eddyflow.jobfile import load_job
    return load_job(EXAMPLES / f"{name}.py")


def union_find(edges_file: Path) -> dict[int, int]:
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for line in edges_file.read_text().splitlines():
        u, v = map(int, line.split())
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    return {x: find(x) for x in parent}


def strictly_decreasing_per_key(pairs: list[tuple[int, int]]) -> dict[int, list[int]]:
    seq: dict[int, list[int]] = {}
    for k, v in pairs:
        seq.setdefault(k, []).append(v)
    for k, vs in seq.items():
        assert all(a > b for a, b in itertools.pairwise(vs)), (
            f"vertex {k}: committed improvements not strictly decreasing (duplicated or "
            f"reordered by a recovery): {vs}")
    return seq


@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize("mode", ["exactly_once", "synchronous"])
def test_connected_components_with_failures(parallelism: int, mode: str, tmp_path: Path,
                                            spy: Spy) -> None:
    """Label propagation with keyed list and value state inside the loop (at
    parallelism 1 the state lives in the loop head's own task). The labels
    committed per vertex must be exactly one failure-free history: starting
    at the vertex itself, strictly decreasing, ending at the component's
    smallest id."""
    cc = _load_example("connected_components")
    edges = tmp_path / "edges.txt"
    cc.make_graph(str(edges), vertices=500, edges=450, seed=11)

    def job(env: ef.StreamEnvironment, sink: ef.Sink, failing: Callable[[Any], Any],
            pace: Callable[[Any], Any]) -> None:
        src = env.read_text_file(edges).name("edges").map(pace).name("pace")
        loop = src.flat_map(cc.parse).name("parse").iterate().name("head")
        propagated = loop.key_by(lambda r: r[1]).process(cc.Propagate()).name("propagate")
        propagated = propagated.map(failing).name("failing")
        loop.close_with(propagated.filter(lambda r: r[0] == "label").name("feedback")
                        .key_by(lambda r: r[1]))
        (propagated.filter(lambda r: r[0] == "final").name("labels")
            .map(lambda r: (r[1], r[2])).name("pairs").sink_to(sink))

    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=16)
    job(env, ef.ListSink(), identity, identity)
    ref = watched(env.execute_async("reference"), TIMEOUT)
    through = ref.records_in["failing"]

    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=16)
    env.enable_checkpointing(0.01, tmp_path / "chk", mode=mode, retained=1000)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0))
    failing = ef.testing.FailingMap(after=max(1, through // 3), times=2)
    sink = ef.ListSink()
    job(env, sink, failing, Pace(4, 0.002))
    result = watched(env.execute_async("checked"), TIMEOUT)
    assert failing.failures >= 1 and result.restarts >= 1

    want = union_find(edges)
    assert result.state("propagate", "label") == want
    seq = strictly_decreasing_per_key(list(sink.results))
    assert set(seq) == set(want)
    for v, labels in seq.items():
        assert labels[0] == v and labels[-1] == want[v], (v, labels)


@pytest.mark.parametrize("parallelism", [1, 2])
def test_shortest_paths_with_failures(parallelism: int, tmp_path: Path, spy: Spy) -> None:
    sp = _load_example("shortest_paths")
    edges = tmp_path / "weighted.txt"
    sp.make_graph(str(edges), vertices=250, edges=1200, seed=4)
    with open(edges, "a") as f:
        f.write(f"{sp.SOURCE} 1 4\n")

    def job(env: ef.StreamEnvironment, sink: ef.Sink, failing: Callable[[Any], Any],
            pace: Callable[[Any], Any]) -> None:
        src = env.read_text_file(edges).name("edges").map(pace).name("pace")
        loop = src.flat_map(sp.parse).name("parse").iterate().name("head")
        relaxed = loop.key_by(lambda r: r[1]).process(sp.Relax()).name("relax")
        relaxed = relaxed.map(failing).name("failing")
        loop.close_with(relaxed.filter(lambda r: r[0] == "dist").name("offers")
                        .key_by(lambda r: r[1]))
        (relaxed.filter(lambda r: r[0] == "final").name("improvements")
            .map(lambda r: (r[1], r[2])).name("pairs").sink_to(sink))

    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=16)
    ref_sink = ef.ListSink()
    job(env, ref_sink, identity, identity)
    ref = watched(env.execute_async("reference"), TIMEOUT)
    through = ref.records_in["failing"]

    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=16)
    env.enable_checkpointing(0.01, tmp_path / "chk", retained=1000)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0))
    failing = ef.testing.FailingMap(after=max(1, through // 3), times=2)
    sink = ef.ListSink()
    job(env, sink, failing, Pace(8, 0.002))
    result = watched(env.execute_async("checked"), TIMEOUT)
    assert failing.failures >= 1 and result.restarts >= 1

    want = ref.state("relax", "distance")
    assert len(want) > 100
    assert result.state("relax", "distance") == want
    assert result.state("relax", "out-edges") == ref.state("relax", "out-edges")
    seq = strictly_decreasing_per_key(list(sink.results))
    assert {v: ds[-1] for v, ds in seq.items()} == want


@pytest.mark.parametrize("mode", ["exactly_once", "synchronous"])
def test_in_flight_records_survive_with_feedback_spilling_to_disk(
        mode: str, tmp_path: Path, spy: Spy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The back-edges spill to disk (a feedback memory of 2 records) while
    barriers and logged records pass through them; recovery is still exact."""
    chk = tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=2, batch_size=4)
    env.enable_checkpointing(0.01, chk, mode=mode, retained=1000)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=1, delay=0))
    config = env._runtime_config()
    monkeypatch.setattr(env, "_runtime_config",
                        lambda: dataclasses.replace(config, feedback_memory=2))
    failing = FailAfterLoggedCheckpoint(chk, "head")
    sink = ef.ListSink()
    in_flight_job(env, sink, failing)
    result = watched(env.execute_async("spilling"), TIMEOUT)
    assert failing.failures == 1 and result.restarts == 1
    check_restored_log(chk, spy, failing.failed_after)
    feedback = [ch for t in spy.tasks if t.gate is not None for ch in t.gate.channels
                if isinstance(ch, FeedbackChannel)]
    assert feedback and all(ch.memory_records == 2 for ch in feedback)
    assert sum(ch.spilled_batches for ch in feedback) > 0
    assert all(ch._disk is None for ch in feedback)  # closed, attempt after attempt
    assert Counter(sink.results) == expected_output()
    assert result.state("passes") == expected_passes()


# -- (c) every checkpoint of a loop is consistent -----------------------------------
#
# A job whose records are identifiable lets each checkpoint be checked offline
# for feasibility (DESIGN.md §1): record i enters with ROUNDS_C rounds and
# every pass emits (i, rounds left) to a FileSink; the feedback is keyed, so
# records cross between head subtasks. In a consistent checkpoint, a record
# the sources had not read has no committed output and is in no back-edge
# log; a record they had read has committed outputs exactly ROUNDS_C-1 down
# to some m, and, if m > 0, is logged exactly once as (i, m).

N_C = 120
ROUNDS_C = 20


class _TwoSplits(ef.Source):
    """Two splits of (i, ROUNDS_C) records, i even in split 0 and odd in
    split 1, two records per read; with ``uneven`` split 1 reads five times
    slower (a lagging partition), so its barriers come later."""

    def __init__(self, uneven: bool) -> None:
        self.uneven = uneven

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        assert parallelism == 2
        delay = 0.02 if self.uneven and subtask == 1 else 0.004
        return _TwoSplitsReader(subtask, delay)


class _TwoSplitsReader(ef.SourceReader):
    def __init__(self, subtask: int, delay: float) -> None:
        self.items = [(i, ROUNDS_C) for i in range(subtask, N_C, 2)]
        self.delay = delay
        self.pos = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.pos >= len(self.items):
            return None
        await asyncio.sleep(self.delay)
        out = self.items[self.pos:self.pos + 2]
        self.pos += len(out)
        return out

    def position(self) -> Any:
        return self.pos

    def seek(self, position: Any) -> None:
        self.pos = position


def one_pass(r: tuple[int, int]) -> tuple[int, int]:
    return (r[0], r[1] - 1)


def passes_job(env: ef.StreamEnvironment, uneven: bool, out: Path) -> None:
    loop = env.from_source(_TwoSplits(uneven)).name("src").set_parallelism(2)
    loop = loop.iterate().name("head")
    body = loop.map(one_pass).name("pass")
    loop.close_with(body.filter(lambda r: r[1] > 0).name("again").key_by(lambda r: r[0] // 2))
    body.sink_to(ef.FileSink(out)).name("sink")


def committed_by(infos: list[ef.CheckpointInfo], n: int, out: Path) -> Counter[tuple[int, int]]:
    """Sink output committed once checkpoint ``n`` has completed: every
    transaction recorded by a checkpoint up to ``n``."""
    names = set()
    for c in infos:
        if c.id <= n:
            for part in c.operators["sink"]["subtasks"].values():
                names.update(final for _, final in part.get("committables") or [])
    got: Counter[tuple[int, int]] = Counter()
    for name in names:
        with open(out / name, encoding="utf-8") as f:
            got.update(tuple(json.loads(line)) for line in f)
    return got


def inconsistencies(info: ef.CheckpointInfo, committed: Counter[tuple[int, int]],
                    chk: Path) -> list[str]:
    from eddyflow.checkpoint.storage import FileHandle
    from eddyflow.runtime.checkpointing.backedge_log import read_backedge_log
    logged: Counter[tuple[int, int]] = Counter()
    for part in info.operators["head"]["subtasks"].values():
        if "backedge" in part:
            handle = FileHandle.from_json(part["backedge"]["file"])
            for recs in read_backedge_log(str(chk), handle).values():
                logged.update(tuple(x) for x in recs)
    read: set[int] = set()
    for s, part in info.operators["src"]["subtasks"].items():
        read.update(list(range(int(s), N_C, 2))[:part["source"]])
    problems = []
    for i in range(N_C):
        outs = sorted((k for (j, k) in committed.elements() if j == i), reverse=True)
        log = sorted((j, k) for (j, k) in logged.elements() if j == i)
        if i not in read:
            if outs or log:
                problems.append(f"record {i} is after the source position (it will be "
                                f"replayed) yet has committed outputs {outs} / is logged {log}")
            continue
        m = outs[-1] if outs else ROUNDS_C
        if outs != list(range(ROUNDS_C - 1, m - 1, -1)):
            problems.append(f"record {i}: committed outputs {outs}")
        elif log != ([(i, m)] if m > 0 else []):
            problems.append(f"record {i}: committed down to {m} but logged {log}")
    return problems


@pytest.mark.parametrize("uneven", [False, True], ids=["even-splits", "lagging-split"])
def test_every_periodic_checkpoint_of_a_loop_is_consistent(uneven: bool, tmp_path: Path) -> None:
    """With keyed feedback, a head subtask can receive barrier n back on a
    back-edge (from a tail fed by another head subtask) *before* barrier n
    reaches it on its own regular input. That barrier must not be lost, and
    the records behind it must not leak into the head's snapshot."""
    chk, out = tmp_path / "chk", tmp_path / "out"
    env = ef.StreamEnvironment(parallelism=2, batch_size=4)
    env.enable_checkpointing(0.01, chk, retained=1000)
    passes_job(env, uneven, out)
    watched(env.execute_async("consistency"), timeout=60)
    infos = ef.list_checkpoints(chk)
    periodic = [c for c in infos if not c.final]
    assert Counter(read_parts(out)) == Counter(
        (i, k) for i in range(N_C) for k in range(ROUNDS_C))
    assert periodic
    for c in periodic:
        problems = inconsistencies(c, committed_by(infos, c.id, out), chk)
        assert not problems, f"checkpoint {c.id}: {len(problems)} problems: {problems[:4]}"
    # The job runs ~0.3-0.7 s with a checkpoint every 10 ms: periodic
    # checkpoints must complete while it runs, not wait for its end.
    assert len(periodic) >= 3, [(c.id, round(c.duration, 3)) for c in infos]


@pytest.mark.parametrize("uneven", [False, True], ids=["even-splits", "lagging-split"])
def test_restoring_any_loop_checkpoint_gives_exact_output(uneven: bool, tmp_path: Path) -> None:
    """A crash right after checkpoint n completed, simulated for several n:
    a sink folder holding what n committed, a fresh environment restored
    from chk-n; the output must then be exactly the failure-free one."""
    chk, out = tmp_path / "chk", tmp_path / "out"
    env = ef.StreamEnvironment(parallelism=2, batch_size=4)
    env.enable_checkpointing(0.01, chk, retained=1000)
    passes_job(env, uneven, out)
    watched(env.execute_async("first"), timeout=60)
    infos = ef.list_checkpoints(chk)
    periodic = [c for c in infos if not c.final]
    assert periodic
    picks = {periodic[0].id, periodic[len(periodic) // 2].id, periodic[-1].id}
    want = Counter((i, k) for i in range(N_C) for k in range(ROUNDS_C))
    for n in sorted(picks):
        names = set()
        for c in infos:
            if c.id <= n:
                for part in c.operators["sink"]["subtasks"].values():
                    names.update(final for _, final in part.get("committables") or [])
        crashed = tmp_path / f"out-after-{n}"
        crashed.mkdir()
        for name in names:
            (crashed / name).write_bytes((out / name).read_bytes())
        env = ef.StreamEnvironment(parallelism=2, batch_size=4)
        env.enable_checkpointing(0.01, tmp_path / f"chk-after-{n}", retained=1000)
        passes_job(env, uneven, crashed)
        watched(env.execute_async("restored", restore=str(chk / f"chk-{n}")), timeout=60)
        got = Counter(read_parts(crashed))
        lost, dup = want - got, got - want
        assert not lost and not dup, (
            f"restored from checkpoint {n}: {sum(lost.values())} lost (e.g. {list(lost)[:3]}), "
            f"{sum(dup.values())} duplicated (e.g. {list(dup)[:3]})")


def test_synchronous_checkpoints_of_a_loop_with_a_lagging_split_do_not_stall(
        tmp_path: Path) -> None:
    """Synchronous mode pauses the sources until the checkpoint completes; a
    checkpoint waiting for a back-edge barrier that was already consumed
    never completes, so the job stalls until the checkpoint timeout, over
    and over. The job (under a second of work) must finish promptly."""
    chk, out = tmp_path / "chk", tmp_path / "out"
    env = ef.StreamEnvironment(parallelism=2, batch_size=4)
    env.enable_checkpointing(0.01, chk, mode="synchronous", retained=1000, timeout=2.0)
    passes_job(env, True, out)
    watched(env.execute_async("synchronous"), timeout=6)
    assert Counter(read_parts(out)) == Counter(
        (i, k) for i in range(N_C) for k in range(ROUNDS_C))
    aborted = [c for c in ef.list_checkpoints(chk) if c.duration > 1.0]
    assert not aborted
