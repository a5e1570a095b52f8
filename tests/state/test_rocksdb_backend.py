"""The RocksDB backend on its own: key layout, write cache, state kinds,
snapshots (incremental, isolated) and restores (same range, rescaled, from
and into the memory backend)."""

from __future__ import annotations

import asyncio
import gc
import os
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import eddyflow as ef
from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage
from eddyflow.errors import StateSerializationError
from eddyflow.keygroups import key_group_for, key_group_range
from eddyflow.state.abc import KeyedStateBackend, SnapshotTarget
from eddyflow.state.handles import ListState, MapState, ReducingState, ValueState
from eddyflow.state.registry import kind_of
from eddyflow.state.rocksdb.backend import RocksDBKeyedStateBackend
from eddyflow.state.rocksdb.keys import decode_key, encode_key

MP = 128

scalar_keys = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                        st.text(max_size=20), st.binary(max_size=20))
keys = st.recursive(scalar_keys, lambda inner: st.tuples(inner, inner), max_leaves=5)


@given(keys)
def test_key_encoding_round_trips_to_an_equal_key(key: Any) -> None:
    decoded, end = decode_key(encode_key(key))
    assert decoded == key
    assert end == len(encode_key(key))


@given(keys, keys)
def test_equal_keys_encode_alike_and_no_encoding_prefixes_another(a: Any, b: Any) -> None:
    ea, eb = encode_key(a), encode_key(b)
    if a == b:
        assert ea == eb
    else:
        assert ea != eb
        assert not ea.startswith(eb) and not eb.startswith(ea)


class Color(StrEnum):
    RED = "red"


class Num(IntEnum):
    ONE = 1


def test_keys_equal_in_python_are_one_key() -> None:
    assert encode_key(1) == encode_key(1.0) == encode_key(True) == encode_key(Num.ONE)
    assert encode_key("red") == encode_key(Color.RED)
    assert encode_key((1, "a")) == encode_key((1.0, "a"))
    assert encode_key(2 ** 100) != encode_key(2 ** 100 + 1)
    with pytest.raises(ef.UnsupportedKeyError):
        encode_key(frozenset({1}))


def make(tmp_path: Path, *, groups: range = range(MP), cache_size: int = 100_000,
         incremental: bool = True) -> RocksDBKeyedStateBackend:
    backend = ef.RocksDBStateBackend(tmp_path / "local", incremental, cache_size=cache_size)
    return backend.create_keyed_backend("op", 0, groups, MP, checkpointing=True)


def snapshot(backend: KeyedStateBackend, storage: CheckpointStorage, n: int,
             subtask: int = 0) -> KeyedStateHandle:
    target = SnapshotTarget(storage, n, "run", subtask)
    handle = asyncio.run(backend.snapshot(target).write())
    backend.notify_checkpoint_complete(n)
    # The handle survives the metadata's JSON.
    return KeyedStateHandle.from_json(handle.to_json())


def test_value_map_list_reducing_state_through_a_small_cache(tmp_path: Path) -> None:
    b = make(tmp_path, cache_size=8)
    value = ValueState(b, "v", default=0)
    lists: ListState[int] = ListState(b, "l")
    maps: MapState[str, Any] = MapState(b, "m")
    red = ReducingState(b, "r", lambda x, y: x + y)
    for i in range(200):
        b.current_key = f"k{i % 50}"
        value.value = value.value + 1
        lists.add(i)
        maps.put(f"e{i % 3}", [i])
        red.add(i)
    b.current_key = "k7"
    assert value.value == 4
    assert lists.get() == [7, 57, 107, 157]
    assert maps.get("e1") == [157] and len(maps) == 3 and "e0" in maps and "zz" not in maps
    maps.remove("e0")
    assert sorted(maps.keys()) == ["e1", "e2"]
    assert red.get() == 7 + 57 + 107 + 157
    lists.update([1, 2])
    assert lists.get() == [1, 2]
    lists.add_all([3])
    assert lists.get() == [1, 2, 3]
    b.current_key = "k8"
    value.clear()
    lists.clear()
    maps.clear()
    assert value.value == 0 and lists.get() == [] and maps.is_empty()
    tables = b.tables()
    assert tables["v"]["k7"] == 4 and "k8" not in tables["v"] and len(tables["v"]) == 49
    assert tables["l"]["k7"] == [1, 2, 3]
    assert tables["m"]["k7"] == {"e1": [157], "e2": [107]}
    b.close()


