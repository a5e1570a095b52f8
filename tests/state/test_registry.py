"""The backend registry: the built-in backends are registered by their
packages, a handle is read as its backend's class, a backend nobody
registered is refused by name, and one name means one backend."""

from __future__ import annotations

from typing import Any

import pytest
from job_support import BACKENDS

import eddyflow as ef
from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.storage import CheckpointCorrupted, FileHandle
from eddyflow.state import registry
from eddyflow.state.memory import MemoryStateHandle
from eddyflow.state.memory.kind import MemoryKind
from eddyflow.state.rocksdb import RocksDBStateHandle


def test_the_built_in_backends_are_registered_by_their_packages(tmp_path: Any) -> None:
    assert set(BACKENDS) <= set(registry.names())
    assert registry.kind_of_backend(ef.MemoryStateBackend()) is registry.kind_named("memory")
    rocks = ef.RocksDBStateBackend(tmp_path / "rocks")
    assert registry.kind_of_backend(rocks) is registry.kind_named("rocksdb")
    assert registry.kind_named("rocksdb").executor_modules == ("rocksdict",)


def test_a_handle_is_read_as_its_backends_class() -> None:
    f = FileHandle("shared/x.sst", 3, "ab")
    rocks = RocksDBStateHandle({"s": "value"}, 5, range(0, 8), (("000009.sst", f),),
                               new_files=frozenset({f.path}))
    memory = MemoryStateHandle({"s": "value"}, 5, range(0, 8))
    for h in (rocks, memory):
        back = KeyedStateHandle.from_json(h.to_json())
        assert type(back) is type(h)
        assert back.to_json() == h.to_json()
    # Written before handles named their backend: the memory backend's.
    legacy = {"kinds": {"s": "value"}, "entries": 0, "key_groups": [0, 8], "files": []}
    assert isinstance(KeyedStateHandle.from_json(legacy), MemoryStateHandle)


def test_a_handle_of_an_unregistered_backend_is_refused_by_name() -> None:
    with pytest.raises(CheckpointCorrupted, match="unknown backend 'nowhere'"):
        KeyedStateHandle.from_json({"backend": "nowhere", "kinds": {}, "entries": 0,
                                    "key_groups": [0, 1]})
    with pytest.raises(KeyError, match="no state backend is registered as 'nowhere'"):
        registry.kind_named("nowhere")


def test_one_name_means_one_backend() -> None:
    class Impostor(MemoryKind):
        pass

    with pytest.raises(ValueError, match="registered already"):
        registry.register(Impostor())
    assert type(registry.kind_named("memory")) is MemoryKind
