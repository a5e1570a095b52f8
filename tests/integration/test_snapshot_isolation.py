"""Snapshot isolation: a checkpoint records what it covers as it was AT THE
BARRIER, whatever user code does to those objects afterwards
(docs/architecture.md: State, Checkpoints, Loops).

User functions are allowed to mutate their own objects in place: the list a
``map_with_state`` function got as its state, the dict a ``ValueState`` or a
``ReducingState`` holds, a record on its way round a loop, a record a source
emitted. The runtime hands those objects out by reference, and the part of a
checkpoint that is written after the barrier (the asynchronous phase of a
state snapshot, a back-edge log pickled when the barrier has come back round
the loop, a source's replay after a restore) must not see what the user code
did to them after the barrier. Otherwise a restore resumes from a state that
never existed at any barrier: appends counted twice, loop records that lost
rounds, replayed source records that were already transformed.

Every test runs the same job twice: once failure-free without checkpoints
(the reference), once with a checkpoint every 10 ms and up to three
``FailingMap`` failures, each once one more checkpoint has completed (so
that every restart restores another checkpoint), recovered in-process by a
restart strategy. The committed sink output (a multiset) and the final
keyed state must EQUAL the reference. A pacing map keeps the source slow
enough for checkpoints to interleave with the records, and each test
asserts that checkpoints completed and that restarts happened, so that none
passes vacuously. (Every test fails on the runtime before snapshot
isolation; the same tests with functions that copy instead of mutating
passed there.)

The cases: (a) a ``map_with_state`` function appending to its state list in
place; (b) a loop body decrementing a field of a dict record in place (the
back-edge log); (c) a ``map`` mutating the dicts ``from_collection`` emits
(the source's replay); (d) a ``ValueState`` dict mutated in place in a
``KeyedProcessFunction``; (e) a ``ReducingState`` whose reduce function
mutates its accumulator dict in place. (a), (d), (e) also at parallelism 2.

Every test runs once per state backend (the ``state_backend`` fixture):
both runs keep their keyed state in the memory backend, or both in RocksDB
(with a write cache smaller than the keys, so that values are serialised
and read back while records flow, not only at barriers). Every test also
checks the reference run's final state against values computed here in
plain Python, so the RocksDB reference is not its own oracle.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace, StateBackendFactory, watched

import eddyflow as ef

TIMEOUT = 60.0  # a run takes about a second; a loaded machine may take several
KEYS = 7


# -- helpers -------------------------------------------------------------------------


def identity(r: Any) -> Any:
    return r


class FailAfterCheckpoints:
    """Identity map failing up to ``times`` times (raising
    ``ef.testing.InjectedFailure`` from an ``ef.testing.FailingMap``), each
    time ``after`` records after a checkpoint that the previous failure did
    not see has completed in ``directory`` (the first after ``first``
    periodic checkpoints). So every restart restores a checkpoint, and
    another one each time, however slowly checkpoints complete: with a plain
    ``FailingMap`` a slow start (the first checkpoint waits for the state
    writer) can make the restarts begin from scratch, or restore the same
    checkpoint again and again, and the test pass vacuously."""

    def __init__(self, directory: Path, after: int, times: int, first: int = 2) -> None:
        self.directory = directory
        self.after = after
        self.times = times
        self.needed = first  # periodic checkpoints complete before the next failure
        self.failures = 0
        self.armed_at: list[list[int]] = []  # the checkpoints complete, per arming
        self._failing: ef.testing.FailingMap | None = None
        self._n = 0
        self._lock = threading.Lock()

    def _arm(self) -> bool:
        self._n += 1
        if self._n % 8:
            return False
        try:
            done = [c.id for c in ef.list_checkpoints(self.directory) if not c.final]
        except OSError:
            return False
        if len(done) < self.needed:
            return False
        self.armed_at.append(done)
        self.needed = len(done) + 1
        self._failing = ef.testing.FailingMap(after=self.after, times=1)
        return True

    def __call__(self, r: Any) -> Any:
        with self._lock:
            if self.failures >= self.times:
                return r
            if self._failing is None and not self._arm():
                return r
            failing = self._failing
            assert failing is not None
        try:
            return failing(r)
        except ef.testing.InjectedFailure:
            with self._lock:
                self.failures += 1
                self._failing = None
            raise

    def __deepcopy__(self, memo: dict[int, Any]) -> FailAfterCheckpoints:
        return self  # shared across subtasks and restarts, as FailingMap is


#: build(env, sink, failing, pace) adds the job to env
Build = Callable[[ef.StreamEnvironment, ef.Sink, Callable[[Any], Any], Callable[[Any], Any]], None]


@dataclass
class Runs:
    reference: ef.JobResult
    reference_output: list[Any]
    checked: ef.JobResult
    checked_output: list[Any]
    failing: FailAfterCheckpoints


def reference_and_checked(build: Build, tmp_path: Path, backend: StateBackendFactory, *,
                          after: int, times: int = 3, checkpoints: int = 2,
                          parallelism: int = 1, interval: float = 0.01,
                          batch_size: int = 16, pace_every: int = 4) -> Runs:
    """Run ``build`` failure-free without checkpoints, then with a checkpoint
    every ``interval`` seconds and up to ``times`` failures, each ``after``
    records after one more checkpoint has completed (the first after
    ``checkpoints``): each restart restores another checkpoint, one more
    chance for what leaked into a checkpoint to show. Checks that the job
    restarted from checkpoints. Both runs use ``backend``."""
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=batch_size)
    backend.use(env, tmp_path / "reference")
    ref_sink = ef.ListSink()
    build(env, ref_sink, identity, identity)
    reference = watched(env.execute_async("reference"), TIMEOUT)

    directory = tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=batch_size)
    backend.use(env, tmp_path / "checked")
    env.enable_checkpointing(interval, directory, retained=1000)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=times, delay=0))
    failing = FailAfterCheckpoints(directory, after, times, first=checkpoints)
    sink = ef.ListSink()
    build(env, sink, failing, Pace(pace_every))
    checked = watched(env.execute_async("checked"), TIMEOUT)

    # Not vacuous: the job failed and restarted, after checkpoints had
    # completed (so the restarts restored checkpoints, not the empty start).
    assert failing.armed_at, "the job ended before checkpoints completed"
    assert failing.failures >= 1, "no failure happened: the job ended first"
    assert checked.restarts == failing.failures, (checked.restarts, failing.failures)
    assert len(checked.completed_checkpoints) >= checkpoints, checked.completed_checkpoints
    return Runs(reference, list(ref_sink.results), checked, list(sink.results), failing)


def assert_same_output(runs: Runs) -> None:
    want, got = Counter(runs.reference_output), Counter(runs.checked_output)
    lost, extra = want - got, got - want
    assert not lost and not extra, (
        f"after {runs.checked.restarts} restarts: {sum(lost.values())} records lost "
        f"(e.g. {sorted(lost, key=repr)[:4]}), {sum(extra.values())} duplicated or wrong "
        f"(e.g. {sorted(extra, key=repr)[:4]})")


def assert_same_state(runs: Runs, operator: str, name: str | None = None) -> None:
    want = runs.reference.state(operator, name)
    got = runs.checked.state(operator, name)
    assert want, "the reference run left no state"
    wrong = sorted((k for k in set(want) | set(got) if want.get(k) != got.get(k)), key=repr)
    assert not wrong, (
        f"after {runs.checked.restarts} restarts, {len(wrong)} of {len(want)} keys differ; "
        + "; ".join(f"key {k!r}: {difference(want.get(k), got.get(k))}" for k in wrong[:3]))


def difference(want: Any, got: Any) -> str:
    """A short description of how ``got`` differs from ``want``."""
    if isinstance(want, list) and isinstance(got, list):
        extra, lost = Counter(got) - Counter(want), Counter(want) - Counter(got)
        return (f"{len(got)} items instead of {len(want)}, extra {sorted(extra.elements())[:6]}, "
                f"missing {sorted(lost.elements())[:6]}")
    if isinstance(want, dict) and isinstance(got, dict):
        return ", ".join(f"[{f!r}] {difference(want.get(f), got.get(f))}"
                         for f in sorted(set(want) | set(got), key=repr)
                         if want.get(f) != got.get(f))
    return f"{got!r:.100} instead of {want!r:.100}"


# -- (a) map_with_state appending to its state list in place --------------------------

N_A = 1200
RECORDS_A = [(f"k{i % KEYS}", i) for i in range(N_A)]


def append_in_place(r: tuple[str, int], s: list[int] | None) -> tuple[tuple[str, int], list[int]]:
    s = s if s is not None else []
    s.append(r[1])
    return (r[0], len(s)), s


def appending_job(env: ef.StreamEnvironment, sink: ef.Sink, failing: Callable[[Any], Any],
                  pace: Callable[[Any], Any]) -> None:
    ds = env.from_collection(RECORDS_A).name("src")
    ds = ds.map(pace).name("pace").set_parallelism(1)
    ds = ds.map(failing).name("failing").set_parallelism(1)
    (ds.key_by(lambda r: r[0]).map_with_state(append_in_place).name("mws")
        .sink_to(sink).name("sink"))


@pytest.mark.parametrize(("parallelism", "after"), [(1, 100), (1, 170), (2, 100)])
def test_map_with_state_list_appended_in_place(parallelism: int, after: int, tmp_path: Path,
                                               state_backend: StateBackendFactory) -> None:
    """``fn`` appends each record's value to the list it got as state and
    returns that same list. The old runtime froze its state for a snapshot
    by a shallow copy and pickled it later: the frozen table shared the
    lists, so the appends made after the barrier leaked into the checkpoint,
    and after a restore those records were appended again (lists longer
    than the input, with values repeated)."""
    runs = reference_and_checked(appending_job, tmp_path, state_backend, after=after,
                                 parallelism=parallelism)
    want = {f"k{k}": [i for i in range(N_A) if i % KEYS == k] for k in range(KEYS)}
    assert runs.reference.state("mws") == want
    assert_same_state(runs, "mws")
    assert_same_output(runs)


# -- (b) a loop body decrementing a field of a dict record in place ------------------

N_B = 400
MAX_STEPS = 12


def steps_of(i: int) -> int:
    return 1 + (i * 7) % MAX_STEPS


def as_dict(t: tuple[int, int]) -> dict[str, int]:
    return {"id": t[0], "steps": t[1]}


def step_in_place(r: dict[str, int]) -> dict[str, int]:
    r["steps"] -= 1
    return r


def count_passes(r: dict[str, int], s: int | None) -> tuple[dict[str, int], int]:
    return r, (s or 0) + 1


def slow_in_loop(r: Any) -> Any:
    time.sleep(0.00005)
    return r


def loop_job(env: ef.StreamEnvironment, sink: ef.Sink, failing: Callable[[Any], Any],
             pace: Callable[[Any], Any]) -> None:
    # The source emits tuples and a map makes a new dict of each: only the
    # back-edge log can hold a dict the body mutates (test (c) covers a
    # source replaying mutated records).
    src = env.from_collection([(i, steps_of(i)) for i in range(N_B)]).name("src")
    src = src.map(pace).name("pace").map(as_dict).name("as-dict")
    loop = src.iterate()
    loop.name("head")
    body = loop.map(step_in_place).name("step").map(slow_in_loop).name("slow")
    body = body.key_by(lambda r: r["id"]).map_with_state(count_passes).name("passes")
    body = body.map(failing).name("failing")
    loop.close_with(body.filter(lambda r: r["steps"] > 0).name("again")
                    .key_by(lambda r: r["id"]))
    (body.filter(lambda r: r["steps"] == 0).name("out")
        .map(lambda r: (r["id"], r["steps"])).name("pairs")
        .sink_to(sink).name("sink"))


@pytest.mark.parametrize(("parallelism", "after"), [(1, 150), (2, 200)])
def test_loop_record_mutated_in_place_keeps_its_rounds(
        parallelism: int, after: int, tmp_path: Path,
        state_backend: StateBackendFactory) -> None:
    """Records ``{"id": i, "steps": s}`` go round a loop whose body does
    ``r["steps"] -= 1`` in place; a keyed counter in the body counts each
    id's passes. The back-edge log of a checkpoint must hold the records as
    they came back round the loop, before the body decremented them again.
    The old runtime logged references and pickled the log only when the
    barrier had come back, by which time the body had decremented the logged
    dicts: after a restore those ids went round too few times (passes <
    steps) and an id logged at 1 step left came back at 0, fell through both
    filters and never finished."""
    # Checkpoints of a loop take longer (a barrier goes round the loop):
    # the failures start once one has completed.
    runs = reference_and_checked(loop_job, tmp_path, state_backend, after=after,
                                 parallelism=parallelism, checkpoints=1, batch_size=8,
                                 pace_every=2)
    assert sorted(runs.reference_output) == [(i, 0) for i in range(N_B)]
    assert runs.reference.state("passes") == {i: steps_of(i) for i in range(N_B)}
    assert_same_output(runs)  # every id finished exactly once
    assert_same_state(runs, "passes")  # after exactly its number of steps


# -- (c) a map mutating the dicts from_collection emits ---------------------------------

N_C = 1200


def bump_in_place(r: dict[str, Any]) -> dict[str, Any]:
    r["v"] += 1
    return r


def mutated_source_job(env: ef.StreamEnvironment, sink: ef.Sink, failing: Callable[[Any], Any],
                       pace: Callable[[Any], Any]) -> None:
    # Fresh dicts for every run (the reference run mutates its own).
    records = [{"k": f"k{i % KEYS}", "v": i} for i in range(N_C)]
    ds = env.from_collection(records).name("src")
    ds = ds.map(pace).name("pace").map(bump_in_place).name("bump").map(failing).name("failing")
    (ds.key_by(lambda r: r["k"]).sum(value_fn=lambda r: r["v"]).name("sum")
        .sink_to(sink).name("sink"))


@pytest.mark.parametrize("after", [100, 170])
def test_source_replays_records_as_they_were_read(after: int, tmp_path: Path,
                                                  state_backend: StateBackendFactory) -> None:
    """``from_collection`` of dicts that a downstream ``map`` bumps in place
    (``r["v"] += 1``), then a keyed sum of ``r["v"]``. After a restore the
    source replays from its checkpointed position and must replay the
    records as they were, not as the job left them. The old runtime re-read
    the very dicts it had emitted, already bumped, so the replayed records
    were bumped twice and the sums came out too large."""
    runs = reference_and_checked(mutated_source_job, tmp_path, state_backend, after=after)
    want = {f"k{k}": sum(i + 1 for i in range(N_C) if i % KEYS == k) for k in range(KEYS)}
    assert runs.reference.state("sum") == want
    assert_same_state(runs, "sum")
    assert_same_output(runs)


# -- (d) a ValueState dict mutated in place ----------------------------------------------

N_D = 1200
RECORDS_D = [(f"k{i % KEYS}", i) for i in range(N_D)]


class DictInValueState(ef.KeyedProcessFunction):
    """Keeps ``{"n": running sum, "seen": [values]}`` per key in a
    ``ValueState``, mutating the dict it holds in place."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.s = ctx.value_state("acc", default=None)

    def process(self, value: tuple[str, int], ctx: ef.RuntimeContext) -> Iterator[Any]:
        d = self.s.value
        if d is None:
            d = {}  # a new dict per key (a shared mutable default would be a user bug)
        d["n"] = d.get("n", 0) + value[1]
        d.setdefault("seen", []).append(value[1])
        self.s.update(d)
        yield (value[0], d["n"], len(d["seen"]))


