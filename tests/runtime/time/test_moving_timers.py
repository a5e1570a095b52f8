"""``MovingTimers`` (the memory backend's timers for session windows) against
``TimerService``: over random registrations, deletions, moves and
watermarks, both hold the same rows and fire the same timers, in time order,
each once; and after a snapshot's rows are restored into a new instance it
goes on as the old one would have."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from eddyflow.runtime.time.moving_timers import MovingTimers
from eddyflow.runtime.time.timers import EVENT_TIME, TIMERS_STATE, TimerService
from eddyflow.state.memory import MemoryKeyedStateBackend

KEYS = ["a", "b"]
TIMES = st.integers(0, 5).map(float)  # few: moves and deletes hit registered timers

Op = tuple[Any, ...]

ops = st.lists(st.one_of(
    st.tuples(st.just("register"), st.sampled_from(KEYS), TIMES),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), TIMES),
    st.tuples(st.just("move"), st.sampled_from(KEYS), TIMES, TIMES),
    st.tuples(st.just("advance"), TIMES),
    st.tuples(st.just("restore"),),
), max_size=80)


def _backend() -> MemoryKeyedStateBackend:
    return MemoryKeyedStateBackend("op", range(0, 128), 128, checkpointing=True)


def _rows(backend: MemoryKeyedStateBackend) -> dict[Any, set[tuple[str, float]]]:
    table = backend.tables().get(TIMERS_STATE, {})
    return {k: set(v) for k, v in table.items() if v}


def _apply(timers: Any, backend: MemoryKeyedStateBackend, op: Op, fired: list[Any],
           watermark: list[float]) -> None:
    kind = op[0]
    if kind == "register":
        backend.current_key = op[1]
        timers.register_event_time_timer(op[2])
    elif kind == "delete":
        backend.current_key = op[1]
        timers.delete_event_time_timer(op[2])
    elif kind == "move":
        backend.current_key = op[1]
        old, new = op[2], op[3]
        if old != new:
            timers.delete_event_time_timer(old)
            timers.register_event_time_timer(new)
    elif kind == "advance":
        until = max(watermark[0], op[1])
        watermark[0] = until
        fired.append(list(timers.pop_due(EVENT_TIME, until)))


def _restored(backend: MemoryKeyedStateBackend, moving: bool) -> tuple[Any, Any]:
    """A new backend holding a copy of ``backend``'s timer rows, and its timers."""
    fresh = _backend()
    rows = copy.deepcopy(backend.tables().get(TIMERS_STATE, {}))
    timers: Any
    if moving:
        timers = MovingTimers(fresh, EVENT_TIME)
    else:
        timers = TimerService(fresh, lambda: 0.0, lambda: 0.0)
        timers.register_event_time_timer(0.0)  # declares the rows' state
        timers.delete_event_time_timer(0.0)
    fresh.tables()[TIMERS_STATE].update(rows)
    timers.rebuild()
    return fresh, timers


@settings(max_examples=500, deadline=None)
@given(ops)
def test_moving_timers_fire_and_store_what_the_timer_service_does(script: list[Op]) -> None:
    exact_backend, moving_backend = _backend(), _backend()
    exact: Any = TimerService(exact_backend, lambda: 0.0, lambda: 0.0)
    moving: Any = MovingTimers(moving_backend, EVENT_TIME)
    exact_fired: list[Any] = []
    moving_fired: list[Any] = []
    exact_wm, moving_wm = [float("-inf")], [float("-inf")]
    for op in script:
        if op[0] == "restore":
            exact_backend, exact = _restored(exact_backend, False)
            moving_backend, moving = _restored(moving_backend, True)
            continue
        _apply(exact, exact_backend, op, exact_fired, exact_wm)
        if op[0] == "move" and op[2] != op[3]:
            moving_backend.current_key = op[1]
            moving.move(EVENT_TIME, op[2], op[3], op[1])
        else:
            _apply(moving, moving_backend, op, moving_fired, moving_wm)
        assert _rows(moving_backend) == _rows(exact_backend)
    for got, want in zip(moving_fired, exact_fired, strict=True):
        # The same timers, in time order; keys of one time in any order.
        assert Counter(got) == Counter(want)
        assert [t for t, _ in got] == sorted(t for t, _ in got)


def test_a_growing_session_moves_its_timer_without_firing_early() -> None:
    backend = _backend()
    timers = MovingTimers(backend, EVENT_TIME)
    backend.current_key = "a"
    timers.register_event_time_timer(10.0)
    for old, new in ((10.0, 12.0), (12.0, 15.0), (15.0, 19.0)):  # the session grows
        timers.move(EVENT_TIME, old, new, "a")
    backend.current_key = "b"
    timers.register_event_time_timer(14.0)
    assert list(timers.pop_due(EVENT_TIME, 13.0)) == []
    assert list(timers.pop_due(EVENT_TIME, 18.0)) == [(14.0, "b")]
    assert list(timers.pop_due(EVENT_TIME, 30.0)) == [(19.0, "a")]
    assert _rows(backend) == {}


def test_next_time_is_never_after_the_earliest_timer() -> None:
    backend = _backend()
    timers = MovingTimers(backend, EVENT_TIME)
    backend.current_key = "a"
    timers.register_event_time_timer(5.0)
    timers.move(EVENT_TIME, 5.0, 9.0, "a")
    nxt = timers.next_time(EVENT_TIME)
    assert nxt is not None and nxt <= 9.0
    assert list(timers.pop_due(EVENT_TIME, 8.0)) == []
    assert timers.next_time(EVENT_TIME) == 9.0
