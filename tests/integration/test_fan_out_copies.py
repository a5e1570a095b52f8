"""Records that go to several consumers are not shared between them.

A stream read by two operators (a split by filters, the exit and the
feedback of a loop) or broadcast to several subtasks hands each consumer
records of its own, as Flink does with object reuse off: a change one
consumer's user code makes in place must not show in another's records.
Before, the same dicts went to every consumer, so what a consumer saw
depended on which task ran first: the loop of ``test_snapshot_isolation``
(``again`` and ``out`` both read the body, whose next round decrements the
record in place) emitted some ids twice, even in a run without failures.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import eddyflow as ef


def bump(r: dict[str, Any]) -> dict[str, Any]:
    r["v"] += 1
    return r


def test_two_consumers_of_a_stream_get_records_of_their_own() -> None:
    env = ef.StreamEnvironment(parallelism=1, batch_size=16)
    plain, bumped = ef.ListSink(), ef.ListSink()
    ds = env.from_collection([{"id": i, "v": 0} for i in range(200)]).map(lambda r: r)
    ds.map(bump).sink_to(bumped).name("bumped")
    ds.sink_to(plain).name("plain")  # with shared records, it would show every bump
    env.execute("split")
    assert sorted(r["id"] for r in plain.results) == list(range(200))
    assert {r["v"] for r in plain.results} == {0}
    assert {r["v"] for r in bumped.results} == {1}


def test_broadcast_gives_each_subtask_records_of_its_own() -> None:
    env = ef.StreamEnvironment(parallelism=3, batch_size=16)
    sink = ef.ListSink()
    (env.from_collection([{"id": i, "v": 0} for i in range(100)]).set_parallelism(1)
        .broadcast().map(bump).sink_to(sink))
    env.execute("broadcast")
    assert Counter(r["id"] for r in sink.results) == {i: 3 for i in range(100)}
    assert {r["v"] for r in sink.results} == {1}  # shared: bumped up to 3 times


def steps_down(r: dict[str, int]) -> dict[str, int]:
    r["steps"] -= 1
    return r


def lagging(r: Any) -> Any:
    time.sleep(0.0002)  # the exit lags behind the loop: records wait in its input
    return r


def test_a_loop_whose_body_mutates_records_finishes_each_once() -> None:
    """The loop exit and the feedback both read the body: with shared
    records, a record waiting on its way to the exit filter was decremented
    by its next round, passed the filter, and finished a second time."""
    n = 300
    for parallelism in (1, 2):
        env = ef.StreamEnvironment(parallelism=parallelism, batch_size=8)
        sink = ef.ListSink()
        src = env.from_collection([(i, 1 + i % 7) for i in range(n)]).map(
            lambda t: {"id": t[0], "steps": t[1]})
        loop = src.iterate()
        body = loop.map(steps_down).key_by(lambda r: r["id"]).map(lambda r: r)
        loop.close_with(body.filter(lambda r: r["steps"] > 0).key_by(lambda r: r["id"]))
        body.map(lagging).filter(lambda r: r["steps"] == 0).map(lambda r: r["id"]).sink_to(sink)
        env.execute("loop")
        assert Counter(sink.results) == {i: 1 for i in range(n)}


def test_immutable_records_are_not_copied() -> None:
    env = ef.StreamEnvironment(parallelism=1, batch_size=16)
    a, b = ef.ListSink(), ef.ListSink()
    records = [("k", i) for i in range(50)]
    ds = env.from_collection(records).map(lambda r: r)
    ds.sink_to(a).name("a")
    ds.sink_to(b).name("b")
    env.execute("tuples")
    # Both got the very tuples (no copy was needed).
    assert all(x is y for x, y in zip(a.results, b.results, strict=True))