def value_state_job(env: ef.StreamEnvironment, sink: ef.Sink, failing: Callable[[Any], Any],
                    pace: Callable[[Any], Any]) -> None:
    ds = env.from_collection(RECORDS_D).name("src")
    ds = ds.map(pace).name("pace").set_parallelism(1)
    ds = ds.map(failing).name("failing").set_parallelism(1)
    (ds.key_by(lambda r: r[0]).process(DictInValueState()).name("valued")
        .sink_to(sink).name("sink"))


@pytest.mark.parametrize(("parallelism", "after"), [(1, 100), (1, 170), (2, 100)])
def test_value_state_dict_mutated_in_place(parallelism: int, after: int, tmp_path: Path,
                                           state_backend: StateBackendFactory) -> None:
    """A ``KeyedProcessFunction`` reads the dict in its ``ValueState``,
    changes it in place (a running sum and a list of the values seen) and
    stores it back. The old runtime's snapshot shared those dicts with the
    live table: the sums and appends made after the barrier leaked into the
    checkpoint and were applied again after a restore (sums too large, values
    seen twice)."""
    runs = reference_and_checked(value_state_job, tmp_path, state_backend, after=after,
                                 parallelism=parallelism)
    want = {f"k{k}": {"n": sum(v for _, v in RECORDS_D[k::KEYS]),
                      "seen": [v for _, v in RECORDS_D[k::KEYS]]} for k in range(KEYS)}
    assert runs.reference.state("valued") == want
    assert_same_state(runs, "valued")
    assert_same_output(runs)


