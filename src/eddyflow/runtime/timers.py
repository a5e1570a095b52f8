"""Timers of a keyed operator: ``ctx.timer_service`` of a ``KeyedProcessFunction``.

Timers are keyed state. Each is a row of a reserved map state, ``_timers``,
of the operator's keyed backend: under its key, the entry ``(domain,
timestamp)`` (``"event"`` or ``"processing"``) — so one timer per (key,
timestamp, domain), stored by key group in either backend, snapshotted with
the rest of the state (incrementally), restored at any parallelism and read
offline like any other row. The state is declared on the first registration
(or at restore, if the checkpoint has it), so an operator without timers
keeps the states it always had.

Beside the rows, an in-memory heap per domain of ``(timestamp, seq, key)``
says which fires next without scanning the state; it is rebuilt from the
rows on restore. Deletions leave heap entries behind, skipped when they come
up (``_live`` holds what is really registered).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

from eddyflow.state.abc import KeyedStateBackend
from eddyflow.state.handles import MapState

__all__ = ["EVENT_TIME", "PROCESSING_TIME", "TIMERS_STATE", "TimerService"]

EVENT_TIME = "event"
PROCESSING_TIME = "processing"
#: The reserved state name timers are kept under.
TIMERS_STATE = "_timers"


class TimerService:
    """Register and delete timers for the current key; read the clocks."""

    def __init__(self, backend: KeyedStateBackend, now: Callable[[], float],
                 watermark: Callable[[], float]) -> None:
        self._backend = backend
        self._now = now
        self._watermark = watermark
        self._state: MapState[tuple[str, float], None] | None = None
        self._heaps: dict[str, list[tuple[float, int, Any]]] = {
            EVENT_TIME: [], PROCESSING_TIME: []}
        self._live: set[tuple[str, float, Any]] = set()
        self._seq = itertools.count()
        #: Called when the earliest processing-time timer may have changed.
        self.on_processing_change: Callable[[], None] | None = None

    # -- the user's side ---------------------------------------------------

    def register_event_time_timer(self, timestamp: float) -> None:
        """Call ``on_timer(timestamp)`` for the current key once the
        watermark reaches ``timestamp`` (``timestamp <= watermark``)."""
        self._register(EVENT_TIME, float(timestamp))

    def register_processing_time_timer(self, timestamp: float) -> None:
        """Call ``on_timer(timestamp)`` for the current key once processing
        time (the job's clock) reaches ``timestamp``."""
        self._register(PROCESSING_TIME, float(timestamp))

    def delete_event_time_timer(self, timestamp: float) -> None:
        self._delete(EVENT_TIME, float(timestamp))

    def delete_processing_time_timer(self, timestamp: float) -> None:
        self._delete(PROCESSING_TIME, float(timestamp))

    def current_watermark(self) -> float:
        """The operator's event time (``-inf`` before its first watermark)."""
        return self._watermark()

    def current_processing_time(self) -> float:
        return self._now()

    # -- the operator's side -----------------------------------------------

    def _rows(self) -> MapState[tuple[str, float], None]:
        if self._state is None:
            self._state = MapState(self._backend, TIMERS_STATE)
        return self._state

    def _register(self, domain: str, t: float) -> None:
        if math.isnan(t):
            raise ValueError("a timer's timestamp cannot be NaN")
        key = self._backend.current_key
        entry = (domain, t, key)
        if entry in self._live:
            return  # one timer per (key, timestamp, domain)
        self._live.add(entry)
        heap = self._heaps[domain]
        earliest = heap[0][0] if heap else None
        heapq.heappush(heap, (t, next(self._seq), key))
        self._rows().put((domain, t), None)
        if domain == PROCESSING_TIME and (earliest is None or t < earliest):
            hook = self.on_processing_change
            if hook is not None:
                hook()

    def _delete(self, domain: str, t: float) -> None:
        key = self._backend.current_key
        entry = (domain, t, key)
        if entry not in self._live:
            return
        self._live.discard(entry)
        self._rows().remove((domain, t))

    def next_time(self, domain: str) -> float | None:
        """The earliest live timer of ``domain``, if any."""
        heap = self._heaps[domain]
        live = self._live
        while heap:
            t, _, key = heap[0]
            if (domain, t, key) in live:
                return t
            heapq.heappop(heap)  # deleted: drop it now
        return None

    def pop_due(self, domain: str, until: float) -> Iterator[tuple[float, Any]]:
        """The timers of ``domain`` with timestamp ``<= until``, in timestamp
        order (then in order of registration), each removed from the state
        as it is handed out with the current key set to its key. A timer
        registered meanwhile for a time ``<= until`` comes out too."""
        heap = self._heaps[domain]
        live = self._live
        backend = self._backend
        while heap and heap[0][0] <= until:
            t, _, key = heapq.heappop(heap)
            entry = (domain, t, key)
            if entry not in live:
                continue
            live.discard(entry)
            backend.current_key = key
            self._rows().remove((domain, t))
            yield t, key

    def rebuild(self) -> int:
        """After a restore: index the timers the state holds (this subtask's
        key groups only); how many."""
        if TIMERS_STATE not in self._backend.kinds:
            return 0
        self._rows()
        table = self._backend.tables()[TIMERS_STATE]
        found = sorted(((t, domain, key) for key in list(table)
                        for (domain, t) in dict(table[key])), key=lambda e: e[0])
        self._heaps = {EVENT_TIME: [], PROCESSING_TIME: []}
        self._live = set()
        for t, domain, key in found:
            self._live.add((domain, t, key))
            self._heaps[domain].append((t, next(self._seq), key))
        for heap in self._heaps.values():
            heapq.heapify(heap)
        return len(found)
