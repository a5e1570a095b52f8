"""The keyed process function operator (``key_by(...).process(fn)``): the
user's ``KeyedProcessFunction`` with its state and timers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.functions import KeyedProcessFunction, RuntimeContext
from eddyflow.keygroups import check_key
from eddyflow.runtime.exchange.events import timestamped
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.runtime.operators.keyed import KeyedOperator, KeyedSpec
from eddyflow.runtime.time.timers import EVENT_TIME, PROCESSING_TIME, TimerService

__all__ = ["KeyedProcessSpec"]


class _Process(KeyedOperator):
    uses_clock = True

    def __init__(self, ctx: OperatorContext, key_fn: Callable[[Any], Any],
                 fn: KeyedProcessFunction) -> None:
        super().__init__(ctx, key_fn)
        self.fn = fn
        self.rctx: RuntimeContext | None = None
        self.timers: TimerService | None = None

    def open(self) -> None:
        backend = self.backend = self.ctx.keyed_backend()
        c = self.ctx
        self.rctx = RuntimeContext(c.uid, c.subtask, c.parallelism, c.max_parallelism, backend,
                                   c.clock.now)
        self.timers = TimerService(backend, c.clock.now, lambda: self.watermark)
        self.rctx.timer_service = self.timers
        self.fn.open(self.rctx)

    def process(self, batch: list[Any]) -> list[Any]:
        return self.process_ts(batch, None)[0]

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        kf, proc, ctx = self.key_fn, self.fn.process, self.rctx
        backend = self.backend
        assert backend is not None and ctx is not None
        out: list[Any] = []
        extend = out.extend
        stamps: list[Any] | None = None if timestamps is None else []
        i = 0
        k: Any = None
        try:
            for i, r in enumerate(batch):
                k = kf(r)
                check_key(k)
                backend.current_key = k
                if stamps is not None:
                    assert timestamps is not None
                    t = ctx.timestamp = timestamps[i]
                    n = len(out)
                    res = proc(r, ctx)
                    if res is not None:
                        extend(res)
                        # Outputs take the timestamp of the record that made them.
                        stamps.extend([t] * (len(out) - n))
                else:
                    res = proc(r, ctx)
                    if res is not None:
                        extend(res)
        except Exception as exc:
            self.record_failure(batch, i, exc, k)
            raise
        finally:
            ctx.timestamp = None
        if backend.has_ttl:
            # Expired state leaves between batches too (not only at
            # snapshots): a job without checkpoints does not keep it. It
            # costs what expired (state/ttl.py).
            backend.expire_ttl()
        return out, stamps

    def _fire(self, domain: str, until: float, stamp: bool) -> list[Any]:
        """Run ``on_timer`` for every timer of ``domain`` due at ``until``."""
        timers, ctx = self.timers, self.rctx
        assert timers is not None and ctx is not None
        on_timer = self.fn.on_timer
        out: list[Any] = []
        stamps: list[Any] = []
        try:
            for t, _ in timers.pop_due(domain, until):
                ctx.timestamp = t
                n = len(out)
                res = on_timer(t, ctx)
                if res is not None:
                    out.extend(res)
                    stamps.extend([t if stamp else None] * (len(out) - n))
        finally:
            ctx.timestamp = None
        # Event-time timer outputs carry the timer's time, processing-time
        # ones none (as Flink).
        return timestamped(out, stamps) if out else out

    def on_watermark(self, watermark: float) -> list[Any]:
        return self._fire(EVENT_TIME, watermark, True)

    def next_processing_time(self) -> float | None:
        return None if self.timers is None else self.timers.next_time(PROCESSING_TIME)

    def on_processing_time(self, now: float) -> list[Any]:
        return self._fire(PROCESSING_TIME, now, False)

    def restore_keyed(self, root: str, kinds: dict[str, str],
                      handles: list[KeyedStateHandle]) -> None:
        super().restore_keyed(root, kinds, handles)
        assert self.timers is not None
        self.timers.rebuild()

    def close(self) -> None:
        try:
            self.fn.close()
        finally:
            super().close()


@dataclass(frozen=True)
class KeyedProcessSpec(KeyedSpec):
    """``key_by(...).process(fn)``: a copy of ``fn`` per subtask."""

    fn: KeyedProcessFunction

    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        try:
            fn = copy.deepcopy(self.fn)
        except Exception as exc:
            raise TypeError(
                f"operator '{ctx.uid}': {type(self.fn).__name__} must be copyable "
                f"(one copy per subtask): {exc}"
            ) from exc
        return _Process(ctx, self.key_fn, fn)
