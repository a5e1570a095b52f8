"""State time-to-live on the keyed backends themselves (``state/ttl.py``,
the ``Ttl*`` handles of ``state/handles.py``), for both backends, the clock
an ``ef.testing.ManualClock``: expiry of each state kind (at ``written_at +
seconds``, inclusive), entries written at different times expiring apart
(map entries, list elements, keys), writes renewing and reads not, reducing
state starting afresh; snapshots without the expired entries (a delta that
deletes them, the cost following what expired, not the state); restores at
another parallelism and into the other backend keeping the write times;
isolation of a snapshot from in-place changes after the barrier; what
``user_tables`` (``JobResult.state``) shows.

The RocksDB backend runs with a write cache of 4 entries, so values go
through the database (evicted, read back) and not only through the cache.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from job_support import BACKENDS

import eddyflow as ef
from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.keygroups import key_group_for, key_group_range
from eddyflow.state.abc import KeyedStateBackend, SnapshotTarget
from eddyflow.state.handles import (
    MapState,
    TtlListState,
    TtlMapState,
    TtlReducingState,
    TtlValueState,
    ValueState,
)

MP = 128
TTL = ef.StateTtl(10.0)

Make = Callable[..., KeyedStateBackend]


def factory(kind: str, tmp_path: Path) -> ef.StateBackend:
    if kind == "memory":
        return ef.MemoryStateBackend()
    return ef.RocksDBStateBackend(tmp_path / "local", cache_size=4)


@pytest.fixture(params=BACKENDS)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Make:
    """``make(subtask=0, parallelism=1)``: a keyed backend of the fixture's kind."""
    def new(subtask: int = 0, parallelism: int = 1) -> KeyedStateBackend:
        groups = key_group_range(subtask, MP, parallelism)
        return factory(request.param, tmp_path).create_keyed_backend(
            "op", subtask, groups, MP, checkpointing=True)
    return new


class States:
    """One handle of each kind with ``ttl``, on ``backend``, reading ``clock``."""

    def __init__(self, backend: KeyedStateBackend, clock: ef.testing.ManualClock,
                 ttl: ef.StateTtl = TTL) -> None:
        self.backend = backend
        self.value: TtlValueState[Any] = TtlValueState(backend, "value", "none", ttl, clock.now)
        self.map: TtlMapState[str, Any] = TtlMapState(backend, "map", ttl, clock.now)
        self.list: TtlListState[Any] = TtlListState(backend, "list", ttl, clock.now)
        self.sum: TtlReducingState[int] = TtlReducingState(backend, "sum", operator.add, ttl,
                                                           clock.now)

    def seen(self, key: Any) -> tuple[Any, ...]:
        """What user code reads of ``key``: value, map items, list, sum."""
        self.backend.current_key = key
        return (self.value.value, sorted(self.map.items()), self.list.get(), self.sum.get())

    def write(self, key: Any, tag: str, *, value: bool = True, total: bool = True) -> None:
        """Write ``key``: the value (a dict), a map entry and a list element
        named ``tag``, and 1 added to the sum."""
        self.backend.current_key = key
        if value:
            self.value.update({"by": tag})
        self.map.put(tag, [tag])
        self.list.add({"by": tag})
        if total:
            self.sum.add(1)


def snapshot(backend: KeyedStateBackend, root: Path, n: int, subtask: int = 0
             ) -> KeyedStateHandle:
    target = SnapshotTarget(CheckpointStorage(root), n, "run", subtask)
    handle = asyncio.run(backend.snapshot(target).write())
    backend.notify_checkpoint_complete(n)
    return KeyedStateHandle.from_json(handle.to_json())  # as the metadata keeps it


def stored(root: Path, handles: list[KeyedStateHandle]) -> dict[str, dict[Any, Any]]:
    """What the checkpoint holds, write times and all: restored into a
    memory backend that declares no handle (so nothing hides anything)."""
    b = ef.MemoryStateBackend().create_keyed_backend("reader", 0, range(MP), MP)
    b.restore_from(str(root), handles[0].kinds, handles)
    return {name: dict(table) for name, table in b.tables().items()}


# -- reads ---------------------------------------------------------------------------


