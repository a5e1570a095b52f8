"""Batch spans: where a batch's records were read, widened as batches merge.

An error downstream of an exchange names the source positions of the batch
it failed in; the span of a merged batch must cover every input batch, per
source, and merging must never change a span another batch still holds.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from eddyflow.runtime.exchange.events import Span, merge_span


@st.composite
def ordered_spans(draw: st.DrawFn) -> list[Span | None]:
    """Spans of consecutive batches, each source's positions increasing."""
    labels = ["a", "b", "c"]
    pos = dict.fromkeys(labels, 0)
    out: list[Span | None] = []
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.booleans()) and out:
            out.append(None)  # a batch without a known origin
            continue
        chosen = draw(st.lists(st.sampled_from(labels), min_size=1, max_size=3, unique=True))
        parts = []
        for label in chosen:
            n = draw(st.integers(1, 5))
            parts.append((label, pos[label], pos[label] + n))
            pos[label] += n
        out.append(tuple(parts))
    return out


@given(ordered_spans())
def test_merged_span_covers_every_input_per_source(spans: list[Span | None]) -> None:
    before = [None if s is None else tuple(s) for s in spans]
    merged: Span | None = None
    for s in spans:
        merged = merge_span(merged, s)
    want: dict[str, list[Any]] = {}
    for s in spans:
        for label, first, end in s or ():
            cur = want.setdefault(label, [first, end])
            cur[0], cur[1] = min(cur[0], first), end
    if not want:
        assert merged is None
    else:
        assert merged is not None
        assert {label: [first, end] for label, first, end in merged} == want
        assert len({label for label, _, _ in merged}) == len(merged)
    assert spans == before  # inputs are shared, never changed


def test_merge_keeps_none_and_shares_the_only_span() -> None:
    s: Span = (("src (subtask 1 of 2)", 0, 10),)
    assert merge_span(None, None) is None
    assert merge_span(s, None) is s
    assert merge_span(None, s) is s
    assert merge_span(s, s) is s
    assert merge_span(s, (("src (subtask 1 of 2)", 10, 20),)) == (("src (subtask 1 of 2)", 0, 20),)
