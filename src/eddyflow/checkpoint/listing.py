"""``ef.list_checkpoints``: the completed, retained checkpoints of a
checkpoint directory with their statistics (docs/operations.md)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from eddyflow.checkpoint.metadata import CheckpointMetadata
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage

__all__ = ["CheckpointInfo", "list_checkpoints"]

log = logging.getLogger("eddyflow.checkpoint.listing")


@dataclass(frozen=True)
class CheckpointInfo:
    id: int
    path: str
    completed_at: float  # Unix time
    duration: float  # seconds from trigger to completion
    alignment_duration: float  # longest alignment of any task, seconds
    checkpointed_size: int  # bytes this checkpoint wrote
    full_size: int  # bytes of all state this checkpoint references
    final: bool = False  # taken at the end of a bounded input
    #: The metadata's ``operators`` and the whole metadata as JSON (as on disk).
    operators: dict[str, Any] = field(default_factory=dict, repr=False)
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)
    #: ``list_checkpoints(..., verify=True)``: True when every file checks
    #: out against the size and SHA-256 its metadata records, False when
    #: one does not or the metadata itself cannot be read (``problem`` says
    #: why: such a checkpoint does not exist for recovery). ``None``: the
    #: files were not checked.
    verified: bool | None = None
    problem: str | None = None

    @cached_property
    def meta(self) -> CheckpointMetadata:
        """The metadata, typed (see :mod:`eddyflow.checkpoint.metadata`)."""
        return CheckpointMetadata.from_json(self.metadata)


def list_checkpoints(directory: str | os.PathLike[str], *,
                     verify: bool = False) -> list[CheckpointInfo]:
    """Completed checkpoints whose metadata verifies, oldest first.

    ``verify``: also check every file of each checkpoint against its
    metadata (``verified`` and ``problem`` say how it went), and list the
    checkpoints whose metadata cannot be read, as not verified with only
    their ``id``, ``path`` and ``completed_at`` (the metadata file's time)
    known, instead of leaving them out."""
    storage = CheckpointStorage(directory)
    out = []
    for n in storage.completed_ids():
        try:
            raw = storage.read_metadata(n)
            meta = CheckpointMetadata.from_json(raw)
        except (CheckpointCorrupted, ValueError) as exc:
            if not verify:
                log.warning("skipping checkpoint %d: %s", n, exc)
                continue
            out.append(_broken(storage, n, _relative(str(exc), storage.root)))
            continue
        verified: bool | None = None
        problem: str | None = None
        if verify:
            try:
                for handle in meta.files:
                    storage.verify_file(handle)
                verified = True
            except CheckpointCorrupted as exc:
                verified, problem = False, _relative(str(exc), storage.root)
        out.append(CheckpointInfo(
            id=n,
            path=storage.layout.checkpoint_dir(n),
            completed_at=meta.completed_at,
            duration=meta.duration,
            alignment_duration=meta.alignment_duration,
            checkpointed_size=meta.checkpointed_size,
            full_size=meta.full_size,
            final=meta.final,
            operators=raw["operators"],
            metadata=raw,
            verified=verified,
            problem=problem,
        ))
    return out


def _broken(storage: CheckpointStorage, n: int, problem: str) -> CheckpointInfo:
    """A checkpoint whose metadata cannot be read: what is known of it."""
    path = storage.layout.checkpoint_dir(n)
    try:
        when = os.stat(storage.layout.metadata(n)).st_mtime
    except OSError:
        when = 0.0
    return CheckpointInfo(id=n, path=path, completed_at=when, duration=0.0,
                          alignment_duration=0.0, checkpointed_size=0, full_size=0,
                          verified=False, problem=problem)


def _relative(message: str, root: str) -> str:
    """``message`` with the paths under ``root`` relative to it (a problem
    is shown in a table beside the checkpoint it is about)."""
    return message.replace(root + os.sep, "")
