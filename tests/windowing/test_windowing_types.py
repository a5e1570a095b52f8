"""The public windowing types of API.md: construction checks, the watermark
generator's rule, window arithmetic (float boundaries included), session
merging against a brute-force grouping, the adapters, WindowResult as
FileSink writes it, OutputTag and StateTtl."""

from __future__ import annotations

import itertools
import json
import math
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eddyflow as ef
from eddyflow.windowing import (
    AggregateAdapter,
    ProcessAdapter,
    TimeWindow,
    add_window,
    check_allowed_lateness,
    check_window_function,
    fires_on_element,
    horizon,
    is_late,
    is_window_late,
    merge_windows,
    on_timer,
    should_fire,
    timers_to_register,
)

# -- watermark strategy --------------------------------------------------------------


def test_generator_watermark_is_max_minus_delay_and_never_goes_back() -> None:
    ws = ef.WatermarkStrategy.bounded_out_of_orderness(max_delay=5, timestamp=lambda r: r)
    assert ws.max_delay == 5.0 and isinstance(ws.max_delay, float) and ws.idleness is None
    gen = ws.create_generator()
    assert gen.current_watermark() == -math.inf
    for t, w in [(10.0, 5.0), (7.0, 5.0), (12.0, 7.0), (1.0, 7.0)]:
        gen.on_event(t)
        assert gen.current_watermark() == w
    assert not is_late(7.0, gen.current_watermark())     # t == W is on time
    assert is_late(6.9, gen.current_watermark())
    other = ws.create_generator()                      # one per parallel instance
    assert other.current_watermark() == -math.inf


def test_monotonous_record_equal_to_max_is_on_time() -> None:
    gen = ef.WatermarkStrategy.for_monotonous_timestamps(lambda r: r).create_generator()
    gen.on_event(3.0)
    assert gen.current_watermark() == 3.0 and not is_late(3.0, gen.current_watermark())


def test_with_idleness_returns_a_new_strategy() -> None:
    ws = ef.WatermarkStrategy.bounded_out_of_orderness(1.0, timestamp=lambda r: r)
    idle = ws.with_idleness(30)
    assert ws.idleness is None and idle.idleness == 30.0 and idle.max_delay == 1.0
    assert idle.timestamp is ws.timestamp
    assert not idle.is_idle(last_record_at=100.0, now=129.9)
    assert idle.is_idle(last_record_at=100.0, now=130.0)
    assert not ws.is_idle(0.0, 1e9)
    with pytest.raises(AttributeError):
        idle.max_delay = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"max_delay": -1.0}, ValueError, "max_delay must be >= 0"),
    ({"max_delay": math.inf}, ValueError, "max_delay must be finite"),
    ({"max_delay": "5"}, TypeError, "max_delay must be a number"),
    ({"max_delay": 1.0, "timestamp": "ts"}, TypeError, "timestamp must be callable"),
])
def test_strategy_rejects_bad_parameters(kwargs: dict[str, Any], error: type[Exception],
                                         match: str) -> None:
    kwargs.setdefault("timestamp", lambda r: r)
    with pytest.raises(error, match=match):
        ef.WatermarkStrategy.bounded_out_of_orderness(**kwargs)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan])
