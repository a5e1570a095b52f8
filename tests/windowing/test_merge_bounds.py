"""``merge_bounds`` (the window operator's hot-path merge on ``(start,
end)`` pairs) agrees with ``add_window`` on random session windows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from eddyflow.windowing import TimeWindow, add_window
from eddyflow.windowing.merging import merge_bounds


@given(st.lists(st.integers(0, 60), max_size=25), st.integers(0, 60), st.integers(1, 8))
def test_merge_bounds_equals_add_window(starts: list[int], new: int, gap: int) -> None:
    windows: list[TimeWindow] = []
    for t in starts:  # a key's sessions, built record by record
        windows = list(add_window(windows, TimeWindow(t / 2, t / 2 + gap)).windows)
    result = add_window(windows, TimeWindow(new / 2, new / 2 + gap))
    window, members = merge_bounds([(w.start, w.end) for w in windows], (new / 2, new / 2 + gap))
    assert window == (result.window.start, result.window.end)
    assert members == tuple((w.start, w.end) for w in result.members)
