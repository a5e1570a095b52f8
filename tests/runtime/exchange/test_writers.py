"""Keyed partitioning (``KeyGroupWriter``): a batch routed whole goes where
routing a record at a time sends it (``key -> stable hash -> key group ->
subtask``), for every kind of key, with its timestamps, and a failing key
selector or key is still named by its record's position in the batch."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyflow.keygroups import UnsupportedKeyError, key_group_for, subtask_for_key_group
from eddyflow.runtime.exchange.channel import Channel
from eddyflow.runtime.exchange.writers import KeyGroupWriter, KeyRoutingError

MP = 128


def _writer(p: int, key_fn: Any = lambda r: r[0]) -> KeyGroupWriter:
    return KeyGroupWriter([Channel(f"c{i}", None) for i in range(p)], 1 << 20, "a -> b",
                          key_fn, MP)


def _expected(records: list[Any], p: int) -> list[list[Any]]:
    out: list[list[Any]] = [[] for _ in range(p)]
    for r in records:
        out[subtask_for_key_group(key_group_for(r[0], MP), MP, p)].append(r)
    return out


KEYS = st.one_of(
    st.lists(st.text(max_size=8), max_size=200),
    st.lists(st.integers(-(2**70), 2**70), max_size=200),  # some beyond 64 bits
    st.lists(st.one_of(st.booleans(), st.integers(-5, 5)), max_size=200),
    st.lists(st.tuples(st.text(max_size=3), st.integers(0, 3)), max_size=200),
    st.lists(st.one_of(st.text(max_size=3), st.integers(), st.floats(allow_nan=False),
                       st.none()), max_size=200),
)


@settings(max_examples=200, deadline=None)
@given(KEYS, st.sampled_from([2, 3, 7]), st.booleans())
def test_a_batch_goes_where_each_of_its_records_would(keys: list[Any], p: int,
                                                      stamped: bool) -> None:
    records = [(k, i) for i, k in enumerate(keys)]
    w = _writer(p)
    stamps = [float(i) for i in range(len(records))] if stamped else None
    w.add(records, None, stamps)
    w.add(records[:3], None, stamps[:3] if stamps is not None else None)  # record at a time
    expected = _expected(records + records[:3], p)
    assert [list(b) for b in w.buffers] == expected
    if stamped:
        for buf in w.buffers:
            assert buf.timestamps == [float(r[1]) for r in buf]


def test_records_with_and_without_timestamps_keep_theirs() -> None:
    w = _writer(3)
    first = [(f"k{i}", i) for i in range(100)]
    w.add(first, None)
    second = [(f"k{i}", 100 + i) for i in range(100)]
    w.add(second, None, [float(100 + i) for i in range(100)])
    for buf in w.buffers:
        assert buf.timestamps == [None if r[1] < 100 else float(r[1]) for r in buf]


def test_a_failing_key_selector_is_named_by_its_record() -> None:
    def key(r: int) -> int:
        if r == 137:
            raise ValueError("no key for 137")
        return r

    w = _writer(2, key)
    with pytest.raises(KeyRoutingError) as caught:
        w.add(list(range(300)), None)
    assert (caught.value.index, caught.value.record) == (137, 137)
    assert isinstance(caught.value.__cause__, ValueError)


@pytest.mark.parametrize("bad", [["a", "list"], frozenset({1})])
def test_a_key_without_a_stable_hash_is_named_by_its_record(bad: Any) -> None:
    records: list[Any] = [(f"k{i}",) for i in range(200)]
    records[150] = (bad,)
    w = _writer(2)
    with pytest.raises(KeyRoutingError) as caught:
        w.add(records, None)
    assert caught.value.index == 150
    assert isinstance(caught.value.__cause__, UnsupportedKeyError)
