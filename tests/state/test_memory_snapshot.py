"""Unit tests of the memory backend's incremental snapshots
(``state/memory/snapshot.py``) and of the keyed-state file format
(``state/format.py``).

A snapshot taken at a "barrier" must hold the state as it was then, whatever
the handles or user code change afterwards, in place included; deltas hold
exactly the keys written and deleted since the last *completed* checkpoint;
the chain is cut after ``max_chain`` deltas; restoring a chain, or any
key-group subset of it (rescaling), gives back exactly the state; damaged
files are reported. Each test runs with the forked child (the default) and
inline (``EDDYFLOW_SNAPSHOT_FORK=0``, and what small snapshots do).
"""

from __future__ import annotations

import asyncio
import operator
import os
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage
from eddyflow.errors import StateSerializationError
from eddyflow.keygroups import key_group_range
from eddyflow.state import forked
from eddyflow.state.abc import SnapshotTarget
from eddyflow.state.changes import Changes
from eddyflow.state.format import (
    DELETED,
    apply_entries,
    decode_frame,
    read_key_groups,
    read_state_file,
)
from eddyflow.state.handles import ListState, MapState, ReducingState, ValueState
from eddyflow.state.memory import MemoryKeyedStateBackend, MemoryStateBackend, MemoryStateHandle
from eddyflow.state.memory import snapshot as memory_snapshot

MP = 128


