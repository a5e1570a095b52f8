"""Cyclic dataflows: loops built with ``iterate()`` / ``close_with`` run to
completion and compute what plain Python computes (DESIGN.md §3, API.md
"Cycles").

A bounded iterative job must end exactly when its sources are exhausted and
no record is left in any loop (termination by counting, never by a
timeout), whatever the loop's shape: a Collatz loop at parallelism 1-3,
nested loops, two loops in one job, a loop body that multiplies records
(which deadlocks on bounded back-edges, so the back-edge must always accept,
even with one-batch channels), keyed and broadcast feedback between a head
and a tail of different parallelism, a source that is empty or finishes
unevenly across subtasks, a loop entered at two places (two iterate() heads
feeding each other, a second source joining the body), and feedback that
spills to disk. Every run goes through a watchdog, so a hang fails its test
instead of blocking the suite.

The shipped examples (``examples/collatz.py``, ``connected_components.py``,
``shortest_paths.py``) are checked against a plain-Python Collatz count,
union-find and Dijkstra, at parallelism 1 and 2, and each runs under the
command line (``python -m eddyflow.cli.main run EXAMPLE -p 2``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from job_support import watched

import eddyflow as ef
from eddyflow.jobfile import load_job
from eddyflow.runtime.job import JobRunner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SRC = Path(ef.__file__).resolve().parents[1]  # the eddyflow under test
TIMEOUT = 30.0  # a job here takes well under a second; more means a hang


def run_job(env: ef.StreamEnvironment, timeout: float = TIMEOUT) -> ef.JobResult:
    """``env.execute`` with a watchdog: a hung job fails the test."""
    return watched(env.execute_async("loops"), timeout)


def run_runner(runner: JobRunner, timeout: float = TIMEOUT) -> ef.JobResult:
    return watched(runner.run(), timeout)


# -- plain-Python references -------------------------------------------------------


def collatz_steps(n: int) -> int:
    """Steps until 1 is reached, at least one (1 -> 4 -> 2 -> 1 is 3)."""
    steps = 0
    while True:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
        if n == 1:
            return steps


def step(r: tuple[int, int, int]) -> tuple[int, int, int]:
    start, n, steps = r
    return start, (n // 2 if n % 2 == 0 else 3 * n + 1), steps + 1


def enter(n: int) -> tuple[int, int, int]:
    return (n, n, 0)


def not_there(r: tuple[int, int, int]) -> bool:
    return r[1] != 1


def there(r: tuple[int, int, int]) -> bool:
    return r[1] == 1


def start_and_steps(r: tuple[int, int, int]) -> tuple[int, int]:
    return (r[0], r[2])


def first(r: Any) -> Any:
    return r[0]


# -- Collatz at parallelism 1-3 ------------------------------------------------------


@pytest.mark.parametrize("parallelism", [1, 2, 3])
@pytest.mark.parametrize("feedback", ["forward", "keyed", "rebalance"])
def test_collatz_loop(parallelism: int, feedback: str) -> None:
    n = 600
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=32)
    loop = env.from_collection(range(1, n + 1)).map(enter).iterate()
    stepped = loop.map(step)
    back = stepped.filter(not_there)
    if feedback == "keyed":
        loop.close_with(back.key_by(first))
    elif feedback == "rebalance":
        loop.close_with(back.rebalance())
    else:
        loop.close_with(back)
    sink = ef.ListSink()
    stepped.filter(there).map(start_and_steps).sink_to(sink)
    result = run_job(env)
    want = {k: collatz_steps(k) for k in range(1, n + 1)}
    assert sorted(sink.results) == sorted(want.items())
    total = sum(want.values())
    # Every step went once round the loop: nothing lost, nothing repeated.
    assert result.records_in[loop.operator_name] == total
    assert result.records_out[back.operator_name] == total - n


def test_collatz_with_checkpointing_terminates_and_commits_everything(tmp_path: Path) -> None:
    n = 3000
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.enable_checkpointing(0.005, tmp_path / "chk")
    loop = env.from_collection(range(1, n + 1)).map(enter).iterate()
    stepped = loop.map(step)
    loop.close_with(stepped.filter(not_there).key_by(first))
    sink = ef.ListSink()
    stepped.filter(there).map(start_and_steps).sink_to(sink)
    result = run_job(env)
    assert sorted(sink.results) == [(k, collatz_steps(k)) for k in range(1, n + 1)]
    assert result.completed_checkpoints
    assert ef.list_checkpoints(tmp_path / "chk")[-1].id == max(result.completed_checkpoints)


# -- nested loops ------------------------------------------------------------------

# A record (id, outer rounds left, inner rounds left, inner steps done): every
# pass round the outer loop runs the inner loop for a number of rounds that
# depends on the id and the pass.


def inner_rounds(i: int, outer_left: int) -> int:
    return (i * 7 + outer_left * 3) % 5


def enter_inner(r: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    i, outer, _, done = r
    return (i, outer, inner_rounds(i, outer), done)


def inner_step(r: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    i, outer, inner, done = r
    return (i, outer, max(inner - 1, 0), done + (inner > 0))


def outer_step(r: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    i, outer, inner, done = r
    return (i, outer - 1, inner, done)


def nested_reference(ids: range, outer_of: Any) -> list[tuple[int, int]]:
    out = []
    for i in ids:
        done = 0
        outer = outer_of(i)
        while True:
            done += inner_rounds(i, outer)
            outer -= 1
            if outer <= 0:
                break
        out.append((i, done))
    return sorted(out)


def outer_rounds_of(i: int) -> int:
    return 1 + i % 4


@pytest.mark.parametrize("parallelism", [1, 2])
def test_nested_loops(parallelism: int) -> None:
    ids = range(300)
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=16)
    src = env.from_collection([(i, outer_rounds_of(i), 0, 0) for i in ids])
    outer = src.iterate().name("outer")
    a = outer.map(enter_inner).name("enter-inner")
    inner = a.iterate().name("inner")
    b = inner.map(inner_step).name("inner-step")
    inner.close_with(b.filter(lambda r: r[2] > 0).name("inner-again").key_by(first))
    left_inner = b.filter(lambda r: r[2] == 0).name("inner-done").map(outer_step)
    outer.close_with(left_inner.filter(lambda r: r[1] > 0).name("outer-again"))
    sink = ef.ListSink()
    left_inner.filter(lambda r: r[1] <= 0).map(lambda r: (r[0], r[3])).sink_to(sink)
    plan = env.plan()
    assert len(plan.loops) == 1 and len(plan.back_edges) == 2
    run_job(env)
    assert sorted(sink.results) == nested_reference(ids, outer_rounds_of)


# -- two loops in one job ------------------------------------------------------------


def countdown(r: tuple[int, int]) -> tuple[int, int]:
    return (r[0], r[1] - 1)


@pytest.mark.parametrize("parallelism", [1, 3])
def test_two_loops_in_one_job(parallelism: int) -> None:
    n = 400
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=16)
    src = env.from_collection(range(1, n + 1))
    # Loop 1: Collatz; its output (start, steps) enters loop 2, a countdown
    # from steps to 0; a third loop on another branch doubles until >= 1000.
    l1 = src.map(enter).iterate().name("collatz")
    s1 = l1.map(step)
    l1.close_with(s1.filter(not_there))
    l2 = s1.filter(there).map(start_and_steps).iterate().name("countdown")
    s2 = l2.map(countdown)
    l2.close_with(s2.filter(lambda r: r[1] > 0).key_by(first))
    sink2 = ef.ListSink()
    s2.filter(lambda r: r[1] <= 0).map(first).sink_to(sink2)
    l3 = src.map(lambda k: (k, k, 0)).iterate().name("doubling")
    s3 = l3.map(lambda r: (r[0], r[1] * 2, r[2] + 1))
    l3.close_with(s3.filter(lambda r: r[1] < 1000).rebalance())
    sink3 = ef.ListSink()
    s3.filter(lambda r: r[1] >= 1000).map(lambda r: (r[0], r[2])).sink_to(sink3)
    assert len(env.plan().loops) == 3
    result = run_job(env)
    assert sorted(sink2.results) == list(range(1, n + 1))
    steps = {k: collatz_steps(k) for k in range(1, n + 1)}
    # Loop 2 ran `steps` rounds for every record, at least one.
    assert result.records_in["countdown"] == sum(max(s, 1) for s in steps.values())

    def doublings(k: int) -> int:
        d = 0
        while True:
            k *= 2
            d += 1
            if k >= 1000:
                return d
    assert sorted(sink3.results) == [(k, doublings(k)) for k in range(1, n + 1)]


# -- a body that multiplies records ----------------------------------------------


def double(r: tuple[int, int]) -> list[tuple[int, int]]:
    return [(r[0], r[1] - 1), (r[0], r[1] - 1)]


@pytest.mark.parametrize(("parallelism", "batch_size", "capacity"),
                         [(1, 2, 1), (2, 4, 1), (3, 8, 1), (2, 64, 2)])
def test_multiplying_body_finishes(parallelism: int, batch_size: int, capacity: int) -> None:
    """Every record doubles ten times round the loop: 1024 copies each. With
    one-batch channels a bounded back-edge would deadlock (head waits on the
    body, tail on the head); the feedback channel must always accept."""
    ids, rounds = 6, 10
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=batch_size,
                               channel_capacity=capacity)
    loop = env.from_collection([(i, rounds) for i in range(ids)]).iterate()
    body = loop.flat_map(double)
    loop.close_with(body.filter(lambda r: r[1] > 0))
    sink = ef.ListSink()
    body.filter(lambda r: r[1] == 0).map(first).sink_to(sink)
    result = run_job(env)
    assert Counter(sink.results) == {i: 2 ** rounds for i in range(ids)}
    # Round j sees 2**j copies of each record.
    assert result.records_in[loop.operator_name] == ids * (2 ** rounds - 1)


def test_multiplying_body_with_keyed_feedback_and_small_batches() -> None:
    ids, rounds = 5, 9
    env = ef.StreamEnvironment(parallelism=2, batch_size=3, channel_capacity=1)
    loop = env.from_collection([(i, rounds) for i in range(ids)]).iterate()
    body = loop.flat_map(double).set_parallelism(3)
    loop.close_with(body.filter(lambda r: r[1] > 0).set_parallelism(3).key_by(first))
    sink = ef.ListSink()
    body.filter(lambda r: r[1] == 0).map(first).sink_to(sink)
    run_job(env)
    assert Counter(sink.results) == {i: 2 ** rounds for i in range(ids)}


# -- keyed feedback, head and tail at different parallelism -------------------------


class MinLabel(ef.KeyedProcessFunction):
    """Keyed state inside the loop: the smallest value seen per key; a record
    whose value improves the minimum goes round again with value - 1 (until 0)."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.best = ctx.value_state("best")

    def process(self, value: tuple[int, int], ctx: ef.RuntimeContext) -> Iterator[Any]:
        k, v = value
        best = self.best.value
        if best is None or v < best:
            self.best.value = v
            yield ("improved", k, v)