def test_idleness_must_be_positive(bad: float) -> None:
    ws = ef.WatermarkStrategy.for_monotonous_timestamps(lambda r: r)
    with pytest.raises(ValueError, match="idleness"):
        ws.with_idleness(bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_generator_refuses_non_finite_timestamps(bad: float) -> None:
    gen = ef.WatermarkStrategy.for_monotonous_timestamps(lambda r: r).create_generator()
    with pytest.raises(ValueError, match="finite"):
        gen.on_event(bad)
    assert gen.current_watermark() == -math.inf


# -- windows and assigners -----------------------------------------------------------


def test_time_window() -> None:
    w = TimeWindow(0.0, 10.0)
    assert w.contains(0.0) and w.contains(w.max_timestamp) and not w.contains(10.0)
    assert w.max_timestamp < 10.0 and math.nextafter(w.max_timestamp, math.inf) == 10.0
    assert w.intersects(TimeWindow(10.0, 12.0))          # touching merges sessions
    assert not w.intersects(TimeWindow(10.5, 12.0))
    assert w.cover(TimeWindow(5.0, 12.0)) == TimeWindow(0.0, 12.0)
    assert sorted([TimeWindow(1, 2), TimeWindow(0, 5), TimeWindow(0, 3)]) == [
        TimeWindow(0, 3), TimeWindow(0, 5), TimeWindow(1, 2)]
    assert len({TimeWindow(0.0, 1.0), TimeWindow(0, 1)}) == 1
    assert pickle.loads(pickle.dumps(w)) == w
    with pytest.raises(ValueError, match="start must be < end"):
        TimeWindow(1.0, 1.0)


def test_assigners() -> None:
    assert ef.TumblingEventTimeWindows(60.0).assign(59.9) == [TimeWindow(0.0, 60.0)]
    assert ef.TumblingEventTimeWindows(60.0).assign(60.0) == [TimeWindow(60.0, 120.0)]
    assert ef.TumblingEventTimeWindows(10.0, offset=3.0).assign(-1.0) == [TimeWindow(-7.0, 3.0)]
    assert ef.SlidingEventTimeWindows(10.0, 5.0).assign(7.0) == [
        TimeWindow(0.0, 10.0), TimeWindow(5.0, 15.0)]
    assert ef.SlidingEventTimeWindows(2.0, 5.0).assign(3.0) == []     # between windows
    assert ef.EventTimeSessionWindows(gap=5).assign(1.5) == [TimeWindow(1.5, 6.5)]
    flags = [(a.is_event_time, a.is_merging) for a in (
        ef.TumblingEventTimeWindows(1), ef.SlidingEventTimeWindows(2, 1),
        ef.EventTimeSessionWindows(1), ef.TumblingProcessingTimeWindows(1))]
    assert flags == [(True, False), (True, False), (True, True), (False, False)]


@pytest.mark.parametrize(("make", "match"), [
    (lambda: ef.TumblingEventTimeWindows(0), "size must be > 0"),
    (lambda: ef.TumblingEventTimeWindows(-1.0), "size must be > 0"),
    (lambda: ef.TumblingEventTimeWindows(math.inf), "size must be finite"),
    (lambda: ef.TumblingEventTimeWindows(math.nan), "size must be finite"),
    (lambda: ef.TumblingEventTimeWindows(10, offset=10), "offset must lie"),
    (lambda: ef.TumblingProcessingTimeWindows(0), "TumblingProcessingTimeWindows: size"),
    (lambda: ef.SlidingEventTimeWindows(10, 0), "slide must be > 0"),
    (lambda: ef.SlidingEventTimeWindows(10, 5, offset=-5), "offset must lie"),
    (lambda: ef.EventTimeSessionWindows(0), "gap must be > 0"),
    (lambda: check_allowed_lateness(-1), "allowed_lateness: seconds must be >= 0"),
])
def test_assigners_reject_bad_parameters(make: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_assigner_rejects_non_numbers() -> None:
    with pytest.raises(TypeError, match="size must be a number"):
        ef.TumblingEventTimeWindows(True)
    with pytest.raises(TypeError, match="gap must be a number"):
        ef.EventTimeSessionWindows("5")  # type: ignore[arg-type]


finite_times = st.floats(-1e9, 1e9, allow_nan=False)


@settings(max_examples=300)
@given(t=finite_times, size=st.floats(1e-3, 1e4), frac=st.floats(-0.99, 0.99))
def test_tumbling_window_contains_its_timestamp_and_is_canonical(
        t: float, size: float, frac: float) -> None:
    a = ef.TumblingEventTimeWindows(size, offset=frac * size)
    [w] = a.assign(t)
    assert w.contains(t)
    # every timestamp of the window computes the very same floats
    assert a.assign(w.start) == [w] and a.assign(w.max_timestamp) == [w]


@settings(max_examples=300)
@given(t=finite_times, slide=st.floats(1e-2, 1e3), ratio=st.integers(1, 5),
       frac=st.floats(-0.99, 0.99))
def test_sliding_windows_are_exactly_those_containing_t(
        t: float, slide: float, ratio: int, frac: float) -> None:
    a = ef.SlidingEventTimeWindows(slide * ratio, slide, offset=frac * slide)
    windows = a.assign(t)
    assert windows == sorted(windows) and all(w.contains(t) for w in windows)
    assert len(windows) in (ratio - 1, ratio, ratio + 1)   # float rounding at the edges
    for w in windows:
        assert w in a.assign(w.start)


def test_float_boundaries_are_shared_by_all_records_of_a_window() -> None:
    a = ef.TumblingEventTimeWindows(0.1)
    [w] = a.assign(0.3)
    assert w.contains(0.3) and a.assign(0.25) == [w]


# -- session merging -----------------------------------------------------------------


def test_add_window_chains_and_reports_members() -> None:
    r = add_window([TimeWindow(0, 4), TimeWindow(7, 10), TimeWindow(20, 25)], TimeWindow(3, 8))
    assert r.window == TimeWindow(0, 10)
    assert r.members == (TimeWindow(0, 4), TimeWindow(7, 10)) and not r.existed
    assert r.retired == r.members
    assert r.windows == (TimeWindow(0, 10), TimeWindow(20, 25))
    inside = add_window([TimeWindow(0, 10)], TimeWindow(2, 5))
    assert inside.window == TimeWindow(0, 10) and inside.existed and inside.retired == ()
    same = add_window([TimeWindow(0, 4)], TimeWindow(0, 4))
    assert same.members == (TimeWindow(0, 4),) and same.existed
    alone = add_window([TimeWindow(0, 4)], TimeWindow(5, 6))
    assert alone.members == () and alone.windows == (TimeWindow(0, 4), TimeWindow(5, 6))


def test_merge_windows_groups_chains_in_any_order() -> None:
    groups = merge_windows([TimeWindow(8, 9), TimeWindow(0, 2), TimeWindow(2, 5),
                            TimeWindow(4, 6)])
    assert groups == [(TimeWindow(0, 6), [TimeWindow(0, 2), TimeWindow(2, 5), TimeWindow(4, 6)]),
                      (TimeWindow(8, 9), [TimeWindow(8, 9)])]


@settings(max_examples=300)
@given(starts=st.lists(st.integers(0, 60), max_size=25), gap=st.integers(1, 8))
def test_sessions_in_any_arrival_order_equal_a_brute_force_grouping(
        starts: list[int], gap: int) -> None:
    """Adding ``[t, t+gap)`` one by one in arrival order gives the same
    sessions as grouping the sorted timestamps at once, and every step's
    members are exactly the previous windows inside the new one."""
    windows: tuple[TimeWindow, ...] = ()
    for t in starts:
        r = add_window(windows, TimeWindow(float(t), float(t + gap)))
        assert set(r.members) == {w for w in windows if r.window.start <= w.start
                                  and w.end <= r.window.end}
        assert set(windows) - set(r.members) <= set(r.windows)
        windows = r.windows
        assert all(not a.intersects(b) for a, b in itertools.pairwise(windows))
    expected: list[list[int]] = []
    for t in sorted(starts):
        if expected and t <= expected[-1][1]:       # touches: [s, e] with t <= e
            expected[-1][1] = max(expected[-1][1], t + gap)
        else:
            expected.append([t, t + gap])
    assert [(w.start, w.end) for w in windows] == [(s, e) for s, e in expected]


# -- adapters, results, tags, TTL ----------------------------------------------------


class NoMerge(ef.AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator


def test_aggregate_without_merge_is_refused_for_sessions_only() -> None:
    adapter = AggregateAdapter(NoMerge())
    check_window_function(adapter, ef.TumblingEventTimeWindows(1.0))
    with pytest.raises(TypeError, match="NoMerge must implement merge"):
        check_window_function(adapter, ef.EventTimeSessionWindows(1.0))
    with pytest.raises(NotImplementedError, match="session windows need it"):
        adapter.merge(1, 2)


def test_adapters_reject_wrong_functions() -> None:
    from eddyflow.windowing import ReduceAdapter, SumAdapter
    with pytest.raises(TypeError, match="reduce: fn must be callable"):
        ReduceAdapter(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sum: value_fn must be callable"):
        SumAdapter(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expected an ef\.AggregateFunction"):
        AggregateAdapter(max)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expected an ef\.ProcessWindowFunction"):
        ProcessAdapter(NoMerge())  # type: ignore[arg-type]


def test_window_result_is_json_friendly() -> None:
    r = ef.WindowResult(("user", 7), 0.0, 60.0, 12)
    assert r.key == ("user", 7) and r.value == 12
    line = json.dumps(r)
    assert line == '[["user", 7], 0.0, 60.0, 12]'
    assert ef.WindowResult(*json.loads(line)) == ef.WindowResult(["user", 7], 0.0, 60.0, 12)
    assert pickle.loads(pickle.dumps(r)) == r


def test_output_tag() -> None:
    late = ef.OutputTag("late")
    assert late == ef.OutputTag("late") and hash(late) == hash(ef.OutputTag("late"))
    assert late != ef.OutputTag("other") and repr(late) == "OutputTag('late')"
    assert pickle.loads(pickle.dumps(late)) == late
    with pytest.raises(ValueError, match="non-empty string"):
        ef.OutputTag("")


def test_state_ttl() -> None:
    ttl = ef.StateTtl(10)
    assert ttl.seconds == 10.0 and ttl.expires_at(5.0) == 15.0
    assert not ttl.expired(written_at=5.0, now=14.9)
    assert ttl.expired(written_at=5.0, now=15.0)
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match="StateTtl: seconds"):
            ef.StateTtl(bad)


def test_timers_of_a_window() -> None:
    w = TimeWindow(0.0, 10.0)
    assert timers_to_register(w, -math.inf, 5.0) == [10.0, 15.0]
    assert timers_to_register(w, -math.inf, 0.0) == [10.0]          # fire and purge together
    assert timers_to_register(w, 10.0, 5.0) == [15.0]               # already fired by the record
    assert timers_to_register(w, 3.0, 5.0, event_time=False) == [10.0]
    assert on_timer(w, 10.0, 5.0) == (True, False)
    assert on_timer(w, 15.0, 5.0) == (False, True)
    assert on_timer(w, 10.0, 0.0) == (True, True)


_TIMES = st.one_of(
    st.floats(allow_nan=False, allow_infinity=True, width=64),
    st.floats(-1e10, 1e10),
    st.integers(-10**6, 10**6).map(float),
    st.sampled_from([0.1, 0.2, 0.3, 0.7, 1e16, 1.7e9 + 0.1, 5e-324]))
_LATENESS = st.one_of(st.just(0.0), st.floats(0.0, 1e12), st.sampled_from([0.1, 0.2, 1e-300]))


@settings(max_examples=2000, deadline=None)
@given(_TIMES, _LATENESS, _TIMES)
def test_the_horizon_decides_as_the_sums_it_stands_for(
        time: float, lateness: float, end: float) -> None:
    """The window operator compares ends with a batch's horizon: that must
    decide exactly as ``time >= end`` and ``time >= end + lateness`` (the
    rules' definitions, with the sum rounded as the cleanup timers are),
    also next to the boundary, where rounding of the sum bites."""
    fired, late = horizon(time, lateness)
    assert fired == time
    for e in (end, math.nextafter(end, -math.inf), math.nextafter(end, math.inf),
              time - lateness, math.nextafter(time - lateness, math.inf),
              math.nextafter(time - lateness, -math.inf)):
        if not math.isfinite(e):
            continue
        assert (e <= fired) == (time >= e)
        assert (e <= late) == (time >= e + lateness), (time, lateness, e, late)


def test_window_rules_at_their_boundaries() -> None:
    w = TimeWindow(0.0, 0.3)
    # 0.1 + 0.2 rounds to 0.30000000000000004: the lateness sum, not the
    # difference, decides.
    assert not is_window_late(TimeWindow(0.0, 0.1), 0.3, 0.2)
    assert 0.1 + 0.2 > 0.3
    assert is_window_late(TimeWindow(0.0, 0.1), 0.1 + 0.2, 0.2)
    assert should_fire(w, 0.3) and fires_on_element(w, 0.3) and not should_fire(w, 0.29)
    assert not is_window_late(w, -math.inf, 0.0) and is_window_late(w, math.inf, 5.0)


def test_idleness_is_decided_on_the_time_it_is_scheduled_for() -> None:
    idle = ef.WatermarkStrategy.for_monotonous_timestamps(lambda r: r).with_idleness(0.3)
    assert idle.idle_at(0.1) == 0.1 + 0.3
    assert not idle.is_idle(0.1, math.nextafter(0.1 + 0.3, 0.0))
    assert idle.is_idle(0.1, idle.idle_at(0.1) or 0.0)  # the check scheduled then finds it idle
    assert ef.WatermarkStrategy.for_monotonous_timestamps(lambda r: r).idle_at(5.0) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-10**400, 10**400),  # beyond a float: fsum overflows
    st.none()), max_size=6), max_size=5))
def test_a_batch_of_timestamps_moves_the_watermark_as_one_at_a_time(
        batches: list[list[Any]]) -> None:
    """``on_events`` (the runtime's batch path) against ``on_event`` per
    record: the same watermark after each batch, the same error for a bad
    timestamp."""
    one, batched = (ef.WatermarkStrategy.bounded_out_of_orderness(2.0, lambda r: r)
                    .create_generator() for _ in range(2))
    for batch in batches:
        try:
            for t in batch:
                one.on_event(t)
            want: Any = one.current_watermark()
        except (TypeError, ValueError, OverflowError) as exc:
            want = type(exc)
        try:
            batched.on_events(batch)
            got: Any = batched.current_watermark()
        except (TypeError, ValueError, OverflowError) as exc:
            got = type(exc)
        assert got == want
        if isinstance(want, type):
            return  # a failed batch fails the job: nothing comes after it
