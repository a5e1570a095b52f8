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
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from eddyflow.backedge.log import decode_backedge_log
from eddyflow.state.abc import KeyedStateHandle, StateFile
from eddyflow.state.format import DELETED
from eddyflow.state.storage import CheckpointCorrupted, CheckpointStorage, FileHandle

__all__ = ["CheckpointRef", "KeyedFile", "keyed_files", "open_checkpoint", "read_keyed_file",
           "read_verified_backedge_log"]

log = logging.getLogger("eddyflow.offline")

_CHK = re.compile(r"^chk-(\d+)$")


@dataclass(frozen=True)
class CheckpointRef:
    """A verified checkpoint: storage root, id and metadata."""

    root: str
    id: int
    meta: dict[str, Any]

    @property
    def path(self) -> str:
        return os.path.join(self.root, f"chk-{self.id}")


def open_checkpoint(path: str | os.PathLike[str], checkpoint: int | None = None
                    ) -> CheckpointRef:
    """``path`` is a checkpoint folder (``…/chk-12``), or a checkpoint
    directory with ``checkpoint`` naming one of its checkpoints (default: the
    latest that verifies)."""
    path = os.path.abspath(os.fspath(path))
    match = _CHK.match(os.path.basename(path.rstrip(os.sep)))
    if match and checkpoint is None:
        storage = CheckpointStorage(os.path.dirname(path.rstrip(os.sep)))
        n = int(match.group(1))
    else:
        if not os.path.isdir(path):
            raise FileNotFoundError(f"checkpoint directory {path!r} does not exist")
        storage = CheckpointStorage(path)
        if checkpoint is None:
            # The newest whose metadata verifies; its files are verified by
            # the executors that read them, not all over again here.
            for n in reversed(storage.completed_ids()):
                try:
                    return CheckpointRef(storage.root, n, storage.read_metadata(n))
                except CheckpointCorrupted as exc:
                    log.warning("skipping checkpoint %d: %s", n, exc)
            raise FileNotFoundError(f"{path!r} holds no completed checkpoint")
        n = checkpoint
    return CheckpointRef(storage.root, n, storage.read_metadata(n))


@dataclass(frozen=True)
class KeyedFile:
    """One subtask's keyed state of one operator: its files, in the order
    they apply (a full snapshot, then the deltas written since)."""

    root: str
    operator: str
    subtask: int
    files: tuple[StateFile, ...]
    kinds: dict[str, str]
    max_parallelism: int = 0


def keyed_files(ref: CheckpointRef, operator: str | None = None) -> list[KeyedFile]:
    """The keyed state of ``operator`` by subtask (every operator if ``None``)."""
    ops = ref.meta["operators"]
    if operator is not None and operator not in ops:
        raise KeyError(f"checkpoint {ref.id} has no operator {operator!r}; it has "
                       f"{sorted(ops)}")
    out = []
    for uid, op in sorted(ops.items()):
        if operator is not None and uid != operator:
            continue
        for s, part in sorted(op["subtasks"].items(), key=lambda kv: int(kv[0])):
            keyed = part.get("keyed")
            if keyed is not None:
                handle = KeyedStateHandle.from_json(keyed)
                out.append(KeyedFile(ref.root, uid, int(s), handle.files, dict(handle.kinds),
                                     int(ref.meta.get("max_parallelism", 0))))
    return out


def read_keyed_file(kf: KeyedFile) -> Iterator[tuple[int, str, Any, Any]]:
    """``(key_group, state, key, value)`` of one subtask's keyed state: each
    of its files verified, the deltas applied over the full snapshot."""
    storage = CheckpointStorage(kf.root)
    state: dict[str, dict[Any, tuple[int, Any]]] = {}
    for f in kf.files:
        storage.verify_file(f.handle)
        for kg, name, key, value in f.entries(kf.root, max_parallelism=kf.max_parallelism,
                                              with_groups=True):
            table = state.setdefault(name, {})
            if value is DELETED:
                table.pop(key, None)
            else:
                table[key] = (kg, value)
    for name, table in state.items():
        for key, (kg, value) in table.items():
            yield kg, name, key, value


def read_verified_backedge_log(root: str, handle: FileHandle) -> dict[int, list[Any]]:
    """The channels of one back-edge log file, verified (read once)."""
    data = CheckpointStorage(root).read_verified(handle)
    return decode_backedge_log(data, os.path.join(root, handle.path))
