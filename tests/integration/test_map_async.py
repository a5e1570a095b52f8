"""``map_async`` (API.md "Asynchronous calls"; docs/concepts/async.md).

Order: ``ordered=True`` emits in input order whatever the calls' latencies;
``ordered=False`` emits every result once, and never after a watermark that
followed its record (an event-time window downstream would drop it as late).

Exactly-once with calls in flight: a job whose ``map_async`` has many slow
calls in flight is failed (a ``FailingMap`` after it, restarts) while
checkpoints are taken; its committed output and final keyed state must equal
those of a failure-free run, in a DAG and in a loop, with aligned, unaligned
and synchronous checkpoints and with each state backend, and some completed
checkpoint must hold records in flight (so the restore really called them
again). A restore at another
parallelism splits those records among the new subtasks.

Failures: a call that raises, or exceeds its timeout, fails the job with one
line naming the operator and the record.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import eddyflow as ef
from tests.integration.job_support import Pace, StateBackendFactory, read_parts, watched

TIMEOUT = 120.0


class Latency:
    """A coroutine function: ``(x, 2 * x)`` after a pseudo-random sleep of up
    to ``most`` seconds (the same for a record in every run), counting its
    calls."""

    def __init__(self, most: float) -> None:
        self.most = most
        self.calls = 0

    async def __call__(self, x: int) -> tuple[int, int]:
        self.calls += 1
        await asyncio.sleep(random.Random(x).random() * self.most)
        return x, 2 * x

    def __deepcopy__(self, memo: dict[int, Any]) -> Latency:
        return self  # counts over restarts


class FailOnceCallsAreCheckpointed:
    """Identity that raises ``InjectedFailure`` once a completed checkpoint
    of ``directory`` holds records in flight at ``operator`` (looked at
    every 20 records): the failure comes after such a checkpoint however
    slowly checkpoints complete on a loaded machine."""

    def __init__(self, directory: Path, operator: str) -> None:
        self.directory = directory
        self.operator = operator
        self.seen = 0
        self.fired = False

    def __call__(self, r: Any) -> Any:
        self.seen += 1
        if (not self.fired and self.seen % 20 == 0 and self.directory.exists()
                and checkpoints_with_calls_in_flight(self.directory, self.operator)):
            self.fired = True
            raise ef.testing.InjectedFailure("a checkpoint holds calls in flight: fail now")
        return r

    def __deepcopy__(self, memo: dict[int, Any]) -> FailOnceCallsAreCheckpointed:
        return self


def checkpoints_with_calls_in_flight(directory: Path, operator: str) -> list[int]:
    """Ids of the retained checkpoints in which ``operator`` recorded records
    in flight (operator list state)."""
    return [c.id for c in ef.list_checkpoints(directory)
            if any(part.get("operator_list", {}).get("records", 0)
                   for part in c.operators.get(operator, {}).get("subtasks", {}).values())]


# -- order --------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [1, 7, 100])
def test_ordered_results_keep_the_input_order(capacity: int) -> None:
    env = ef.StreamEnvironment(parallelism=1)
    sink = ef.ListSink()
    (env.from_collection(list(range(1500)))
        .map_async(Latency(0.005), capacity=capacity, ordered=True).sink_to(sink))
    watched(env.execute_async("ordered"), TIMEOUT)
    assert sink.results == [(x, 2 * x) for x in range(1500)]


def test_unordered_results_come_as_they_complete_and_each_once() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    sink = ef.ListSink()
    (env.from_collection(list(range(2000)))
        .map_async(Latency(0.005), capacity=50, ordered=False).sink_to(sink))
    watched(env.execute_async("unordered"), TIMEOUT)
    assert Counter(sink.results) == Counter((x, 2 * x) for x in range(2000))
    assert sink.results != sorted(sink.results)  # they did overtake each other


@pytest.mark.parametrize("ordered", [True, False])
def test_no_result_passes_a_watermark_that_followed_its_record(ordered: bool) -> None:
    """Timestamps are the records (in order, no delay allowed): a result
    emitted after a watermark beyond it would be late and dropped by the
    window; every window must count all of its records."""
    n, size = 3000, 100.0
    env = ef.StreamEnvironment(parallelism=1)
    late = ef.OutputTag("late")
    sink, late_sink = ef.ListSink(), ef.ListSink()
    ws = ef.WatermarkStrategy.bounded_out_of_orderness(0.0, timestamp=float)
    counts = (env.from_collection(list(range(n))).assign_timestamps_and_watermarks(ws)
              .map_async(Latency(0.01), capacity=64, ordered=ordered)
              .key_by(lambda r: 0)
              .window(ef.TumblingEventTimeWindows(size=size))
              .side_output_late_data(late)
              .count())
    counts.sink_to(sink)
    counts.get_side_output(late).sink_to(late_sink)
    watched(env.execute_async("watermarks"), TIMEOUT)
    assert late_sink.results == []
    assert sorted((w.start, w.value) for w in sink.results) == [
        (float(s), int(size)) for s in range(0, n, int(size))]


def test_a_task_holding_records_in_flight_is_not_idle() -> None:
    """A quiet input goes idle while its records' calls are in flight; a
    busy one moves the watermark on meanwhile. Had the ``map_async`` task
    said it was idle, the window downstream would have let the watermark
    pass those records and dropped their results as late."""
    quiet_n = 10

    async def quiet() -> AsyncIterator[float]:
        for i in range(quiet_n):
            yield float(i)
        await asyncio.sleep(3.0)  # idle, with its calls still running

    async def slow(x: float) -> float:
        await asyncio.sleep(1.5)  # beyond the busy input's watermark passing 1000
        return x

    env = ef.StreamEnvironment(parallelism=1)
    ws = ef.WatermarkStrategy.bounded_out_of_orderness(0.0, timestamp=float).with_idleness(0.05)
    late = ef.OutputTag("late")
    sink, late_sink = ef.ListSink(), ef.ListSink()
    held = (env.from_async_iterable(quiet()).assign_timestamps_and_watermarks(ws)
            .map_async(slow, capacity=100))  # not at capacity: it reads the idleness
    busy = (env.from_collection([float(x) for x in range(3000)]).map(Pace(10, 0.004))
            .assign_timestamps_and_watermarks(ws))
    counts = (held.union(busy).key_by(lambda r: 0)
              .window(ef.TumblingEventTimeWindows(size=1000.0))
              .side_output_late_data(late).count())
    counts.sink_to(sink)
    counts.get_side_output(late).sink_to(late_sink)
    watched(env.execute_async("idle-with-calls"), TIMEOUT)
    assert late_sink.results == []
    assert sorted((w.start, w.value) for w in sink.results) == [
        (0.0, 1000 + quiet_n), (1000.0, 1000), (2000.0, 1000)]


# -- failures of the calls ------------------------------------------------------------


def test_a_call_that_raises_fails_the_job_naming_operator_and_record() -> None:
    async def lookup(x: int) -> int:
        await asyncio.sleep(0)
        if x == 17:
            raise KeyError(f"no customer {x}")
        return x

    env = ef.StreamEnvironment(parallelism=1)
    env.from_collection(list(range(40))).map_async(lookup).name("enrich").sink_to(ef.ListSink())
    with pytest.raises(ef.JobFailed) as info:
        watched(env.execute_async("raises"), TIMEOUT)
    text = str(info.value)
    assert "map_async 'enrich'" in text and "on record 17" in text and "no customer 17" in text


def test_a_call_past_its_timeout_fails_the_job_and_the_restart_strategy_applies() -> None:
    attempts = {"n": 0}

    async def lookup(x: int) -> int:
        attempts["n"] += x == 5
        await asyncio.sleep(30.0 if x == 5 else 0.0)
        return x

    env = ef.StreamEnvironment(parallelism=1)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=1, delay=0.0))
    (env.from_collection(list(range(10)))
        .map_async(lookup, timeout=0.2).name("enrich").sink_to(ef.ListSink()))
    with pytest.raises(ef.JobFailed) as info:
        watched(env.execute_async("timeout"), TIMEOUT)
    text = str(info.value)
    assert "map_async 'enrich'" in text and "on record 5" in text
    assert "timeout of 0.2 s" in text
    assert attempts["n"] == 2  # the first attempt and the one restart


def test_a_function_that_is_not_async_fails_naming_it() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    env.from_collection([1, 2]).map_async(lambda x: x).name("sync").sink_to(ef.ListSink())
    with pytest.raises(ef.JobFailed, match=r"map_async 'sync'.*coroutine function"):
        watched(env.execute_async("not-async"), TIMEOUT)


@pytest.mark.parametrize("bad, match", [
    ({"capacity": 0}, "capacity must be an int >= 1"),
    ({"timeout": 0}, "timeout must be a number of seconds > 0"),
    ({"ordered": "yes"}, "ordered must be a bool"),
])
def test_bad_settings_are_refused_naming_the_operator(bad: dict[str, Any], match: str) -> None:
    env = ef.StreamEnvironment(parallelism=1)
    with pytest.raises((ValueError, TypeError), match=f"operator 'map_async-.*{match}"):
        env.from_collection([1]).map_async(Latency(0.0), **bad)


# -- exactly-once with calls in flight ------------------------------------------------


def identity(r: Any) -> Any:
    """Where a run without failures has its ``FailingMap`` (the same graph)."""
    return r


def dag_job(env: ef.StreamEnvironment, n: int, ordered: bool, sink: ef.Sink,
            failing: Any | None, latency: Latency) -> None:
    """numbers (paced) -> map_async (slow) -> [FailingMap] -> keyed sum by x % 11, and
    a branch of every third result -> the sink."""
    results = env.from_collection(list(range(n))).map(Pace(10, 0.003)).map_async(
        latency, capacity=40, ordered=ordered).name("enrich")
    results = results.map(failing if failing is not None else identity)
    # Running sums depend on the order records meet: the final state is compared.
    results.key_by(lambda r: r[0] % 11).sum(lambda r: r[1]).name("sums")
    results.filter(lambda r: r[0] % 3 == 0).map(lambda r: ("third", r[0])).sink_to(sink)


def loop_job(env: ef.StreamEnvironment, n: int, ordered: bool, sink: ef.Sink,
             failing: Any | None, latency: Latency) -> None:
    """(id, rounds) records (paced) go round a loop whose body is a map_async that
    counts a round down; finished ones are counted per id % 5."""

    async def step(r: list[int]) -> list[int]:
        await latency(r[0] * 31 + r[1])
        return [r[0], r[1] - 1]

    loop = env.from_collection([[i, i % 4] for i in range(n)]).map(Pace(10, 0.003)).iterate()
    body = loop.map_async(step, capacity=30, ordered=ordered).name("step")
    body = body.map(failing if failing is not None else identity)
    loop.close_with(body.filter(lambda r: r[1] > 0))
    done = body.filter(lambda r: r[1] <= 0)
    done.key_by(lambda r: r[0] % 5).count().name("finished")  # its final state is compared
    done.map(lambda r: ("done", r[0])).sink_to(sink)


JOBS = {"dag": (dag_job, "enrich", "sums"), "loop": (loop_job, "step", "finished")}


def run(tmp: Path, shape: str, *, n: int, ordered: bool, failing: Any | None, mode: str,
        backend: StateBackendFactory, parallelism: int = 2, restore: str | None = None,
        attempts: int = 5) -> tuple[list[tuple[Any, ...]], dict[Any, Any], Latency]:
    build, _, stateful = JOBS[shape]
    env = ef.StreamEnvironment(parallelism=parallelism)
    backend.use(env, tmp)
    env.enable_checkpointing(0.03, str(tmp / "chk"), mode=mode, retained=50)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=attempts, delay=0.0))
    latency = Latency(0.02)
    build(env, n, ordered, ef.FileSink(str(tmp / "out")), failing, latency)
    result = watched(env.execute_async(shape, restore=restore), TIMEOUT)
    return read_parts(tmp / "out"), dict(result.state(stateful)), latency


@pytest.mark.parametrize("shape", ["dag", "loop"])
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("mode", ["exactly_once", "unaligned",
                                  pytest.param("synchronous", marks=pytest.mark.slow)])
def test_exactly_once_with_failures_while_calls_are_in_flight(
        tmp_path: Path, shape: str, ordered: bool, mode: str,
        state_backend: StateBackendFactory) -> None:
    n = 1500
    ref_out, ref_state, _ = run(tmp_path / "ref", shape, n=n, ordered=ordered, failing=None,
                                mode=mode, backend=state_backend)
    failing = ef.testing.FailingMap(after=n // 3, times=3)
    out, state, latency = run(tmp_path / "run", shape, n=n, ordered=ordered, failing=failing,
                              mode=mode, backend=state_backend)
    assert failing.failures == 3
    assert Counter(out) == Counter(ref_out)
    assert state == ref_state
    calls_ref = n if shape == "dag" else sum(1 + i % 4 - (i % 4 > 0) for i in range(n))
    assert latency.calls > calls_ref  # calls were made again after the restarts
    assert checkpoints_with_calls_in_flight(tmp_path / "run" / "chk", JOBS[shape][1])


@pytest.mark.parametrize("shape", ["dag", "loop"])
@pytest.mark.parametrize("parallelism", [1, 3])
def test_restore_at_another_parallelism_calls_the_records_in_flight_again(
        tmp_path: Path, shape: str, parallelism: int) -> None:
    """A run at parallelism 2 fails for good (no restart) after checkpoints
    with records in flight; a new job at ``parallelism`` restores the
    latest and finishes: its output and state are those of a failure-free
    run."""
    n = 1500
    backend = StateBackendFactory("memory")
    ref_out, ref_state, _ = run(tmp_path / "ref", shape, n=n, ordered=True, failing=None,
                                mode="exactly_once", backend=backend)
    tmp = tmp_path / "run"
    failing = FailOnceCallsAreCheckpointed(tmp / "chk", JOBS[shape][1])
    with pytest.raises(ef.JobFailed):
        run(tmp, shape, n=n, ordered=True, failing=failing, mode="exactly_once",
            backend=backend, attempts=0)
    assert checkpoints_with_calls_in_flight(tmp / "chk", JOBS[shape][1])
    out, state, _ = run(tmp, shape, n=n, ordered=True, failing=None, mode="exactly_once",
                        backend=backend, parallelism=parallelism, restore="latest")
    assert Counter(out) == Counter(ref_out)
    assert state == ref_state


def test_records_in_flight_that_no_operator_matches_refuse_the_restore(tmp_path: Path) -> None:
    """Strict state matching covers them: a renamed ``map_async`` would
    drop its records in flight without a word."""
    def job(name: str, failing: Any) -> ef.StreamEnvironment:
        env = ef.StreamEnvironment(parallelism=1)
        env.enable_checkpointing(0.03, str(tmp_path / "chk"), retained=50)
        (env.from_collection(list(range(1500))).map(Pace(10, 0.003))
            .map_async(Latency(0.02), capacity=40).name(name).map(failing)
            .sink_to(ef.FileSink(str(tmp_path / "out"))))
        return env

    with pytest.raises(ef.JobFailed):
        failing = FailOnceCallsAreCheckpointed(tmp_path / "chk", "enrich")
        watched(job("enrich", failing).execute_async("a"), TIMEOUT)
    held = checkpoints_with_calls_in_flight(tmp_path / "chk", "enrich")
    assert held
    path = next(c.path for c in ef.list_checkpoints(tmp_path / "chk") if c.id == held[-1])
    with pytest.raises(ef.IncompatibleCheckpoint, match=r"'enrich' \(map_async\): \d+ records? "
                       r"in flight \(operator list state\), but the job has no operator"):
        watched(job("lookup", identity).execute_async("b", restore=str(path)), TIMEOUT)
