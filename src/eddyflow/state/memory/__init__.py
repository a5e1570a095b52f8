"""Keyed state in Python dicts on the heap, snapshotted incrementally: a
forked child writes the keys changed since the last checkpoint as a delta
over the files of the checkpoints before it (see :mod:`.snapshot`)."""

from eddyflow.state.memory.backend import MemoryKeyedStateBackend, MemoryStateBackend

__all__ = ["MemoryKeyedStateBackend", "MemoryStateBackend"]