@pytest.fixture(params=["fork", "inline"], autouse=True)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every snapshot by a forked child, or every one serialised at the barrier."""
    monkeypatch.setattr(forked, "ENABLED", request.param == "fork")
    monkeypatch.setattr(memory_snapshot, "_INLINE_SECONDS", 0 if request.param == "fork" else 1e9)
    yield str(request.param)


def make(backend: MemoryStateBackend | None = None) -> MemoryKeyedStateBackend:
    b = (backend or MemoryStateBackend()).create_keyed_backend(
        "op", 0, range(MP), MP, checkpointing=True)
    assert isinstance(b, MemoryKeyedStateBackend)
    return b


def snap(b: MemoryKeyedStateBackend, root: Path, n: int, *, complete: bool = True
         ) -> MemoryStateHandle:
    handle = asyncio.run(b.snapshot(SnapshotTarget(CheckpointStorage(root), n, "run", 0)).write())
    if complete:
        b.notify_checkpoint_complete(n)
    return handle


def read(root: Path, handle: MemoryStateHandle, groups: range = range(MP)
         ) -> dict[str, dict[Any, Any]]:
    """The state a chain restores (optionally: of some key groups only)."""
    tables: dict[str, dict[Any, Any]] = {}
    for f in handle.files:
        entries = read_state_file(str(root), f, key_groups=groups, owner=handle.key_groups,
                                  max_parallelism=MP)
        apply_entries(lambda name: tables.setdefault(name, {}),
                      ((name, k, v) for _, name, k, v in entries))
    return {name: t for name, t in tables.items() if t}


def test_full_then_deltas_restore_exactly(tmp_path: Path) -> None:
    b = make()
    v = ValueState(b, "count", default=0)
    for i in range(300):
        b.current_key = f"k{i}"
        v.value = i
    h1 = snap(b, tmp_path, 1)
    assert [f.full for f in h1.files] == [True] and h1.entries == 300
    b.current_key = "k5"
    v.value = 55
    b.current_key = "k7"
    v.clear()
    b.current_key = "new"
    v.value = -1
    h2 = snap(b, tmp_path, 2)
    assert [f.full for f in h2.files] == [True, False]
    assert h2.new_files == {h2.files[1].handle.path}
    assert h2.files[1].handle.size < h1.files[0].handle.size / 10  # 3 keys, not 300
    assert read(tmp_path, h2) == {"count": dict(b.tables()["count"])}
    # Nothing changed: the same chain, no new file.
    h3 = snap(b, tmp_path, 3)
    assert h3.files == h2.files and not h3.new_files


def test_chain_is_cut_after_max_chain_deltas(tmp_path: Path) -> None:
    b = make(MemoryStateBackend(max_chain=2))
    v = ValueState(b, "s")
    for k in range(100):
        b.current_key = k
        v.value = 0
    kinds = []
    for n in range(1, 8):
        b.current_key = n
        v.value = n
        h = snap(b, tmp_path, n)
        kinds.append([f.full for f in h.files])
        assert read(tmp_path, h) == {"s": {k: k if 1 <= k <= n else 0 for k in range(100)}}
    assert kinds[:4] == [[True], [True, False], [True, False, False], [True]]
    # Most keys written since the last snapshot: a full one (cheaper to write).
    for k in range(60):
        b.current_key = k
        v.value = -k
    assert [f.full for f in snap(b, tmp_path, 8).files] == [True]
    full = make(MemoryStateBackend(incremental=False))
    w = ValueState(full, "s")
    for n in range(1, 4):
        full.current_key = n
        w.value = n
        assert [f.full for f in snap(full, tmp_path / "full", n).files] == [True]


def test_changes_of_an_aborted_checkpoint_go_into_the_next_delta(tmp_path: Path) -> None:
    b = make()
    v = ValueState(b, "s")
    for k in range(100):
        b.current_key = k
        v.value = k
    b.current_key = "a"
    v.value = 1
    snap(b, tmp_path, 1)
    b.current_key = "b"
    v.value = 2
    h2 = snap(b, tmp_path, 2, complete=False)
    b.notify_checkpoint_aborted(2)
    b.current_key = "c"
    v.value = 3
    h3 = snap(b, tmp_path, 3)
    # Built on checkpoint 1's chain, not on the aborted 2's file.
    assert h2.files[1] not in h3.files and len(h3.files) == 2
    assert read(tmp_path, h3) == {"s": {"a": 1, "b": 2, "c": 3} | {k: k for k in range(100)}}


@pytest.mark.parametrize("kind", ["value", "list", "map", "reducing"])
def test_in_place_changes_after_the_barrier_do_not_reach_the_snapshot(
        tmp_path: Path, kind: str) -> None:
    """The synchronous half returns at once; whatever the handles, or user
    code holding the values, do afterwards must not reach the files."""
    b = make()
    b.current_key = "k"
    if kind == "value":
        vs = ValueState(b, "s")
        vs.update({"n": 1, "items": [1]})
        snapshot = b.snapshot(SnapshotTarget(CheckpointStorage(tmp_path), 1, "run", 0))
        d = vs.value
        d["n"] += 1
        d["items"].append(2)  # in place, not even written back
        vs.update(d)
        expected: Any = {"n": 1, "items": [1]}
    elif kind == "list":
        ls = ListState(b, "s")
        ls.add({"x": 1})
        snapshot = b.snapshot(SnapshotTarget(CheckpointStorage(tmp_path), 1, "run", 0))
        ls.add({"x": 2})
        b.tables()["s"]["k"][0]["x"] = 99
        expected = [{"x": 1}]
    elif kind == "map":
        ms = MapState(b, "s")
        ms.put("a", [1])
        snapshot = b.snapshot(SnapshotTarget(CheckpointStorage(tmp_path), 1, "run", 0))
        got = ms.get("a")
        assert got is not None
        got.append(2)
        ms.put("b", [3])
        expected = {"a": [1]}
    else:
        def merge(a: dict[str, Any], x: dict[str, Any]) -> dict[str, Any]:
            a["n"] += x["n"]  # the accumulator, changed in place
            return a
        rs = ReducingState(b, "s", merge)
        rs.add({"n": 1})
        snapshot = b.snapshot(SnapshotTarget(CheckpointStorage(tmp_path), 1, "run", 0))
        rs.add({"n": 5})
        expected = {"n": 1}
    handle = asyncio.run(snapshot.write())
    assert read(tmp_path, handle) == {"s": {"k": expected}}
    # The change is in the state now, and the next delta writes it.
    b.notify_checkpoint_complete(1)
    h2 = snap(b, tmp_path, 2)
    assert read(tmp_path, h2) == {"s": dict(b.tables()["s"])}


def test_a_value_lent_to_user_code_counts_as_written(tmp_path: Path) -> None:
    """Code that changes a dict it read from ValueState in place and never
    calls update() still changed the state: the next delta has it."""
    b = make()
    vs = ValueState(b, "s")
    b.current_key = "k"
    vs.update({"n": 1})
    snap(b, tmp_path, 1)
    vs.value["n"] = 2  # no update()
    assert read(tmp_path, snap(b, tmp_path, 2)) == {"s": {"k": {"n": 2}}}


@pytest.mark.parametrize(("old_p", "new_p"), [(1, 3), (2, 3), (3, 2), (4, 1)])
def test_rescaling_reads_exactly_the_owned_key_groups(tmp_path: Path, old_p: int,
                                                      new_p: int) -> None:
    everything: dict[Any, Any] = {}
    handles = []
    for s in range(old_p):
        b = MemoryStateBackend().create_keyed_backend(
            "op", s, key_group_range(s, MP, old_p), MP, checkpointing=True)
        v = ValueState(b, "count")
        for i in range(400):
            key = ("k", i)
            if key_group_range(s, MP, old_p).start <= _kg(key) < key_group_range(
                    s, MP, old_p).stop:
                b.current_key = key
                v.value = i
                everything[key] = i
        target = SnapshotTarget(CheckpointStorage(tmp_path), 1, "r", s)
        handles.append(asyncio.run(b.snapshot(target).write()))
    parts = []
    for s in range(new_p):
        groups = key_group_range(s, MP, new_p)
        mine: dict[Any, Any] = {}
        for h in handles:
            mine.update(read(tmp_path, h, groups).get("count", {}))
        assert all(_kg(k) in groups for k in mine)
        parts.append(mine)
    assert sum(map(len, parts)) == len(everything)
    assert {k: v for p in parts for k, v in p.items()} == everything


def _kg(key: Any) -> int:
    from eddyflow.keygroups import key_group_for
    return key_group_for(key, MP)


def test_unpicklable_value_names_state_and_key(tmp_path: Path) -> None:
    b = make()
    vs = ValueState(b, "conn")
    b.current_key = "user-1"
    vs.update(lambda: None)
    # Raised by the forked child (which hands it over as itself) or at the
    # barrier (see also tests/state/test_unpicklable_values.py).
    with pytest.raises(StateSerializationError, match="cannot snapshot keyed state 'conn' of "
                       "operator 'op' for key 'user-1' in checkpoint 1: Can't pickle"):
        snap(b, tmp_path, 1)


def test_damaged_and_truncated_frames_raise_checkpoint_corrupted(tmp_path: Path) -> None:
    b = make()
    v = ValueState(b, "s")
    for i in range(50):
        b.current_key = f"k{i}"
        v.value = i
    f = snap(b, tmp_path, 1).files[0]
    path = tmp_path / f.handle.path

    def read_all() -> list[Any]:
        return list(read_state_file(str(tmp_path), f, max_parallelism=MP, with_groups=True))

    assert len(read_all()) == 50
    data = path.read_bytes()
    offset, length = f.index["0"]
    path.write_bytes(data[:offset + 8] + b"\x00" * (length - 8) + data[offset + length:])
    with pytest.raises(CheckpointCorrupted):
        read_all()
    path.write_bytes(data[: offset + 3])
    with pytest.raises(CheckpointCorrupted, match="truncated"):
        read_all()
    os.unlink(path)
    with pytest.raises(CheckpointCorrupted, match="unreadable"):
        read_all()


def test_a_grouped_file_is_read_by_key_group(tmp_path: Path) -> None:
    """Files written by frame per key group (earlier checkpoints, the
    offline tools) read only the wanted key groups' frames."""
    from eddyflow.state.format import encode_frames

    entries = {_kg(k): [("s", [k], [i], [])] for i, k in enumerate(["a", "b", "c", "d"])}
    chunks, index = encode_frames(entries)
    (tmp_path / "f").write_bytes(b"".join(chunks))
    some = range(0, 64)
    got = list(read_key_groups(str(tmp_path), "f", index, some))
    assert sorted(k for _, _, k, _ in got) == sorted(k for k in "abcd" if _kg(k) in some)


