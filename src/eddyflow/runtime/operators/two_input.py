"""What every two-input operator shares: how its two inputs reach it, and
the keyed operator base that runs a two-input function with keyed state,
timers and side outputs.

Two inputs as one tagged input (the design, docs/architecture/runtime.md):
each input of a two-input operator goes through a stateless ``tag``
operator (``TagInput``, chained to the input's producer) that makes every
record a ``(side, record)`` pair, and the operator reads the tagged
streams as one union. Everything the runtime does for a union then holds
as it is: barriers align over all the channels of both inputs, unaligned
checkpoints store the tagged records in flight, the watermark is the
minimum over every channel (so over both inputs), a loop may run through
the operator, and the offline replay runs the operator like any keyed one
(``SideKeys`` keys a tagged record by its own side's key selector). Flink's
window join takes the same path (``coGroup`` over a tagged union); its
other two-input operators have a dedicated task, which buys nothing here:
this runtime's batches are per channel already, and the side travels with
the record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.functions import RuntimeContext
from eddyflow.keygroups import check_key
from eddyflow.runtime.exchange.events import timestamped
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.runtime.operators.keyed import KeyedOperator
from eddyflow.runtime.operators.side_outputs import SideRecord
from eddyflow.runtime.time.timers import EVENT_TIME, PROCESSING_TIME, TimerService

__all__ = ["LEFT", "RIGHT", "SideKeys", "TagInput", "TwoInputKeyedOperator", "after", "side_record"]

#: The side of the first input (``a`` of ``a.connect(b)``) and of the second.
LEFT = 0
RIGHT = 1


@dataclass(frozen=True)
class TagInput:
    """The map of a ``tag`` operator: ``record -> (side, record)``."""

    side: int

    def __call__(self, record: Any) -> tuple[int, Any]:
        return self.side, record


@dataclass(frozen=True)
class SideKeys:
    """The key of a tagged record: its side's key selector applied to the
    record (``None`` for a side without keys: a broadcast input)."""

    left: Callable[[Any], Any] | None
    right: Callable[[Any], Any] | None

    def __call__(self, tagged: tuple[int, Any]) -> Any:
        side, record = tagged
        fn = self.right if side else self.left
        if fn is None:
            raise TypeError(f"input {side + 1} of a two-input operator has no key")
        return fn(record)


def side_record(tag: Any, value: Any) -> SideRecord:
    """A function's ``ctx.output(tag, value)`` among the operator's outputs."""
    name = getattr(tag, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"ctx.output needs an ef.OutputTag, got {tag!r:.100}")
    return SideRecord(name, value)


class TwoInputKeyedOperator(KeyedOperator):
    """A keyed operator over tagged records: the user function's context with
    keyed state and timers, and the loop that sets each record's key and
    timestamp and collects what it yields (side outputs included).
    Subclasses say what a record of each side does (:meth:`handle`) and
    what a timer does (:meth:`timer`)."""

    uses_clock = True
    #: Which sides are keyed (a broadcast side is not: its records reach
    #: every subtask and have no current key).
    keyed_sides: tuple[bool, bool] = (True, True)

    def __init__(self, ctx: OperatorContext, key_fn: SideKeys) -> None:
        super().__init__(ctx, key_fn)
        self.sides = key_fn
        self.rctx: RuntimeContext | None = None
        self.timers: TimerService | None = None
        self._side_out: list[Any] = []

    def open(self) -> None:
        backend = self.backend = self.ctx.keyed_backend()
        c = self.ctx
        rctx = self.rctx = RuntimeContext(c.uid, c.subtask, c.parallelism, c.max_parallelism,
                                          backend, c.clock.now)
        self.timers = TimerService(backend, c.clock.now, lambda: self.watermark)
        rctx.timer_service = self.timers
        pending = self._side_out
        rctx.set_side_output(lambda tag, value: pending.append(side_record(tag, value)))
        self.open_function(rctx)

    def open_function(self, rctx: RuntimeContext) -> None:
        """Open the user's function (and declare the operator's own state)."""

    def handle(self, side: int, record: Any, ctx: RuntimeContext) -> Iterable[Any] | None:
        """The outputs of one record of ``side`` (its key is current); a
        ``RecordBatch`` with ``timestamps`` gives them their own."""
        raise NotImplementedError

    def timer(self, timestamp: float, ctx: RuntimeContext) -> Iterable[Any] | None:
        """The outputs of a timer of the current key firing at ``timestamp``."""
        return None

    def process(self, batch: list[Any]) -> list[Any]:
        return self.process_ts(batch, None)[0]

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        ctx, backend = self.rctx, self.backend
        assert backend is not None and ctx is not None
        left, right = self.sides.left, self.sides.right
        keyed = self.keyed_sides
        handle = self.handle
        pending = self._side_out
        out: list[Any] = []
        extend = out.extend
        stamps: list[Any] | None = None if timestamps is None else []
        i = 0
        k: Any = None
        try:
            for i, (side, r) in enumerate(batch):
                if keyed[side]:
                    k = right(r) if side else left(r)  # type: ignore[misc]
                    check_key(k)
                    backend.current_key = k
                t = None if timestamps is None else timestamps[i]
                ctx.timestamp = t
                res = handle(side, r, ctx)
                own = None
                if res is not None:
                    extend(res)
                    own = getattr(res, "timestamps", None)
                if pending:
                    extend(pending)
                    pending.clear()
                if stamps is not None:
                    # Outputs take the timestamp of the record that made
                    # them, unless ``handle`` gave them their own (a
                    # ``RecordBatch`` with timestamps).
                    if own is not None:
                        stamps.extend(own)
                    stamps.extend([t] * (len(out) - len(stamps)))
        except Exception as exc:
            pending.clear()
            self.record_failure(batch, i, exc, k)
            raise
        finally:
            ctx.timestamp = None
        if backend.has_ttl:
            backend.expire_ttl()  # as the one-input process operator does
        return out, stamps

    def _fire(self, domain: str, until: float, stamp: bool) -> list[Any]:
        timers, ctx = self.timers, self.rctx
        assert timers is not None and ctx is not None
        pending = self._side_out
        out: list[Any] = []
        stamps: list[Any] = []
        try:
            for t, _ in timers.pop_due(domain, until):
                ctx.timestamp = t
                n = len(out)
                res = self.timer(t, ctx)
                if res is not None:
                    out.extend(res)
                if pending:
                    out.extend(pending)
                    pending.clear()
                stamps.extend([t if stamp else None] * (len(out) - n))
        finally:
            ctx.timestamp = None
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


def after(t: float) -> float:
    """The first float above ``t``: a timer there fires only once the
    watermark has passed ``t`` (a record at ``t`` itself is not late yet)."""
    return math.nextafter(t, math.inf)
