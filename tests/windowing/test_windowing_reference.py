"""The windowing primitives, run the way the window operator will run them,
equal the plain-Python reference (``reference.py``, which imports nothing
from eddyflow) on out-of-order streams.

``simulate`` below is that operator in miniature: a watermark generator per
stream, the assigner, session merging, an adapter's accumulators per
(key, window) in a dict (the keyed state), and a timer queue with one timer
per (key, window, time) that fires as the watermark passes it, all decided
by the lifecycle functions. Examples pin the subtle cases (re-firing,
sessions bridged by a late record, lateness boundaries); hypothesis checks
random streams with bounded disorder, gaps and late stragglers.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from operator import itemgetter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import Emitted, Event, processing_time_reference, reference

import eddyflow as ef
from eddyflow.windowing import (
    AggregateAdapter,
    CountAdapter,
    ProcessAdapter,
    ReduceAdapter,
    SumAdapter,
    TimeWindow,
    WindowAdapter,
    WindowAssigner,
    add_window,
    fires_on_element,
    on_timer,
    route_record,
    timers_to_register,
)


class Mean(ef.AggregateFunction):
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: Any, accumulator: tuple[int, int]) -> tuple[int, int]:
        return (accumulator[0] + value, accumulator[1] + 1)

    def get_result(self, accumulator: tuple[int, int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


class Elements(ef.ProcessWindowFunction):
    def process(self, key: Any, window: TimeWindow, elements: list[Any]) -> Any:
        yield ef.WindowResult(key, window.start, window.end, tuple(elements))


def _identity(record: Any) -> Any:
    return record


ADAPTERS: dict[str, Any] = {
    "sum": lambda: SumAdapter(_identity),
    "count": lambda: CountAdapter(),
    "max": lambda: ReduceAdapter(max),
    "mean": lambda: AggregateAdapter(Mean()),
    "elements": lambda: ProcessAdapter(Elements()),
}


def _assigner(kind: tuple[Any, ...]) -> WindowAssigner:
    if kind[0] == "tumbling":
        return ef.TumblingEventTimeWindows(size=kind[1], offset=kind[2])
    if kind[0] == "sliding":
        return ef.SlidingEventTimeWindows(size=kind[1], slide=kind[2], offset=kind[3])
    return ef.EventTimeSessionWindows(gap=kind[1])


def simulate(events: list[Event], *, max_delay: float, assigner: WindowAssigner,
             allowed_lateness: float, adapter: WindowAdapter
             ) -> tuple[list[Emitted], list[Event]]:
    """A window operator over one stream, built from eddyflow's primitives."""
    strategy = ef.WatermarkStrategy.bounded_out_of_orderness(max_delay, timestamp=itemgetter(1))
    generator = strategy.create_generator()
    lateness = allowed_lateness
    acc: dict[tuple[Any, TimeWindow], Any] = {}          # the keyed window state
    sessions: dict[Any, set[TimeWindow]] = defaultdict(set)
    timers: list[tuple[float, int, Any, TimeWindow]] = []  # (time, seq, key, window)
    registered: set[tuple[float, Any, TimeWindow]] = set()
    seq = 0
    emitted: list[Emitted] = []
    late: list[Event] = []
    watermark = -math.inf

    def register(key: Any, window: TimeWindow) -> None:
        nonlocal seq
        for time in timers_to_register(window, watermark, lateness):
            if (time, key, window) not in registered:   # one timer per (key, window, time)
                registered.add((time, key, window))
                heapq.heappush(timers, (time, seq, key, window))
                seq += 1

    def advance(new: float) -> None:
        nonlocal watermark
        if new <= watermark:
            return
        watermark = new
        while timers and timers[0][0] <= watermark:
            time, _, key, window = heapq.heappop(timers)
            registered.discard((time, key, window))
            if (key, window) not in acc:      # a merged-away session's timer
                continue
            action = on_timer(window, time, lateness)
            if action.fire:
                emitted.extend(adapter.result(key, window, acc[(key, window)]))
            if action.purge:
                del acc[(key, window)]
                sessions[key].discard(window)

    for event in events:
        key, t, value = event
        assigned = assigner.assign(t)
        if assigner.is_merging:
            merge = add_window(sessions[key], assigned[0])
            kept, is_late = route_record(t, [merge.window], watermark, lateness)
            if kept:
                merged: Any = None
                for i, member in enumerate(merge.members):
                    a = acc.pop((key, member))
                    merged = a if i == 0 else adapter.merge(merged, a)
                acc[(key, merge.window)] = (adapter.first(value) if not merge.members
                                            else adapter.add(merged, value))
                sessions[key] = set(merge.windows)
        else:
            kept, is_late = route_record(t, assigned, watermark, lateness)
            for w in kept:
                current = acc.get((key, w))
                acc[(key, w)] = (adapter.first(value) if current is None
                                 else adapter.add(current, value))
        for w in kept:
            if fires_on_element(w, watermark):
                emitted.extend(adapter.result(key, w, acc[(key, w)]))
            register(key, w)
        if is_late:
            late.append(event)
        generator.on_event(t)
        advance(generator.current_watermark())
    advance(math.inf)     # the end of a bounded input: the final watermark
    assert not acc, "every window is dropped by the final watermark"
    return [tuple(e) for e in emitted], late  # type: ignore[misc]


