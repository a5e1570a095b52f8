"""User function types: ``KeyedProcessFunction`` and the ``RuntimeContext``
it is opened with and called with."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from eddyflow.state.abc import KeyedStateBackend
from eddyflow.state.handles import (
    ListState,
    MapState,
    ReducingState,
    TtlListState,
    TtlMapState,
    TtlReducingState,
    TtlValueState,
    ValueState,
)
from eddyflow.state.ttl import StateTtl

if TYPE_CHECKING:
    from eddyflow.runtime.time.timers import TimerService

__all__ = ["KeyedProcessFunction", "RuntimeContext"]


class RuntimeContext:
    """What a keyed function knows about where it runs, and its state."""

    def __init__(
        self,
        operator: str,
        subtask: int,
        parallelism: int,
        max_parallelism: int,
        backend: KeyedStateBackend,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.operator_name = operator
        self.subtask_index = subtask
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self._backend = backend
        #: Processing time (the job's clock; the operator passes it, the
        #: wall clock otherwise): what state time-to-live reads.
        self._now = now
        #: The event timestamp of the record being processed (``None`` if it
        #: has none), or of the timer firing in ``on_timer``.
        self.timestamp: float | None = None
        #: Timers of the current key (set by the operator before ``open``).
        self.timer_service: TimerService = None  # type: ignore[assignment]

    @property
    def current_key(self) -> Any:
        """The key of the record being processed (of the timer, in ``on_timer``)."""
        return self._backend.current_key

    # State with ``ttl``: its entries (a key's value; each map entry; each
    # list element) expire ``ttl.seconds`` of the job's processing time
    # after they were written; expired entries are never returned and are
    # dropped from snapshots (``state/ttl.py``).

    def value_state(self, name: str, default: Any = None, *,
                    ttl: StateTtl | None = None) -> ValueState[Any]:
        """The keyed value state ``name`` (``default`` for a key without one)."""
        if ttl is not None:
            return TtlValueState(self._backend, name, default, ttl, self._now)
        return ValueState(self._backend, name, default)

    def list_state(self, name: str, *, ttl: StateTtl | None = None) -> ListState[Any]:
        """The keyed list state ``name``."""
        if ttl is not None:
            return TtlListState(self._backend, name, ttl, self._now)
        return ListState(self._backend, name)

    def map_state(self, name: str, *, ttl: StateTtl | None = None) -> MapState[Any, Any]:
        """The keyed map state ``name``."""
        if ttl is not None:
            return TtlMapState(self._backend, name, ttl, self._now)
        return MapState(self._backend, name)

    def reducing_state(self, name: str, fn: Callable[[Any, Any], Any], *,
                       ttl: StateTtl | None = None) -> ReducingState[Any]:
        """The keyed reducing state ``name``: ``add`` folds a value in with ``fn``."""
        if ttl is not None:
            return TtlReducingState(self._backend, name, fn, ttl, self._now)
        return ReducingState(self._backend, name, fn)


class KeyedProcessFunction(ABC):
    """A function of a keyed stream with keyed state.

    Every parallel subtask gets its own copy of the object (as Flink
    serialises one per subtask), so state handles kept on ``self`` in
    :meth:`open` are per subtask.
    """

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Declare state handles here."""

    @abstractmethod
    def process(self, value: Any, ctx: RuntimeContext) -> Iterable[Any] | None:
        """Handle one record; yield (or return an iterable of) output records."""

    def on_timer(self, timestamp: float, ctx: RuntimeContext) -> Iterable[Any] | None:
        """A timer registered for ``timestamp`` fires (``ctx.current_key`` is
        its key, ``ctx.timestamp`` its time); yield outputs. Event-time
        timers fire once the watermark reaches them, in timestamp order;
        processing-time timers once the job's clock does."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called once when the subtask ends."""
