"""``ef.list_checkpoints``: the completed, retained checkpoints of a
checkpoint directory with their statistics (API.md, Checkpoint statistics)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from eddyflow.state.metadata import CheckpointMetadata
from eddyflow.state.storage import CheckpointCorrupted, CheckpointStorage

__all__ = ["CheckpointInfo", "list_checkpoints"]

log = logging.getLogger("eddyflow.checkpoints")


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

    @cached_property
    def meta(self) -> CheckpointMetadata:
        """The metadata, typed (see :mod:`eddyflow.state.metadata`)."""
        return CheckpointMetadata.from_json(self.metadata)


def list_checkpoints(directory: str | os.PathLike[str]) -> list[CheckpointInfo]:
    """Completed checkpoints whose metadata verifies, oldest first."""
    storage = CheckpointStorage(directory)
    out = []
    for n in storage.completed_ids():
        try:
            raw = storage.read_metadata(n)
            meta = CheckpointMetadata.from_json(raw)
        except (CheckpointCorrupted, ValueError) as exc:
            log.warning("skipping checkpoint %d: %s", n, exc)
            continue
        out.append(CheckpointInfo(
            id=n,
            path=storage.checkpoint_dir(n),
            completed_at=meta.completed_at,
            duration=meta.duration,
            alignment_duration=meta.alignment_duration,
            checkpointed_size=meta.checkpointed_size,
            full_size=meta.full_size,
            final=meta.final,
            operators=raw["operators"],
            metadata=raw,
        ))
    return out