def test_each_kind_expires_at_written_at_plus_seconds(make: Make) -> None:
    clock = ef.testing.ManualClock(100.0)
    s = States(make(), clock)
    s.write("k", "a")
    clock.set(109.5)
    assert s.seen("k") == ({"by": "a"}, [("a", ["a"])], [{"by": "a"}], 1)
    clock.set(110.0)  # expired from then on, inclusive (as Flink)
    assert s.seen("k") == ("none", [], [], None)
    assert "a" not in s.map and s.map.get("a", "dflt") == "dflt" and s.map.is_empty()
    assert len(s.map) == 0 and s.map.keys() == [] and s.map.values() == []


def test_entries_written_at_different_times_expire_apart(make: Make) -> None:
    clock = ef.testing.ManualClock()
    s = States(make(), clock)
    s.write("k", "a")
    s.write("other", "a")
    clock.set(4.0)
    s.write("k", "b", value=False, total=False)  # a map entry and an element more
    clock.set(10.0)
    assert s.seen("k") == ("none", [("b", ["b"])], [{"by": "b"}], None)
    assert s.seen("other") == ("none", [], [], None)
    clock.set(14.0)
    assert s.seen("k") == ("none", [], [], None)


def test_a_write_renews_an_entry_a_read_does_not(make: Make) -> None:
    clock = ef.testing.ManualClock()
    s = States(make(), clock)
    s.write("k", "a")
    clock.set(6.0)
    s.seen("k")  # reads at 6 do not count
    s.backend.current_key = "k"
    s.value.value = {"by": "b"}  # the property setter writes too
    s.map.put("a", ["a2"])
    clock.set(12.0)
    assert s.seen("k") == ({"by": "b"}, [("a", ["a2"])], [], None)
    clock.set(16.0)
    assert s.seen("k") == ("none", [], [], None)


def test_reducing_state_starts_afresh_after_expiry(make: Make) -> None:
    clock = ef.testing.ManualClock()
    s = States(make(), clock)
    for t in (0.0, 5.0, 14.0):  # each add within 10 s of the last
        clock.set(t)
        s.backend.current_key = "k"
        s.sum.add(2)
    assert s.sum.get() == 6
    clock.set(24.0)
    assert s.sum.get() is None
    s.sum.add(5)
    assert s.sum.get() == 5


def test_list_update_and_add_all_stamp_every_element(make: Make) -> None:
    clock = ef.testing.ManualClock()
    s = States(make(), clock)
    s.backend.current_key = "k"
    s.list.add_all([{"i": 1}, {"i": 2}])
    clock.set(5.0)
    s.list.add_all([])
    s.list.add({"i": 3})
    assert s.list.get() == [{"i": 1}, {"i": 2}, {"i": 3}]
    clock.set(10.0)
    assert s.list.get() == [{"i": 3}]
    s.list.update([{"i": 4}])
    clock.set(15.0)
    assert s.list.get() == [{"i": 4}]
    s.list.update([])
    assert s.list.get() == []


def test_one_state_has_one_ttl(make: Make) -> None:
    b = make()
    clock = ef.testing.ManualClock()
    TtlValueState(b, "v", None, TTL, clock.now)
    TtlValueState(b, "v", None, ef.StateTtl(10), clock.now)  # the same TTL: fine
    with pytest.raises(ValueError, match="'v' is already declared with StateTtl"):
        TtlValueState(b, "v", None, ef.StateTtl(5.0), clock.now)
    with pytest.raises(ValueError, match="already declared as value\\+ttl state, not value"):
        ValueState(b, "v")
    with pytest.raises(TypeError, match=r"ttl must be an ef\.StateTtl"):
        TtlMapState(b, "m", 10.0, clock.now)  # type: ignore[arg-type]


def test_user_tables_show_values_without_write_times_nor_what_expired(make: Make) -> None:
    clock = ef.testing.ManualClock()
    b = make()
    s = States(b, clock)
    plain: MapState[str, int] = MapState(b, "plain")
    s.write("old", "a")
    b.current_key = "old"
    plain.put("x", 1)
    clock.set(5.0)
    s.write("new", "b")
    clock.set(12.0)
    tables = b.user_tables()
    assert {name: dict(t.items()) for name, t in tables.items()} == {
        "value": {"new": {"by": "b"}},
        "map": {"new": {"b": ["b"]}},
        "list": {"new": [{"by": "b"}]},
        "sum": {"new": 1},
        "plain": {"old": {"x": 1}},
    }
    assert tables["map"]["new"] == {"b": ["b"]} and "old" not in tables["map"]
    assert len(tables["list"]) == 1
    with pytest.raises(KeyError):
        tables["value"]["old"]