def test_write_caches_stay_bounded_on_a_fresh_database(tmp_path: Path) -> None:
    # A fresh database is "complete" (nothing to read back): its value cache
    # must still evict, and map/list overlays flush, past cache_size.
    b = make(tmp_path, cache_size=64)
    value: ValueState[list[int]] = ValueState(b, "v")
    maps: MapState[int, int] = MapState(b, "m")
    lists: ListState[int] = ListState(b, "l")
    biggest = 0
    for i in range(5000):
        b.current_key = i
        value.value = [i]
        maps.put(i % 7, i)
        lists.add(i)
        tables = b._rtables
        biggest = max(biggest, len(tables["v"]), tables["m"]._pending_size(),
                      tables["l"]._pending_size())
    assert biggest <= 65
    b.current_key = 4321
    assert value.value == [4321] and maps.get(4321 % 7) == 4321 and lists.get() == [4321]
    assert len(b.tables()["v"]) == 5000
    b.close()


def test_mutable_value_changed_in_place_is_written(tmp_path: Path) -> None:
    b = make(tmp_path, cache_size=2)
    v: ValueState[dict[str, int]] = ValueState(b, "v")
    m: MapState[str, list[int]] = MapState(b, "m")
    b.current_key = "a"
    v.value = {"n": 1}
    m.put("x", [1])
    b.flush()
    b.current_key = "a"
    v.value["n"] += 1  # no write-back, as a Python user would
    m.get("x").append(2)  # type: ignore[union-attr]
    for k in "bcdef":  # push "a" out of the small cache
        b.current_key = k
        v.value = {"n": 0}
    b.current_key = "a"
    assert v.value == {"n": 2}
    assert m.get("x") == [1, 2]


def test_snapshot_holds_the_state_at_the_barrier(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path / "chk")
    b = make(tmp_path)
    v: ValueState[list[int]] = ValueState(b, "v")
    b.current_key = "k"
    v.value = [1]
    snap = b.snapshot(SnapshotTarget(storage, 1, "run", 0))
    v.value.append(2)  # after the barrier, before the asynchronous half
    handle = asyncio.run(snap.write())
    got = [(n, k, val) for _, n, k, val in kind_of(handle).read(storage.root, handle)]
    assert got == [("v", "k", [1])]


def test_incremental_checkpoints_upload_only_new_files(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path / "chk")
    b = make(tmp_path)
    table = b.declare("count", "value")
    changes = b.changes("count")
    for i in range(20_000):
        table[f"k{i}"] = i
    changes.add_batch([f"k{i}" for i in range(20_000)])
    first = snapshot(b, storage, 1)
    for i in range(100):
        table[f"k{i}"] = -i
    changes.add_batch([f"k{i}" for i in range(100)])
    second = snapshot(b, storage, 2)
    size = {h.path: h.size for h in second.file_handles()}
    new = sum(size[p] for p in second.new_files)
    assert {h.path for _, h in first.db_files if h.path.endswith(".sst")} <= set(size)
    assert new < 0.2 * sum(size.values()), (new, size)
    got = {k: v for _, _, k, v in kind_of(second).read(storage.root, second)}
    assert got["k5"] == -5 and got["k500"] == 500 and len(got) == 20_000


