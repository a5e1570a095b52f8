"""A plain-Python reference of event-time windows, independent of eddyflow.

It imports nothing from eddyflow on purpose: it exists to check eddyflow's
windowing (the primitives now, the window operator later). It keeps every
element of every window and computes a window's value from the elements when
it fires; eddyflow keeps accumulators. Rules (the contract in
``eddyflow/windowing/watermarks.py`` and ``lifecycle.py``, restated here
from the documentation, not from the code):

* the watermark ``W`` after a record is ``max timestamp so far - max_delay``
  (``-inf`` before the first record) and ``+inf`` after the last; a record
  is handled under the watermark from before it;
* a record goes to each of its windows ``[s, e)`` with ``e + L > W``; a
  window fires when ``W`` reaches ``e`` (as ``W`` crosses it, or at once when
  a record joins a window with ``e <= W``), and is gone once ``W >= e + L``;
* a record that no window takes goes to the late output if it was assigned
  a window, or if ``t + L < W``;
* sessions: ``[t, t + gap)`` joins every session of the key it overlaps or
  touches; the record is late iff the joined session has ``e + L <= W``;
  the joined session's elements are its parts' by start, then the record.

Window kinds: ``("tumbling", size, offset)``, ``("sliding", size, slide,
offset)``, ``("session", gap)``. Aggregates: ``"sum"``, ``"count"``,
``"max"``, ``"mean"`` and ``"elements"`` (the tuple of elements), each
emitted as ``(key, start, end, value)``.
"""

from __future__ import annotations

import math
from typing import Any

Event = tuple[Any, float, Any]
Emitted = tuple[Any, float, float, Any]


def _value(aggregate: str, values: list[Any]) -> Any:
    if aggregate == "sum":
        return sum(values[1:], values[0])
    if aggregate == "count":
        return len(values)
    if aggregate == "max":
        return max(values)
    if aggregate == "mean":
        return sum(values) / len(values)
    if aggregate == "elements":
        return tuple(values)
    raise ValueError(aggregate)


def _windows_of(kind: tuple[Any, ...], t: float) -> list[tuple[float, float]]:
    if kind[0] == "tumbling":
        _, size, offset = kind
        n = (t - offset) // size
        return [(offset + n * size, offset + (n + 1) * size)]
    if kind[0] == "sliding":
        _, size, slide, offset = kind
        found = []
        n = (t - offset) // slide
        # every start offset + n*slide with start <= t < start + size
        while offset + n * slide + size > t:
            found.append((offset + n * slide, offset + n * slide + size))
            n -= 1
        return sorted(found)
    raise ValueError(kind)


def reference(events: list[Event], *, max_delay: float, kind: tuple[Any, ...],
              allowed_lateness: float, aggregate: str) -> tuple[list[Emitted], list[Event]]:
    """``(emitted, late)`` for ``events`` in arrival order."""
    lateness = allowed_lateness
    emitted: list[Emitted] = []
    late: list[Event] = []
    # key -> {(start, end): [values in the order they joined]}
    open_windows: dict[Any, dict[tuple[float, float], list[Any]]] = {}
    watermark = -math.inf
    max_ts = -math.inf

    def emit(key: Any, w: tuple[float, float]) -> None:
        emitted.append((key, w[0], w[1], _value(aggregate, open_windows[key][w])))

    def advance(new: float) -> None:
        nonlocal watermark
        if new <= watermark:
            return
        old, watermark = watermark, new
        for key, wins in open_windows.items():
            for w in sorted(wins, key=lambda w: (w[1], w[0])):
                if old < w[1] <= new:
                    emit(key, w)
            for w in [w for w in wins if w[1] + lateness <= new]:
                del wins[w]

    for event in events:
        key, t, v = event
        wins = open_windows.setdefault(key, {})
        if kind[0] == "session":
            start, end = t, t + kind[1]
            parts = sorted(w for w in wins if w[0] <= end and start <= w[1])
            start = min([start] + [w[0] for w in parts])
            end = max([end] + [w[1] for w in parts])
            if end + lateness <= watermark:
                late.append(event)
            else:
                values = [x for w in parts for x in wins.pop(w)] + [v]
                wins[(start, end)] = values
                if end <= watermark:
                    emit(key, (start, end))
        else:
            mine = _windows_of(kind, t)
            taken = [w for w in mine if w[1] + lateness > watermark]
            if not taken and (mine or t + lateness < watermark):
                late.append(event)
            for w in taken:
                wins.setdefault(w, []).append(v)
                if w[1] <= watermark:
                    emit(key, w)
        max_ts = max(max_ts, t)
        advance(max_ts - max_delay)
    advance(math.inf)
    return emitted, late


def processing_time_reference(events: list[Event], *, size: float,
                              aggregate: str) -> list[Emitted]:
    """Tumbling processing-time windows: ``events`` are ``(key, arrival
    time, value)`` with non-decreasing arrival times; before a record is
    handled the clock moves to its arrival time, firing (and dropping) every
    window with ``end <= clock``; after the last record every window fires."""
    emitted: list[Emitted] = []
    open_windows: dict[tuple[Any, float, float], list[Any]] = {}

    def advance(clock: float) -> None:
        for w in sorted(open_windows, key=lambda w: w[2]):
            if w[2] <= clock:
                emitted.append((*w, _value(aggregate, open_windows.pop(w))))

    for key, now, v in events:
        advance(now)
        n = now // size
        open_windows.setdefault((key, n * size, (n + 1) * size), []).append(v)
    advance(math.inf)
    return emitted
