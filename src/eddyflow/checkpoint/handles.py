"""What a checkpoint's metadata says of keyed state, whatever backend wrote
it: one :class:`KeyedStateHandle` per operator subtask, and the keyed-state
files (:class:`StateFile`) that handles and bootstrap inputs name.

A handle here is generic: the backend's name, the kinds of its states, how
many entries it held, the key groups it owned and the files it wrote this
time. What else a backend records (the memory backend's chain of
keyed-state files, RocksDB's database files) is a field of its own
subclass, which the backend registers (``eddyflow.state.registry``) under
its name: :meth:`KeyedStateHandle.from_json` reads a handle as the class
registered for its ``backend`` field. Reading the entries a handle holds is
the backend's business, not the checkpoint's (``state/registry.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from eddyflow.checkpoint.storage import CheckpointCorrupted, FileHandle

__all__ = ["KeyedStateHandle", "StateFile", "handle_type", "register_handle_type"]


@dataclass(frozen=True)
class StateFile:
    """One keyed-state file (``state/format.py``): where it is (relative to
    the checkpoint storage root), its checksum, its frame index, whether its
    frames are by key group (``grouped``) and whether it is a full snapshot
    or a delta over the file before it."""

    handle: FileHandle
    index: Mapping[str, tuple[int, int]]
    full: bool
    grouped: bool = True

    def to_json(self) -> dict[str, Any]:
        """The file as the metadata records it."""
        return {**self.handle.to_json(), "index": {k: list(v) for k, v in self.index.items()},
                "full": self.full, "grouped": self.grouped}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> StateFile:
        """The file :meth:`to_json` recorded."""
        return StateFile(FileHandle.from_json(dict(d)),
                         {str(k): (int(v[0]), int(v[1])) for k, v in d["index"].items()},
                         bool(d.get("full", True)), bool(d.get("grouped", True)))


@dataclass(frozen=True)
class KeyedStateHandle(ABC):
    """One operator subtask's keyed state in a checkpoint: the kinds of its
    states, how many entries it held, the key groups it owned (empty:
    unknown, metadata format 1) and the files this checkpoint wrote for it.
    Each backend's subclass adds where its files are and names the backend
    (:attr:`backend`, the name it is registered under)."""

    #: The name of the backend that wrote it (its registration's).
    backend: ClassVar[str]

    kinds: Mapping[str, str]
    entries: int
    key_groups: range
    #: Files this checkpoint wrote (the others were written by earlier ones).
    new_files: frozenset[str] = field(default_factory=frozenset, kw_only=True)

    @abstractmethod
    def file_handles(self) -> list[FileHandle]:
        """Every file this state needs, for the checkpoint's file list."""

    @abstractmethod
    def backend_json(self) -> dict[str, Any]:
        """The backend's own fields, as the metadata records them."""

    def to_json(self) -> dict[str, Any]:
        """The handle as the metadata records it: the generic fields, then
        the backend's own."""
        return {"backend": self.backend, "kinds": dict(self.kinds), "entries": self.entries,
                "key_groups": [self.key_groups.start, self.key_groups.stop],
                **self.backend_json()}

    @classmethod
    @abstractmethod
    def decode(cls, d: Mapping[str, Any], kinds: dict[str, str], entries: int,
               key_groups: range) -> KeyedStateHandle:
        """The handle of this backend whose JSON is ``d``, the generic
        fields already read."""

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> KeyedStateHandle:
        """The handle :meth:`to_json` recorded, as its backend's class.
        Keyed state written before handles named their backend is the
        memory backend's, and metadata format 1 had no key groups."""
        name = str(d.get("backend", "memory"))
        cls = handle_type(name)
        if "key_groups" in d:
            start, stop = d["key_groups"]
            groups = range(int(start), int(stop))
        else:
            groups = range(0, 0)
        return cls.decode(d, dict(d["kinds"]), int(d.get("entries", 0)), groups)


_types: dict[str, type[KeyedStateHandle]] = {}


def register_handle_type(cls: type[KeyedStateHandle]) -> None:
    """Read handles whose ``backend`` is ``cls.backend`` as ``cls`` (called
    by ``eddyflow.state.registry.register``)."""
    known = _types.get(cls.backend)
    if known is not None and known is not cls:
        raise ValueError(f"a handle type is registered for backend {cls.backend!r} already: "
                         f"{known.__qualname__}")
    _types[cls.backend] = cls


def handle_type(name: str) -> type[KeyedStateHandle]:
    """The handle class of backend ``name``; :class:`CheckpointCorrupted`
    for a backend no registration names."""
    cls = _types.get(name)
    if cls is None:
        raise CheckpointCorrupted(
            f"keyed state of unknown backend {name!r}: no registered state backend reads it "
            f"(registered: {', '.join(sorted(_types)) or 'none'})")
    return cls
