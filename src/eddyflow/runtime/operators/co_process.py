"""The co-process operators: ``a.connect(b).process(CoProcessFunction)``
(no keys: the records of either input, no keyed state) and
``a.key_by(ka).connect(b.key_by(kb)).process(KeyedCoProcessFunction)``
(both inputs share the keyed state and timers of a key). Both read the
tagged union of their inputs (``two_input.py``)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, TypeVar

from eddyflow.functions import CoProcessFunction, KeyedCoProcessFunction, RuntimeContext
from eddyflow.runtime.operators.base import Operator, OperatorContext
from eddyflow.runtime.operators.keyed import KeyedOperator, KeyedSpec
from eddyflow.runtime.operators.two_input import SideKeys, TwoInputKeyedOperator, side_record

__all__ = ["CoProcessSpec", "KeyedCoProcessSpec", "copy_function"]

F = TypeVar("F")


def copy_function(fn: F, uid: str) -> F:
    """A copy of a user function for one subtask (as Flink deserialises one
    per subtask), or one clear error naming the operator."""
    try:
        return copy.deepcopy(fn)
    except Exception as exc:
        raise TypeError(f"operator '{uid}': {type(fn).__name__} must be copyable "
                        f"(one copy per subtask): {exc}") from exc


class _CoProcess(Operator):
    def __init__(self, ctx: OperatorContext, fn: CoProcessFunction) -> None:
        super().__init__(ctx)
        self.fn = fn
        self._side_out: list[Any] = []
        self.rctx = RuntimeContext(ctx.uid, ctx.subtask, ctx.parallelism, ctx.max_parallelism,
                                   None, ctx.clock.now)
        pending = self._side_out
        self.rctx.set_side_output(lambda tag, value: pending.append(side_record(tag, value)))

    def open(self) -> None:
        self.fn.open(self.rctx)

    def process(self, batch: list[Any]) -> list[Any]:
        return self.process_ts(batch, None)[0]

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        ctx = self.rctx
        calls = (self.fn.process1, self.fn.process2)
        pending = self._side_out
        out: list[Any] = []
        stamps: list[Any] | None = None if timestamps is None else []
        i = 0
        try:
            for i, (side, r) in enumerate(batch):
                t = None if timestamps is None else timestamps[i]
                ctx.timestamp = t
                n = len(out)
                res = calls[side](r, ctx)
                if res is not None:
                    out.extend(res)
                if pending:
                    out.extend(pending)
                    pending.clear()
                if stamps is not None:
                    stamps.extend([t] * (len(out) - n))
        except Exception:
            pending.clear()
            self.failed_index = i
            raise
        finally:
            ctx.timestamp = None
        return out, stamps

    def close(self) -> None:
        self.fn.close()


class _KeyedCoProcess(TwoInputKeyedOperator):
    def __init__(self, ctx: OperatorContext, key_fn: SideKeys,
                 fn: KeyedCoProcessFunction) -> None:
        super().__init__(ctx, key_fn)
        self.fn = fn
        self.calls = (fn.process1, fn.process2)

    def open_function(self, rctx: RuntimeContext) -> None:
        self.fn.open(rctx)

    def handle(self, side: int, record: Any, ctx: RuntimeContext) -> Any:
        return self.calls[side](record, ctx)

    def timer(self, timestamp: float, ctx: RuntimeContext) -> Any:
        return self.fn.on_timer(timestamp, ctx)

    def close(self) -> None:
        try:
            self.fn.close()
        finally:
            super().close()


@dataclass(frozen=True)
class CoProcessSpec:
    """``a.connect(b).process(fn)``: a copy of ``fn`` per subtask, reading
    ``(side, record)`` pairs."""

    fn: CoProcessFunction

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _CoProcess(ctx, copy_function(self.fn, ctx.uid))


@dataclass(frozen=True)
class KeyedCoProcessSpec(KeyedSpec):
    """``a.key_by(ka).connect(b.key_by(kb)).process(fn)``: ``key_fn`` is the
    ``SideKeys`` of both inputs."""

    fn: KeyedCoProcessFunction

    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        assert isinstance(self.key_fn, SideKeys)
        return _KeyedCoProcess(ctx, self.key_fn, copy_function(self.fn, ctx.uid))
