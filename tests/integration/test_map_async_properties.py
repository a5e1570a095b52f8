"""A property test of ``map_async`` under failures (docs/concepts/async.md).

Hypothesis draws a job and its failures: a DAG (numbers as dicts -> a
``map_async`` -> a ``FailingMap`` -> a keyed sum, and a branch of every third
result to a ``FileSink``) or a loop (records go round a loop whose body is a
``map_async`` counting a round down; finished ones are counted per key and
sent to the sink); ordered or unordered; the capacity (1-64) and the
parallelism of the ``map_async`` (1-3); whether its function changes the
record in place (the checkpoint must still hold it as it arrived); the
checkpoint mode (aligned, unaligned, aligned switching to unaligned); a
``FailingMap`` after it failing 0-2 times after a drawn number of records;
and a call that raises once, at a drawn record. The committed output and the
final keyed state must equal what the job computes without failures
(computed here in plain Python), and each run must end.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from job_support import Pace, StateBackendFactory, read_parts, watched

import eddyflow as ef

N = 600
ROUNDS = 3


class FlakyOnce:
    """Raises ``ConnectionError`` the first time it sees record ``at``
    (across restarts), else nothing."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.fired = False

    def check(self, x: int) -> None:
        if not self.fired and x == self.at:
            self.fired = True
            raise ConnectionError(f"the service dropped the call for {x}")

    def __deepcopy__(self, memo: dict[int, Any]) -> FlakyOnce:
        return self


@dataclass(frozen=True)
class Case:
    shape: str
    ordered: bool
    capacity: int
    parallelism: int
    in_place: bool
    mode: str
    fail_after: int
    fail_times: int
    flaky_at: int | None
    seed: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    return Case(
        shape=draw(st.sampled_from(["dag", "loop"])),
        ordered=draw(st.booleans()),
        capacity=draw(st.integers(1, 64)),
        parallelism=draw(st.integers(1, 3)),
        in_place=draw(st.booleans()),
        mode=draw(st.sampled_from(["exactly_once", "unaligned", "aligned_timeout"])),
        fail_after=draw(st.integers(N // 5, N)),
        fail_times=draw(st.integers(0, 2)),
        flaky_at=draw(st.none() | st.integers(0, N - 1)),
        seed=draw(st.integers(0, 2**16)),
    )


def build(env: ef.StreamEnvironment, case: Case, out: Path, failing: Any,
          flaky: FlakyOnce) -> str:
    """The drawn job; returns the uid of its keyed operator."""
    most = 0.004

    async def enrich(r: dict[str, int]) -> dict[str, int]:
        flaky.check(r["x"])
        await asyncio.sleep(random.Random(case.seed + r["x"]).random() * most)
        if case.in_place:
            r["y"] = 2 * r["x"]  # the checkpoint keeps the record as it arrived
            return r
        return {**r, "y": 2 * r["x"]}

    async def step(r: list[int]) -> list[int]:
        flaky.check(r[0])
        await asyncio.sleep(random.Random(case.seed + r[0] * 7 + r[1]).random() * most)
        if case.in_place:
            r[1] -= 1
            return r
        return [r[0], r[1] - 1]

    sink = ef.FileSink(str(out))
    if case.shape == "dag":
        results = (env.from_collection([{"x": x} for x in range(N)]).map(Pace(10, 0.002))
                   .map_async(enrich, capacity=case.capacity, ordered=case.ordered)
                   .set_parallelism(case.parallelism).name("enrich").map(failing))
        results.key_by(lambda r: r["x"] % 11).sum(lambda r: r["y"]).name("sums")
        results.filter(lambda r: r["x"] % 3 == 0).map(lambda r: (r["x"], r["y"])).sink_to(sink)
        return "sums"
    loop = env.from_collection([[i, i % ROUNDS] for i in range(N)]).map(Pace(10, 0.002)).iterate()
    body = (loop.map_async(step, capacity=case.capacity, ordered=case.ordered)
            .set_parallelism(case.parallelism).name("step").map(failing))
    loop.close_with(body.filter(lambda r: r[1] > 0))
    done = body.filter(lambda r: r[1] <= 0)
    done.key_by(lambda r: r[0] % 5).count().name("finished")
    done.map(lambda r: (r[0], r[1])).sink_to(sink)
    return "finished"


def expected(case: Case) -> tuple[Counter[tuple[Any, ...]], dict[Any, Any]]:
    """Output and final keyed state of the job without failures."""
    if case.shape == "dag":
        out = Counter((x, 2 * x) for x in range(N) if x % 3 == 0)
        sums: dict[Any, Any] = {}
        for x in range(N):
            sums[x % 11] = sums.get(x % 11, 0) + 2 * x
        return out, sums
    # A record with r rounds left goes round max(r, 1) times, ending at 0 (or -1).
    done = Counter((i, 0 if i % ROUNDS else -1) for i in range(N))
    counts = Counter(i % 5 for i in range(N))
    return done, dict(counts)


@dataclass
class Stats:
    runs: int = 0  # started, each in a folder of its own
    examples: int = 0  # passed
    restarted: int = 0
    in_flight_checkpoints: int = 0


def check(case: Case, tmp: Path, backend: StateBackendFactory, stats: Stats) -> None:
    note(repr(case))
    env = ef.StreamEnvironment(parallelism=2)
    backend.use(env, tmp)
    options: dict[str, Any] = ({"mode": "exactly_once", "aligned_timeout": 0.005}
                               if case.mode == "aligned_timeout" else {"mode": case.mode})
    env.enable_checkpointing(0.02, str(tmp / "chk"), retained=100, **options)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=5, delay=0.0))
    failing = ef.testing.FailingMap(after=case.fail_after, times=case.fail_times)
    flaky = FlakyOnce(case.flaky_at)
    stateful = build(env, case, tmp / "out", failing, flaky)
    result = watched(env.execute_async("map-async-property"), 120.0)
    want_out, want_state = expected(case)
    assert Counter(read_parts(tmp / "out")) == want_out
    assert dict(result.state(stateful)) == want_state
    stats.examples += 1
    stats.restarted += result.restarts > 0
    uid = "enrich" if case.shape == "dag" else "step"
    stats.in_flight_checkpoints += any(
        part.get("operator_list", {}).get("records", 0)
        for c in ef.list_checkpoints(tmp / "chk")
        for part in c.operators.get(uid, {}).get("subtasks", {}).values())


def test_map_async_is_exactly_once_under_drawn_failures(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    stats = Stats()

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases())
    def prop(case: Case) -> None:
        stats.runs += 1
        check(case, tmp_path / f"ex{stats.runs}", state_backend, stats)

    prop()
    # The examples did exercise recovery with records in flight.
    assert stats.restarted >= stats.examples // 3, stats
    assert stats.in_flight_checkpoints >= stats.examples // 2, stats