def test_a_database_restored_from_another_storage_is_uploaded_into_its_own(
        tmp_path: Path) -> None:
    # Restored as it is (same key groups) from another folder's checkpoint,
    # the database's SST files live under that folder: the next checkpoint,
    # in this job's folder, must hold them itself, not name files that its
    # root does not have (its handles are relative to its root).
    other = CheckpointStorage(tmp_path / "other")
    a = make(tmp_path)
    table = a.declare("count", "value")
    for i in range(30_000):
        table[f"k{i}"] = i
    a.changes("count").add_batch([f"k{i}" for i in range(30_000)])
    old = snapshot(a, other, 1)
    a.close()
    assert any(h.path.endswith(".sst") for _, h in old.db_files)
    own = CheckpointStorage(tmp_path / "own")
    b = make(tmp_path)
    b.restore_from(other.root, old.kinds, [old])
    table = b.declare("count", "value")
    table["k1"] = -1
    b.changes("count").add_batch(["k1"])
    first = snapshot(b, own, 7)
    for h in first.file_handles():
        own.verify_file(h)  # each under this storage's root
    got = {k: v for _, _, k, v in kind_of(first).read(own.root, first)}
    assert len(got) == 30_000 and got["k1"] == -1 and got["k2"] == 2
    # After that, its own files are referenced again, not uploaded.
    table["k2"] = -2
    b.changes("count").add_batch(["k2"])
    second = snapshot(b, own, 8)
    assert {h.path for _, h in first.db_files if h.path.endswith(".sst")} <= {
        h.path for h in second.file_handles()}


def test_full_checkpoints_upload_everything(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path / "chk")
    b = make(tmp_path, incremental=False)
    table = b.declare("count", "value")
    table["a"] = 1
    b.changes("count").add_batch(["a"])
    first = snapshot(b, storage, 1)
    second = snapshot(b, storage, 2)
    assert not {h.path for h in first.file_handles()} & {h.path for h in second.file_handles()}


def fill(b: KeyedStateBackend, n: int) -> dict[Any, Any]:
    expected = {}
    v = ValueState(b, "v")
    lists: ListState[int] = ListState(b, "l")
    for i in range(n):
        key = (i, f"k{i}") if i % 3 else i
        b.current_key = key
        v.value = {"i": i}
        lists.add_all([i, i + 1])
        expected[key] = ({"i": i}, [i, i + 1])
    return expected


def restored(b: KeyedStateBackend) -> dict[Any, Any]:
    tables = b.tables()
    return {k: (tables["v"][k], tables["l"][k]) for k in tables["v"]}


@pytest.mark.parametrize(("before", "after"), [(2, 3), (2, 1), (1, 1)])
@pytest.mark.parametrize(("old_kind", "new_kind"),
                         [("rocksdb", "rocksdb"), ("memory", "rocksdb"), ("rocksdb", "memory")])
def test_restore_at_another_parallelism_and_across_backends(
        tmp_path: Path, before: int, after: int, old_kind: str, new_kind: str) -> None:
    storage = CheckpointStorage(tmp_path / "chk")

    def backend(kind: str, subtask: int, p: int) -> KeyedStateBackend:
        groups = key_group_range(subtask, MP, p)
        factory: ef.StateBackend = (ef.RocksDBStateBackend(tmp_path / "local")
                                    if kind == "rocksdb" else ef.MemoryStateBackend())
        return factory.create_keyed_backend("op", subtask, groups, MP, checkpointing=True)

    expected: dict[Any, Any] = {}
    handles = []
    everything = fill(ef.MemoryStateBackend().create_keyed_backend("x", 0, range(MP), MP), 3000)
    for s in range(before):
        old = backend(old_kind, s, before)
        mine = {k: v for k, v in everything.items() if key_group_for(k, MP) in old.key_groups}
        assert fill_exact(old, mine) == len(mine)
        expected.update(mine)
        handles.append(snapshot(old, storage, 1, subtask=s))
        old.close()
    got: dict[Any, Any] = {}
    for s in range(after):
        new = backend(new_kind, s, after)
        overlapping = [h for h in handles if set(h.key_groups) & set(new.key_groups)]
        new.restore_from(storage.root, handles[0].kinds, overlapping)
        part = restored(new)
        assert all(key_group_for(k, MP) in new.key_groups for k in part)
        got.update(part)
    assert got == expected


def fill_exact(b: KeyedStateBackend, entries: dict[Any, Any]) -> int:
    v = ValueState(b, "v")
    lists: ListState[int] = ListState(b, "l")
    for key, (value, items) in entries.items():
        b.current_key = key
        v.value = value
        lists.add_all(items)
    return len(entries)


