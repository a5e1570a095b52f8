"""The RocksDB backend's registration (``state/registry.py``): a handle is
read by copying its files into a local folder (each verified as it is
copied) and opening that database read-only; two handles hold the same
state when they name the same SST files; executors need ``rocksdict``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.state.abc import StateBackend
from eddyflow.state.registry import BackendKind
from eddyflow.state.rocksdb.backend import RocksDBStateBackend
from eddyflow.state.rocksdb.handle import RocksDBStateHandle
from eddyflow.state.rocksdb.reader import read_handle

__all__ = ["RocksDBKind"]


class RocksDBKind(BackendKind):
    """The RocksDB backend's registration."""

    name = "rocksdb"
    handle_type = RocksDBStateHandle
    backend_type = RocksDBStateBackend
    executor_modules = ("rocksdict",)

    def read(self, root: str, handle: KeyedStateHandle, *, key_groups: range | None = None,
             max_parallelism: int = 0, with_groups: bool = False
             ) -> Iterator[tuple[int, str, Any, Any]]:
        assert isinstance(handle, RocksDBStateHandle)
        for name, kg, key, value in read_handle(root, handle, key_groups):
            yield kg, name, key, value

    def read_verified(self, root: str, handle: KeyedStateHandle,
                      key_groups: range | None = None, max_parallelism: int = 0
                      ) -> Iterator[tuple[int, str, Any, Any]]:
        # Each key once, and every file verified as it is copied: streamed.
        return self.read(root, handle, key_groups=key_groups, max_parallelism=max_parallelism)

    def same_state(self, a: KeyedStateHandle, b: KeyedStateHandle) -> bool:
        assert isinstance(a, RocksDBStateHandle) and isinstance(b, RocksDBStateHandle)
        return set(a.sst_files().values()) == set(b.sst_files().values())

    def offline_settings(self, configured: StateBackend) -> Any:
        # The job's serializer, if it has one: the bootstrapped rows are read
        # back by it.
        return configured.serializer if isinstance(configured, RocksDBStateBackend) else None

    def offline_backend(self, workdir: str, settings: Any) -> StateBackend:
        return RocksDBStateBackend(workdir, serializer=settings)