def test_frames_of_earlier_formats_are_still_read() -> None:
    body = pickle.dumps((5, [("count", "a", 1), ("seen", "b", [1, 2])]))
    frame = struct.pack(">Q", len(body)) + body
    assert decode_frame(frame, 5, "old", 0) == [("count", "a", 1), ("seen", "b", [1, 2])]
    body = pickle.dumps((5, "columns", [("count", ["a", "b"], [1, 2])]))
    frame = struct.pack(">Q", len(body)) + body
    assert decode_frame(frame, 5, "old", 0) == [("count", "a", 1), ("count", "b", 2)]
    body = pickle.dumps((5, "delta", [("count", ["a"], [1], ["b"])]))
    frame = struct.pack(">Q", len(body)) + body
    assert decode_frame(frame, 5, "new", 0) == [("count", "a", 1), ("count", "b", DELETED)]
    body = pickle.dumps((-1, "table", "count", {"a": 1, "b": 2}))
    frame = struct.pack(">Q", len(body)) + body
    assert decode_frame(frame, -1, "new", 0) == [("count", "a", 1), ("count", "b", 2)]


def test_full_snapshots_of_scalar_and_of_mutable_values_round_trip(tmp_path: Path) -> None:
    """Scalar tables are written whole (a dict frame), others as columns."""
    b = make()
    counts, docs = ValueState(b, "counts"), ValueState(b, "docs")
    for i in range(200):
        b.current_key = ("k", i)
        counts.value = i
        docs.value = {"i": [i]}
    h = snap(b, tmp_path, 1)
    assert read(tmp_path, h) == {"counts": {("k", i): i for i in range(200)},
                                 "docs": {("k", i): {"i": [i]} for i in range(200)}}


