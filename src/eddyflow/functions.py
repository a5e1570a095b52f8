"""User function types: ``KeyedProcessFunction``, the two-input functions
(``CoProcessFunction``, ``KeyedCoProcessFunction``, ``BroadcastProcessFunction``,
``KeyedBroadcastProcessFunction``) and the ``RuntimeContext`` they are
opened with and called with."""

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

__all__ = [
    "BroadcastProcessFunction",
    "CoProcessFunction",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "RuntimeContext",
]


class RuntimeContext:
    """What a keyed function knows about where it runs, and its state."""

    def __init__(
        self,
        operator: str,
        subtask: int,
        parallelism: int,
        max_parallelism: int,
        backend: KeyedStateBackend | None,
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
        #: A broadcast function's broadcast state (the operator sets it): a
        #: read-only mapping in ``process_element`` and ``on_timer``, a
        #: writable dict-like in ``process_broadcast_element``.
        self.broadcast_state: Any = None
        self._side: Callable[[Any, Any], None] | None = None

    def set_side_output(self, emit: Callable[[Any, Any], None]) -> None:
        """Where :meth:`output` sends ``(tag, value)`` (set by the operator of
        a two-input function)."""
        self._side = emit

    def output(self, tag: Any, value: Any) -> None:
        """Send ``value`` to the side output ``tag`` (an ``ef.OutputTag``;
        read it with ``get_side_output(tag)`` on the function's result)."""
        if self._side is None:
            raise TypeError(f"operator '{self.operator_name}': side outputs are for "
                            "two-input and broadcast functions")
        self._side(tag, value)

    def _keyed(self) -> KeyedStateBackend:
        if self._backend is None:
            raise TypeError(f"operator '{self.operator_name}': keyed state needs keyed inputs "
                            "(connect two key_by streams, or key_by before connect)")
        return self._backend

    @property
    def current_key(self) -> Any:
        """The key of the record being processed (of the timer, in ``on_timer``)."""
        return self._keyed().current_key

    # State with ``ttl``: its entries (a key's value; each map entry; each
    # list element) expire ``ttl.seconds`` of the job's processing time
    # after they were written; expired entries are never returned and are
    # dropped from snapshots (``state/ttl.py``).

    def value_state(self, name: str, default: Any = None, *,
                    ttl: StateTtl | None = None) -> ValueState[Any]:
        """The keyed value state ``name`` (``default`` for a key without one)."""
        if ttl is not None:
            return TtlValueState(self._keyed(), name, default, ttl, self._now)
        return ValueState(self._keyed(), name, default)

    def list_state(self, name: str, *, ttl: StateTtl | None = None) -> ListState[Any]:
        """The keyed list state ``name``."""
        if ttl is not None:
            return TtlListState(self._keyed(), name, ttl, self._now)
        return ListState(self._keyed(), name)

    def map_state(self, name: str, *, ttl: StateTtl | None = None) -> MapState[Any, Any]:
        """The keyed map state ``name``."""
        if ttl is not None:
            return TtlMapState(self._keyed(), name, ttl, self._now)
        return MapState(self._keyed(), name)

    def reducing_state(self, name: str, fn: Callable[[Any, Any], Any], *,
                       ttl: StateTtl | None = None) -> ReducingState[Any]:
        """The keyed reducing state ``name``: ``add`` folds a value in with ``fn``."""
        if ttl is not None:
            return TtlReducingState(self._keyed(), name, fn, ttl, self._now)
        return ReducingState(self._keyed(), name, fn)


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


class CoProcessFunction(ABC):
    """A function of two connected streams: ``process1`` handles the first
    (``a`` of ``a.connect(b)``), ``process2`` the second. Both are
    generators (yield outputs); ``ctx.output(tag, value)`` sends to a side
    output. Without keys there is no keyed state and no timers: connect two
    ``key_by`` streams for those (:class:`KeyedCoProcessFunction`)."""

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Called once per subtask before the first record."""

    @abstractmethod
    def process1(self, value: Any, ctx: RuntimeContext) -> Iterable[Any] | None:
        """Handle one record of the first input."""

    @abstractmethod
    def process2(self, value: Any, ctx: RuntimeContext) -> Iterable[Any] | None:
        """Handle one record of the second input."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called once when the subtask ends."""


class KeyedCoProcessFunction(CoProcessFunction):
    """A function of two keyed streams connected on the same key space: both
    ``process1`` and ``process2`` see the keyed state and the timers of the
    record's key (``ctx.current_key``), as one ``KeyedProcessFunction``
    would. Each subtask gets its own copy of the object."""

    def on_timer(self, timestamp: float, ctx: RuntimeContext) -> Iterable[Any] | None:
        """A timer of ``ctx.current_key`` fires (as in ``KeyedProcessFunction``)."""
        return None


class BroadcastProcessFunction(ABC):
    """A function of a stream connected to a broadcast stream
    (``events.connect(rules.broadcast("rules"))``): ``process_element``
    handles the events and reads ``ctx.broadcast_state`` (a read-only
    mapping: the broadcast state of that name); ``process_broadcast_element``
    handles the broadcast records, which every subtask receives, and may
    change ``ctx.broadcast_state`` (there a writable dict-like). Every subtask holds the same
    broadcast state as long as ``process_broadcast_element`` changes it the
    same way from the same records (a function of the record and the state
    only)."""

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Called once per subtask before the first record."""

    @abstractmethod
    def process_element(self, value: Any, ctx: RuntimeContext) -> Iterable[Any] | None:
        """Handle one record of the non-broadcast input."""

    @abstractmethod
    def process_broadcast_element(self, value: Any, ctx: RuntimeContext) -> Iterable[Any] | None:
        """Handle one broadcast record (in every subtask)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called once when the subtask ends."""


class KeyedBroadcastProcessFunction(BroadcastProcessFunction):
    """:class:`BroadcastProcessFunction` over a keyed stream: in
    ``process_element`` and ``on_timer`` the keyed state and timers of the
    record's key, and the broadcast state read-only."""

    def on_timer(self, timestamp: float, ctx: RuntimeContext) -> Iterable[Any] | None:
        """A timer of ``ctx.current_key`` fires; the broadcast state is readable."""
        return None
