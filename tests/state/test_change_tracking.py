"""Changes count distinct keys: a few hot keys written many times make a
small snapshot in both backends (a delta of the memory backend, a few rows
written at the barrier by RocksDB rather than a forked child's SST file),
and what a snapshot restores is the table."""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from job_support import BACKENDS

import eddyflow as ef
from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.state import forked
from eddyflow.state.abc import KeyedStateBackend, SnapshotTarget
from eddyflow.state.changes import Changes
from eddyflow.state.memory import MemoryKeyedStateBackend

MP = 128


def _write(b: KeyedStateBackend, batch: list[Any]) -> None:
    """What a keyed sum does with a batch: a read and a write per record,
    then the batch's keys recorded in one list."""
    table = b.declare("s", "value")
    for k in batch:
        table[k] = table.get(k, 0) + 1
    changes = b.changes("s")
    if changes.keys is not None:
        changes.add_batch(list(batch))


def _snap(b: KeyedStateBackend, root: Path, n: int) -> KeyedStateHandle:
    handle = asyncio.run(b.snapshot(SnapshotTarget(CheckpointStorage(root), n, "run", 0)).write())
    b.notify_checkpoint_complete(n)
    return KeyedStateHandle.from_json(handle.to_json())


def _restored(root: Path, handle: KeyedStateHandle) -> dict[Any, Any]:
    fresh = ef.MemoryStateBackend().create_keyed_backend("op", 0, range(MP), MP)
    fresh.restore_from(str(root), handle.kinds, [handle])
    return dict(fresh.tables().get("s", {}))


def _current(b: KeyedStateBackend) -> dict[Any, Any]:
    return dict(b.tables()["s"].items())


def test_hot_keys_are_counted_once_and_unique_keys_stop_the_folding() -> None:
    hot = Changes(True)
    rng = random.Random(1)
    keys = [f"h{i}" for i in range(50)]
    for _ in range(200):
        hot.add_batch(rng.choices(keys, k=500))
    assert hot.count() == len(hot) == 50  # 100,000 writes of 50 keys
    one_by_one, batches = hot.take()
    assert one_by_one == {} and batches == [set(keys)]

    unique = Changes(True)
    for i in range(100):
        unique.add_batch(list(range(i * 1000, (i + 1) * 1000)))
    # Mostly new keys: the lists are kept as they are, past the first fold.
    assert unique.count() == len(unique) == 100_000
    _, batches = unique.take()
    assert isinstance(batches[0], set) and len(batches[0]) <= 2 * Changes.dedup_every
    assert sum(map(len, batches)) == 100_000


def test_folding_starts_again_after_each_snapshot() -> None:
    """An interval of new keys (a load) stops the folding for that interval
    only: after the snapshot takes them, hot keys are folded again, so what
    is left to fold at the next barrier stays below ``dedup_every`` and a
    batch, however many writes the interval had."""
    ch = Changes(True)
    for i in range(50):
        ch.add_batch(list(range(i * 1000, (i + 1) * 1000)))
    assert len(ch) == 50_000
    ch.take()
    rng = random.Random(3)
    for _ in range(100):
        ch.add_batch(rng.choices(range(40), k=1000))
        assert len(ch) <= 40 + Changes.dedup_every + 1000
    assert ch.count() == 40


def test_a_budget_counts_distinct_keys() -> None:
    """A budget of 100 keys holds 60 hot keys written 10,000 times, and is
    exceeded by 150 distinct ones."""
    hot = Changes(True, lambda: 100.0)
    for i in range(100):
        hot.add_batch([f"h{(i * 7 + j) % 60}" for j in range(100)])
    assert not hot.saturated and hot.count() == 60
    many = Changes(True, lambda: 100.0)
    many.add_batch([f"k{i}" for i in range(150)])
    assert many.saturated and many.take_written() is None