# -- snapshots -----------------------------------------------------------------------


def test_snapshots_drop_expired_entries_and_deltas_delete_them(make: Make,
                                                               tmp_path: Path) -> None:
    clock = ef.testing.ManualClock()
    b = make()
    s = States(b, clock)
    for i in range(20):
        s.write(f"k{i}", "a")
    clock.set(5.0)
    for i in range(10, 100):
        s.write(f"k{i}", "b")
    first = snapshot(b, tmp_path / "chk", 1)
    assert len(stored(tmp_path / "chk", [first])["value"]) == 100
    clock.set(10.0)  # every "a" expired; the "b" writes live
    second = snapshot(b, tmp_path / "chk", 2)
    if first.backend == "memory":
        # An incremental snapshot: a delta over the first, which deletes.
        assert [f.full for f in second.files] == [True, False]
    got = stored(tmp_path / "chk", [second])
    assert sorted(got["value"]) == sorted(got["sum"]) == sorted(f"k{i}" for i in range(10, 100))
    assert got["value"]["k15"] == (5.0, {"by": "b"}) and got["sum"]["k15"] == (5.0, 2)
    assert got["map"]["k15"] == {"b": (5.0, ["b"])}
    assert got["list"]["k15"] == [(5.0, {"by": "b"})]
    assert set(got["map"]) == set(got["list"]) == set(got["value"])
    clock.set(15.0)
    assert stored(tmp_path / "chk", [snapshot(b, tmp_path / "chk", 3)]) == {
        "value": {}, "map": {}, "list": {}, "sum": {}}


def test_expiry_looks_only_at_the_entries_due(make: Make) -> None:
    """A snapshot's expiry costs what expired (and entries rewritten since
    they were indexed, once each), not the state: the index says which."""
    clock = ef.testing.ManualClock()
    b = make()
    v: TtlValueState[int] = TtlValueState(b, "v", None, TTL, clock.now)
    m: TtlMapState[int, int] = TtlMapState(b, "m", TTL, clock.now)
    for key in ("early", "renewed"):
        b.current_key = key
        v.update(0)
        m.put(0, 0)
    clock.set(5.0)
    for i in range(500):
        b.current_key = i
        v.update(i)
        m.put(i, i)
    b.current_key = "renewed"
    v.update(1)
    m.put(0, 1)
    clock.set(10.0)
    assert b.expire_ttl() == 2  # "early": its value and its map entry
    value_index, map_index = b._ttl["v"], b._ttl["m"]
    assert value_index.examined == map_index.examined == 2  # "early" and "renewed" only
    assert len(value_index) == len(map_index) == 501
    clock.set(15.0)
    assert b.expire_ttl() == 1002
    assert value_index.examined == map_index.examined == 2 + 501
    assert len(value_index) == len(map_index) == 0
    assert len(b.user_tables()["v"]) == 0


def test_a_clock_that_goes_back_still_expires_on_time(make: Make) -> None:
    now = [20.0]
    b = make()
    v: TtlValueState[str] = TtlValueState(b, "v", None, TTL, lambda: now[0])
    b.current_key = "k"
    v.update("first")  # indexed at 20
    now[0] = 12.0  # (a wall clock set back)
    v.update("second")  # written at 12: expires at 22, before 30
    now[0] = 22.0
    assert v.value is None
    assert b.expire_ttl() == 1


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_value_changed_in_place_after_the_barrier_stays_out(kind: str, tmp_path: Path) -> None:
    clock = ef.testing.ManualClock()
    b = factory(kind, tmp_path).create_keyed_backend("op", 0, range(MP), MP, checkpointing=True)
    s = States(b, clock)
    b.current_key = "k"
    s.value.update({"n": 1})
    s.map.put("e", [1])
    s.list.add({"n": 1})
    b.current_key = "other"  # (RocksDB: "k" may leave the cache)
    snap = b.snapshot(SnapshotTarget(CheckpointStorage(tmp_path / "chk"), 1, "run", 0))
    b.current_key = "k"
    s.value.value["n"] = 2  # in place, after the barrier
    s.map.get("e").append(2)  # type: ignore[union-attr]
    s.list.get()[0]["n"] = 2
    handle = asyncio.run(snap.write())
    got = stored(tmp_path / "chk", [handle])
    assert got["value"]["k"] == (0.0, {"n": 1})
    assert got["map"]["k"] == {"e": (0.0, [1])}
    assert got["list"]["k"] == [(0.0, {"n": 1})]
    # The change is state all the same (written with its old time) for the next one.
    assert s.value.value == {"n": 2} and s.map.get("e") == [1, 2]
    got = stored(tmp_path / "chk", [snapshot(b, tmp_path / "chk", 2)])
    assert got["value"]["k"] == (0.0, {"n": 2}) and got["map"]["k"] == {"e": (0.0, [1, 2])}