def _by_window(emitted: list[Emitted]) -> list[Emitted]:
    # Windows firing at one watermark may come in any order; one window's
    # firings keep theirs (a stable sort).
    return sorted(emitted, key=lambda e: (e[0], e[1], e[2]))


def check(events: list[Event], *, max_delay: float, kind: tuple[Any, ...],
          allowed_lateness: float, aggregate: str) -> tuple[list[Emitted], list[Event]]:
    expected, expected_late = reference(events, max_delay=max_delay, kind=kind,
                                        allowed_lateness=allowed_lateness, aggregate=aggregate)
    actual, actual_late = simulate(events, max_delay=max_delay, assigner=_assigner(kind),
                                   allowed_lateness=allowed_lateness,
                                   adapter=ADAPTERS[aggregate]())
    assert _by_window(actual) == _by_window(expected)
    assert actual_late == expected_late
    # Nothing is lost: every record reaches a window or the late output
    # (sliding windows with slide > size leave gaps, and none here do).
    if aggregate == "count" and kind[0] != "sliding":
        last = {}
        for k, s, e, v in actual:
            last[(k, s, e)] = v
        if kind[0] == "tumbling":
            assert sum(last.values()) + len(actual_late) == len(events)
    return actual, actual_late


# -- examples ---------------------------------------------------------------------


def test_tumbling_fires_on_watermark_and_refires_within_lateness() -> None:
    events = [("a", 1.0, 1), ("a", 4.0, 2), ("a", 12.0, 3),   # W = 10 after 12: [0,10) fires
              ("a", 5.0, 4),                                  # late, within lateness: re-fire
              ("a", 16.0, 5),                                 # W = 14: [0,10) dropped (10+4)
              ("a", 9.0, 6)]                                  # too late: side output
    emitted, late = check(events, max_delay=2.0, kind=("tumbling", 10.0, 0.0),
                          allowed_lateness=4.0, aggregate="sum")
    assert emitted == [("a", 0.0, 10.0, 3), ("a", 0.0, 10.0, 7), ("a", 10.0, 20.0, 8)]
    assert late == [("a", 9.0, 6)]


def test_record_at_watermark_is_on_time() -> None:
    # W = 10 - 0 = 10 after the second record; t = 10 is on time (t < W is
    # late) and [0, 10) has fired: a record at 9.5 is too late with L = 0.
    events = [("a", 3.0, 1), ("a", 10.0, 1), ("a", 10.0, 1), ("a", 9.5, 1)]
    emitted, late = check(events, max_delay=0.0, kind=("tumbling", 10.0, 0.0),
                          allowed_lateness=0.0, aggregate="count")
    assert emitted == [("a", 0.0, 10.0, 1), ("a", 10.0, 20.0, 2)]
    assert late == [("a", 9.5, 1)]