def test_damaged_or_missing_file_is_named_at_restore(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path / "chk")
    b = make(tmp_path)
    fill(b, 100)
    handle = snapshot(b, storage, 1)
    sst = next(h for name, h in handle.db_files if name.endswith(".sst"))
    path = os.path.join(storage.root, sst.path)
    with open(path, "r+b") as f:
        f.seek(sst.size // 2)
        f.write(b"\x00\x01\x02")
    fresh = make(tmp_path)
    with pytest.raises(CheckpointCorrupted, match="checksum mismatch") as info:
        fresh.restore_from(storage.root, handle.kinds, [handle])
    assert sst.path in str(info.value)
    os.unlink(path)
    with pytest.raises(CheckpointCorrupted, match="missing"):
        make(tmp_path).restore_from(storage.root, handle.kinds, [handle])


def test_local_folder_goes_with_the_last_reference(tmp_path: Path) -> None:
    b = make(tmp_path)
    fill(b, 10)
    views = b.tables()
    b.close()
    local = tmp_path / "local"
    assert len([n for n in os.listdir(local) if not n.endswith(".lock")]) == 1
    assert len(views["v"]) == 10  # readable after close
    del b, views
    gc.collect()
    assert os.listdir(local) == []


def test_max_parallelism_is_capped(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="32768"):
        ef.RocksDBStateBackend(tmp_path).create_keyed_backend("op", 0, range(10), 40_000)


@given(st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=12), min_size=1,
                max_size=60), st.integers(1, 16))
