"""Session window merging (Flink's ``MergingWindowSet`` and
``TimeWindow.mergeWindows``), as pure functions over plain windows.

A key's session windows are kept pairwise non-intersecting. A new record
brings the window ``[t, t + gap)``; ``add_window`` says which of the key's
windows it merges with (all that intersect it, transitively: one late
record can bridge two sessions, and a record can arrive before the ones it
precedes) and what the key's windows are afterwards. The window operator
then merges the accumulators of ``members`` with the window function's
``merge`` into one accumulator stored under ``window``, deletes the others
and moves their timers. Unlike Flink, there is no "state window"
indirection (Flink keeps each merged window's state under the namespace of
one of its members, to avoid copying RocksDB state): eddyflow's
accumulators are single values, so the operator simply re-files the merged
accumulator under the merged window.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from eddyflow.windowing.windows import TimeWindow

__all__ = ["MergeResult", "add_window", "merge_bounds", "merge_windows"]


def merge_windows(windows: Iterable[TimeWindow]) -> list[tuple[TimeWindow, list[TimeWindow]]]:
    """Groups windows into maximal chains of intersecting ones (overlapping or
    touching, ``TimeWindow.intersects``): ``[(cover, members), ...]`` with
    members and groups ordered by start. One sweep over the windows sorted
    by start: a window joins the current group iff it starts at or before
    the group's end so far, which catches chains (A meets B, B meets C)
    whatever order the windows came in."""
    groups: list[tuple[TimeWindow, list[TimeWindow]]] = []
    for w in sorted(windows):
        if groups and groups[-1][0].intersects(w):
            cover, members = groups[-1]
            members.append(w)
            groups[-1] = (cover.cover(w), members)
        else:
            groups.append((w, [w]))
    return groups


@dataclass(frozen=True)
class MergeResult:
    """The outcome of adding one window to a key's session windows.

    ``window``: the window the new record belongs to now (the new window
    itself, an existing window containing it, or a merge).
    ``members``: the key's *previous* windows that ``window`` is made of,
    ordered by start; it contains ``window`` itself when that already
    existed. Their accumulators merge, in this order, into ``window``'s.
    Empty when the new window touched nothing.
    ``windows``: all the key's windows afterwards, ordered, pairwise
    non-intersecting.
    """

    window: TimeWindow
    members: tuple[TimeWindow, ...]
    windows: tuple[TimeWindow, ...]

    @property
    def existed(self) -> bool:
        """``window`` was already one of the key's windows, unchanged."""
        return self.window in self.members

    @property
    def retired(self) -> tuple[TimeWindow, ...]:
        """Previous windows that no longer exist: their state and timers go."""
        return tuple(w for w in self.members if w != self.window)


def add_window(current: Iterable[TimeWindow], new: TimeWindow) -> MergeResult:
    """Adds ``new`` to a key's ``current`` session windows (pairwise
    non-intersecting, in any order) and merges what intersects."""
    previous = set(current)
    # ``new`` goes through the same sweep as the rest; the set union makes an
    # exact duplicate of an existing window one window (then ``existed``).
    result_windows: list[TimeWindow] = []
    window: TimeWindow | None = None
    members: tuple[TimeWindow, ...] = ()
    for cover, group in merge_windows(previous | {new}):
        result_windows.append(cover)
        if new in group:
            window = cover
            members = tuple(w for w in group if w in previous)
    assert window is not None  # ``new`` is in exactly one group
    return MergeResult(window, members, tuple(result_windows))


def merge_bounds(current: list[tuple[float, float]], new: tuple[float, float]
                 ) -> tuple[tuple[float, float], tuple[tuple[float, float], ...]]:
    """``add_window`` on ``(start, end)`` pairs, for the window operator's
    hot path: ``(window, members)`` as in ``MergeResult``, without building
    the key's resulting windows. One pass is enough: the key's windows are
    pairwise non-intersecting, so a window meeting the cover of ``new`` and
    its members would meet one of the members (or ``new``) itself."""
    start, end = new
    members = sorted(w for w in current if w[0] <= end and start <= w[1])
    if members:
        start = min(start, members[0][0])
        end = max(end, max(w[1] for w in members))
    return (start, end), tuple(members)
