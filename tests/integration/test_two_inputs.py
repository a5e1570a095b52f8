"""Two-input operators: what they compute (against plain Python), and that
it is exactly once — with restarts after injected failures (``FailingMap``),
in aligned and unaligned checkpoints, on both state backends, and after a
crash restored at another parallelism — against a failure-free run
(``jobs/two_input_job.py``: a keyed co-process function with timers and a
side output, an interval join, a window join and broadcast state in one
job). Also: a two-input operator inside a loop, and the API's errors.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace, StateBackendFactory, watched

import eddyflow as ef
from eddyflow.offline.checkpoint import keyed_files, open_checkpoint, read_keyed_file

sys.path.insert(0, str(Path(__file__).parent / "jobs"))
import two_input_job as job


def run(env: ef.StreamEnvironment, name: str = "job", **kw: Any) -> ef.JobResult:
    return watched(env.execute_async(name, **kw), 120)


def committed(folder: Path) -> Counter[str]:
    """The records committed to a ``FileSink`` folder (JSON strings here)."""
    return Counter(json.loads(line) for part in sorted(folder.glob("part-*"))
                   for line in part.read_text().splitlines())


# -- what the operators compute ------------------------------------------------


def test_interval_and_window_join_equal_plain_python() -> None:
    left, right = job.records(300, 5, 1), job.records(300, 5, 2)
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    sink = ef.ListSink()
    job.build_job(env, sink, n=300, keys=5)
    run(env)
    got = Counter(json.dumps(r) if not isinstance(r, str) else r for r in sink.results)
    rows = [json.loads(r) for r in got.elements()]
    ij = Counter((r[1], r[2]) for r in rows if r[0] == "ij")
    # [a.ts - 2, a.ts + 1], both bounds inclusive.
    want_ij = Counter((a[2], b[2]) for a in left for b in right
                      if a[0] == b[0] and a[1] - 2.0 <= b[1] <= a[1] + 1.0)
    assert ij == want_ij and ij
    wj = Counter((r[1], r[2]) for r in rows if r[0] == "wj")
    want_wj = Counter((a[2], b[2]) for a in left for b in right
                      if a[0] == b[0] and a[1] // 5 == b[1] // 5)
    assert wj == want_wj and wj
    co = [r for r in rows if r[0] == "co"]
    assert len(co) == 600
    # Each side's records of a key counted in order: the count of the
    # n-th record of a key on a side is n.
    for side, records in (("L", left), ("R", right)):
        seen: Counter[str] = Counter()
        want = {}
        for k, _, seq in records:
            seen[k] += 1
            want[seq] = seen[k]
        assert {r[3]: r[4] for r in co if r[1] == side} == want
    assert Counter(r[0] for r in rows)["co-side"] == sum(
        1 for rs in (left, right) for r in rs if r[2] % 7 == 0)
    timers = {(r[1], r[2]) for r in rows if r[0] == "timer"}
    assert timers == {(k, ts + 5.0) for rs in (left, right) for k, ts, _ in rs}
    bc = [r for r in rows if r[0] == "bc"]
    assert {(r[1], r[2]) for r in bc} == {(k, ts) for k, ts, _ in left}
    assert all(r[3] == int(r[2] // 10) * 100 for r in bc)


def test_sliding_and_session_window_joins_equal_plain_python() -> None:
    left, right = job.records(200, 4, 1), job.records(200, 4, 2)
    for kind in ("sliding", "session"):
        env = ef.StreamEnvironment(parallelism=2, batch_size=16)
        sink = ef.ListSink()
        job.build_job(env, sink, n=200, keys=4, windows=kind)
        run(env)
        wj = Counter((r[1], r[2]) for r in map(json.loads, sink.results) if r[0] == "wj")
        if kind == "sliding":
            def windows(t: float) -> set[float]:
                first = (t // 3.0) * 3.0 - 3.0
                return {s for s in (first, first + 3.0) if s <= t < s + 6.0}
            want = Counter((a[2], b[2]) for a in left for b in right
                           if a[0] == b[0] for _ in windows(a[1]) & windows(b[1]))
        else:
            want = Counter(_session_pairs(left, right, 1.25))
        assert wj == want and wj, kind


def _session_pairs(left: list[Any], right: list[Any], gap: float) -> list[tuple[int, int]]:
    """Pairs of a session join in plain Python: per key, sessions of both
    sides' records together (a record extends a session to ts + gap)."""
    out = []
    keys = {r[0] for r in left + right}
    for k in keys:
        tagged = sorted([(r[1], 0, r[2]) for r in left if r[0] == k]
                        + [(r[1], 1, r[2]) for r in right if r[0] == k])
        session: list[tuple[float, int, int]] = []
        end = -1.0
        for rec in [*tagged, None]:
            if rec is None or rec[0] >= end:
                ls = [s for _, side, s in session if side == 0]
                rs = [s for _, side, s in session if side == 1]
                out.extend((a, b) for a in ls for b in rs)
                session = []
            if rec is not None:
                session.append(rec)
                end = max(end, rec[0] + gap) if session[1:] else rec[0] + gap
    return out