def test_counts_through_a_cache_smaller_than_the_keys_are_exact(
        batches: list[list[int]], cache_size: int) -> None:
    """The operators' path: ``load`` a batch's keys, then plain dict reads
    and writes; evictions in between must not lose a count."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        b = make(Path(folder), cache_size=cache_size)
        table = b.declare("count", "value")
        changes = b.changes("count")
        expected: dict[int, int] = {}
        for i, batch in enumerate(batches):
            table.load(batch)  # type: ignore[attr-defined]
            for k in batch:
                table[k] = table.get(k, 0) + 1
                expected[k] = expected.get(k, 0) + 1
            changes.add_batch(list(batch))
            if i % 7 == 6:  # and a snapshot now and then
                storage = CheckpointStorage(Path(folder) / "chk")
                snapshot(b, storage, i)
        assert dict(b.tables()["count"]) == expected
        b.close()


@given(st.lists(st.text(max_size=300), max_size=30), st.sampled_from([1, MP, 256, 257, 32768]))
def test_string_row_keys_take_a_fast_path_to_the_same_bytes(keys: list[str], mp: int) -> None:
    from eddyflow.state.rocksdb.keys import StatePrefix

    rows = StatePrefix("s", mp)
    assert rows.prefixes(keys) == [rows.prefix(k) for k in keys]
    # A lone surrogate (strict UTF-8 refuses it: the batch takes the slow path).
    odd = [*keys, "a\ud800b"]
    assert rows.prefixes(odd) == [rows.prefix(k) for k in odd]


@pytest.mark.parametrize("kind", ["rocksdb", "memory"])
def test_restore_declares_every_state_the_checkpoint_names(tmp_path: Path, kind: str) -> None:
    """A state no overlapping old subtask held is declared all the same."""
    storage = CheckpointStorage(tmp_path / "chk")
    old = make(tmp_path)
    fill(old, 10)
    handle = snapshot(old, storage, 1)
    factory: ef.StateBackend = (ef.RocksDBStateBackend(tmp_path / "again")
                                if kind == "rocksdb" else ef.MemoryStateBackend())
    new = factory.create_keyed_backend("op", 0, range(MP), MP, checkpointing=True)
    new.restore_from(storage.root, {**handle.kinds, "elsewhere": "map"}, [handle])
    assert new.kinds == {"v": "value", "l": "list", "elsewhere": "map"}
    assert len(restored(new)) == 10


@pytest.mark.parametrize("kind", ["rocksdb", "memory"])
def test_bulk_load_of_a_fresh_backend_snapshots_and_restores(tmp_path: Path, kind: str) -> None:
    storage = CheckpointStorage(tmp_path / "chk")
    factory: ef.StateBackend = (ef.RocksDBStateBackend(tmp_path / "local") if kind == "rocksdb"
                                else ef.MemoryStateBackend())
    b = factory.create_keyed_backend("op", 0, range(MP), MP, checkpointing=True)
    values = {f"k{i}" if i % 2 else (i, "t"): {"n": i, "seen": [i]} for i in range(5000)}
    maps = {f"k{i}": {"a": i, ("b", 1): [i]} for i in range(300)}
    b.restore({"v": "value", "m": "map", "l": "list"}, ())
    assert b.bulk_load("v", "value", values) == 5000
    assert b.bulk_load("m", "map", maps) == 300  # (a map's rows: through restore)
    assert b.kinds == {"v": "value", "m": "map", "l": "list"}
    # The values are read back as loaded, before and after a snapshot.
    assert dict(b.tables()["v"].items()) == values
    handle = snapshot(b, storage, 1)
    b.close()
    new = ef.MemoryStateBackend().create_keyed_backend("op", 0, range(MP), MP)
    new.restore_from(storage.root, handle.kinds, [handle])
    tables = new.tables()
    assert tables["v"] == values and tables["m"] == maps and tables["l"] == {}
row_keys = st.one_of(st.integers(), st.text(max_size=12), st.binary(max_size=12),
                     st.tuples(st.integers(), st.binary(max_size=4)))


@given(st.lists(row_keys, max_size=60, unique_by=encode_key), st.booleans())
def test_rows_are_sorted_in_byte_order(keys: list[Any], long_rows: bool) -> None:
    """numpy's fixed-width, NUL-padded order is Python's byte order for row
    keys (ints end in zero bytes), and so is the fallback for long rows."""
    from eddyflow.state.rocksdb import keys as rocks_keys

    rows = rocks_keys.StatePrefix("s", MP).prefixes(keys)
    if long_rows:
        rows.append(rocks_keys.StatePrefix("s", MP).prefix("x" * 300))
    order = rocks_keys.sort_order(rows)
    assert [rows[i] for i in order] == sorted(rows)


@given(st.lists(st.text(max_size=8), max_size=40), st.sampled_from([1, 7, MP, 32768]))
def test_string_key_groups_in_bulk_are_the_stable_hashes(keys: list[str], mp: int) -> None:
    from eddyflow.state.rocksdb.keys import str_key_groups

    utf8 = [k.encode("utf-8", "surrogatepass") for k in keys]
    assert str_key_groups(utf8, mp) == [key_group_for(k, mp) for k in keys]


def _stored(b: RocksDBKeyedStateBackend, name: str) -> dict[Any, Any]:
    return dict(b.tables()[name].items())


@pytest.mark.parametrize("fork", [True, False])
@pytest.mark.parametrize("states", [1, 2])
def test_end_of_input_snapshot_writes_the_barrier_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork: bool, states: int) -> None:
    """The end-of-input snapshot of many changed keys: written half by a
    forked child and half at the barrier (or all at the barrier), and with
    one state (rewritten whole over a range deletion) or two. Keys removed
    since the last checkpoint are gone from the next one, mutable values are
    the bytes at the barrier, and restoring the checkpoint gives it all back."""
    from eddyflow.state import forked
    from eddyflow.state.rocksdb import backend as rocksdb_backend

    monkeypatch.setattr(forked, "ENABLED", fork)
    monkeypatch.setattr(rocksdb_backend, "_INLINE", 10)
    monkeypatch.setattr(rocksdb_backend, "_SPLIT", 10)
    storage = CheckpointStorage(tmp_path / "chk")
    b = make(tmp_path)
    table = b.declare("s", "value")
    changes = b.changes("s")
    other = b.declare("t", "value") if states == 2 else None
    expected: dict[Any, Any] = {}
    for k in range(300):
        table[k] = expected[k] = {"n": k, "items": [k]}
    if other is not None:
        other["x"] = 1
        b.changes("t").add_batch(["x"])
    changes.add_batch(list(range(300)))
    snapshot(b, storage, 1)
    # Then: some keys removed, some changed, some new; more writes recorded
    # than there are keys (as when nearly every key changed).
    for k in range(0, 300, 3):
        del table[k]
        del expected[k]
    for k in range(1, 300, 3):
        table[k]["n"] += 1000
    for k in range(300, 330):
        table[k] = expected[k] = [k]
    changes.add_batch(list(range(330)) * 2)
    snap = b.snapshot(SnapshotTarget(storage, 2, "run", 0, at_end=True))
    barrier = {k: (dict(v, items=list(v["items"])) if isinstance(v, dict) else list(v))
               for k, v in expected.items()}
    for v in table.values():  # after the barrier, before the asynchronous half
        (v["items"] if isinstance(v, dict) else v).append("late")
    handle = asyncio.run(snap.write())
    b.notify_checkpoint_complete(2)
    got = {k: v for _, name, k, v in kind_of(handle).read(storage.root, handle) if name == "s"}
    assert got == barrier
    restored = make(tmp_path / "restored")
    restored.restore_from(storage.root, handle.kinds, [KeyedStateHandle.from_json(
        handle.to_json())])
    assert _stored(restored, "s") == barrier
    if other is not None:
        assert _stored(restored, "t") == {"x": 1}
    assert not [f for f in os.listdir(b._instance.folder) if f.endswith((".sst", ".partial"))]
    b.close()
    restored.close()


@pytest.mark.parametrize("fork", [True, False])
def test_end_of_input_snapshot_names_a_value_that_cannot_be_pickled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork: bool) -> None:
    """In either share of the keys (the child's or the barrier's)."""
    from eddyflow.state import forked
    from eddyflow.state.rocksdb import backend as rocksdb_backend

    monkeypatch.setattr(forked, "ENABLED", fork)
    monkeypatch.setattr(rocksdb_backend, "_INLINE", 10)
    monkeypatch.setattr(rocksdb_backend, "_SPLIT", 10)
    for bad in (5, 95):
        b = make(tmp_path / str(bad))
        table = b.declare("s", "value")
        for k in range(100):
            table[f"k{k}"] = (lambda: None) if k == bad else k
        b.changes("s").add_batch([f"k{k}" for k in range(100)])
        with pytest.raises(StateSerializationError, match=f"key 'k{bad}'"):
            target = SnapshotTarget(CheckpointStorage(tmp_path / "chk"), 1, "run", 0,
                                    at_end=True)
            asyncio.run(b.snapshot(target).write())
        b.close()


@given(st.lists(st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b", ""]), st.booleans(),
                          st.floats(-1, 1), st.just({"n": 1})), max_size=300))
def test_values_are_serialized_as_the_serializer_does_repeats_or_not(values: list[Any]) -> None:
    """Repeated ints and strings are serialized once each: the bytes are the
    serializer's own (True is not 1, 1.0 is not 1)."""
    from eddyflow.state.rocksdb.backend import PickleSerializer
    from eddyflow.state.rocksdb.tables import dump_all

    dumps = PickleSerializer().dumps
    for vs in (values, [v for v in values if type(v) in (int, str)] * 5):
        assert dump_all(vs, dumps) == list(map(dumps, vs))


def test_local_folders_of_finished_processes_go_and_live_ones_stay(tmp_path: Path) -> None:
    """A new backend removes the local folders whose lock nobody holds (a
    killed process's), never one whose instance lives."""
    local = tmp_path / "rocks"
    live = ef.RocksDBStateBackend(local).create_keyed_backend("op", 0, range(0, 128), 128)
    dead = local / "op-1-deadbeef"
    dead.mkdir()
    (local / "op-1-deadbeef.lock").write_text("")
    old = os.stat(local).st_mtime - 3600  # older than a lock being set up
    for lock in local.glob("*.lock"):
        os.utime(lock, (old, old))
    other = ef.RocksDBStateBackend(local).create_keyed_backend("op", 2, range(0, 128), 128)
    names = set(os.listdir(local))
    assert "op-1-deadbeef" not in names and "op-1-deadbeef.lock" not in names
    assert len([n for n in names if n.startswith("op-0-")]) == 2  # folder and lock
    live.close()
    other.close()