def test_lateness_boundary_is_end_plus_lateness() -> None:
    # [0, 10) with L = 5 is dropped when W >= 15: at W = 14.9 a record still
    # re-fires it, at W = 15 it is late.
    fire = [("a", 1.0, 1), ("a", 14.9, 1), ("a", 2.0, 1)]
    emitted, late = check(fire, max_delay=0.0, kind=("tumbling", 10.0, 0.0),
                          allowed_lateness=5.0, aggregate="count")
    assert ("a", 0.0, 10.0, 2) in emitted and late == []
    drop = [("a", 1.0, 1), ("a", 15.0, 1), ("a", 2.0, 1)]
    emitted, late = check(drop, max_delay=0.0, kind=("tumbling", 10.0, 0.0),
                          allowed_lateness=5.0, aggregate="count")
    assert late == [("a", 2.0, 1)]


def test_sliding_record_in_some_live_windows_is_not_late() -> None:
    # t = 8 belongs to [0,10) and [5,15); at W = 12 with L = 0 only [5,15)
    # takes it, so it is not late.
    events = [("a", 1.0, 1), ("a", 12.0, 1), ("a", 8.0, 1)]
    emitted, late = check(events, max_delay=0.0, kind=("sliding", 10.0, 5.0, 0.0),
                          allowed_lateness=0.0, aggregate="elements")
    assert late == []
    assert ("a", 5.0, 15.0, (1, 1)) in emitted


def test_session_bridged_by_out_of_order_record() -> None:
    events = [("u", 0.0, "a"), ("u", 10.0, "c"), ("u", 5.0, "b"), ("u", 30.0, "d")]
    emitted, late = check(events, max_delay=20.0, kind=("session", 5.0),
                          allowed_lateness=0.0, aggregate="elements")
    # [0,5) and [10,15) are bridged by [5,10) (touching windows merge);
    # elements: the merged sessions' by start, then the bridging record
    assert emitted == [("u", 0.0, 15.0, ("a", "c", "b")), ("u", 30.0, 35.0, ("d",))]
    assert late == []


def test_session_extended_after_firing_fires_again_at_new_end() -> None:
    events = [("u", 0.0, 1), ("u", 20.0, 1),    # W = 20: [0,5) fired
              ("u", 4.0, 1),                    # within lateness: [0,9), end 9 <= 20: fires now
              ("u", 40.0, 1)]
    emitted, late = check(events, max_delay=0.0, kind=("session", 5.0),
                          allowed_lateness=30.0, aggregate="count")
    assert emitted[:2] == [("u", 0.0, 5.0, 1), ("u", 0.0, 9.0, 2)]
    assert late == []


def test_session_late_record_merging_into_live_session_is_not_late() -> None:
    # [2,7) lives until W >= 7; a record at 0 opens [0,5), late on its own
    # (5 <= W = 6) but it touches [2,7), so it joins it.
    events = [("u", 2.0, 1), ("u", 6.0, 1), ("u", 0.0, 1)]
    emitted, late = check(events, max_delay=0.0, kind=("session", 5.0),
                          allowed_lateness=0.0, aggregate="count")
    assert emitted == [("u", 0.0, 11.0, 3)] and late == []


# -- properties ---------------------------------------------------------------------


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Event], float]:
    """Events with integer-valued float timestamps (exact arithmetic in both
    the reference and eddyflow), disorder bounded by ``max_disorder`` except
    for a few stragglers far behind, gaps, and several keys."""
    n = draw(st.integers(0, 60))
    max_disorder = draw(st.integers(0, 8))
    t = draw(st.integers(-20, 20))
    events: list[Event] = []
    for _ in range(n):
        t += draw(st.sampled_from([0, 0, 1, 1, 2, 3, 15]))     # 15: a gap
        if draw(st.integers(0, 19)) == 0:
            ts = t - draw(st.integers(0, 40))                  # a straggler, maybe too late
        else:
            ts = t - draw(st.integers(0, max_disorder))
        events.append((draw(st.sampled_from("abc")), float(ts), draw(st.integers(-5, 9))))
    max_delay = float(draw(st.integers(0, 10)))
    return events, max_delay


