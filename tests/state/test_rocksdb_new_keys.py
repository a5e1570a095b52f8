"""RocksDB value tables on keys seen for the first time: the key filter that
spares them a read, the eviction that writes the whole cache, and removals
remembered through both; every result compared with the memory backend's,
through incremental checkpoints and restores."""

from __future__ import annotations

import asyncio
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eddyflow as ef
from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.state.abc import KeyedStateBackend, SnapshotTarget
from eddyflow.state.handles import ValueState
from eddyflow.state.rocksdb.backend import RocksDBKeyedStateBackend
from eddyflow.state.rocksdb.filter import KeyFilter
from eddyflow.state.rocksdb.keys import StatePrefix
from eddyflow.state.rocksdb.tables import ValueTable

MP = 128

scalar_keys = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                        st.text(max_size=12), st.binary(max_size=12))
any_keys = st.recursive(scalar_keys, lambda inner: st.tuples(inner, inner), max_leaves=4)


# -- the filter ----------------------------------------------------------------------


@given(st.lists(any_keys, max_size=200), st.lists(any_keys, max_size=50), any_keys)
def test_a_key_added_any_way_is_never_reported_absent(many: list[Any], batch: list[Any],
                                                      one: Any) -> None:
    f = KeyFilter(16)
    f.add_many(many)
    f.test_and_add(batch)
    f.test_and_add_one(one)
    added = [*many, *batch, one]
    assert all(f.test_and_add(added))
    assert all(f.test_and_add_one(k) for k in added)


def test_equal_keys_are_one_key_to_the_filter() -> None:
    f = KeyFilter()
    f.add_many([1, "red", (2, "a")])
    assert f.test_and_add([1.0, True]) == [True, True]
    assert f.test_and_add_one(Color.RED) and f.test_and_add_one((2.0, "a"))


def test_test_and_add_reports_new_keys_once_and_the_filter_grows() -> None:
    f = KeyFilter(1 << 14)
    first = [f.test_and_add(list(range(i, i + 1000))) for i in range(0, 200_000, 1000)]
    assert f.nbytes > (1 << 14) * 4  # it grew past its first capacity
    assert all(all(again) for again in (f.test_and_add(list(range(i, i + 1000)))
                                        for i in range(0, 200_000, 1000)))
    # Ints hash to themselves: the false maybes are the same in every run.
    false_maybes = sum(map(sum, first))
    assert false_maybes < 0.01 * 200_000
    others = f.test_and_add(list(range(10**9, 10**9 + 100_000)))
    assert sum(others) < 0.01 * len(others)


class Color(StrEnum):
    RED = "red"


@given(st.lists(st.text(max_size=40), min_size=16, max_size=80))
def test_a_batch_of_keys_gets_the_rows_of_its_keys_one_by_one(keys: list[str]) -> None:
    rows = StatePrefix("s", MP)
    for batch in (keys, [Color.RED, *keys], [*keys, 7, (1, "a")], [*keys, "a\ud800b"]):
        assert rows.prefixes(batch) == [rows.prefix(k) for k in batch]


# -- the operators' path against the memory backend ---------------------------------

#: An operation on one key of a batch: add 1 to its count, or remove it.
ops = st.tuples(st.integers(0, 60), st.sampled_from(["add", "add", "add", "pop"]))


def make_rocks(folder: Path, cache_size: int) -> RocksDBKeyedStateBackend:
    backend = ef.RocksDBStateBackend(folder / "local", cache_size=cache_size)
    return backend.create_keyed_backend("op", 0, range(MP), MP, checkpointing=True)


def make_memory() -> KeyedStateBackend:
    return ef.MemoryStateBackend().create_keyed_backend("op", 0, range(MP), MP,
                                                       checkpointing=True)


def apply(backend: KeyedStateBackend, batch: list[tuple[int, str]], fresh: int) -> None:
    """One batch as the keyed operators run it: its keys loaded, then plain
    dict reads, writes and removals, the keys recorded as written. Key
    ``n`` is ``"id-n"`` shifted by ``fresh``, so that later batches meet
    keys never seen before as well as old ones."""
    table: Any = backend.declare("count", "value")
    keys = [f"id-{k + fresh}" for k, _ in batch]
    load = getattr(table, "load", None)
    if load is not None:
        load(keys)
    for key, (_, op) in zip(keys, batch, strict=True):
        if op == "add":
            table[key] = table.get(key, 0) + 1
        else:
            table.pop(key, None)
    backend.changes("count").add_batch(keys)


def snapshot(backend: KeyedStateBackend, storage: CheckpointStorage, n: int
             ) -> KeyedStateHandle:
    handle = asyncio.run(backend.snapshot(SnapshotTarget(storage, n, "run", 0)).write())
    backend.notify_checkpoint_complete(n)
    return KeyedStateHandle.from_json(handle.to_json())


def state_of(backend: KeyedStateBackend) -> dict[Any, Any]:
    return dict(backend.tables()["count"].items())


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(ops, min_size=1, max_size=20), min_size=1, max_size=40),
       st.sampled_from([2, 5, 12, 40, 150]), st.sets(st.integers(0, 39), max_size=8),
       st.sets(st.integers(0, 39), max_size=4))
