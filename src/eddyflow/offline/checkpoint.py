"""Locating and reading one checkpoint for the offline jobs, on the driver
and on Spark executors alike (no Spark imports here).

A checkpoint is named by its folder, ``<checkpoint dir>/chk-<n>``; its
``_metadata`` is verified (checksum, format version) before anything is read,
and every state file is verified against the size and SHA-256 the metadata
records for it, by the executor that reads it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.layout import CheckpointLayout, parse_checkpoint_dir
from eddyflow.checkpoint.metadata import CheckpointMetadata, read_checkpoint
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage, FileHandle
from eddyflow.offline.shipping import import_on_executor
from eddyflow.runtime.checkpointing.backedge_log import Logged, decode_backedge_log
from eddyflow.runtime.checkpointing.channel_state import decode_channel_state
from eddyflow.state.registry import kind_of

__all__ = ["CheckpointRef", "KeyedFile", "keyed_files", "open_checkpoint", "read_keyed_file",
           "read_verified_backedge_log", "read_verified_channel_state"]

log = logging.getLogger("eddyflow.offline")


@dataclass(frozen=True)
class CheckpointRef:
    """A verified checkpoint: storage root, id and metadata."""

    root: str
    id: int
    meta: CheckpointMetadata

    @property
    def path(self) -> str:
        """The checkpoint's folder."""
        return CheckpointLayout(self.root).checkpoint_dir(self.id)

    @property
    def backends(self) -> frozenset[str]:
        """The state backends whose formats its keyed state is written in."""
        return frozenset(part.keyed.backend for op in self.meta.operators.values()
                         for part in op.subtasks.values() if part.keyed is not None)


def open_checkpoint(path: str | os.PathLike[str], checkpoint: int | None = None
                    ) -> CheckpointRef:
    """``path`` is a checkpoint folder (``…/chk-12``), or a checkpoint
    directory with ``checkpoint`` naming one of its checkpoints (default: the
    latest that verifies)."""
    path = os.path.abspath(os.fspath(path))
    named = parse_checkpoint_dir(path)
    if named is not None and checkpoint is None:
        storage = CheckpointStorage(os.path.dirname(path))
        n = named
    else:
        if not os.path.isdir(path):
            raise FileNotFoundError(f"checkpoint directory {path!r} does not exist")
        storage = CheckpointStorage(path)
        if checkpoint is None:
            # The newest whose metadata verifies; its files are verified by
            # the executors that read them, not all over again here.
            for n in reversed(storage.completed_ids()):
                try:
                    return CheckpointRef(storage.root, n, read_checkpoint(storage, n))
                except CheckpointCorrupted as exc:
                    log.warning("skipping checkpoint %d: %s", n, exc)
            raise FileNotFoundError(f"{path!r} holds no completed checkpoint")
        n = checkpoint
    return CheckpointRef(storage.root, n, read_checkpoint(storage, n))


@dataclass(frozen=True)
class KeyedFile:
    """One subtask's keyed state of one operator: its handle in the
    checkpoint of storage ``root``, read by its backend's registration
    (``state/registry.py``)."""

    root: str
    operator: str
    subtask: int
    handle: KeyedStateHandle
    max_parallelism: int = 0

    @property
    def kinds(self) -> dict[str, str]:
        """State name -> kind."""
        return dict(self.handle.kinds)

    @property
    def key_groups(self) -> range | None:
        """The key groups the subtask owned (``None``: unknown, metadata
        format 1)."""
        if not len(self.handle.key_groups):
            return None
        return self.handle.key_groups


def keyed_files(ref: CheckpointRef, operator: str | None = None) -> list[KeyedFile]:
    """The keyed state of ``operator`` by subtask (every operator if ``None``)."""
    ops = ref.meta.operators
    if operator is not None and operator not in ops:
        raise KeyError(f"checkpoint {ref.id} has no operator {operator!r}; it has "
                       f"{sorted(ops)}")
    out = []
    for uid, op in sorted(ops.items()):
        if operator is not None and uid != operator:
            continue
        for s, part in sorted(op.subtasks.items()):
            if part.keyed is not None:
                out.append(KeyedFile(ref.root, uid, s, part.keyed, ref.meta.max_parallelism))
    return out


def read_keyed_file(kf: KeyedFile, key_groups: range | None = None
                    ) -> Iterator[tuple[int, str, Any, Any]]:
    """``(key_group, state, key, value)`` of one subtask's keyed state (of
    ``key_groups`` only, if given), each key once, each of its files
    verified: as its backend's registration reads it. A module the backend
    needs here (``rocksdict``: compiled) is imported from this executor's
    Python, or from the copy the driver shipped."""
    kind = kind_of(kf.handle)
    for module in kind.executor_modules:
        import_on_executor(module)
    yield from kind.read_verified(kf.root, kf.handle, key_groups, kf.max_parallelism)


def read_verified_channel_state(root: str, handle: FileHandle
                                ) -> tuple[dict[str, list[Logged]], dict[str, list[Logged]]]:
    """One channel-state file (an unaligned checkpoint's), verified: its
    input and output parts per channel key."""
    storage = CheckpointStorage(root)
    data = storage.read_verified(handle)
    return decode_channel_state(data, storage.layout.path(handle.path))


def read_verified_backedge_log(root: str, handle: FileHandle) -> dict[int, list[Any]]:
    """The channels of one back-edge log file, verified (read once)."""
    storage = CheckpointStorage(root)
    data = storage.read_verified(handle)
    return decode_backedge_log(data, storage.layout.path(handle.path))