def test_snapshot_of_a_closed_backend_is_refused(tmp_path: Path) -> None:
    b = make()
    b.close()
    with pytest.raises(RuntimeError, match="closed"):
        b.snapshot(SnapshotTarget(CheckpointStorage(tmp_path), 1, "run", 0))


def test_reducing_state_add_uses_fn(tmp_path: Path) -> None:
    b = make()
    rs = ReducingState(b, "r", operator.add)
    b.current_key = 1
    rs.add(2)
    rs.add(3)
    assert read(tmp_path, snap(b, tmp_path, 1)) == {"r": {1: 5}}


def _write_batch(b: MemoryKeyedStateBackend, name: str, items: dict[Any, Any]) -> None:
    """What a built-in keyed operator does with a batch: write the table,
    then record the batch's keys in one list (unless nobody reads them)."""
    table = b.declare(name, "value")
    table.update(items)
    changes = b.changes(name)
    if changes.keys is not None:
        changes.add_batch(list(items))


def test_batch_records_saturate_into_a_full_snapshot(tmp_path: Path) -> None:
    """Keys are not recorded before the first snapshot (it is full), and no
    longer once more than half the entries were written since the last one
    (the next one is full); a delta follows a completed full snapshot."""
    b = make()
    _write_batch(b, "s", {k: {"v": [k]} for k in range(100)})
    changes = b.changes("s")
    assert changes.saturated and changes.keys is None and len(changes) == 0
    assert [f.full for f in snap(b, tmp_path, 1).files] == [True]
    assert changes.keys == {} and not changes.saturated
    _write_batch(b, "s", {k: {"v": [-k]} for k in range(10)})
    h2 = snap(b, tmp_path, 2)
    assert [f.full for f in h2.files] == [True, False]
    assert read(tmp_path, h2) == {"s": dict(b.tables()["s"])}
    for start in range(10, 70, 10):  # 60 of 100 keys, a batch of 10 at a time
        _write_batch(b, "s", {k: {"v": [k, k]} for k in range(start, start + 10)})
    assert changes.saturated and changes.keys is None
    h3 = snap(b, tmp_path, 3)
    assert [f.full for f in h3.files] == [True]
    want = {k: {"v": [-k]} if k < 10 else {"v": [k, k]} if k < 70 else {"v": [k]}
            for k in range(100)}
    assert read(tmp_path, h3) == {"s": want}
    b.tables()["s"][3]["v"].append("after the barrier")  # in place: not in h3
    assert read(tmp_path, h3) == {"s": want}
    _write_batch(b, "s", {3: b.tables()["s"][3], "new": {"v": []}})
    h4 = snap(b, tmp_path, 4)
    assert [f.full for f in h4.files] == [True, False] and h4.files[0] == h3.files[0]
    assert read(tmp_path, h4) == {"s": dict(b.tables()["s"])}


def test_a_saturated_snapshot_not_completed_makes_the_next_one_full(tmp_path: Path) -> None:
    """The keys written before an unconfirmed snapshot whose record
    saturated are not known: a delta over the chain before it would miss
    them, so the next snapshot is full until one after it completes."""
    b = make()
    _write_batch(b, "s", {k: k for k in range(100)})
    snap(b, tmp_path, 1)
    _write_batch(b, "s", {k: -k for k in range(80)})
    assert b.changes("s").saturated
    snap(b, tmp_path, 2, complete=False)
    b.notify_checkpoint_aborted(2)
    _write_batch(b, "s", {"x": 1})
    h3 = snap(b, tmp_path, 3)
    assert [f.full for f in h3.files] == [True]
    assert read(tmp_path, h3) == {"s": dict(b.tables()["s"])}
    _write_batch(b, "s", {"y": 2})
    h4 = snap(b, tmp_path, 4)
    assert [f.full for f in h4.files] == [True, False]
    assert read(tmp_path, h4) == {"s": dict(b.tables()["s"])}