def test_new_keys_written_removed_checkpointed_and_restored_match_memory(
        batches: list[list[tuple[int, str]]], cache_size: int, checkpoints: set[int],
        abandoned: set[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rocks, memory = make_rocks(folder, cache_size), make_memory()
        storages = {b: CheckpointStorage(folder / b) for b in ("rocks", "memory")}
        last: dict[str, KeyedStateHandle] = {}
        for i, batch in enumerate(batches):
            fresh = 7 * i  # every batch shifts the key range: new keys keep coming
            apply(rocks, batch, fresh)
            apply(memory, batch, fresh)
            if i in abandoned:
                # A snapshot begun and abandoned: its keys are written later.
                rocks.snapshot(SnapshotTarget(storages["rocks"], 1000 + i, "run", 0)).cancel()
                rocks.notify_checkpoint_aborted(1000 + i)
            if i in checkpoints:
                last = {"rocks": snapshot(rocks, storages["rocks"], i),
                        "memory": snapshot(memory, storages["memory"], i)}
                assert state_of(rocks) == state_of(memory)
        assert state_of(rocks) == state_of(memory)
        rocks.close()
        if not last:
            return
        # Restored, each from its own incremental checkpoint; then more
        # batches on keys old and new (a restored table has no filter).
        again = make_rocks(folder / "again", cache_size)
        again.restore_from(str(folder / "rocks"), {"count": "value"}, [last["rocks"]])
        mem_again = make_memory()
        mem_again.restore_from(str(folder / "memory"), {"count": "value"}, [last["memory"]])
        assert state_of(again) == state_of(mem_again)
        for i, batch in enumerate(batches[:10]):
            apply(again, batch, 3 * i)
            apply(mem_again, batch, 3 * i)
        assert state_of(again) == state_of(mem_again)
        again.close()


def test_a_table_evicted_many_times_reads_back_only_what_it_may_hold(tmp_path: Path) -> None:
    """3,000 new keys through a cache of 100: the filter spares every key
    seen for the first time its read; old keys are read back, removed ones
    stay removed, and every count is exact."""
    backend = make_rocks(tmp_path, 100)
    table = backend.declare("count", "value")
    assert isinstance(table, ValueTable)
    store = backend._store
    reads: list[int] = []
    get_many = store.get_many

    def counting(rows: list[bytes]) -> list[bytes | None]:
        reads.append(len(rows))
        return get_many(rows)

    store.get_many = counting  # type: ignore[method-assign]
    expected: dict[str, int] = {}
    memory = make_memory()
    for start in range(0, 3000, 50):
        batch = [(k, "add") for k in range(50)]
        apply(backend, batch, start)
        apply(memory, batch, start)
    assert table.filter is not None
    new_key_reads = sum(reads)
    assert new_key_reads < 0.02 * 3000  # false maybes only
    # Old keys come back from the database; some are removed, then re-added.
    for start in range(0, 3000, 150):
        batch = [(k, "pop" if k % 3 == 0 else "add") for k in range(50)]
        apply(backend, batch, start)
        apply(memory, batch, start)
    assert sum(reads) > new_key_reads
    apply(backend, [(0, "add")], 0)
    apply(memory, [(0, "add")], 0)
    expected = state_of(memory)
    assert expected["id-0"] == 1 and expected["id-1"] == 2
    assert state_of(backend) == expected
    backend.close()


def test_a_new_key_removed_after_a_snapshot_wrote_it_stays_removed(tmp_path: Path) -> None:
    """A key the filter had never seen is cached without a read and without
    being known; once a snapshot has written it and it is removed, a later
    load must not read back what the snapshot wrote."""
    backend = make_rocks(tmp_path, 20)
    storage = CheckpointStorage(tmp_path / "chk")
    for start in range(0, 60, 10):  # past the cache: the filter is built
        apply(backend, [(k, "add") for k in range(10)], start)
    table = backend.declare("count", "value")
    assert isinstance(table, ValueTable) and table.filter is not None
    apply(backend, [(0, "add")], 1000)  # a new key, in the cache only
    snapshot(backend, storage, 1)  # now in the database too
    apply(backend, [(0, "pop")], 1000)
    apply(backend, [(0, "add")], 1000)
    assert table["id-1000"] == 1
    backend.close()


@pytest.mark.parametrize("cache_size", [3, 1000])
def test_value_state_handles_on_new_keys_match_memory(tmp_path: Path, cache_size: int) -> None:
    """The state handles' path (a key loaded as it becomes current): reads
    of keys never written, writes, clears, through evictions."""
    rocks = make_rocks(tmp_path, cache_size)
    memory = make_memory()
    for backend in (rocks, memory):
        v: ValueState[int] = ValueState(backend, "count", default=0)
        for i in range(400):
            backend.current_key = f"k{i % 150}"
            if v.value == 0 or i % 5:
                v.value = v.value + i
            else:
                v.clear()
            backend.current_key = f"never-{i}"
            assert v.value == 0  # read, not written: absent
    assert state_of(rocks) == state_of(memory)
    rocks.close()
