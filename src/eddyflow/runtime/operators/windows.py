"""The window operator: ``key_by(...).window(assigner)...reduce/aggregate/
sum/count/process``; its late records go to a side output
(``side_outputs.py``).

Everything the operator decides (which windows a record joins, when a
window fires, re-fires and is dropped, how sessions merge) is a pure
function in ``eddyflow.windowing`` (``lifecycle.py``, ``merging.py``);
this module only keeps the state those functions act on, as keyed state
of the operator's backend (memory or RocksDB), so that it is checkpointed,
restored at any parallelism and read offline like any other keyed state:

* ``_windows``: a map state; under each key, one entry per open window,
  ``(start, end) -> accumulator`` (the adapter's accumulator: one value for
  ``reduce``/``aggregate``/``sum``/``count``, the tuple of elements for
  ``process``).
* ``_timers``: the operator's timers (``runtime/time/timers.py``), one per
  (key, time): a window's fire time (its end) and its cleanup time (end +
  allowed lateness). A timer is not tied to one window: when it fires the
  operator looks at the key's windows and fires those that end at that time
  and drops those whose cleanup time has come. Two windows of a key that
  share a time share its timer, and a timer left behind by a merged
  session finds nothing to do. Session windows on the memory backend keep
  the same rows with ``MovingTimers``, whose index lets a growing session
  move its end's timer without a heap operation.

On the memory backend, tumbling and session windows run hot paths that
make the same decisions on the backend's dicts directly (see
``_add_tumbling_heap``); everything else goes through the state handles.
The hot paths take the lifecycle's decisions per batch (a ``Horizon``)
or per window, not per record.

Window results take the timestamp ``TimeWindow.max_timestamp`` (the last
float inside the window), so that a downstream window of the same size puts
a result in the same window, and a downstream operator does not see it as
late (its watermark is still the one before the window fired).

Late records (see ``windowing/lifecycle.py``) are dropped, or, with
``side_output_late_data(tag)``, emitted wrapped in a ``SideRecord``
(``side_outputs.py``); the
stream the user gets is then a ``main output`` selection of the operator's
outputs, and ``get_side_output(tag)`` a side one (both stateless operators
added by ``WindowedStream``).

Processing-time windows fire on the job's clock. A bounded input's last
processing-time windows fire at the end of input (their records would
otherwise be lost silently; Flink leaves them unfired).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.keygroups import check_key
from eddyflow.runtime.exchange.events import timestamped
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.runtime.operators.keyed import KeyedOperator, KeyedSpec
from eddyflow.runtime.operators.side_outputs import SideRecord
from eddyflow.runtime.time.moving_timers import MovingTimers
from eddyflow.runtime.time.timers import EVENT_TIME, PROCESSING_TIME, TimerService
from eddyflow.state.handles import MapState
from eddyflow.values import SCALARS
from eddyflow.windowing.functions import WindowAdapter
from eddyflow.windowing.lifecycle import (
    cleanup_at,
    effective_lateness,
    fires_on_element,
    horizon,
    is_window_late,
    on_timer,
    route_record,
    timers_to_register,
)
from eddyflow.windowing.merging import merge_bounds
from eddyflow.windowing.windows import (
    EventTimeSessionWindows,
    TimeWindow,
    TumblingWindows,
    WindowAssigner,
)

__all__ = ["WINDOW_STATE", "WindowSpec"]

#: The map state windows are kept in (reserved, as the timers' ``_timers``).
WINDOW_STATE = "_windows"

_INF = math.inf

Bounds = tuple[float, float]


class _WindowOperator(KeyedOperator):
    """Keyed windows: accumulators per (key, window), timers per (key, time)."""

    def __init__(self, ctx: OperatorContext, key_fn: Callable[[Any], Any], spec: WindowSpec
                 ) -> None:
        super().__init__(ctx, key_fn)
        self.spec = spec
        self.adapter: WindowAdapter = spec.adapter
        assigner = spec.assigner
        self.event_time = assigner.is_event_time
        self.merging = assigner.is_merging
        self.domain = EVENT_TIME if self.event_time else PROCESSING_TIME
        self.uses_clock = not self.event_time
        self.lateness = effective_lateness(spec.allowed_lateness, event_time=self.event_time)
        self.late_tag = spec.late_tag
        self.assigner = assigner
        self.tumbling = assigner if isinstance(assigner, TumblingWindows) else None
        self.gap = assigner.gap if isinstance(assigner, EventTimeSessionWindows) else None
        self.windows: MapState[Bounds, Any] | None = None
        self.timers: TimerService | MovingTimers | None = None
        #: The memory backend's table of windows (``key -> {(start, end): acc}``),
        #: which the hot paths read and write directly; ``None`` otherwise.
        self.heap: dict[Any, dict[Bounds, Any]] | None = None
        #: Late records dropped (no side output), as Flink's numLateRecordsDropped.
        self.late_dropped = 0

    def open(self) -> None:
        backend = self.backend = self.ctx.keyed_backend()
        self.windows = MapState(backend, WINDOW_STATE)
        self.changes = backend.changes(WINDOW_STATE)
        self.heap = backend.plain_table(WINDOW_STATE)
        # Sessions move their timers with nearly every record: on the memory
        # backend they get timers whose index allows that cheaply. Fixed
        # windows share their times across keys, which TimerService's
        # index is built for (measured: 30% faster tumbling windows).
        self.timers = (MovingTimers(backend, self.domain)
                       if self.heap is not None and self.merging
                       else TimerService(backend, self.ctx.clock.now, lambda: self.watermark))

    # -- records -----------------------------------------------------------

    def process(self, batch: list[Any]) -> list[Any]:
        if self.event_time:
            raise TypeError(
                f"operator '{self.uid}': event-time windows need records with timestamps; "
                "call assign_timestamps_and_watermarks(...) before key_by(...).window(...)")
        return self._add(batch, None)

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        if timestamps is None:
            return self.process(batch), None
        out = self._add(batch, timestamps)
        return out, getattr(out, "timestamps", None)

    def _add(self, batch: list[Any], timestamps: list[Any] | None) -> list[Any]:
        if self.heap is not None:
            if self.gap is not None:
                return self._add_sessions_heap(batch, timestamps, self.gap)
            if self.tumbling is not None:
                return self._add_tumbling_heap(batch, timestamps, self.tumbling)
        backend, windows = self.backend, self.windows
        assert backend is not None and windows is not None
        kf, assign, adapter = self.key_fn, self.assigner.assign, self.adapter
        first, add = adapter.first, adapter.add
        lateness, merging = self.lateness, self.merging
        get, put = windows.get, windows.put
        # Event time: the watermark from before the batch; processing time:
        # the clock now (a window is never late in processing time).
        now = self.watermark if self.event_time else self.ctx.clock.now()
        out: list[Any] = []
        stamps: list[Any] = []
        missing = _MISSING
        i = 0
        k: Any = None
        try:
            for i, r in enumerate(batch):
                k = kf(r)
                check_key(k)
                t = timestamps[i] if timestamps is not None else now
                backend.current_key = k
                if merging:
                    self._add_to_session(k, r, t, now, out, stamps)
                    continue
                kept, late = route_record(t, assign(t), now, lateness)
                for window in kept:
                    w = (window.start, window.end)
                    acc = get(w, missing)
                    if acc is missing:
                        put(w, first(r))
                        self._register(window, now)
                    else:
                        put(w, add(acc, r))
                    if fires_on_element(window, now):  # late within the lateness: fire again
                        self._fire(k, w, out, stamps)
                if late:
                    self._late(r, t, now, out, stamps)
        except Exception as exc:
            self.record_failure(batch, i, exc, k)
            raise
        return timestamped(out, stamps) if out else out

    # -- the memory backend's hot paths ------------------------------------
    #
    # The same decisions as ``_add`` and ``_add_to_session``, made on the
    # backend's dicts rather than through the state handles and per-record
    # method calls, which were most of the operator's time (pyinstrument on
    # benchmarks/windows.py: handles, timer bookkeeping and ``_open`` took
    # 4/5 of a session window's time). What is unusual (several sessions of
    # a key, a late record) takes the general path. A batch's written keys
    # are recorded at once, as the keyed operators do.

    def _add_tumbling_heap(self, batch: list[Any], timestamps: list[Any] | None,
                           assigner: TumblingWindows) -> list[Any]:
        table, timers = self.heap, self.timers
        assert table is not None and timers is not None
        kf, first, add = self.key_fn, self.adapter.first, self.adapter.add
        lateness, domain, register = self.lateness, self.domain, timers.register
        assign = assigner.assign
        now = self.watermark if self.event_time else self.ctx.clock.now()
        out: list[Any] = []
        stamps: list[Any] = []
        seen: list[Any] = []
        mark = seen.append
        missing = _MISSING
        # The last window a record fell in (most records of a batch share it)
        # and the lifecycle's decisions for it at ``now``, taken once per
        # window rather than per record: [start, end) holds exactly the
        # timestamps ``assign`` puts there. The window before it is kept too:
        # near a window's end, out-of-order records alternate between two.
        start, end, w = 1.0, 0.0, (1.0, 0.0)
        late = refire = False
        times: list[float] = []
        before: tuple[float, float, Bounds, bool, bool, list[float]] = (
            1.0, 0.0, w, False, False, times)
        i = 0
        k: Any = None
        try:
            for i, r in enumerate(batch):
                k = kf(r)
                t = timestamps[i] if timestamps is not None else now
                if not start <= t < end:
                    current = (start, end, w, late, refire, times)
                    if before[0] <= t < before[1]:
                        start, end, w, late, refire, times = before
                    else:
                        (window,) = assign(t)
                        start, end = w = (window.start, window.end)
                        late = is_window_late(window, now, lateness)
                        refire = fires_on_element(window, now)
                        times = timers_to_register(window, now, lateness)
                    before = current
                if late:
                    self._late(r, t, now, out, stamps)
                    continue
                m = table.get(k)
                if m is None:
                    check_key(k)
                    acc = first(r)
                    table[k] = m = {w: acc}
                    fresh = True
                else:
                    acc = m.get(w, missing)
                    fresh = acc is missing
                    acc = m[w] = first(r) if fresh else add(acc, r)
                mark(k)
                if fresh:
                    for time in times:
                        register(domain, time, k)
                if refire:  # late within the allowed lateness: fire again
                    self._emit(k, w, acc, out, stamps, mark)
        except Exception as exc:
            self.record_failure(batch, i, exc, k)
            raise
        finally:
            if seen and self.changes.keys is not None:
                self.changes.add_batch(seen)
        return timestamped(out, stamps) if out else out

    def _add_sessions_heap(self, batch: list[Any], timestamps: list[Any] | None,
                           gap: float) -> list[Any]:
        table, timers, backend = self.heap, self.timers, self.backend
        assert table is not None and isinstance(timers, MovingTimers) and backend is not None
        kf, first, add = self.key_fn, self.adapter.first, self.adapter.add
        lateness, domain = self.lateness, self.domain
        register, move, delete = timers.register, timers.move, timers.delete
        now = self.watermark if self.event_time else self.ctx.clock.now()
        # The lifecycle at ``now``: a session ending at or before ``fired``
        # fires on its record, one ending at or before ``gone`` is late.
        fired, gone = horizon(now, lateness)
        out: list[Any] = []
        stamps: list[Any] = []
        seen: list[Any] = []
        mark = seen.append
        i = 0
        k: Any = None
        try:
            for i, r in enumerate(batch):
                k = kf(r)
                t = timestamps[i] if timestamps is not None else now
                if type(t) is not float:
                    t = float(t)  # so that bounds and timer times are floats
                m = table.get(k)
                ne = t + gap
                if m is None:
                    check_key(k)
                    meets = 0
                elif len(m) == 1:
                    ((w, acc),) = m.items()
                    meets = 1 if w[0] <= ne and t <= w[1] else 0
                else:
                    # The key's sessions that the record's window meets (as
                    # merge_bounds; they do not meet each other).
                    hit = [w for w in m if w[0] <= ne and t <= w[1]]
                    meets = len(hit)
                    if meets == 1:
                        w = hit[0]
                        acc = m[w]
                # One session met: it grows. With other sessions beside it and
                # a lateness, a timer may be shared with them (a cleanup time
                # that is another's end): the general path sorts that out.
                if meets == 1 and m is not None and (len(m) == 1 or not lateness):
                    s, e = w
                    # The cover, as merge_bounds: min/max keep the first of equals.
                    ns = s if s < t else t
                    if e > ne:
                        ne = e
                    if ne <= gone:
                        self._late(r, t, now, out, stamps)
                        continue
                    acc = add(acc, r)
                    if ns == s and ne == e:
                        m[w] = acc
                    else:
                        w = (ns, ne)
                        if len(m) == 1:
                            # A fresh dict rather than a delete and an insert,
                            # whose deleted slot later lookups would skip.
                            table[k] = {w: acc}
                        else:
                            del m[(s, e)]
                            m[w] = acc
                        if ne != e:
                            # The old end's timers move to the new end (no
                            # other window has them); a fire time already
                            # passed fires below instead. The cleanup time
                            # first: the new fire time may be the old cleanup.
                            if lateness:
                                move(domain, cleanup_at(e, lateness),
                                     cleanup_at(ne, lateness), k)
                            if ne > fired:
                                move(domain, e, ne, k)
                            else:
                                delete(domain, e, k)
                    mark(k)
                    if ne <= fired:
                        self._emit(k, w, acc, out, stamps, mark)
                    continue
                if meets == 0:
                    # A session of its own: the key's first, or one beside
                    # (before or after) the key's sessions.
                    if ne <= gone:
                        self._late(r, t, now, out, stamps)
                        continue
                    w = (t, ne)
                    acc = first(r)
                    if m is None:
                        table[k] = {w: acc}
                    else:
                        m[w] = acc
                    mark(k)
                    for time in timers_to_register(TimeWindow(t, ne), now, lateness):
                        register(domain, time, k)
                    if ne <= fired:
                        self._emit(k, w, acc, out, stamps, mark)
                    continue
                backend.current_key = k
                self._add_to_session(k, r, t, now, out, stamps)
        except Exception as exc:
            self.record_failure(batch, i, exc, k)
            raise
        finally:
            if seen and self.changes.keys is not None:
                self.changes.add_batch(seen)
        return timestamped(out, stamps) if out else out

    def _emit(self, key: Any, w: Bounds, acc: Any, out: list[Any], stamps: list[Any],
              mark: Callable[[Any], None]) -> None:
        """Fire ``key``'s window ``w`` whose accumulator is ``acc``."""
        if type(acc) not in SCALARS:
            mark(key)  # the function may change it in place, as any state lent out
        end = float(w[1])
        results = self.adapter.result_for(key, float(w[0]), end, acc)
        if results:
            out.extend(results)
            stamp = math.nextafter(end, -_INF) if self.event_time else None
            stamps.extend([stamp] * len(results))

    def _add_to_session(self, k: Any, r: Any, t: float, now: float,
                        out: list[Any], stamps: list[Any]) -> None:
        windows, timers, adapter = self.windows, self.timers, self.adapter
        assert windows is not None and timers is not None
        lateness = self.lateness
        current = _open(windows)
        (assigned,) = self.assigner.assign(t)
        window, members = merge_bounds(current, (assigned.start, assigned.end))
        merged = TimeWindow(*window)
        if not route_record(t, [merged], now, lateness)[0]:
            # The session the record would join is gone (or it would open a
            # new one that is complete already): late.
            self._late(r, t, now, out, stamps)
            return
        if window in members:
            acc = adapter.add(windows.get(window), r)
            windows.put(window, acc)
        else:
            acc = None
            for m in members:  # ordered by start: the earlier session's first
                part = windows.get(m)
                acc = part if acc is None else adapter.merge(acc, part)
                windows.remove(m)
            acc = adapter.first(r) if acc is None else adapter.add(acc, r)
            windows.put(window, acc)
            self._retire_timers(members, window, _open(windows), now)
            self._register(merged, now)
        if fires_on_element(merged, now):
            self._fire(k, window, out, stamps)

    def _late(self, r: Any, t: float, now: float, out: list[Any], stamps: list[Any]) -> None:
        if self.late_tag is None:
            self.late_dropped += 1
            return
        out.append(SideRecord(self.late_tag, r))
        stamps.append(t if self.event_time else None)

    # -- timers ------------------------------------------------------------

    def _times(self, w: Bounds) -> list[float]:
        """All the timers window ``w`` has (fire and cleanup, once each)."""
        return timers_to_register(TimeWindow(*w), -_INF, self.lateness)

    def _register(self, window: TimeWindow, now: float) -> None:
        """A window's timers still ahead of ``now``."""
        timers = self.timers
        assert timers is not None
        register = (timers.register_event_time_timer if self.event_time
                    else timers.register_processing_time_timer)
        for t in timers_to_register(window, now, self.lateness):
            register(t)

    def _retire_timers(self, retired: tuple[Bounds, ...], window: Bounds,
                       remaining: list[Bounds], now: float) -> None:
        """Delete the timers of merged-away sessions that no window of the
        key still needs (the timers are per key and time, not per window)."""
        timers = self.timers
        assert timers is not None
        needed = {t for w in remaining for t in self._times(w)}
        delete = (timers.delete_event_time_timer if self.event_time
                  else timers.delete_processing_time_timer)
        for m in retired:
            if m == window:
                continue
            for t in self._times(m):
                if t not in needed:
                    delete(t)

    def _fire(self, key: Any, w: Bounds, out: list[Any], stamps: list[Any]) -> None:
        windows = self.windows
        assert windows is not None
        window = TimeWindow(*w)
        results = self.adapter.result(key, window, windows.get(w))
        if results:
            out.extend(results)
            stamp = window.max_timestamp if self.event_time else None
            stamps.extend([stamp] * len(results))

    def _on_time(self, until: float) -> list[Any]:
        """Run the timers due at ``until``: fire the windows that end at a
        timer's time, drop those whose cleanup time has come."""
        if self.heap is not None:
            return self._on_time_heap(until, self.heap)
        timers, windows = self.timers, self.windows
        assert timers is not None and windows is not None
        lateness = self.lateness
        out: list[Any] = []
        stamps: list[Any] = []
        for t, key in timers.pop_due(self.domain, until):
            for w in sorted(_open(windows), key=_by_end):
                action = on_timer(TimeWindow(*w), t, lateness)
                if action.fire:
                    self._fire(key, w, out, stamps)
                if action.purge:
                    windows.remove(w)
        return timestamped(out, stamps) if out else out

    def _on_time_heap(self, until: float, table: dict[Any, dict[Bounds, Any]]) -> list[Any]:
        """``_on_time`` on the memory backend's table."""
        timers = self.timers
        assert timers is not None
        lateness = self.lateness
        out: list[Any] = []
        stamps: list[Any] = []
        seen: list[Any] = []
        mark = seen.append
        emit = self._emit
        # ``on_timer``'s decisions, on the horizon of the timer's time, made
        # once per time (timers come in time order, and many keys share one).
        at, fired, gone = None, _INF, -_INF
        try:
            for t, key in timers.pop_due(self.domain, until):
                m = table.get(key)
                if not m:
                    continue  # left behind by a merged session
                if t != at:
                    at = t
                    fired, gone = horizon(t, lateness)
                if len(m) == 1:
                    w = next(iter(m))
                    end = w[1]
                    if end == fired:
                        emit(key, w, m[w], out, stamps, mark)
                    if end <= gone:
                        table.pop(key, None)
                        mark(key)
                    continue
                for w in sorted(m, key=_by_end):
                    end = w[1]
                    if end == fired:
                        emit(key, w, m[w], out, stamps, mark)
                    if end <= gone:
                        del m[w]
                        mark(key)
                if not m:
                    table.pop(key, None)
        finally:
            if seen and self.changes.keys is not None:
                self.changes.add_batch(seen)
        return timestamped(out, stamps) if out else out

    def on_watermark(self, watermark: float) -> list[Any]:
        return self._on_time(watermark) if self.event_time else []

    def next_processing_time(self) -> float | None:
        if self.event_time or self.timers is None:
            return None
        return self.timers.next_time(PROCESSING_TIME)

    def on_processing_time(self, now: float) -> list[Any]:
        return [] if self.event_time else self._on_time(now)

    def end_input(self) -> list[Any]:
        # Event time has reached +inf already (the task sends it first);
        # processing-time windows still open fire now rather than be lost.
        return self._on_time(_INF)

    def restore_keyed(self, root: str, kinds: dict[str, str],
                      handles: list[KeyedStateHandle]) -> None:
        super().restore_keyed(root, kinds, handles)
        assert self.timers is not None
        self.timers.rebuild()


def _open(windows: MapState[Bounds, Any]) -> list[Bounds]:
    """The current key's windows, as float pairs: RocksDB encodes map keys
    canonically (``5.0`` and ``5`` are one key, as in a dict), so bounds
    with integral values come back as ints."""
    return [(float(s), float(e)) for s, e in windows.keys()]  # noqa: SIM118 - not a dict


def _by_end(w: Bounds) -> tuple[float, float]:
    return w[1], w[0]


_MISSING: Any = object()


@dataclass(frozen=True)
class WindowSpec(KeyedSpec):
    """The window operator's payload: ``key_by(key_fn).window(assigner)``
    with its lateness, late-data tag and function."""

    assigner: WindowAssigner
    adapter: WindowAdapter
    allowed_lateness: float = 0.0
    #: The name of the late side output's tag (``None``: late records are dropped).
    late_tag: str | None = None

    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        return _WindowOperator(ctx, self.key_fn, self)
