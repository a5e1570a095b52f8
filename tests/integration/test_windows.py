"""The window operator against the plain-Python reference
(``tests/windowing/reference.py``, which imports nothing from eddyflow):
every window kind and window function, out-of-order input with bounded
lateness, late records beyond ``allowed_lateness`` on the side output and
nothing else dropped, at parallelism 1-3 on both state backends.

How the runs match the reference exactly: the source and its watermark
generator run at parallelism 1 with batches of one record and a watermark
after every batch, so each record is handled under the watermark from
before it, as the reference says. The window operator's subtasks, at any
parallelism, see their keys' records and the watermarks in that same order
(one upstream subtask, FIFO channels), so each key's windows fire and take
late records exactly as in the reference.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_support import StateBackendFactory
from reference import Emitted, Event, processing_time_reference, reference

import eddyflow as ef

KINDS = [
    ("tumbling", 4.0, 0.0),
    ("tumbling", 3.0, 1.0),
    ("sliding", 6.0, 2.0, 0.0),
    ("sliding", 2.0, 3.0, 0.0),  # slide > size: gaps between windows
    ("session", 2.5),
]
AGGREGATES = ["sum", "count", "max", "mean", "elements"]


def _ts(r: Event) -> float:
    return r[1]


class Max(ef.AggregateFunction):
    def create_accumulator(self) -> Any:
        return None

    def add(self, value: Event, acc: Any) -> Any:
        return value[2] if acc is None else max(acc, value[2])

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return max(a, b)


class Mean(ef.AggregateFunction):
    """A mutable accumulator changed in place, as Flink users write them."""

    def create_accumulator(self) -> Any:
        return [0, 0]

    def add(self, value: Event, acc: Any) -> Any:
        acc[0] += value[2]
        acc[1] += 1
        return acc

    def get_result(self, acc: Any) -> Any:
        return acc[0] / acc[1]

    def merge(self, a: Any, b: Any) -> Any:
        return [a[0] + b[0], a[1] + b[1]]


class Elements(ef.ProcessWindowFunction):
    def process(self, key: Any, window: ef.TimeWindow, elements: list[Any]) -> Any:
        yield (key, window.start, window.end, tuple(e[2] for e in elements))


def assigner(kind: tuple[Any, ...]) -> Any:
    if kind[0] == "tumbling":
        return ef.TumblingEventTimeWindows(size=kind[1], offset=kind[2])
    if kind[0] == "sliding":
        return ef.SlidingEventTimeWindows(size=kind[1], slide=kind[2], offset=kind[3])
    return ef.EventTimeSessionWindows(gap=kind[1])


def apply(windowed: Any, aggregate: str) -> Any:
    if aggregate == "sum":
        return windowed.sum(lambda r: r[2])
    if aggregate == "count":
        return windowed.count()
    if aggregate == "max":
        return windowed.aggregate(Max())
    if aggregate == "mean":
        return windowed.aggregate(Mean())
    return windowed.process(Elements())


def as_emitted(r: Any) -> Emitted:
    return tuple(r)  # type: ignore[return-value]  # WindowResult and Elements' tuples


def events(seed: int, n: int = 300, keys: int = 5, disorder: float = 6.0) -> list[Event]:
    """Out of order by up to ``disorder`` seconds, some stragglers far
    behind, gaps (a session closes), timestamps on a 0.5 s grid (exact floats)."""
    rnd = random.Random(seed)
    out: list[Event] = []
    t = 0.0
    for _ in range(n):
        t += rnd.choice([0.0, 0.5, 0.5, 1.0, 1.5]) + (8.0 if rnd.random() < 0.03 else 0.0)
        late_by = rnd.choice([0.0] * 6 + [0.5, 1.0, 2.0, disorder])
        if rnd.random() < 0.03:
            late_by = 3 * disorder  # a straggler: late even within the lateness
        out.append((f"k{rnd.randrange(keys)}", max(0.0, t - late_by), rnd.randrange(1, 10)))
    return out


def run_windows(data: list[Event], kind: tuple[Any, ...], aggregate: str, *, max_delay: float,
                lateness: float, parallelism: int, backend: StateBackendFactory | None = None,
                folder: Path | None = None) -> tuple[list[Any], list[Any]]:
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=1)
    env.set_auto_watermark_interval(0)
    if backend is not None:
        assert folder is not None
        backend.use(env, folder)
    late_tag = ef.OutputTag("late")
    strategy = ef.WatermarkStrategy.bounded_out_of_orderness(max_delay, _ts)
    stream = (env.from_collection(data).set_parallelism(1)
              .assign_timestamps_and_watermarks(strategy).set_parallelism(1))
    windowed = (stream.key_by(lambda r: r[0]).window(assigner(kind))
                .allowed_lateness(lateness).side_output_late_data(late_tag))
    results = apply(windowed, aggregate).name("windows")
    out, late = ef.ListSink(), ef.ListSink()
    results.sink_to(out).name("out")
    results.get_side_output(late_tag).sink_to(late).name("late")
    env.execute("windows")
    return [as_emitted(r) for r in out.results], list(late.results)


def check(data: list[Event], kind: tuple[Any, ...], aggregate: str, *, max_delay: float,
          lateness: float, got: list[Any], late: list[Any]) -> None:
    want, want_late = reference(data, max_delay=max_delay, kind=kind,
                                allowed_lateness=lateness, aggregate=aggregate)
    assert Counter(got) == Counter(want), (
        f"missing {sorted((Counter(want) - Counter(got)).elements())[:5]}, "
        f"extra {sorted((Counter(got) - Counter(want)).elements())[:5]}")
    assert Counter(late) == Counter(want_late)
    if aggregate == "count" and kind[0] == "tumbling":
        # Nothing is dropped silently: each record is counted in its window's
        # last firing, or is late. (A sliding window counts a record several
        # times, or never in a gap; a session that fired may merge later.)
        final: dict[tuple[Any, float, float], int] = {}
        for k, s, e, v in got:
            final[(k, s, e)] = max(final.get((k, s, e), 0), v)
        assert sum(final.values()) + len(late) == len(data)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: "-".join(map(str, k)))
@pytest.mark.parametrize("aggregate", AGGREGATES)
def test_window_results_equal_the_reference(kind: tuple[Any, ...], aggregate: str) -> None:
    data = events(seed=hash((kind, aggregate)) % 1000)
    got, late = run_windows(data, kind, aggregate, max_delay=2.0, lateness=3.0, parallelism=2)
    check(data, kind, aggregate, max_delay=2.0, lateness=3.0, got=got, late=late)
    assert late, "the input has records beyond the allowed lateness"


@pytest.mark.parametrize("parallelism", [1, 2, 3])
@pytest.mark.parametrize("kind", [KINDS[0], KINDS[2], KINDS[4]],
                         ids=lambda k: "-".join(map(str, k)))
def test_each_parallelism_and_backend_gives_the_reference(
        parallelism: int, kind: tuple[Any, ...], tmp_path: Path,
        state_backend: StateBackendFactory) -> None:
    data = events(seed=parallelism * 7, n=250)
    got, late = run_windows(data, kind, "mean", max_delay=1.0, lateness=2.0,
                            parallelism=parallelism, backend=state_backend,
                            folder=tmp_path / "db")
    check(data, kind, "mean", max_delay=1.0, lateness=2.0, got=got, late=late)


def test_without_lateness_a_window_fires_once_and_late_records_are_dropped() -> None:
    data = [("a", 1.0, 1), ("a", 2.0, 1), ("a", 9.0, 1), ("a", 3.0, 1), ("a", 12.0, 1)]
    env = ef.StreamEnvironment(parallelism=1, batch_size=1)
    env.set_auto_watermark_interval(0)
    out = ef.ListSink()
    (env.from_collection(data)
        .assign_timestamps_and_watermarks(ef.WatermarkStrategy.for_monotonous_timestamps(_ts))
        .key_by(lambda r: r[0]).window(ef.TumblingEventTimeWindows(5.0)).count()
        .sink_to(out))
    env.execute("no lateness")
    # (a, 3.0) comes when the watermark is 9: its window [0, 5) fired and is gone.
    assert out.results == [ef.WindowResult("a", 0.0, 5.0, 2), ef.WindowResult("a", 5.0, 10.0, 1),
                           ef.WindowResult("a", 10.0, 15.0, 1)]


def test_a_late_record_within_the_lateness_fires_the_window_again() -> None:
    data = [("a", 1.0, 1), ("a", 7.0, 1), ("a", 2.0, 1), ("a", 30.0, 1), ("a", 3.0, 1)]
    env = ef.StreamEnvironment(parallelism=1, batch_size=1)
    env.set_auto_watermark_interval(0)
    out, late = ef.ListSink(), ef.ListSink()
    tag = ef.OutputTag("late")
    w = (env.from_collection(data)
         .assign_timestamps_and_watermarks(ef.WatermarkStrategy.for_monotonous_timestamps(_ts))
         .key_by(lambda r: r[0]).window(ef.TumblingEventTimeWindows(5.0))
         .allowed_lateness(5.0).side_output_late_data(tag).sum(lambda r: r[2]))
    w.sink_to(out).name("out")
    w.get_side_output(tag).sink_to(late).name("late")
    env.execute("refire")
    assert out.results == [
        ef.WindowResult("a", 0.0, 5.0, 1),   # watermark 7 fires [0, 5)
        ef.WindowResult("a", 0.0, 5.0, 2),   # (a, 2.0) within the lateness: fires again
        ef.WindowResult("a", 5.0, 10.0, 1),  # watermark 30
        ef.WindowResult("a", 30.0, 35.0, 1),  # end of input
    ]
    assert late.results == [("a", 3.0, 1)]   # [0, 5) was dropped at watermark 10


def test_session_windows_merge_when_a_late_record_bridges_them() -> None:
    data = [("u", 0.0, 1), ("u", 4.0, 1), ("u", 2.0, 1), ("u", 20.0, 1)]
    env = ef.StreamEnvironment(parallelism=1, batch_size=1)
    env.set_auto_watermark_interval(0)
    out = ef.ListSink()
    (env.from_collection(data)
        .assign_timestamps_and_watermarks(ef.WatermarkStrategy.bounded_out_of_orderness(3.0, _ts))
        .key_by(lambda r: r[0]).window(ef.EventTimeSessionWindows(gap=2.0)).count()
        .sink_to(out))
    env.execute("sessions")
    # [0, 2) and [4, 6) are bridged by 2.0 ([2, 4) touches both).
    assert out.results == [ef.WindowResult("u", 0.0, 6.0, 3), ef.WindowResult("u", 20.0, 22.0, 1)]


def test_window_results_carry_the_last_timestamp_of_their_window() -> None:
    """A result is inside its window, so a downstream window of the same
    size counts it in the same window (as Flink's ``maxTimestamp``)."""
    data = [("a", float(t), 1) for t in range(20)]
    env = ef.StreamEnvironment(parallelism=1, batch_size=4)
    out = ef.ListSink()
    (env.from_collection(data)
        .assign_timestamps_and_watermarks(ef.WatermarkStrategy.for_monotonous_timestamps(_ts))
        .key_by(lambda r: r[0]).window(ef.TumblingEventTimeWindows(5.0)).count()
        .key_by(lambda r: r.key).window(ef.TumblingEventTimeWindows(10.0))
        .sum(lambda r: r.value)
        .sink_to(out))
    env.execute("two levels")
    assert out.results == [ef.WindowResult("a", 0.0, 10.0, 10),
                           ef.WindowResult("a", 10.0, 20.0, 10)]


def test_processing_time_windows_under_a_manual_clock() -> None:
    clock = ef.testing.ManualClock(0.0)
    rnd = random.Random(5)
    arrivals: list[Event] = []
    now = 0.0
    for _ in range(200):
        now += rnd.choice([0.0, 0.3, 0.7, 1.1, 4.0])
        arrivals.append((f"k{rnd.randrange(3)}", now, rnd.randrange(5)))

    def arrive(r: Event) -> Event:
        if r[1] > clock.now():
            clock.advance(r[1] - clock.now())
        return r

    env = ef.StreamEnvironment(parallelism=1, batch_size=1)
    env.set_clock(clock)
    out = ef.ListSink()
    (env.from_collection(arrivals).map(arrive)
        .key_by(lambda r: r[0]).window(ef.TumblingProcessingTimeWindows(size=2.0))
        .sum(lambda r: r[2]).sink_to(out))
    env.execute("processing time")
    want = processing_time_reference(arrivals, size=2.0, aggregate="sum")
    assert Counter(map(tuple, out.results)) == Counter(want)


def test_event_time_windows_need_timestamps() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    (env.from_collection([("a", 1.0, 1)]).key_by(lambda r: r[0])
        .window(ef.TumblingEventTimeWindows(5.0)).count().name("counts").print())
    with pytest.raises(ef.JobFailed, match=r"counts.*assign_timestamps_and_watermarks"):
        env.execute("no timestamps")


def test_declaration_errors_are_clear() -> None:
    env = ef.StreamEnvironment()
    keyed = env.from_collection([1]).key_by(lambda r: r)
    with pytest.raises(TypeError, match="window assigner"):
        keyed.window(5.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="processing-time"):
        keyed.window(ef.TumblingProcessingTimeWindows(5.0)).allowed_lateness(1.0)
    with pytest.raises(TypeError, match="merge"):
        class NoMerge(ef.AggregateFunction):
            def create_accumulator(self) -> Any:
                return 0

            def add(self, value: Any, acc: Any) -> Any:
                return acc + 1

            def get_result(self, acc: Any) -> Any:
                return acc
        keyed.window(ef.EventTimeSessionWindows(1.0)).aggregate(NoMerge())
    counts = keyed.window(ef.TumblingEventTimeWindows(1.0)).count()
    with pytest.raises(ValueError, match="no side output 'late'"):
        counts.get_side_output(ef.OutputTag("late"))


def test_records_fired_by_the_watermark_count_as_the_operators_output() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    out = ef.ListSink()
    (env.from_collection([("a", float(t), 1) for t in range(10)])
        .assign_timestamps_and_watermarks(ef.WatermarkStrategy.for_monotonous_timestamps(_ts))
        .key_by(lambda r: r[0]).window(ef.TumblingEventTimeWindows(5.0)).count()
        .name("windows").sink_to(out).name("out"))
    result = env.execute("counted")
    assert len(out.results) == 2
    assert result.records_out["windows"] == 2 == result.records_in["out"]
