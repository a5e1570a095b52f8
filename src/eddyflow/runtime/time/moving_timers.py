"""The window operator's timers on the memory backend: exact rows, a lazy index.

A session window's end moves with nearly every record of its key, and with
it the window's timers. ``TimerService`` keeps an exact index (each timer
in a per-time dict and its time in a heap), so every move was a delete and
a register there: two dict entries created and dropped, a heap push, and a
stale heap entry popped later. That bookkeeping was half of a session
window's cost (pyinstrument and py-spy on ``benchmarks/windows.py``).

``MovingTimers`` keeps the same rows, in the same reserved map state
``_timers`` (``key -> {(domain, time): None}``): checkpoints, restores,
rescaling and the offline readers see exactly the timers ``TimerService``
would hold. Only the in-memory index differs. It holds, per key, one entry
*at or before* the key's earliest timer (``_first``), in a heap of
``(time, seq, key)``. Moving a timer later (a session growing) leaves the
entry where it is; when the entry comes due, the key's rows say where its
earliest timer really is, and the key is indexed there, or its timer fires
if it is due. So timers still fire in time order, each once, and a key is
re-indexed about once per watermark step instead of once per record. An
entry that is not a key's ``_first`` any more is stale, dropped when it
comes up.

Only the memory backend's dict rows are cheap enough to read at every due
entry; the RocksDB backend keeps ``TimerService``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from typing import Any

from eddyflow.runtime.time.timers import TIMERS_STATE
from eddyflow.state.abc import KeyedStateBackend
from eddyflow.state.handles import MapState

__all__ = ["MovingTimers"]

_INF = math.inf


class MovingTimers:
    """One domain's timers of an operator on the memory backend (see the
    module docstring): the subset of ``TimerService`` the window operator
    uses, plus ``move``."""

    def __init__(self, backend: KeyedStateBackend, domain: str) -> None:
        self._backend = backend
        self._domain = domain
        MapState(backend, TIMERS_STATE)  # declares the rows' state
        table = backend.tables()[TIMERS_STATE]
        if type(table) is not dict:
            raise TypeError("MovingTimers needs the memory backend's dict tables")
        self._rows: dict[Any, dict[tuple[str, float], None]] = table
        self._changes = backend.changes(TIMERS_STATE)
        self._heap: list[tuple[float, int, Any]] = []
        #: key -> the time of its index entry, at or before its earliest timer.
        self._first: dict[Any, float] = {}
        self._seq = itertools.count()

    def _index(self, key: Any, t: float) -> None:
        """Make sure ``key`` has an index entry at or before ``t``."""
        if t < self._first.get(key, _INF):
            self._first[key] = t
            heapq.heappush(self._heap, (t, next(self._seq), key))

    def _written(self, key: Any) -> None:
        written = self._changes.keys
        if written is not None:
            written[key] = None

    def register(self, domain: str, t: float, key: Any) -> None:
        """A timer at ``t`` (a float) for ``key``, the backend's current key."""
        assert domain == self._domain
        entry = (domain, t)
        rows = self._rows.get(key)
        if rows is None:
            self._rows[key] = {entry: None}
        elif entry in rows:
            return
        else:
            rows[entry] = None
        self._written(key)
        self._index(key, t)

    def delete(self, domain: str, t: float, key: Any) -> None:
        """Delete ``key``'s timer at ``t``, if it has one (its index entry
        stays: still at or before the earliest timer left)."""
        rows = self._rows.get(key)
        if rows is None or rows.pop((domain, t), _MISSING) is _MISSING:
            return
        if not rows:
            del self._rows[key]
        self._written(key)

    def move(self, domain: str, old: float, new: float, key: Any) -> None:
        """``delete(old)`` and ``register(new)``; for ``new > old`` the index
        is not touched."""
        table = self._rows
        rows = table.get(key)
        if rows is not None and len(rows) == 1 and (domain, old) in rows:
            # A fresh dict: a delete would leave a slot that lookups skip.
            table[key] = {(domain, new): None}
            written = self._changes.keys
            if written is not None:
                written[key] = None
            if new < old:
                self._index(key, new)
            return
        self.delete(domain, old, key)
        self.register(domain, new, key)

    def register_event_time_timer(self, timestamp: float) -> None:
        self.register(self._domain, float(timestamp), self._backend.current_key)

    register_processing_time_timer = register_event_time_timer

    def delete_event_time_timer(self, timestamp: float) -> None:
        self.delete(self._domain, float(timestamp), self._backend.current_key)

    delete_processing_time_timer = delete_event_time_timer

    def _earliest(self, key: Any) -> float | None:
        rows = self._rows.get(key)
        if not rows:
            return None
        domain = self._domain
        if len(rows) == 1:  # the common case, without a generator
            ((d, t),) = rows
            return t if d == domain else None
        return min((t for d, t in rows if d == domain), default=None)

    def next_time(self, domain: str) -> float | None:
        """At or before the earliest timer (a wake-up that finds nothing due
        re-indexes the key it woke for)."""
        heap, first = self._heap, self._first
        while heap:
            t, _, key = heap[0]
            if first.get(key) == t:
                return t
            heapq.heappop(heap)  # stale
        return None

    def pop_due(self, domain: str, until: float) -> Iterator[tuple[float, Any]]:
        """The timers with time ``<= until`` in time order, each removed
        from the rows as it is handed out with the current key set to its
        key; timers registered meanwhile for a time ``<= until`` come out
        too."""
        assert domain == self._domain
        heap, first, backend = self._heap, self._first, self._backend
        while heap and heap[0][0] <= until:
            t, _, key = heapq.heappop(heap)
            if first.get(key) != t:
                continue  # stale: the key was indexed earlier since
            del first[key]
            rows = self._rows.get(key)
            due: float | None
            if rows is not None and len(rows) == 1:  # the common case, inline
                ((d, due),) = rows
                if d != domain:
                    continue
            else:
                due = self._earliest(key)
            if due is None:
                continue  # its timers were all deleted
            if due > t:
                self._index(key, due)  # the timer moved on: wait for it there
                continue
            self.delete(domain, due, key)
            backend.current_key = key
            yield due, key
            after = self._earliest(key)
            if after is not None:
                self._index(key, after)

    def rebuild(self) -> int:
        """After a restore: index the keys of the rows (this subtask's key
        groups only); how many timers they hold."""
        self._heap.clear()
        self._first.clear()
        domain, count = self._domain, 0
        for key, rows in self._rows.items():
            times = [t for d, t in rows if d == domain]
            count += len(times)
            if times:
                self._index(key, float(min(times)))
        return count


_MISSING: Any = object()
