"""The memory backend's registration (``state/registry.py``): its handles
are chains of keyed-state files, read by any backend and by the offline
jobs as they apply; the change feed reads only the deltas a chain added."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle, StateFile
from eddyflow.state.abc import StateBackend
from eddyflow.state.format import read_state_file
from eddyflow.state.memory.backend import MemoryStateBackend
from eddyflow.state.memory.handle import MemoryStateHandle
from eddyflow.state.registry import BackendKind

__all__ = ["MemoryKind"]


class MemoryKind(BackendKind):
    """The memory backend's registration."""

    name = "memory"
    handle_type = MemoryStateHandle
    backend_type = MemoryStateBackend

    def read(self, root: str, handle: KeyedStateHandle, *, key_groups: range | None = None,
             max_parallelism: int = 0, with_groups: bool = False
             ) -> Iterator[tuple[int, str, Any, Any]]:
        assert isinstance(handle, MemoryStateHandle)
        owner = handle.key_groups if len(handle.key_groups) else None
        for f in handle.files:
            yield from read_state_file(root, f, key_groups=key_groups, owner=owner,
                                       max_parallelism=max_parallelism, with_groups=with_groups)

    def delta_files(self, start: KeyedStateHandle, end: KeyedStateHandle
                    ) -> tuple[StateFile, ...] | None:
        """The files ``end``'s chain adds to ``start``'s, if it extends it
        (``start`` empty: all of ``end``'s, a full file too — every entry is
        new)."""
        assert isinstance(start, MemoryStateHandle) and isinstance(end, MemoryStateHandle)
        n = len(start.files)
        if len(end.files) < n or [f.handle for f in end.files[:n]] != start.file_handles():
            return None
        return tuple(end.files[n:])

    def offline_backend(self, workdir: str, settings: Any) -> StateBackend:
        return MemoryStateBackend()
