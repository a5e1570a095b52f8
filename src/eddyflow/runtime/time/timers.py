"""Timers of a keyed operator: ``ctx.timer_service`` of a ``KeyedProcessFunction``,
and the window operator's fire and cleanup times.

Timers are keyed state. Each is a row of a reserved map state, ``_timers``,
of the operator's keyed backend: under its key, the entry ``(domain,
timestamp)`` (``"event"`` or ``"processing"``) — so one timer per (key,
timestamp, domain), stored by key group in either backend, snapshotted with
the rest of the state (incrementally), restored at any parallelism and read
offline like any other row. The state is declared on the first registration
(or at restore, if the checkpoint has it), so an operator without timers
keeps the states it always had.

Beside the rows, an in-memory index per domain says which fires next
without scanning the state: the keys with a timer at each time, in order of
registration (``time -> {key: None}``), and a heap of those times. Many keys
share a time (every key's window ends at the same instant), so the heap
holds a time once, not a (time, key) pair per timer: registering for a time
already indexed is a dict insert, and a watermark that passes a time fires
all its keys in one heap pop. A deleted timer leaves its time in the heap,
skipped when it comes up empty. The index is rebuilt from the rows on
restore.

The memory backend's rows are plain dicts: the service writes them directly
(the window operator registers a timer per new window; the handle's method
calls were a third of that, measured with pyinstrument) and records the
keys it wrote in the table's ``Changes``, as the handles do. Session
windows on the memory backend, which move a timer with nearly every
record, use ``MovingTimers`` (``runtime/time/moving_timers.py``) instead: the
same rows, a lazier index.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any

from eddyflow.state.abc import KeyedStateBackend
from eddyflow.state.changes import Changes
from eddyflow.state.handles import MapState

__all__ = ["EVENT_TIME", "PROCESSING_TIME", "TIMERS_STATE", "TimerService"]

EVENT_TIME = "event"
PROCESSING_TIME = "processing"
#: The reserved state name timers are kept under.
TIMERS_STATE = "_timers"

_MISSING: Any = object()


class _Domain:
    """The index of one time domain's timers."""

    __slots__ = ("by_time", "heap")

    def __init__(self) -> None:
        #: time -> the keys with a timer at that time, in order of registration.
        self.by_time: dict[float, dict[Any, None]] = {}
        #: The times of ``by_time``, each once (a time stays until popped,
        #: even when its keys are all deleted).
        self.heap: list[float] = []


