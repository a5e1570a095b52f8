"""Event time in the runtime: timestamps through operators and exchanges,
watermarks in band (minimum over inputs, idleness, the final ``+inf``),
lateness, and timers of a ``KeyedProcessFunction`` (event time, processing
time under a ``ManualClock``), across failures and rescaling on both state
backends. Expected results come from plain Python, not from eddyflow."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_support import StateBackendFactory

import eddyflow as ef
from eddyflow.runtime.exchange.events import RecordBatch, Watermark, WatermarkStatus
from eddyflow.runtime.exchange.writers import KeyGroupWriter, RebalanceWriter
from eddyflow.runtime.time.valve import WatermarkValve
from eddyflow.windowing import is_late


def _ts(r: Any) -> float:
    return float(r[1])


def strategy(delay: float = 0.0) -> ef.WatermarkStrategy:
    return ef.WatermarkStrategy.bounded_out_of_orderness(delay, _ts)


class Stamp(ef.KeyedProcessFunction):
    """Outputs each record with its timestamp and the watermark it saw."""

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        yield (value, ctx.timestamp, ctx.timer_service.current_watermark())


# -- timestamps ---------------------------------------------------------------


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_timestamps_follow_records_through_operators_and_exchanges(parallelism: int) -> None:
    records = [(f"k{i % 7}", float(i * 3 % 101), i) for i in range(500)]
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=16)
    sink = ef.ListSink()
    (env.from_collection(records)
        .assign_timestamps_and_watermarks(strategy(1000.0))
        .map(lambda r: (r[0], r[1], r[2] * 2))
        .filter(lambda r: r[2] % 3 != 0)
        .flat_map(lambda r: [r, (r[0], r[1], -r[2])])
        .rebalance()
        .map(lambda r: r)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: b)
        .key_by(lambda kv: kv[0])
        .process(Stamp())
        .sink_to(sink))
    env.execute("timestamps")
    got = [(v[1], ts) for v, ts, _ in sink.results]
    assert len(got) == 2 * sum(1 for r in records if (r[2] * 2) % 3 != 0)
    assert all(ts == rec[1] for rec, ts in got)


def test_a_stream_without_event_time_has_no_timestamps() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    sink = ef.ListSink()
    env.from_collection(range(50)).key_by(lambda x: x % 3).process(Stamp()).sink_to(sink)
    env.execute("no event time")
    assert {(ts, wm) for _, ts, wm in sink.results} == {(None, -math.inf)}


def test_writers_split_timestamps_with_their_records() -> None:
    from eddyflow.runtime.exchange.channel import Channel

    chans = [Channel(f"c{i}", None) for i in range(3)]
    w = KeyGroupWriter(chans, 1000, "a -> b", lambda r: r, 128)
    w.add(list(range(30)), None, [float(i) for i in range(30)])
    for buf in w.buffers:
        assert buf.timestamps == [float(r) for r in buf]
    r = RebalanceWriter(chans, 1000, "a -> b", 0)
    r.add([1, 2], None)  # no timestamps, then some: padded with None
    r.add([3], None)
    r.add([4], None, [4.0])
    r.add([5], None, [5.0])
    assert r.buffers[0].timestamps == [None, None, 5.0]
    assert r.buffers[1].timestamps is None
    assert r.buffers[2].timestamps == [4.0]


# -- the valve ----------------------------------------------------------------


def test_valve_takes_the_minimum_and_only_moves_forward() -> None:
    v = WatermarkValve([True, True, True])
    assert v.on_watermark(0, 5.0) is None  # the others are still at -inf
    assert v.on_watermark(1, 7.0) is None
    assert v.on_watermark(2, 3.0) == 3.0
    assert v.on_watermark(2, 9.0) == 5.0
    assert v.on_watermark(0, 4.0) is None  # a channel's own watermark never goes back
    assert v.on_end(0) == 7.0  # an ended channel holds nothing back
    assert v.on_end(1) == 9.0
    assert v.on_end(2) == math.inf


def test_valve_ignores_idle_inputs_until_they_are_active_again() -> None:
    v = WatermarkValve([True, True])
    v.on_watermark(0, 10.0)
    assert v.on_status(1, True) == 10.0  # the silent split no longer holds it back
    assert not v.idle_out
    assert v.on_status(0, True) is None
    assert v.idle_out  # every input idle: the task's output is idle
    assert v.on_watermark(1, 4.0) is None  # active again, but behind: no going back
    assert not v.idle_out
    assert v.on_watermark(1, 12.0) == 12.0  # channel 0 is still idle


def test_valve_of_a_loop_head_ignores_back_edges_and_waits_for_its_end() -> None:
    v = WatermarkValve([True, False], final_at_end=False)
    assert v.on_watermark(1, 100.0) is None  # the back-edge never counts
    assert v.on_watermark(0, 5.0) == 5.0
    assert v.on_end(0) is None  # +inf comes at the head's end of input, loop empty


# -- watermarks in jobs -------------------------------------------------------


class Late(ef.KeyedProcessFunction):
    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        assert ctx.timestamp is not None
        yield (value[2], is_late(ctx.timestamp, ctx.timer_service.current_watermark()))


def test_a_late_record_is_detectable_in_a_process_function() -> None:
    # delay 2: after ts 10 the watermark is 8; ts 9 and 8 are on time, 3 is late.
    records = [("a", 1.0, 0), ("a", 10.0, 1), ("a", 9.0, 2), ("a", 8.0, 3), ("a", 3.0, 4),
               ("a", 20.0, 5), ("a", 18.5, 6), ("a", 18.0, 7)]
    env = ef.StreamEnvironment(parallelism=1, batch_size=1)
    env.set_auto_watermark_interval(0)
    sink = ef.ListSink()
    (env.from_collection(records).assign_timestamps_and_watermarks(strategy(2.0))
        .key_by(lambda r: r[0]).process(Late()).sink_to(sink))
    env.execute("late")
    assert sink.results == [(0, False), (1, False), (2, False), (3, False), (4, True),
                            (5, False), (6, False), (7, False)]


def test_the_watermark_is_the_minimum_over_the_splits() -> None:
    # Two source splits, one far behind the other: downstream, the watermark
    # never passes the slower split's while it runs (once it ended, it no
    # longer holds anything back).
    slow = [("s", float(i), i) for i in range(200)]
    fast = [("f", 1000.0 + i, i) for i in range(200)]
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    env.set_auto_watermark_interval(0)
    sink = ef.ListSink()
    (env.from_collection(slow + fast).assign_timestamps_and_watermarks(strategy(0.0))
        .key_by(lambda r: r[0]).process(Stamp()).sink_to(sink))
    env.execute("minimum")
    seen = [(v[0], v[1], wm) for v, _, wm in sink.results]
    assert all(wm < 200.0 for k, _, wm in seen if k == "s")
    assert any(wm < 200.0 for k, _, wm in seen if k == "f")  # held back by the slow split
    assert all(wm < t for _, t, wm in seen)  # in order per split: nothing late


# -- timers -------------------------------------------------------------------


class Timeouts(ef.KeyedProcessFunction):
    """An event-time timer ``delay`` after each record; counts per key."""

    def __init__(self, delay: float = 10.0) -> None:
        self.delay = delay

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.count = ctx.value_state("count", 0)

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        self.count.value = self.count.value + 1
        assert ctx.timestamp is not None
        ctx.timer_service.register_event_time_timer(ctx.timestamp + self.delay)
        return None

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Any:
        yield (ctx.current_key, timestamp, ctx.timestamp, ctx.timer_service.current_watermark())


def test_event_time_timers_fire_once_in_order_at_their_watermark() -> None:
    records = [("a", 1.0), ("b", 2.0), ("a", 1.0), ("a", 5.0), ("b", 30.0), ("a", 40.0),
               ("c", 41.0)]
    env = ef.StreamEnvironment(parallelism=1, batch_size=1)
    env.set_auto_watermark_interval(0)
    sink = ef.ListSink()
    (env.from_collection(records).assign_timestamps_and_watermarks(strategy(0.0))
        .key_by(lambda r: r[0]).process(Timeouts()).sink_to(sink))
    env.execute("timers")
    fired = sink.results
    # One timer per (key, timestamp): "a" at 11 once although registered twice.
    assert [(k, t) for k, t, _, _ in fired] == [("a", 11.0), ("b", 12.0), ("a", 15.0),
                                               ("b", 40.0), ("a", 50.0), ("c", 51.0)]
    assert all(t == ts for _, t, ts, _ in fired)
    # each fired when the watermark reached it, the last ones at the end (+inf)
    assert [wm for _, _, _, wm in fired[:4]] == [30.0, 30.0, 30.0, 40.0]
    assert [wm for _, _, _, wm in fired[4:]] == [math.inf, math.inf]


class Deleting(ef.KeyedProcessFunction):
    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        ctx.timer_service.register_event_time_timer(100.0)
        if value[0] == "x":
            ctx.timer_service.delete_event_time_timer(100.0)
        return None

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Any:
        yield ctx.current_key


def test_a_deleted_timer_does_not_fire() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    sink = ef.ListSink()
    (env.from_collection([("x", 1.0), ("y", 1.0)]).assign_timestamps_and_watermarks(strategy())
        .key_by(lambda r: r[0]).process(Deleting()).sink_to(sink))
    env.execute("delete")
    assert sink.results == ["y"]


class ProcTimer(ef.KeyedProcessFunction):
    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        if value != "tick":
            now = ctx.timer_service.current_processing_time()
            ctx.timer_service.register_processing_time_timer(now + 5.0)
        yield ("seen", value, ctx.timer_service.current_processing_time())

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Any:
        yield ("timer", ctx.current_key, timestamp, ctx.timer_service.current_processing_time())


def test_processing_time_timers_fire_under_a_manual_clock() -> None:
    clock = ef.testing.ManualClock(100.0)

    def tick(x: str) -> str:
        if x == "tick":
            clock.advance(10.0)  # processing time moves on, as the records say
        return x

    env = ef.StreamEnvironment(parallelism=1, batch_size=1)
    env.set_clock(clock)
    sink = ef.ListSink()
    (env.from_collection(["a", "b", "tick", "c", "tick"]).map(tick)
        .key_by(lambda x: x).process(ProcTimer()).sink_to(sink))
    started = time.monotonic()
    env.execute("processing time")
    assert time.monotonic() - started < 30
    out = sink.results
    timers = [r for r in out if r[0] == "timer"]
    assert sorted(timers) == [("timer", "a", 105.0, 110.0), ("timer", "b", 105.0, 110.0),
                              ("timer", "c", 115.0, 120.0)]
    # a and b fired after the first tick and before "c" was processed
    assert out.index(("seen", "c", 110.0)) > max(out.index(t) for t in timers[:2])


# -- exactly once across failures and rescaling -------------------------------


def _records(n: int) -> list[tuple[str, float]]:
    return [(f"k{i % 13}", float(i // 3 + (i * 7) % 5)) for i in range(n)]


def _slow(r: Any) -> Any:
    time.sleep(0.0002)
    return r


def _timer_job(env: ef.StreamEnvironment, out: Path, records: list[Any],
               fail: ef.testing.FailingMap | None) -> None:
    s = (env.from_collection(records).set_parallelism(2)
         .assign_timestamps_and_watermarks(strategy(3.0)).set_parallelism(2)
         .map(_slow).set_parallelism(2))
    if fail is not None:
        s = s.map(fail).set_parallelism(2)
    (s.key_by(lambda r: r[0]).process(Timeouts(4.0)).name("timeouts")
        .map(lambda r: [r[0], r[1]]).sink_to(ef.FileSink(str(out))))


def _read(folder: Path) -> Counter[tuple[str, float]]:
    got: Counter[tuple[str, float]] = Counter()
    for p in folder.glob("part-*"):
        for line in p.read_text().splitlines():
            k, t = json.loads(line)
            got[(k, t)] += 1
    return got


@pytest.mark.parametrize("restore_at", [3, 1])
def test_timers_fire_exactly_once_across_a_crash_and_a_restore_at_another_parallelism(
        tmp_path: Path, state_backend: StateBackendFactory, restore_at: int) -> None:
    records = _records(2400)
    expected = Counter({(k, t + 4.0): 1 for k, t in set(records)})
    out = tmp_path / "out"

    env = ef.StreamEnvironment(parallelism=2, batch_size=32)
    state_backend.use(env, tmp_path / "db1")
    env.enable_checkpointing(0.02, tmp_path / "chk")
    _timer_job(env, out, records, ef.testing.FailingMap(after=1600, times=1))
    with pytest.raises(ef.JobFailed):
        env.execute("timers")
    assert ef.list_checkpoints(tmp_path / "chk"), "no checkpoint before the crash"

    env = ef.StreamEnvironment(parallelism=restore_at, batch_size=32)
    state_backend.use(env, tmp_path / "db2")
    env.enable_checkpointing(0.02, tmp_path / "chk")
    _timer_job(env, out, records, None)
    env.execute("timers", restore="latest")
    assert _read(out) == expected


def test_timers_fire_exactly_once_with_restarts(tmp_path: Path,
                                                state_backend: StateBackendFactory) -> None:
    records = _records(2400)
    expected = Counter({(k, t + 4.0): 1 for k, t in set(records)})
    env = ef.StreamEnvironment(parallelism=2, batch_size=32)
    state_backend.use(env, tmp_path / "db")
    env.enable_checkpointing(0.02, tmp_path / "chk")
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0))
    _timer_job(env, tmp_path / "out", records, ef.testing.FailingMap(after=700, times=2))
    env.execute("timers")
    assert _read(tmp_path / "out") == expected


# -- loops --------------------------------------------------------------------


class Total(ef.KeyedProcessFunction):
    """Sums what reaches it and emits the sum when event time ends."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.total = ctx.value_state("total", 0)

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        self.total.value = self.total.value + 1
        ctx.timer_service.register_event_time_timer(1e9)
        return None

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Any:
        yield (ctx.current_key, self.total.value)


def test_back_edges_do_not_hold_the_loop_heads_watermark_back() -> None:
    # Collatz steps circulate round the loop with their timestamps; the
    # timer at the end of event time fires once every record left the loop.
    env = ef.StreamEnvironment(parallelism=1, batch_size=4)
    env.set_auto_watermark_interval(0)
    sink = ef.ListSink()
    start = env.from_collection([(n, float(n)) for n in range(1, 40)]) \
        .assign_timestamps_and_watermarks(strategy())
    loop = start.iterate()
    step = loop.map(lambda r: (r[0] // 2 if r[0] % 2 == 0 else 3 * r[0] + 1, r[1]))
    loop.close_with(step.filter(lambda r: r[0] != 1))
    step.filter(lambda r: r[0] == 1).key_by(lambda r: "ones").process(Total()).sink_to(sink)
    env.execute("loop")
    assert sink.results == [("ones", 39)]


def test_watermark_events_are_in_band_batches_keep_timestamps() -> None:
    b = RecordBatch([1, 2], None, [1.0, 2.0])
    assert b.timestamps == [1.0, 2.0] and list(b) == [1, 2]
    assert Watermark(3.0).timestamp == 3.0 and WatermarkStatus(True).idle
