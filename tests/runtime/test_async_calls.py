"""The ``map_async`` operator on its own (runtime/operators/async_calls.py):
calls completed by hand, in a chosen order, to pin down what it emits and
when — order, segments between watermarks, capacity, and what a snapshot
holds and a restore calls again."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from eddyflow.runtime.operators.async_calls import AsyncCallFailed, AsyncCallOperator
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.state.memory import MemoryStateBackend


class Service:
    """A coroutine function whose calls complete when the test says (a
    dict record by its ``id``)."""

    def __init__(self) -> None:
        self.pending: dict[Any, asyncio.Future[Any]] = {}
        self.calls: list[Any] = []

    async def __call__(self, x: Any) -> Any:
        self.calls.append(x)
        fut = asyncio.get_running_loop().create_future()
        self.pending[x["id"] if isinstance(x, dict) else x] = fut
        return await fut

    def complete(self, x: Any, value: Any = None) -> None:
        self.pending.pop(x).set_result(("r", x) if value is None else value)

    def fail(self, x: Any, exc: BaseException) -> None:
        self.pending.pop(x).set_exception(exc)


def make(service: Service, *, capacity: int = 10, ordered: bool = True,
         timeout: float = 10.0, checkpointing: bool = True) -> AsyncCallOperator:
    ctx = OperatorContext("enrich", 0, 1, 128, MemoryStateBackend(), checkpointing=checkpointing)
    op = AsyncCallOperator(ctx, service, capacity, timeout, ordered)
    op.open()
    return op


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def drain(op: AsyncCallOperator) -> list[Any]:
    """Everything ``take`` has ready: ``("w", watermark)`` for a watermark,
    the results themselves otherwise."""
    out: list[Any] = []
    while (got := op.take()) is not None:
        results, _, wm = got
        out.extend(results)
        if wm is not None:
            out.append(("w", wm))
    return out


def run(test: Callable[[], Any]) -> None:
    asyncio.run(test())


def test_ordered_results_wait_for_the_earlier_ones() -> None:
    async def go() -> None:
        s = Service()
        op = make(s)
        woken: list[int] = []
        op.on_ready = lambda: woken.append(1)
        assert op.process([1, 2, 3]) == []
        await settle()
        s.complete(3)
        s.complete(2)
        await settle()
        assert not op.ready and drain(op) == []  # 1 is still out
        s.complete(1)
        await settle()
        assert op.ready and woken
        assert drain(op) == [("r", 1), ("r", 2), ("r", 3)]
        assert op.count == 0 and not op.ready
    run(go)


def test_a_watermark_is_held_behind_the_results_before_it() -> None:
    async def go() -> None:
        for ordered in (True, False):
            s = Service()
            op = make(s, ordered=ordered)
            op.process([1, 2])
            await settle()
            assert op.hold_watermark(5.0)
            op.process([3])
            await settle()
            s.complete(3)  # after the watermark: waits for it
            s.complete(2)
            await settle()
            first = drain(op)
            assert first == ([] if ordered else [("r", 2)])
            s.complete(1)
            await settle()
            rest = drain(op)
            assert rest == ([("r", 1), ("r", 2), ("w", 5.0), ("r", 3)] if ordered
                            else [("r", 1), ("w", 5.0), ("r", 3)])
            assert op.watermark == 5.0
            assert not op.hold_watermark(6.0)  # nothing held: it passes
    run(go)


def test_unordered_results_go_out_as_they_complete_within_a_segment() -> None:
    async def go() -> None:
        s = Service()
        op = make(s, ordered=False)
        op.process([1, 2, 3])
        await settle()
        s.complete(2)
        await settle()
        assert drain(op) == [("r", 2)]
        s.complete(3)
        s.complete(1)
        await settle()
        assert drain(op) == [("r", 3), ("r", 1)]
    run(go)


def test_at_most_capacity_calls_run_and_the_rest_start_as_slots_free() -> None:
    async def go() -> None:
        s = Service()
        op = make(s, capacity=2)
        op.process([1, 2, 3, 4])
        await settle()
        assert s.calls == [1, 2] and op.saturated
        s.complete(2)
        await settle()
        assert s.calls == [1, 2, 3]  # started by the completion, without the task
        assert op.saturated  # 1 still holds everything back
        s.complete(1)
        await settle()
        assert drain(op) == [("r", 1), ("r", 2)]
        assert s.calls == [1, 2, 3, 4]
        assert op.count == 2 and op.saturated  # 3 and 4: still capacity records held
        s.complete(3)
        await settle()
        assert drain(op) == [("r", 3)] and not op.saturated
    run(go)


def test_a_snapshot_holds_the_records_as_they_arrived_and_a_restore_calls_them_again() -> None:
    async def go() -> None:
        s = Service()
        op = make(s, ordered=False)
        records = [{"id": 1}, {"id": 2}, {"id": 3}]
        op.process_ts(records, [10.0, 11.0, 12.0])
        await settle()
        records[0]["changed"] = True  # the call changes its record in place
        s.complete(2, "two")
        await settle()
        assert drain(op) == ["two"]
        snap = op.snapshot(7)
        assert snap is not None and snap.operator_list is not None
        assert snap.operator_list_records == 2
        _, items = pickle.loads(snap.operator_list)
        assert items == [({"id": 1}, 10.0), ({"id": 3}, 12.0)]
        op.close()

        again = Service()
        restored = make(again, ordered=True)
        restored.restore_operator_list(items)
        await settle()
        assert again.calls == [{"id": 1}, {"id": 3}]
        again.complete(3, "three")
        again.complete(1, "one")
        await settle()
        got = restored.take()
        assert got == (["one", "three"], [10.0, 12.0], None)
    run(go)


def test_a_failed_or_timed_out_call_is_reported_with_its_record() -> None:
    async def go() -> None:
        s = Service()
        op = make(s)
        op.process(["a", "b"])
        await settle()
        s.fail("b", ConnectionError("refused"))
        await settle()
        assert op.ready
        with pytest.raises(AsyncCallFailed) as info:
            op.take()
        assert info.value.record == "b" and isinstance(info.value.cause, ConnectionError)
        op.abort()
        await settle()
        assert s.pending["a"].cancelled()

        slow = make(Service(), timeout=0.01)
        slow.process(["late"])
        await asyncio.sleep(0.05)
        with pytest.raises(AsyncCallFailed, match=r"within its timeout of 0\.01 s") as info:
            slow.take()
        assert info.value.record == "late"
        slow.close()
    run(go)
