"""Keyed state in Python dicts on the heap, snapshotted incrementally: a
forked child writes the keys changed since the last checkpoint as a delta
over the files of the checkpoints before it (see :mod:`.snapshot`).
``handle`` is its checkpoint handle, ``kind`` its registration
(``state/registry.py``), made here."""

from eddyflow.state.memory.backend import MemoryKeyedStateBackend, MemoryStateBackend
from eddyflow.state.memory.handle import MemoryStateHandle
from eddyflow.state.memory.kind import MemoryKind
from eddyflow.state.registry import register

register(MemoryKind())

__all__ = ["MemoryKeyedStateBackend", "MemoryStateBackend", "MemoryStateHandle"]