class PlainCo(ef.CoProcessFunction):
    def process1(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        yield ("a", value)

    def process2(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        if value % 2:
            ctx.output(ef.OutputTag("odd"), value)
        yield ("b", value)


class Filtered(ef.BroadcastProcessFunction):
    def process_element(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        with pytest.raises(TypeError):
            ctx.broadcast_state["x"] = 1  # read-only on the element side
        yield value

    def process_broadcast_element(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        ctx.broadcast_state[value] = True
        return None


def test_co_process_without_keys_side_outputs_and_broadcast_function() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    a = env.from_collection(list(range(10))).name("a")
    b = env.from_collection(list(range(100, 110))).name("b")
    out, odd, plain = ef.ListSink(), ef.ListSink(), ef.ListSink()
    co = a.connect(b).process(PlainCo())
    co.sink_to(out)
    co.get_side_output(ef.OutputTag("odd")).sink_to(odd)
    a.connect(b.broadcast("seen")).process(Filtered()).sink_to(plain)
    run(env)
    assert sorted(out.results) == sorted([("a", i) for i in range(10)]
                                         + [("b", i) for i in range(100, 110)])
    assert sorted(odd.results) == list(range(101, 110, 2))
    assert sorted(plain.results) == list(range(10))


class Late(ef.KeyedCoProcessFunction):
    def process1(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        yield value

    def process2(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        yield value


def test_interval_join_sends_late_records_to_its_side_output() -> None:
    env = ef.StreamEnvironment(parallelism=1, batch_size=1)
    env.set_auto_watermark_interval(0)  # a watermark after every record
    ws = ef.WatermarkStrategy.bounded_out_of_orderness(0.0, lambda r: r[1])
    # One source for both sides, so that the watermark is ahead of the
    # late record when it arrives: ("a", 1.0) comes after 10.0.
    both = env.from_collection([("a", 0.0), ("b", 0.5), ("a", 10.0), ("a", 1.0),
                                ("b", 10.5)]).assign_timestamps_and_watermarks(ws)
    a = both.filter(lambda r: r[0] == "a")
    b = both.filter(lambda r: r[0] == "b")
    late = ef.OutputTag("late")
    joined = (a.key_by(lambda r: 0).interval_join(b.key_by(lambda r: 0)).between(0.0, 0.5)
              .side_output_late_data(late).apply(lambda x, y: (x[1], y[1])))
    pairs, dropped = ef.ListSink(), ef.ListSink()
    joined.sink_to(pairs)
    joined.get_side_output(late).sink_to(dropped)
    run(env)
    assert sorted(pairs.results) == [(0.0, 0.5), (10.0, 10.5)]
    assert dropped.results == [("a", 1.0)]


def test_the_api_refuses_what_it_cannot_run() -> None:
    env = ef.StreamEnvironment()
    a = env.from_collection([1]).name("a")
    b = env.from_collection([2]).name("b")
    with pytest.raises(TypeError, match="key both inputs"):
        a.key_by(lambda r: r).connect(b).process(Late())
    with pytest.raises(TypeError, match=r"needs an ef\.KeyedCoProcessFunction"):
        a.key_by(lambda r: r).connect(b.key_by(lambda r: r)).process(PlainCo())
    with pytest.raises(TypeError, match="needs keyed inputs"):
        a.connect(b).process(Late())
    with pytest.raises(ValueError, match="lower <= upper"):
        a.key_by(lambda r: r).interval_join(b.key_by(lambda r: r)).between(1.0, -1.0)
    with pytest.raises(TypeError, match="two keyed streams"):
        a.key_by(lambda r: r).interval_join(b)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="call window"):
        a.join(b).where(lambda r: r).equal_to(lambda r: r).apply(lambda x, y: x)
    with pytest.raises(TypeError, match="cannot join a BroadcastStream"):
        a.join(b.broadcast("x"))  # type: ignore[arg-type]


# -- exactly once --------------------------------------------------------------


def reference(**kw: Any) -> Counter[str]:
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    sink = ef.ListSink()
    job.build_job(env, sink, **kw)
    run(env, "reference")
    return Counter(sink.results)


@pytest.mark.parametrize("mode", ["exactly_once", "unaligned"])
def test_two_input_operators_are_exactly_once_with_restarts(
        tmp_path: Path, state_backend: StateBackendFactory, mode: str) -> None:
    want = reference()
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    state_backend.use(env, tmp_path / "db")
    env.enable_checkpointing(0.01, tmp_path / "chk", mode=mode)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0))
    sink = ef.ListSink()
    failing = ef.testing.FailingMap(after=150, times=3)
    job.build_job(env, sink, extra=(Pace(4), failing))
    result = run(env, "restarts")
    got = Counter(sink.results)
    assert result.restarts == 3 and result.completed_checkpoints
    assert got == want, (f"lost {list((want - got).elements())[:3]}, "
                         f"extra {list((got - want).elements())[:3]}")


@pytest.mark.parametrize(("windows", "rescale_to"), [("tumbling", 3), ("session", 1),
                                                     ("sliding", 4)])
def test_a_crash_restored_at_another_parallelism_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory, windows: str,
        rescale_to: int) -> None:
    want = reference(windows=windows)
    out = tmp_path / "out"
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    state_backend.use(env, tmp_path / "db")
    env.enable_checkpointing(0.01, tmp_path / "chk")
    job.build_job(env, ef.FileSink(str(out)), windows=windows,
                  extra=(Pace(4), ef.testing.FailingMap(after=400, times=1)))
    with pytest.raises(ef.JobFailed):
        run(env, "crash")
    assert ef.list_checkpoints(tmp_path / "chk"), "the crash came before any checkpoint"
    env = ef.StreamEnvironment(parallelism=rescale_to, batch_size=8)
    state_backend.use(env, tmp_path / "db2")
    env.enable_checkpointing(0.01, tmp_path / "chk")
    job.build_job(env, ef.FileSink(str(out)), windows=windows)
    run(env, "restored", restore="latest")
    got = committed(out)
    assert got == want, (f"at parallelism {rescale_to}: lost "
                         f"{list((want - got).elements())[:3]}, "
                         f"extra {list((got - want).elements())[:3]}")


class Rules(ef.BroadcastProcessFunction):
    def process_element(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        yield (value, dict(ctx.broadcast_state))

    def process_broadcast_element(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        ctx.broadcast_state[value[0]] = value[1]
        if value[1] is None:
            del ctx.broadcast_state[value[0]]
        return None


def test_every_subtask_gets_the_whole_broadcast_state_at_any_parallelism(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    """Rules set, changed and deleted in a first run; a second run at another
    parallelism, restored from its last checkpoint, sees all of them in
    every subtask before any new element."""
    updates = [(f"r{i % 13}", i) for i in range(60)] + [(f"r{i}", None) for i in range(0, 13, 3)]
    final = {}
    for k, v in updates:
        final[k] = v
    final = {k: v for k, v in final.items() if v is not None}
    env = ef.StreamEnvironment(parallelism=2)
    state_backend.use(env, tmp_path / "db")
    env.enable_checkpointing(60.0, tmp_path / "chk")  # the final checkpoint only
    rules = env.from_collection(updates).name("rules").set_parallelism(1)
    events = env.from_collection([]).name("events")
    out = events.connect(rules.broadcast("rules")).process(Rules()).name("bc")
    out.sink_to(ef.ListSink())
    first = run(env, "first")
    assert first.state("bc") == final
    for p in (1, 3, 4):
        env = ef.StreamEnvironment(parallelism=p)
        state_backend.use(env, tmp_path / f"db{p}")
        rules = env.from_collection(updates).name("rules").set_parallelism(1)
        # No new rules: the restored position is the end of the collection.
        # New events come from a source of their own: the first run's
        # "events" read its (empty) split to the end, and a finished split
        # stays finished after a restore.
        events = env.from_collection(list(range(20))).name("new-events")
        sink = ef.ListSink()
        events.connect(rules.broadcast("rules")).process(Rules()).name("bc").sink_to(sink)
        run(env, f"at {p}", restore=str(ef.list_checkpoints(tmp_path / "chk")[-1].path),
            allow_non_restored_state=True)
        assert sorted(v for v, _ in sink.results) == list(range(20))
        assert all(seen == final for _, seen in sink.results), p


# -- inside a loop ---------------------------------------------------------------


class Halve(ef.KeyedCoProcessFunction):
    """Input 1: numbers entering; input 2: the loop's feedback. Counts the
    steps of each number's Collatz walk in keyed state."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.steps = ctx.value_state("steps", default=0)

    def process1(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        yield (value[0], value[1])

    def process2(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        self.steps.value += 1
        yield (value[0], value[1])


def collatz(r: tuple[int, int]) -> tuple[int, int]:
    n = r[1]
    return (r[0], n // 2 if n % 2 == 0 else 3 * n + 1)


def test_a_keyed_co_process_function_inside_a_loop_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    def build(env: ef.StreamEnvironment, sink: ef.Sink, *extra: Any) -> None:
        numbers = env.from_collection([(i, i) for i in range(1, 400)]).name("numbers")
        for fn in extra:
            numbers = numbers.map(fn)
        head = env.from_collection([]).name("nothing").iterate()
        step = (numbers.key_by(lambda r: r[0]).connect(head.key_by(lambda r: r[0]))
                .process(Halve()).name("co").map(collatz).name("step"))
        head.close_with(step.filter(lambda r: r[1] != 1))
        step.filter(lambda r: r[1] == 1).sink_to(sink)

    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    ref = ef.ListSink()
    build(env, ref)
    want_state = run(env, "reference").state("co")
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    state_backend.use(env, tmp_path / "db")
    env.enable_checkpointing(0.01, tmp_path / "chk")
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=2, delay=0))
    sink = ef.ListSink()
    build(env, sink, Pace(2), ef.testing.FailingMap(after=150, times=2))
    result = run(env, "loop")
    assert result.restarts == 2
    assert Counter(sink.results) == Counter(ref.results)
    assert result.state("co") == want_state
    # Plain Python: the number of steps to reach 1.
    for n in (27, 97, 399):
        steps, m = 0, n
        while m != 1:
            m = m // 2 if m % 2 == 0 else 3 * m + 1
            steps += 1
        assert want_state[n] == steps - 1  # the first step comes from input 1


class Expiring(ef.KeyedCoProcessFunction):
    """Writes state with a time-to-live; the last record of input 1 moves
    processing time past the earlier writes' expiry first."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.seen = ctx.value_state("seen", ttl=ef.StateTtl(5.0))

    def process1(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        if value == "last":
            self.clock.set(100.0)
        self.seen.value = value
        return None

    def process2(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        yield (value, self.seen.value)


def test_keyed_co_process_state_expires_with_its_time_to_live(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    clock = ef.testing.ManualClock(0.0)
    env = ef.StreamEnvironment(parallelism=1)
    env.set_clock(clock)
    state_backend.use(env, tmp_path / "db")
    env.enable_checkpointing(60.0, tmp_path / "chk")  # the final checkpoint only
    a = env.from_collection(["a", "b", "c", "last"]).name("a")
    b = env.from_collection([]).name("b")
    (a.key_by(lambda r: r).connect(b.key_by(lambda r: r)).process(Expiring(clock)).name("co")
        .sink_to(ef.ListSink()))
    result = run(env)
    assert set(result.state("co")) == {"last"}
    final = ef.list_checkpoints(tmp_path / "chk")[-1]
    stored = {key for kf in keyed_files(open_checkpoint(final.path), "co")
              for _, name, key, _ in read_keyed_file(kf) if name == "seen"}
    assert stored == {"last"}  # expired entries are dropped from snapshots