class TimerService:
    """Register and delete timers for the current key; read the clocks."""

    def __init__(self, backend: KeyedStateBackend, now: Callable[[], float],
                 watermark: Callable[[], float]) -> None:
        self._backend = backend
        self._now = now
        self._watermark = watermark
        self._state: MapState[tuple[str, float], None] | None = None
        #: The memory backend's rows table (``key -> {(domain, t): None}``)
        #: and its changes, written directly; ``None``: go through ``_state``.
        self._table: dict[Any, dict[tuple[str, float], None]] | None = None
        self._changes: Changes | None = None
        self._domains = {EVENT_TIME: _Domain(), PROCESSING_TIME: _Domain()}

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
        self.delete(EVENT_TIME, float(timestamp), self._backend.current_key)

    def delete_processing_time_timer(self, timestamp: float) -> None:
        self.delete(PROCESSING_TIME, float(timestamp), self._backend.current_key)

    def current_watermark(self) -> float:
        """The operator's event time (``-inf`` before its first watermark)."""
        return self._watermark()

    def current_processing_time(self) -> float:
        return self._now()

    # -- the operator's side -----------------------------------------------

    def _rows(self) -> MapState[tuple[str, float], None]:
        if self._state is None:
            self._state = MapState(self._backend, TIMERS_STATE)
            table = self._backend.plain_table(TIMERS_STATE)
            if table is not None:
                self._table = table
                self._changes = self._backend.changes(TIMERS_STATE)
        return self._state

    def _register(self, domain: str, t: float) -> None:
        if t != t:  # NaN
            raise ValueError("a timer's timestamp cannot be NaN")
        self.register(domain, t, self._backend.current_key)

    def register(self, domain: str, t: float, key: Any) -> None:
        """A timer of ``domain`` at ``t`` (a float, not NaN) for ``key``, the
        backend's current key (one per key, time and domain: registering it
        again does nothing)."""
        index = self._domains[domain]
        keys = index.by_time.get(t)
        if keys is None:
            index.by_time[t] = {key: None}
            heapq.heappush(index.heap, t)
        elif key in keys:
            return
        else:
            keys[key] = None
        if self._state is None:
            self._rows()
        table = self._table
        if table is None:
            self._rows().put((domain, t), None)
            return
        entries = table.get(key)
        if entries is None:
            table[key] = {(domain, t): None}
        else:
            entries[(domain, t)] = None
        assert self._changes is not None
        written = self._changes.keys
        if written is not None:
            written[key] = None

    def delete(self, domain: str, t: float, key: Any) -> None:
        """Delete ``key``'s timer of ``domain`` at ``t``, if there is one
        (``key`` is the backend's current key)."""
        keys = self._domains[domain].by_time.get(t)
        if keys is None or key not in keys:
            return
        del keys[key]
        self._remove_row(domain, t, key)

    def _remove_row(self, domain: str, t: float, key: Any) -> None:
        table = self._table
        if table is None:
            self._rows().remove((domain, t))
            return
        entries = table.get(key)
        if entries is not None and entries.pop((domain, t), _MISSING) is not _MISSING:
            if not entries:
                table.pop(key, None)
            assert self._changes is not None
            written = self._changes.keys
            if written is not None:
                written[key] = None

    def next_time(self, domain: str) -> float | None:
        """The earliest live timer of ``domain``, if any."""
        index = self._domains[domain]
        heap, by_time = index.heap, index.by_time
        while heap:
            t = heap[0]
            if by_time[t]:
                return t
            heapq.heappop(heap)  # its timers were all deleted: drop it now
            del by_time[t]
        return None

    def pop_due(self, domain: str, until: float) -> Iterator[tuple[float, Any]]:
        """The timers of ``domain`` with timestamp ``<= until``, in timestamp
        order (then in order of registration), each removed from the state
        as it is handed out with the current key set to its key. A timer
        registered meanwhile for a time ``<= until`` comes out too, in its
        place in that order."""
        index = self._domains[domain]
        heap, by_time = index.heap, index.by_time
        backend = self._backend
        while heap and heap[0] <= until:
            t = heap[0]
            keys = by_time[t]
            if not keys:
                heapq.heappop(heap)
                del by_time[t]
                continue
            for key in list(keys):
                if key not in keys:
                    continue  # deleted by the code a timer before it ran
                del keys[key]
                backend.current_key = key
                self._remove_row(domain, t, key)
                yield t, key
                if heap[0] != t:
                    break  # a timer for an earlier time was registered: it goes first

    def rebuild(self) -> int:
        """After a restore: index the timers the state holds (this subtask's
        key groups only); how many."""
        if TIMERS_STATE not in self._backend.kinds:
            return 0
        self._rows()
        table = self._backend.tables()[TIMERS_STATE]
        found = sorted(((t, domain, key) for key in list(table)
                        for (domain, t) in dict(table[key])), key=lambda e: e[0])
        for index in self._domains.values():
            index.by_time.clear()
            index.heap.clear()
        for t, domain, key in found:
            index = self._domains[domain]
            t = float(t)
            keys = index.by_time.get(t)
            if keys is None:
                index.by_time[t] = {key: None}
                index.heap.append(t)
            else:
                keys[key] = None
        for index in self._domains.values():
            heapq.heapify(index.heap)
        return len(found)