# -- (e) a ReducingState whose reduce function mutates its accumulator ------------------

N_E = 1200
RECORDS_E = [(f"k{i % KEYS}", i) for i in range(N_E)]


def merge_in_place(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    a["n"] += b["n"]
    a["items"].extend(b["items"])
    return a


class DictInReducingState(ef.KeyedProcessFunction):
    def open(self, ctx: ef.RuntimeContext) -> None:
        self.acc = ctx.reducing_state("acc", merge_in_place)

    def process(self, value: tuple[str, int], ctx: ef.RuntimeContext) -> Iterator[Any]:
        self.acc.add({"n": value[1], "items": [value[1]]})  # a fresh dict per record
        acc = self.acc.get()
        assert acc is not None
        yield (value[0], acc["n"], len(acc["items"]))


def reducing_state_job(env: ef.StreamEnvironment, sink: ef.Sink, failing: Callable[[Any], Any],
                       pace: Callable[[Any], Any]) -> None:
    ds = env.from_collection(RECORDS_E).name("src")
    ds = ds.map(pace).name("pace").set_parallelism(1)
    ds = ds.map(failing).name("failing").set_parallelism(1)
    (ds.key_by(lambda r: r[0]).process(DictInReducingState()).name("reduced")
        .sink_to(sink).name("sink"))


@pytest.mark.parametrize(("parallelism", "after"), [(1, 100), (1, 170), (2, 100)])
def test_reducing_state_accumulator_mutated_in_place(
        parallelism: int, after: int, tmp_path: Path,
        state_backend: StateBackendFactory) -> None:
    """A ``ReducingState`` whose reduce function folds each fresh record dict
    into its accumulator dict in place (``a["n"] += b["n"]``,
    ``a["items"].extend(b["items"])``) and returns it. The old runtime's
    snapshot shared the accumulator with the live table: what was folded in
    after the barrier leaked into the checkpoint and was folded in again
    after a restore (sums too large, items repeated)."""
    runs = reference_and_checked(reducing_state_job, tmp_path, state_backend, after=after,
                                 parallelism=parallelism)
    want = {f"k{k}": {"n": sum(v for _, v in RECORDS_E[k::KEYS]),
                      "items": [v for _, v in RECORDS_E[k::KEYS]]} for k in range(KEYS)}
    assert runs.reference.state("reduced") == want
    assert_same_state(runs, "reduced")
    assert_same_output(runs)
