"""The RocksDB backend's checkpoint handle: the files of a RocksDB
checkpoint of the subtask's database, by their names in the database folder
(``rocksdb/snapshot.py`` uploads them, ``rocksdb/files.py`` brings them
back)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.storage import FileHandle

__all__ = ["RocksDBStateHandle"]


@dataclass(frozen=True)
class RocksDBStateHandle(KeyedStateHandle):
    """A RocksDB subtask's keyed state: its database's checkpoint files."""

    backend = "rocksdb"

    #: (its name in the database folder, where the checkpoint storage holds it).
    db_files: tuple[tuple[str, FileHandle], ...] = ()

    def file_handles(self) -> list[FileHandle]:
        return [h for _, h in self.db_files]

    def sst_files(self) -> dict[str, FileHandle]:
        """The SST files by name: every row (a checkpoint flushes the
        memtable); the small ``MANIFEST``/``CURRENT``/``OPTIONS`` files are
        each checkpoint's own."""
        return {name: h for name, h in self.db_files if name.endswith(".sst")}

    def backend_json(self) -> dict[str, Any]:
        # "files" (always empty) keeps the metadata readable by the releases
        # whose handles had it for every backend.
        d: dict[str, Any] = {"files": []}
        if self.db_files:
            d["db_files"] = [[name, h.to_json()] for name, h in self.db_files]
        return d

    @classmethod
    def decode(cls, d: Mapping[str, Any], kinds: dict[str, str], entries: int,
               key_groups: range) -> RocksDBStateHandle:
        return cls(kinds, entries, key_groups,
                   tuple((str(name), FileHandle.from_json(dict(h)))
                         for name, h in d.get("db_files", ())))