def test_unique_keys_ask_the_budget_only_when_the_lists_could_reach_it() -> None:
    """New keys into a table of 100k entries (half of them the budget,
    growing with the table): the lists are not folded after the first
    probe, and the budget is asked again only when the lists could have
    reached it, not at every batch."""
    table = [100_000]
    asked = [0]

    def budget() -> float:
        asked[0] += 1
        return table[0] / 2

    ch = Changes(True, budget)
    ch.take_written()
    asked[0] = 0
    for i in range(95):
        ch.add_batch(list(range(i * 1000, (i + 1) * 1000)))
        table[0] += 1000
    assert not ch.saturated and len(ch) == 95_000
    assert asked[0] <= 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_percent_hot_keys_written_many_times_make_a_small_snapshot(
        tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 keys loaded, then 60,000 writes to 100 of them (six times the
    state): the memory backend writes a delta of those 100 keys, RocksDB
    writes them at the barrier (no forked child); both restore exactly."""
    forks: list[Any] = []
    start = forked.start

    def counted(fn: Callable[[], Any]) -> forked.ChildWork:
        forks.append(fn)
        return start(fn)

    monkeypatch.setattr(forked, "start", counted)
    factory: ef.StateBackend = (ef.MemoryStateBackend() if backend == "memory" else
                                ef.RocksDBStateBackend(tmp_path / "local"))
    b = factory.create_keyed_backend("op", 0, range(MP), MP, checkpointing=True)
    keys = [f"k{i:05d}" for i in range(10_000)]
    for i in range(0, len(keys), 500):
        _write(b, keys[i:i + 500])
    root = tmp_path / "chk"
    first = _snap(b, root, 1)
    assert _restored(root, first) == _current(b)
    hot = keys[::100]
    rng = random.Random(7)
    for _ in range(60):
        _write(b, rng.choices(hot, k=1000))
    assert b.changes("s").count() == len(hot)
    forks.clear()
    second = _snap(b, root, 2)
    assert _restored(root, second) == _current(b)
    if backend == "memory":
        assert [f.full for f in second.files] == [True, False]
        assert second.files[-1].handle.size * 20 < second.files[0].handle.size
    else:
        assert forks == []  # 100 rows written at the barrier, not 60,000 by a child
    b.close()


@settings(max_examples=40, deadline=None)
@given(entries=st.integers(10, 300), hot=st.integers(1, 120),
       batches=st.lists(st.integers(1, 60), min_size=1, max_size=40),
       seed=st.integers(0, 1000))
def test_the_distinct_count_decides_full_or_delta(entries: int, hot: int, batches: list[int],
                                                   seed: int) -> None:
    """The memory backend's snapshot is full when at least a fifth of the
    entries changed and a delta otherwise, whatever the number of writes;
    either way the chain restores the table."""
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp:
        mp.setattr(Changes, "dedup_every", 64)
        root = Path(tmp)
        b = ef.MemoryStateBackend().create_keyed_backend("op", 0, range(MP), MP,
                                                         checkpointing=True)
        assert isinstance(b, MemoryKeyedStateBackend)
        keys = list(range(entries))
        _write(b, keys)
        _snap(b, root, 1)
        rng = random.Random(seed)
        hot_keys = rng.sample(keys, min(hot, entries))
        written: set[int] = set()
        for size in batches:
            batch = rng.choices(hot_keys, k=size)
            written.update(batch)
            _write(b, batch)
        changes = b.changes("s")
        saturated = changes.saturated
        count = changes.count()
        assert saturated or len(written) <= count <= sum(batches)
        if len(hot_keys) * 8 <= Changes.dedup_every:
            # Folds find few new keys: the count is exact.
            assert saturated == (len(written) > 0.2 * entries)
            assert saturated or count == len(written)
        handle = _snap(b, root, 2)
        full = handle.files[-1].full
        assert full == (saturated or count >= 0.2 * entries)
        assert _restored(root, handle) == _current(b)
