"""The window operator: ``key_by(...).window(assigner)...reduce/aggregate/
sum/count/process``, and the side output that takes its late records.

Everything the operator decides (which windows a record joins, when a
window fires, re-fires and is dropped, how sessions merge) is a pure
function in ``eddyflow.windowing``; this module only keeps the state those
functions act on, as keyed state of the operator's backend (memory or
RocksDB), so that it is checkpointed, restored at any parallelism and read
offline like any other keyed state:

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

Window results take the timestamp ``TimeWindow.max_timestamp`` (the last
float inside the window), so that a downstream window of the same size puts
a result in the same window, and a downstream operator does not see it as
late (its watermark is still the one before the window fired).

Late records (see ``windowing/lifecycle.py``) are dropped, or, with
``side_output_late_data(tag)``, emitted wrapped in a ``SideRecord``; the
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
from typing import Any, NamedTuple

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.keygroups import check_key
from eddyflow.runtime.exchange.events import timestamped
from eddyflow.runtime.operators.base import Operator, OperatorContext, _Keyed
from eddyflow.runtime.time.moving_timers import MovingTimers
from eddyflow.runtime.time.timers import EVENT_TIME, PROCESSING_TIME, TimerService
from eddyflow.state.handles import MapState
from eddyflow.values import SCALARS
from eddyflow.windowing.functions import WindowAdapter
from eddyflow.windowing.merging import merge_bounds
from eddyflow.windowing.windows import (
    EventTimeSessionWindows,
    OutputTag,
    TimeWindow,
    WindowAssigner,
    _Tumbling,
    window_index,
)

__all__ = ["WINDOW_STATE", "MainOutputSpec", "SideOutputSpec", "SideRecord", "WindowSpec"]

#: The map state windows are kept in (reserved, as the timers' ``_timers``).
WINDOW_STATE = "_windows"

_INF = math.inf

Bounds = tuple[float, float]


class SideRecord(NamedTuple):
    """A record for the side output ``tag`` (a tag's name), among the
    window operator's outputs until a side or main selection unwraps or
    drops it."""

    tag: str
    value: Any


def _bounds_function(assigner: WindowAssigner) -> Callable[[float], list[Bounds]]:
    """``timestamp -> [(start, end), ...]`` for ``assigner``, without making a
    ``TimeWindow`` per record (the operator's hot path); the same boundary
    arithmetic as the assigners' ``assign``."""
    if isinstance(assigner, _Tumbling):
        size, offset = assigner.size, assigner.offset

        def tumbling(t: float) -> list[Bounds]:
            k = window_index(t, offset, size)
            return [(offset + k * size, offset + (k + 1) * size)]
        return tumbling
    if isinstance(assigner, EventTimeSessionWindows):
        gap = assigner.gap
        return lambda t: [(t, t + gap)]
    return lambda t: [(w.start, w.end) for w in assigner.assign(t)]


class _WindowOperator(_Keyed):
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
        self.lateness = spec.allowed_lateness if self.event_time else 0.0
        self.late_tag = spec.late_tag
        self.bounds = _bounds_function(assigner)
        self.tumbling = assigner if isinstance(assigner, _Tumbling) else None
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
        backend, windows, timers = self.backend, self.windows, self.timers
        assert backend is not None and windows is not None and timers is not None
        kf, bounds, adapter = self.key_fn, self.bounds, self.adapter
        first, add = adapter.first, adapter.add
        lateness, merging = self.lateness, self.merging
        get, put = windows.get, windows.put
        event_time = self.event_time
        # Event time: the watermark from before the batch; processing time:
        # the clock now (a window is never late in processing time).
        now = self.watermark if event_time else self.ctx.clock.now()
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
                joined = False
                mine = bounds(t)
                for w in mine:
                    end = w[1]
                    if now >= end + lateness:
                        continue  # this window is gone: the record is late for it
                    joined = True
                    acc = get(w, missing)
                    if acc is missing:
                        put(w, first(r))
                        self._register(w, now)
                    else:
                        put(w, add(acc, r))
                    if now >= end:  # late within the allowed lateness: fire again
                        self._fire(k, w, out, stamps)
                # Late: too late for each of its windows, or, in a gap
                # between sliding windows, behind the watermark by more than
                # the lateness (``route_record``'s rule, as Flink).
                if not joined and (mine or t + lateness < now):
                    self._late(r, t, now, out, stamps)
        except Exception as exc:
            self._failed(batch, i, exc, k)
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
                           assigner: _Tumbling) -> list[Any]:
        table, timers = self.heap, self.timers
        assert table is not None and timers is not None
        kf, first, add = self.key_fn, self.adapter.first, self.adapter.add
        lateness, domain, register = self.lateness, self.domain, timers.register
        size, offset = assigner.size, assigner.offset
        now = self.watermark if self.event_time else self.ctx.clock.now()
        out: list[Any] = []
        stamps: list[Any] = []
        seen: list[Any] = []
        mark = seen.append
        missing = _MISSING
        # The last window a record fell in (most records of a batch share it):
        # [start, end) holds exactly the timestamps ``window_index`` puts there.
        start, end, w = 1.0, 0.0, (1.0, 0.0)
        i = 0
        k: Any = None
        try:
            for i, r in enumerate(batch):
                k = kf(r)
                t = timestamps[i] if timestamps is not None else now
                if not start <= t < end:
                    n = window_index(t, offset, size)
                    start, end = offset + n * size, offset + (n + 1) * size
                    w = (start, end)
                if now >= end + lateness:
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
                    if end > now:
                        register(domain, float(end), k)
                    if lateness and end + lateness > now:
                        register(domain, float(end + lateness), k)
                if now >= end:  # late within the allowed lateness: fire again
                    self._emit(k, w, acc, out, stamps, mark)
        except Exception as exc:
            self._failed(batch, i, exc, k)
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
                    if now >= ne + lateness:
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
                                move(domain, e + lateness, ne + lateness, k)
                            if ne > now:
                                move(domain, e, ne, k)
                            else:
                                delete(domain, e, k)
                    mark(k)
                    if now >= ne:
                        self._emit(k, w, acc, out, stamps, mark)
                    continue
                if meets == 0:
                    # A session of its own: the key's first, or one beside
                    # (before or after) the key's sessions.
                    if now >= ne + lateness:
                        self._late(r, t, now, out, stamps)
                        continue
                    w = (t, ne)
                    acc = first(r)
                    if m is None:
                        table[k] = {w: acc}
                    else:
                        m[w] = acc
                    mark(k)
                    if ne > now:
                        register(domain, ne, k)
                    if lateness and ne + lateness > now:
                        register(domain, ne + lateness, k)
                    if now >= ne:
                        self._emit(k, w, acc, out, stamps, mark)
                    continue
                backend.current_key = k
                self._add_to_session(k, r, t, now, out, stamps)
        except Exception as exc:
            self._failed(batch, i, exc, k)
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
        new = self.bounds(t)[0]
        window, members = merge_bounds(current, new)
        if now >= window[1] + lateness:
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
            self._register(window, now)
        if now >= window[1]:
            self._fire(k, window, out, stamps)

    def _late(self, r: Any, t: float, now: float, out: list[Any], stamps: list[Any]) -> None:
        if self.late_tag is None:
            self.late_dropped += 1
            return
        out.append(SideRecord(self.late_tag, r))
        stamps.append(t if self.event_time else None)

    # -- timers ------------------------------------------------------------

    def _times(self, w: Bounds) -> tuple[float, ...]:
        end = w[1]
        cleanup = end + self.lateness
        return (end,) if cleanup == end else (end, cleanup)

    def _register(self, w: Bounds, now: float) -> None:
        """A window's fire and cleanup timers, those still ahead of ``now``
        (a fire time already reached: the record fires the window at once)."""
        timers = self.timers
        assert timers is not None
        register = (timers.register_event_time_timer if self.event_time
                    else timers.register_processing_time_timer)
        for t in self._times(w):
            if t > now:
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
                end = w[1]
                if end == t:
                    self._fire(key, w, out, stamps)
                if end + lateness <= t:
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
        try:
            for t, key in timers.pop_due(self.domain, until):
                m = table.get(key)
                if not m:
                    continue  # left behind by a merged session
                if len(m) == 1:
                    w = next(iter(m))
                    end = w[1]
                    if end == t:
                        emit(key, w, m[w], out, stamps, mark)
                    if end + lateness <= t:
                        table.pop(key, None)
                        mark(key)
                    continue
                for w in sorted(m, key=_by_end):
                    end = w[1]
                    if end == t:
                        emit(key, w, m[w], out, stamps, mark)
                    if end + lateness <= t:
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
class WindowSpec:
    """The window operator's payload: ``key_by(key_fn).window(assigner)``
    with its lateness, late-data tag and function."""

    key_fn: Callable[[Any], Any]
    assigner: WindowAssigner
    adapter: WindowAdapter
    allowed_lateness: float = 0.0
    #: The name of the late side output's tag (``None``: late records are dropped).
    late_tag: str | None = None

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _WindowOperator(ctx, self.key_fn, self)


class _SelectSide(Operator):
    """The records of one side output, unwrapped (with their timestamps)."""

    pure = True

    def __init__(self, ctx: OperatorContext, tag: str | None) -> None:
        super().__init__(ctx)
        self.tag = tag

    def process(self, batch: list[Any]) -> list[Any]:
        return self.process_ts(batch, None)[0]

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        tag = self.tag
        picked = [i for i, r in enumerate(batch)
                  if (type(r) is SideRecord) == (tag is not None)
                  and (tag is None or r.tag == tag)]
        out = ([batch[i] for i in picked] if tag is None
               else [batch[i].value for i in picked])
        if timestamps is None:
            return out, None
        return out, [timestamps[i] for i in picked]

    def output_counts(self, batch: list[Any]) -> list[int] | None:
        tag = self.tag
        return [int((type(r) is SideRecord) == (tag is not None)
                    and (tag is None or r.tag == tag)) for r in batch]


@dataclass(frozen=True)
class SideOutputSpec:
    """``get_side_output(tag)``: the records the operator before put in ``tag``."""

    tag: OutputTag

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _SelectSide(ctx, self.tag.name)


@dataclass(frozen=True)
class MainOutputSpec:
    """The main output of an operator with side outputs: its records that
    are not side records."""

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _SelectSide(ctx, None)
