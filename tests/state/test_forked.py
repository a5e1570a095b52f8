"""Snapshot work in a forked child (``eddyflow.state.forked``): its answer,
its errors, the image it sees, and what it does to the parent's collector."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest

from eddyflow.errors import StateSerializationError
from eddyflow.state import forked

pytestmark = pytest.mark.skipif(not forked.ENABLED, reason="no fork() here")


@pytest.fixture
def collector() -> Iterator[None]:
    """Leave the collector as the test found it (enabled, nothing frozen)."""
    was_enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


def run(work: forked.ChildWork) -> Any:
    return asyncio.run(work.result())


def test_the_child_answers_with_the_image_taken_at_the_fork() -> None:
    state = {"a": [1, 2]}
    work = forked.start(lambda: (os.getpid(), list(state["a"])))
    state["a"].append(3)  # after the fork: the child does not see it
    pid, seen = run(work)
    assert pid != os.getpid()
    assert seen == [1, 2]


def test_an_error_in_the_child_reaches_the_parent() -> None:
    def fail() -> None:
        raise ValueError("no such key")

    with pytest.raises(OSError, match="ValueError: no such key"):
        run(forked.start(fail))


def test_eddyflows_own_errors_arrive_as_themselves() -> None:
    def fail() -> None:
        raise StateSerializationError("op 'sum', state 'sum', key 'k': cannot pickle")

    with pytest.raises(StateSerializationError, match="key 'k'"):
        run(forked.start(fail))


def test_a_cancelled_child_is_killed_and_reaped() -> None:
    work = forked.start(lambda: __import__("time").sleep(30))
    pid = work._pid
    assert pid is not None
    work.cancel()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, and no zombie left


def test_cancelling_ends_a_wait_for_the_answer_with_an_error() -> None:
    async def main() -> None:
        work = forked.start(lambda: __import__("time").sleep(30))
        waiting = asyncio.create_task(work.result())
        await asyncio.sleep(0.05)
        work.cancel()
        with pytest.raises(OSError, match="died without an answer"):
            await waiting

    asyncio.run(main())


def test_while_a_child_lives_the_collector_leaves_old_objects_alone(collector: None) -> None:
    gc.enable()
    work = forked.start(lambda: None)
    assert gc.get_freeze_count() > 0  # frozen for the child's sake
    run(work)
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()


def _is_frozen(obj: object) -> bool:
    """``obj`` is in the collector's permanent generation: tracked, yet in
    none of the generations the collector visits (``gc.get_objects`` lists
    those, not the permanent one)."""
    return gc.is_tracked(obj) and not any(o is obj for o in gc.get_objects())


def test_a_programs_own_frozen_objects_stay_frozen(collector: None) -> None:
    """What the program froze is still frozen once the children are gone.
    (Checked on an object of the test's own, which it keeps alive: the
    freeze count may drop as other frozen objects are freed meanwhile.)"""
    gc.enable()
    mine = [object()]  # a container: tracked by the collector
    gc.freeze()  # as a pre-forking server does
    assert _is_frozen(mine)
    works = [forked.start(lambda: None) for _ in range(2)]
    assert not gc.isenabled()  # paused instead: unfreezing would release theirs
    for work in works:
        run(work)
    assert _is_frozen(mine)
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled(collector: None) -> None:
    gc.disable()
    run(forked.start(lambda: None))
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0
