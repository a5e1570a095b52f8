"""The memory backend's checkpoint handle: its state is a chain of
keyed-state files (``state/format.py``), a full file then the deltas
written since."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle, StateFile
from eddyflow.checkpoint.storage import FileHandle

__all__ = ["MemoryStateHandle"]


@dataclass(frozen=True)
class MemoryStateHandle(KeyedStateHandle):
    """A memory backend subtask's keyed state: its files in the order they
    apply (a full snapshot, then deltas)."""

    backend = "memory"

    files: tuple[StateFile, ...] = ()

    def file_handles(self) -> list[FileHandle]:
        return [f.handle for f in self.files]

    def backend_json(self) -> dict[str, Any]:
        return {"files": [f.to_json() for f in self.files]}

    @classmethod
    def decode(cls, d: Mapping[str, Any], kinds: dict[str, str], entries: int,
               key_groups: range) -> MemoryStateHandle:
        if "file" in d:  # metadata format 1: one full file per subtask
            return cls(kinds, entries, range(0, 0),
                       (StateFile.from_json({**d["file"], "index": d["index"]}),))
        return cls(kinds, entries, key_groups,
                   tuple(StateFile.from_json(f) for f in d["files"]))
