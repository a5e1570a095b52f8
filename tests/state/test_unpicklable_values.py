"""Keyed-state values that cannot be pickled, on every path that pickles
them (issue 13): a :class:`~eddyflow.errors.StateSerializationError` naming
the operator, the state, the key and, at a snapshot, the checkpoint.

Paths: the memory backend's snapshot at the barrier and in a forked child;
the RocksDB backend's snapshot of a few changed keys (values taken at the
barrier), of many (an SST file, by a forked child or at the barrier), of
map and list state (flushed at the barrier), and its write cache flushed
outside any snapshot ("in RocksDB"). A forked child hands the error over as
itself, not as text, so that the restart loop can tell what it is. The
runtime's side (the job fails at once) is in
``tests/integration/test_unpicklable_state.py``.
"""

from __future__ import annotations

import asyncio
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from job_support import BACKENDS

import eddyflow as ef
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.errors import StateSerializationError, is_retryable
from eddyflow.state import forked
from eddyflow.state.abc import KeyedStateBackend, SnapshotTarget
from eddyflow.state.handles import ListState, MapState, ValueState
from eddyflow.state.memory import snapshot as memory_snapshot
from eddyflow.state.rocksdb import backend as rocksdb_backend

MP = 128
REASON = r"Can't pickle local object '_local\.<locals>\.Local'"


@pytest.fixture(params=["fork", "inline", "few"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Snapshots by a forked child, or at the barrier (both backends).
    RocksDB: above ``_INLINE`` changed keys an SST file is written (by a
    child, or at the barrier without fork); up to it ("few"), the values
    are taken at the barrier and written by the checkpoint's thread."""
    fork = request.param == "fork"
    monkeypatch.setattr(forked, "ENABLED", fork)
    monkeypatch.setattr(memory_snapshot, "_INLINE_SECONDS", 0 if fork else 1e9)
    if request.param != "few":
        monkeypatch.setattr(rocksdb_backend, "_INLINE", 0)
    yield str(request.param)


def _backend(kind: str, tmp_path: Path, **options: Any) -> KeyedStateBackend:
    factory: ef.StateBackend = (ef.MemoryStateBackend() if kind == "memory"
                                else ef.RocksDBStateBackend(tmp_path / "rocks", **options))
    return factory.create_keyed_backend("dedup", 0, range(MP), MP, checkpointing=True)


def _snapshot(b: KeyedStateBackend, tmp_path: Path, n: int) -> None:
    target = SnapshotTarget(CheckpointStorage(tmp_path / "chk"), n, "run", 0)
    asyncio.run(b.snapshot(target).write())


def _local() -> Any:
    class Local:
        pass
    return Local()


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("state", ["value", "map", "list"])
def test_snapshot_names_operator_state_key_and_checkpoint(
        tmp_path: Path, mode: str, kind: str, state: str) -> None:
    b = _backend(kind, tmp_path)
    handles = {"value": lambda: ValueState(b, "seen"), "map": lambda: MapState(b, "seen"),
               "list": lambda: ListState(b, "seen")}
    h: Any = handles[state]()
    for i in range(20):  # picklable values around the bad one
        b.current_key = f"k{i}"
        value = _local() if i == 13 else i
        if state == "value":
            h.value = value
        elif state == "map":
            h.put("m", value)
        else:
            h.add(value)
    with pytest.raises(StateSerializationError) as info:
        _snapshot(b, tmp_path, 3)
    e = info.value
    assert re.fullmatch(rf"cannot snapshot keyed state 'seen' of operator 'dedup' for key "
                        rf"'k13' in checkpoint 3: {REASON}", str(e)), str(e)
    assert (e.operator, e.state, e.key, e.checkpoint) == ("dedup", "seen", "'k13'", 3)
    assert not is_retryable(e)
    b.close()  # (RocksDB: does not try to write the value again)


def test_rocksdb_write_cache_names_operator_state_and_key(tmp_path: Path) -> None:
    # Outside a snapshot (the write cache is flushed when it is full, and at
    # the end of a job without checkpoints) there is no checkpoint to name.
    b = _backend("rocksdb", tmp_path)
    seen = ValueState(b, "seen")
    for i in range(10):
        b.current_key = f"k{i}"
        seen.value = _local() if i == 1 else i
    with pytest.raises(StateSerializationError) as info:
        b.flush()
    assert re.fullmatch(rf"cannot store keyed state 'seen' of operator 'dedup' for key 'k1' "
                        rf"in RocksDB: {REASON}", str(info.value)), str(info.value)
    assert info.value.checkpoint is None
    b.close()


def test_the_error_survives_pickling_as_a_forked_child_sends_it() -> None:
    e = StateSerializationError("Can't pickle x", operator="op", state="s", key="'k'",
                                checkpoint=7)
    copy = pickle.loads(pickle.dumps(e))
    assert type(copy) is StateSerializationError
    assert str(copy) == str(e) == ("cannot snapshot keyed state 's' of operator 'op' for key "
                                   "'k' in checkpoint 7: Can't pickle x")
    assert not copy.retryable


def test_forked_child_hands_eddyflow_errors_over_as_themselves() -> None:
    def fail() -> None:
        raise StateSerializationError("boom", state="s", key="1")

    def other() -> None:
        raise KeyError("x")

    for enabled in (True, False):
        forked.ENABLED, saved = enabled, forked.ENABLED
        try:
            with pytest.raises(StateSerializationError, match="for key 1: boom"):
                asyncio.run(forked.start(fail).result())
            with pytest.raises(OSError, match="KeyError"):  # others as text, as before
                asyncio.run(forked.start(other).result())
        finally:
            forked.ENABLED = saved