@pytest.mark.parametrize(("head_p", "tail_p"), [(2, 3), (3, 2), (2, 2), (3, 1), (1, 3)])
def test_keyed_feedback_with_parallel_head_and_tail(head_p: int, tail_p: int) -> None:
    keys = 40
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    src = env.from_collection([(k % keys, 20 + (k * 13) % 17) for k in range(400)])
    loop = src.iterate().set_parallelism(head_p)
    improved = loop.key_by(first).process(MinLabel()).name("min").set_parallelism(tail_p)
    again = improved.filter(lambda r: r[2] > 0).map(lambda r: (r[1], r[2] - 1))
    again = again.set_parallelism(tail_p)
    loop.close_with(again.key_by(first))
    sink = ef.ListSink()
    improved.map(lambda r: (r[1], r[2])).set_parallelism(tail_p).sink_to(sink)
    result = run_job(env)
    # Every key's minimum ends at 0: each improvement goes round once more.
    assert result.state("min", "best") == dict.fromkeys(range(keys), 0)
    got: dict[int, list[int]] = {}
    for k, v in sink.results:
        got.setdefault(k, []).append(v)
    assert set(got) == set(range(keys))
    for k, vs in got.items():
        assert min(vs) == 0, k
        assert len(vs) == len(set(vs)), f"key {k}: an improvement was emitted twice: {vs}"