kinds = st.one_of(
    st.tuples(st.just("tumbling"), st.integers(1, 12).map(float), st.integers(0, 0).map(float)),
    st.integers(1, 12).flatmap(lambda size: st.tuples(
        st.just("tumbling"), st.just(float(size)), st.integers(-size + 1, size - 1).map(float))),
    st.integers(1, 12).flatmap(lambda slide: st.tuples(
        st.just("sliding"), st.integers(slide, 4 * slide).map(float), st.just(float(slide)),
        st.integers(-slide + 1, slide - 1).map(float))),
    st.tuples(st.just("session"), st.integers(1, 10).map(float)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), kind=kinds, lateness=st.integers(0, 12).map(float),
       aggregate=st.sampled_from(sorted(ADAPTERS)))
def test_windows_equal_the_reference(stream: tuple[list[Event], float], kind: tuple[Any, ...],
                                     lateness: float, aggregate: str) -> None:
    events, max_delay = stream
    check(events, max_delay=max_delay, kind=kind, allowed_lateness=lateness, aggregate=aggregate)


@settings(max_examples=100, deadline=None)
@given(stream=streams(), kind=kinds, lateness=st.integers(0, 12).map(float))
def test_nothing_but_late_records_is_dropped(stream: tuple[list[Event], float],
                                             kind: tuple[Any, ...], lateness: float) -> None:
    """Every record is in some emitted window's final count or in the late
    output, exactly once (``elements`` of the last firing of each window;
    sliding windows with slide <= size cover every timestamp)."""
    events, max_delay = stream
    tagged = [(k, t, i) for i, (k, t, _) in enumerate(events)]
    emitted, late = simulate(tagged, max_delay=max_delay, assigner=_assigner(kind),
                             allowed_lateness=lateness, adapter=ProcessAdapter(Elements()))
    final: dict[tuple[Any, float, float], tuple[int, ...]] = {}
    for k, s, e, elements in emitted:
        final[(k, s, e)] = elements
    seen = {i for elements in final.values() for i in elements}
    late_ids = {i for _, _, i in late}
    assert seen.isdisjoint(late_ids)
    assert seen | late_ids == set(range(len(events)))


@settings(max_examples=100, deadline=None)
@given(arrivals=st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 4),
                                   st.integers(0, 9)), max_size=40),
       size=st.integers(1, 10).map(float), aggregate=st.sampled_from(sorted(ADAPTERS)))
def test_processing_time_windows_equal_the_reference(
        arrivals: list[tuple[str, int, int]], size: float, aggregate: str) -> None:
    """Tumbling processing-time windows under a manual clock: the clock
    plays the watermark (``assign`` gets "now"; no lateness)."""
    clock, events = 0.0, []
    for key, step, value in arrivals:
        clock += step
        events.append((key, clock, value))
    assigner = ef.TumblingProcessingTimeWindows(size)
    assert not assigner.is_event_time
    adapter = ADAPTERS[aggregate]()
    acc: dict[tuple[Any, TimeWindow], Any] = {}
    emitted: list[Any] = []

    def advance(now: float) -> None:
        for (key, window) in sorted(acc, key=lambda kw: kw[1].end):
            action = on_timer(window, window.end, 0.0, event_time=False)
            if window.end <= now:
                assert action == (True, True)
                emitted.extend(adapter.result(key, window, acc.pop((key, window))))

    for key, now, value in events:
        advance(now)
        [window] = assigner.assign(now)
        kept, is_late = route_record(now, [window], now, 0.0)
        assert kept == [window] and not is_late
        current = acc.get((key, window))
        acc[(key, window)] = adapter.first(value) if current is None else adapter.add(current,
                                                                                      value)
        assert not fires_on_element(window, now)
    advance(math.inf)
    expected = processing_time_reference(events, size=size, aggregate=aggregate)
    assert _by_window([tuple(e) for e in emitted]) == _by_window(expected)


@pytest.mark.parametrize("aggregate", sorted(ADAPTERS))
def test_accumulators_pickle(aggregate: str) -> None:
    """What the operator stores per window goes through pickle (RocksDB,
    snapshots) and comes back equal: no callables inside."""
    import pickle
    adapter = ADAPTERS[aggregate]()
    acc = adapter.first(3)
    acc = adapter.add(acc, 4)
    acc = adapter.merge(acc, adapter.first(5))
    again = pickle.loads(pickle.dumps(acc))
    assert again == acc
    w = TimeWindow(0.0, 10.0)
    assert adapter.result("k", w, again) == adapter.result("k", w, acc)