# -- restores ------------------------------------------------------------------------


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1)])
@pytest.mark.parametrize(("old_kind", "new_kind"), list(itertools.product(BACKENDS, repeat=2)))
def test_restores_keep_write_times_at_another_parallelism(
        tmp_path: Path, before: int, after: int, old_kind: str, new_kind: str) -> None:
    clock = ef.testing.ManualClock()
    keys = [f"k{i}" for i in range(40)]
    handles = []
    for subtask in range(before):
        old = factory(old_kind, tmp_path / "old").create_keyed_backend(
            "op", subtask, key_group_range(subtask, MP, before), MP, checkpointing=True)
        s = States(old, clock)
        mine = [k for k in keys if key_group_for(k, MP) in old.key_groups]
        for k in mine:
            s.write(k, "a")
        handles.append(snapshot(old, tmp_path / "chk", 1, subtask))
        old.close()
    clock.set(5.0)
    news = []
    for subtask in range(after):
        new = factory(new_kind, tmp_path / "new").create_keyed_backend(
            "op", subtask, key_group_range(subtask, MP, after), MP, checkpointing=True)
        s = States(new, clock)  # declared before the restore, as an operator's open() does
        overlapping = [h for h in handles if set(h.key_groups) & set(new.key_groups)]
        new.restore_from(str(tmp_path / "chk"), handles[0].kinds, overlapping)
        new.rebuild_ttl()
        mine = [k for k in keys if key_group_for(k, MP) in new.key_groups]
        for k in mine[::2]:
            s.write(k, "b", value=False)
        news.append((s, mine))
    clock.set(9.999)
    for s, mine in news:
        for k in mine:
            renewed = k in mine[::2]
            tags = ["a", "b"] if renewed else ["a"]
            assert s.seen(k) == ({"by": "a"}, [(t, [t]) for t in tags],
                                 [{"by": t} for t in tags], 2 if renewed else 1)
    clock.set(10.0)  # "a" (written at 0 before the restore) expires on time
    for s, mine in news:
        for k in mine:
            renewed = k in mine[::2]
            assert s.seen(k) == (("none", [("b", ["b"])], [{"by": "b"}], 2) if renewed
                                 else ("none", [], [], None))
        # and the rebuilt index drops it from the next snapshot
        assert s.backend.expire_ttl() == (3 * len(mine)   # values, "a" entries, "a" elements
                                          + len(mine) - len(mine[::2]))  # sums not renewed


def test_a_handle_declared_after_the_restore_indexes_what_was_restored(
        make: Make, tmp_path: Path) -> None:
    clock = ef.testing.ManualClock()
    old = make()
    s = States(old, clock)
    s.write("k", "a")
    handle = snapshot(old, tmp_path / "chk", 1)
    new = make()
    new.restore_from(str(tmp_path / "chk"), handle.kinds, [handle])
    late = States(new, clock)  # declared after the restore
    clock.set(10.0)
    assert late.seen("k") == ("none", [], [], None)
    assert new.expire_ttl() == 4
    assert stored(tmp_path / "chk", [snapshot(new, tmp_path / "chk", 2)])["map"] == {}


def test_the_duration_may_change_across_a_restore(make: Make, tmp_path: Path) -> None:
    """What is stored is the write time: a restored state with a longer (or
    shorter) TTL keeps its entries ``seconds`` (the new) after their writes."""
    clock = ef.testing.ManualClock()
    old = make()
    States(old, clock).write("k", "a")
    handle = snapshot(old, tmp_path / "chk", 1)
    new = make()
    s = States(new, clock, ef.StateTtl(30.0))
    new.restore_from(str(tmp_path / "chk"), handle.kinds, [handle])
    clock.set(29.0)
    assert s.seen("k") == ({"by": "a"}, [("a", ["a"])], [{"by": "a"}], 1)
    clock.set(30.0)
    assert s.seen("k") == ("none", [], [], None)