class _SkewedSource(ef.Source):
    """Two splits: split 0 has a handful of records, available at once;
    split 1 has many, trickling in a few per read (like an uneven pair of
    log partitions)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return _SkewedReader(subtask, self.n)


class _SkewedReader(ef.SourceReader):
    def __init__(self, subtask: int, n: int) -> None:
        self.items = list(range(5)) if subtask == 0 else list(range(5, n))
        self.slow = subtask != 0
        self.pos = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.pos >= len(self.items):
            return None
        if self.slow:
            await asyncio.sleep(0.002)
            max_records = min(max_records, 4)
        out = self.items[self.pos:self.pos + max_records]
        self.pos += len(out)
        return out

    def position(self) -> Any:
        return self.pos

    def seek(self, position: Any) -> None:
        self.pos = position


@pytest.mark.parametrize("feedback", ["keyed", "rebalance"])
def test_head_subtask_whose_input_ends_early_waits_for_the_other_heads(feedback: str) -> None:
    """Head subtask 0's input ends at once, subtask 1's trickles in. Records
    that subtask 1 feeds into the loop come back (keyed or rebalanced) to
    subtask 0 too, so subtask 0 must not end while another head subtask can
    still feed the loop: the loop is empty only when *every* head's input has
    ended and nothing is in flight."""
    n = 300
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    src = env.from_source(_SkewedSource(n)).set_parallelism(2)
    loop = src.map(lambda i: (i, 2)).iterate()
    body = loop.map(countdown)
    back = body.filter(lambda r: r[1] > 0)
    loop.close_with(back.key_by(first) if feedback == "keyed" else back.rebalance())
    sink = ef.ListSink()
    body.filter(lambda r: r[1] <= 0).map(first).sink_to(sink)
    run_job(env, timeout=4.0)
    assert sorted(sink.results) == list(range(n))


class _TrickleSource(ef.Source):
    """A few records per read, with a pause before each read."""

    max_parallelism = 1

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return _TrickleReader(self.items)


class _TrickleReader(ef.SourceReader):
    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.pos = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.pos >= len(self.items):
            return None
        await asyncio.sleep(0.002)
        out = self.items[self.pos:self.pos + 4]
        self.pos += len(out)
        return out

    def position(self) -> Any:
        return self.pos

    def seek(self, position: Any) -> None:
        self.pos = position


def test_one_loop_fed_from_two_sources_through_two_iterates() -> None:
    """Two iterate() heads feed each other's back-edge: one strongly connected
    component with two entries, each from its own source. The DFS makes only
    one of the two feedback edges a back-edge (the other is a regular edge
    inside the loop). The loop is empty only when *both* sources have ended:
    the head whose own source ended first must not end the loop while the
    other source still feeds it."""
    env = ef.StreamEnvironment(parallelism=1, batch_size=16)
    fast = env.from_collection([(i, 3) for i in range(5)]).name("fast")
    slow = env.from_source(_TrickleSource([(i, 3) for i in range(5, 200)])).name("slow")
    la = fast.iterate().name("ha")
    lb = slow.iterate().name("hb")
    a = la.map(countdown).name("a")
    b = lb.map(countdown).name("b")
    la.close_with(b.filter(lambda r: r[1] > 0).name("b-to-a"))
    lb.close_with(a.filter(lambda r: r[1] > 0).name("a-to-b"))
    sink = ef.ListSink()
    out_a = a.filter(lambda r: r[1] <= 0).name("out-a")
    out_b = b.filter(lambda r: r[1] <= 0).name("out-b")
    out_a.union(out_b).map(first).sink_to(sink)
    plan = env.plan()
    assert len(plan.loops) == 1 and len(plan.back_edges) == 1
    run_job(env, timeout=4.0)
    assert sorted(sink.results) == list(range(200))


@pytest.mark.parametrize("parallelism", [1, 2])
def test_second_source_joins_the_loop_body_not_the_head(parallelism: int) -> None:
    """A stream from outside enters the loop at a body operator (a union), not
    at the head: the head's own input ends at once, but the loop is not empty
    while that other entry still feeds it."""
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=8)
    loop = env.from_collection([(i, 3) for i in range(5)]).name("fast").iterate()
    late = env.from_source(_TrickleSource([(i, 3) for i in range(5, 150)])).name("late")
    body = loop.map(countdown).union(late).map(lambda r: r).name("joined")
    loop.close_with(body.filter(lambda r: r[1] > 0).key_by(first))
    sink = ef.ListSink()
    body.filter(lambda r: r[1] <= 0).map(first).sink_to(sink)
    plan = env.plan()
    assert len(plan.loops) == 1
    joined = plan.graph.node_by_uid("joined").id
    assert plan.loop_of(joined) == 0
    result = run_job(env, timeout=10.0)
    assert sorted(sink.results) == list(range(150))
    # "fast" records pass "joined" 3 times (after each countdown); "late"
    # ones enter at "joined" with 3 rounds left, so they pass it 4 times.
    assert result.records_in["joined"] == 5 * 3 + 145 * 4


@pytest.mark.parametrize("parallelism", [2, 3])
def test_broadcast_feedback_counts_every_copy(parallelism: int) -> None:
    """Broadcast feedback sends each record to every head subtask: the loop's
    in-flight count must count every copy, or the loop ends too early (lost
    records) or never (a hang)."""
    rounds = 4
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=8)
    loop = env.from_collection([(i, rounds) for i in range(20)]).iterate()
    body = loop.map(countdown)
    loop.close_with(body.filter(lambda r: r[1] > 0).broadcast())
    sink = ef.ListSink()
    body.filter(lambda r: r[1] <= 0).map(first).sink_to(sink)
    result = run_job(env)
    copies = parallelism ** (rounds - 1)
    assert Counter(sink.results) == dict.fromkeys(range(20), copies)
    assert result.records_in[loop.operator_name] == 20 * sum(
        parallelism ** j for j in range(rounds))


def test_broadcast_inside_the_loop() -> None:
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    loop = env.from_collection([(i, 3) for i in range(30)]).iterate()
    body = loop.broadcast().map(countdown).set_parallelism(2)
    loop.close_with(body.filter(lambda r: r[1] > 0).key_by(first))
    sink = ef.ListSink()
    body.filter(lambda r: r[1] <= 0).map(first).sink_to(sink)
    run_job(env)
    # Each round doubles every record (two body subtasks get a copy).
    assert Counter(sink.results) == dict.fromkeys(range(30), 2 ** 3)


# -- edge cases --------------------------------------------------------------------


@pytest.mark.parametrize("parallelism", [1, 3])
def test_empty_source(parallelism: int, tmp_path: Path) -> None:
    env = ef.StreamEnvironment(parallelism=parallelism)
    env.enable_checkpointing(0.01, tmp_path / "chk")
    loop = env.from_collection([]).iterate()
    body = loop.map(countdown)
    loop.close_with(body.filter(lambda r: r[1] > 0).key_by(first))
    sink = ef.ListSink()
    body.filter(lambda r: r[1] <= 0).sink_to(sink)
    result = run_job(env)
    assert sink.results == []
    assert result.records_in[loop.operator_name] == 0
    assert len(result.completed_checkpoints) == 1  # the final one


def test_records_that_never_go_round() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    loop = env.from_collection(range(100)).iterate()
    body = loop.map(lambda x: x + 1)
    loop.close_with(body.filter(lambda x: False))
    sink = ef.ListSink()
    body.sink_to(sink)
    run_job(env)
    assert sorted(sink.results) == list(range(1, 101))


def test_loop_that_drops_everything_inside() -> None:
    env = ef.StreamEnvironment(parallelism=2, batch_size=4)
    loop = env.from_collection([(i, i % 9) for i in range(200)]).iterate()
    body = loop.map(countdown).filter(lambda r: r[1] >= 0)
    loop.close_with(body.key_by(first))
    sink = ef.ListSink()
    body.filter(lambda r: False).sink_to(sink)
    result = run_job(env)
    assert sink.results == []
    assert result.records_in[loop.operator_name] == sum(i % 9 + 1 for i in range(200))


def test_self_loop() -> None:
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    loop = env.from_collection([(i, i % 7) for i in range(100)]).map(countdown).iterate()
    # The head feeds itself back, counting down.
    loop.close_with(loop.filter(lambda r: r[1] > 0).map(countdown))
    sink = ef.ListSink()
    loop.filter(lambda r: r[1] <= 0).map(first).sink_to(sink)
    run_job(env)
    assert sorted(sink.results) == list(range(100))


def test_loop_without_chaining() -> None:
    env = ef.StreamEnvironment(parallelism=2, batch_size=8, chaining=False)
    loop = env.from_collection(range(1, 201)).map(enter).iterate()
    stepped = loop.map(step)
    loop.close_with(stepped.filter(not_there))
    sink = ef.ListSink()
    stepped.filter(there).map(start_and_steps).sink_to(sink)
    run_job(env)
    assert sorted(sink.results) == [(k, collatz_steps(k)) for k in range(1, 201)]


# -- feedback that spills to disk ----------------------------------------------------


@pytest.mark.parametrize("parallelism", [1, 2])
def test_feedback_spills_to_disk_and_results_stay_exact(parallelism: int,
                                                         tmp_path: Path) -> None:
    ids, rounds = 8, 9
    # Channels that queue several batches: the loop body then works off a
    # backlog and puts several batches onto the back-edge in one turn, faster
    # than the head reads them, so the back-edge outgrows its memory bound.
    # (By count: debloating would size them by rates measured as the short
    # job goes, starting small.)
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=4, channel_capacity=8,
                               buffer_debloat_target=None)
    env.enable_checkpointing(0.01, tmp_path / "chk")
    loop = env.from_collection([(i, rounds) for i in range(ids)]).iterate()
    body = loop.flat_map(double)
    loop.close_with(body.filter(lambda r: r[1] > 0).key_by(first))
    sink = ef.ListSink()
    body.filter(lambda r: r[1] == 0).map(first).sink_to(sink)
    config = dataclasses.replace(env._runtime_config(), feedback_memory=8)
    runner = JobRunner(env.plan(), config, "spill", checkpointing=env.checkpoint_config)
    result = run_runner(runner)
    assert Counter(sink.results) == {i: 2 ** rounds for i in range(ids)}
    assert result.records_in[loop.operator_name] == ids * (2 ** rounds - 1)
    assert runner.feedback_channels, "the back-edge uses feedback channels"
    assert all(ch.memory_records == 8 for ch in runner.feedback_channels)
    assert sum(ch.spilled_batches for ch in runner.feedback_channels) > 0
    # The job closed its spill files.
    assert all(ch._disk is None for ch in runner.feedback_channels)
    assert all(len(ch) == 0 for ch in runner.feedback_channels)


def test_default_feedback_memory_is_used_by_the_environment() -> None:
    env = ef.StreamEnvironment()
    loop = env.from_collection(range(3)).iterate()
    loop.close_with(loop.filter(lambda x: False))
    loop.sink_to(ef.ListSink())
    runner = JobRunner(env.plan(), env._runtime_config(), "x")
    run_runner(runner)
    assert runner.feedback_channels
    assert all(ch.memory_records == env._runtime_config().feedback_memory
                for ch in runner.feedback_channels)
    assert all(ch.spilled_batches == 0 for ch in runner.feedback_channels)


# -- the examples --------------------------------------------------------------------


def load_example(name: str) -> ModuleType:
    return load_job(EXAMPLES / f"{name}.py")


def union_find_components(edges_file: Path) -> dict[int, int]:
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for line in edges_file.read_text().splitlines():
        if not line.strip():
            continue
        u, v = map(int, line.split())
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    # The smallest id of each component is its root (roots only ever get smaller).
    return {x: find(x) for x in parent}


def dijkstra(edges_file: Path, source: int) -> dict[int, int]:
    adj: dict[int, list[tuple[int, int]]] = {}
    vertices_with_edges = set()
    for line in edges_file.read_text().splitlines():
        if not line.strip():
            continue
        u, v, w = map(int, line.split())
        adj.setdefault(u, []).append((v, w))
        vertices_with_edges.add(u)
    if source not in vertices_with_edges:
        return {}
    dist = {source: 0}
    heap = [(0, source)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        for v, w in adj.get(u, []):
            if d + w < dist.get(v, 1 << 60):
                dist[v] = d + w
                heapq.heappush(heap, (d + w, v))
    return dist


def example_sink(env: ef.StreamEnvironment) -> ef.ListSink:
    (sink,) = [n.payload.sink for n in env._graph.nodes if n.is_sink]
    assert isinstance(sink, ef.ListSink)
    return sink


@pytest.mark.parametrize("parallelism", [1, 2])
def test_example_collatz(parallelism: int, tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the example checkpoints to a relative folder
    module = load_example("collatz")
    monkeypatch.setattr(module, "LIMIT", 2000)
    env = ef.StreamEnvironment(parallelism=parallelism)
    module.build(env)
    result = run_job(env)
    assert sorted(example_sink(env).results) == [(k, collatz_steps(k)) for k in range(1, 2001)]
    assert result.records_in["step"] == sum(collatz_steps(k) for k in range(1, 2001))
    assert (tmp_path / "checkpoints" / "collatz").is_dir()


@pytest.mark.parametrize("parallelism", [1, 2])
def test_example_connected_components(parallelism: int, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = load_example("connected_components")
    edges = tmp_path / "edges.txt"
    module.make_graph(str(edges), vertices=600, edges=500, seed=parallelism)
    monkeypatch.setattr(module, "EDGES", str(edges))
    env = ef.StreamEnvironment(parallelism=parallelism)
    module.build(env)
    result = run_job(env)
    want = union_find_components(edges)
    assert result.state("propagate", "label") == want
    # The sink saw every improvement; each vertex's last (smallest) is final.
    final: dict[int, int] = {}
    for v, label in example_sink(env).results:
        final[v] = min(label, final.get(v, v))
    assert final == want
    assert len(set(want.values())) > 10  # a graph with many components


def test_example_connected_components_shipped_data(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = load_example("connected_components")
    env = ef.StreamEnvironment(parallelism=2)
    module.build(env)
    result = run_job(env)
    assert result.state("propagate", "label") == union_find_components(Path(module.EDGES))


@pytest.mark.parametrize("parallelism", [1, 2])
def test_example_shortest_paths(parallelism: int, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = load_example("shortest_paths")
    edges = tmp_path / "weighted.txt"
    module.make_graph(str(edges), vertices=300, edges=1500, seed=parallelism)
    # Make sure the source has out-edges.
    with open(edges, "a") as f:
        f.write(f"{module.SOURCE} 1 5\n{module.SOURCE} 2 3\n")
    monkeypatch.setattr(module, "EDGES", str(edges))
    env = ef.StreamEnvironment(parallelism=parallelism)
    module.build(env)
    result = run_job(env)
    want = dijkstra(edges, module.SOURCE)
    assert len(want) > 100
    assert result.state("relax", "distance") == want
    best: dict[int, int] = {}
    for v, d in example_sink(env).results:
        best[v] = min(d, best.get(v, d))
    assert best == want


def test_example_shortest_paths_shipped_data(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = load_example("shortest_paths")
    env = ef.StreamEnvironment(parallelism=2)
    module.build(env)
    result = run_job(env)
    assert result.state("relax", "distance") == dijkstra(Path(module.EDGES), module.SOURCE)


@pytest.mark.parametrize(("example", "folder"), [
    ("collatz", "collatz"),
    ("connected_components", "connected-components"),
    ("shortest_paths", "shortest-paths"),
])
def test_example_runs_under_the_cli(example: str, folder: str, tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["COLLATZ_LIMIT"] = "3000"
    proc = subprocess.run(
        [sys.executable, "-m", "eddyflow.cli.main", "run", str(EXAMPLES / f"{example}.py"),
         "-p", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"job '{example}' finished" in proc.stderr
    chk = tmp_path / "checkpoints" / folder
    infos = ef.list_checkpoints(chk)
    assert infos, f"no completed checkpoint in {chk}"
    assert infos[-1].final