def test_changes_budget_follows_the_table_and_take_refuses_when_saturated() -> None:
    size = [0]
    changes = Changes(True, lambda: size[0] / 2)
    size[0] = 10
    changes.add_batch(list(range(4)))  # over the budget it started with (0), not 5
    assert not changes.saturated and len(changes) == 4
    changes.add_batch(list(range(4, 8)))
    assert changes.saturated and changes.keys is None and len(changes) == 0
    with pytest.raises(RuntimeError, match="saturated"):
        changes.take()
    assert changes.take_written() is None
    assert changes.keys == {} and not changes.saturated
    changes.add_batch([1, 2])
    assert changes.take_written() == ({}, [[1, 2]])
    untracked = Changes(False, lambda: 0.0)
    untracked.saturate()
    assert untracked.keys is None and not untracked.saturated
    assert untracked.take_written() == ({}, [])


def _files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("kind", ["scalars", "mutable"])
def test_an_end_of_input_snapshot_is_streamed_into_its_file(tmp_path: Path, kind: str,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """At the end of the input a large snapshot is encoded straight into a
    temporary file and sealed (checksum read back, renamed): the same
    frames as one encoded in memory, and nothing left but the file."""
    monkeypatch.setattr(memory_snapshot, "_INLINE_SECONDS", 0)
    b = make()
    vs = ValueState(b, "s")
    for i in range(5000):
        b.current_key = f"k{i}"
        vs.update(i if kind == "scalars" else {"n": i, "seen": [i]})
    storage = CheckpointStorage(tmp_path)
    snapshot = b.snapshot(SnapshotTarget(storage, 1, "run", 0, at_end=True))
    assert isinstance(snapshot, memory_snapshot._Snapshot) and snapshot.streamed is not None
    b.current_key = "k0"
    if kind == "mutable":
        vs.value["seen"].append("after the barrier")  # type: ignore[index]
    handle = asyncio.run(snapshot.write())
    (state_file,) = handle.files
    assert _files_under(tmp_path) == [state_file.handle.path]
    storage.verify_file(state_file.handle)  # size and checksum as recorded
    want = {f"k{i}": (i if kind == "scalars" else {"n": i, "seen": [i]}) for i in range(5000)}
    assert read(tmp_path, handle) == {"s": want}
    # Byte for byte what the encoder gives in memory.
    chunks, index = memory_snapshot._encode(
        {"s": dict(zip(want, want.values(), strict=True))}, [], True, MP, "op", 1)
    assert (tmp_path / state_file.handle.path).read_bytes() == b"".join(chunks)
    assert dict(state_file.index) == index


def test_a_streamed_snapshot_that_fails_or_is_cancelled_leaves_no_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_snapshot, "_INLINE_SECONDS", 0)
    b = make()
    vs = ValueState(b, "s")
    for i in range(100):
        b.current_key = f"k{i}"
        vs.update([i])
    storage = CheckpointStorage(tmp_path)
    snapshot = b.snapshot(SnapshotTarget(storage, 1, "run", 0, at_end=True))
    snapshot.cancel()
    assert _files_under(tmp_path) == []
    b.current_key = "k50"
    vs.update(lambda: None)  # cannot be pickled
    with pytest.raises(StateSerializationError, match="k50"):
        b.snapshot(SnapshotTarget(storage, 2, "run", 0, at_end=True))
    assert _files_under(tmp_path) == []


def test_a_long_intervals_keys_are_folded_a_slice_per_batch() -> None:
    """Keys that do not repeat stop the de-duplication at its first fold;
    past ``fold`` recorded keys, each batch recorded then folds at most
    ``fold_step`` keys (and whole batches) into the set: the loop never
    stops to fold a long interval at once, and nothing recorded is lost."""

    class Small(Changes):
        fold = 100
        fold_step = 20
        dedup_every = 14

    ch = Small(True)
    added: set[int] = set()
    for i in range(60):
        batch = [i * 7 + j for j in range(7)]  # every key new
        before = ch._batched
        ch.add_batch(batch)
        added.update(batch)
        folded_now = before + len(batch) - ch._batched
        assert folded_now <= max(Small.fold_step, Small.dedup_every) + len(batch)
        assert ch._batched <= Small.fold + 2 * (Small.fold_step + len(batch))
    assert len(ch) == len(added) == ch.count()
    keys, batches = ch.take()
    assert set(keys) | {k for b in batches for k in b} == added
    assert isinstance(batches[0], set) and len(batches) > 1  # some folded, some not
