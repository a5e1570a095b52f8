"""A toy state backend: everything docs/extending/state-backend.md asks of a
new backend, in one module and one registration, and nothing more.

Its state is a dict per declared state on the heap (tables that declare no
capability: the operators and handles use the mapping methods only), its
snapshot a pickle of every table taken at the barrier and written as one
file under the storage's ``shared/`` folder, its handle that file, its
registration the reader of that file.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.storage import FileHandle
from eddyflow.keygroups import key_group_for
from eddyflow.state.abc import KeyedSnapshot, KeyedStateBackend, SnapshotTarget, StateBackend
from eddyflow.state.changes import Changes
from eddyflow.state.registry import BackendKind, register
from eddyflow.state.table import TableCapabilities

NAME = "toy"


@dataclass(frozen=True)
class ToyStateHandle(KeyedStateHandle):
    """A toy subtask's keyed state: one pickle file of every table."""

    backend = NAME

    file: FileHandle | None = None

    def file_handles(self) -> list[FileHandle]:
        return [] if self.file is None else [self.file]

    def backend_json(self) -> dict[str, Any]:
        return {"file": None if self.file is None else self.file.to_json()}

    @classmethod
    def decode(cls, d: Mapping[str, Any], kinds: dict[str, str], entries: int,
               key_groups: range) -> ToyStateHandle:
        f = d.get("file")
        return cls(kinds, entries, key_groups, None if f is None else FileHandle.from_json(f))


class ToySnapshot(KeyedSnapshot):
    """The tables as pickled at the barrier, written by :meth:`write`."""

    def __init__(self, backend: ToyKeyedStateBackend, target: SnapshotTarget) -> None:
        self.backend = backend
        self.target = target
        # Pickled now: what user code changes after the barrier is not in it.
        self.data = pickle.dumps(backend.tables(), protocol=pickle.HIGHEST_PROTOCOL)
        self.kinds = backend.kinds
        self.entries = sum(map(len, backend.tables().values()))

    async def write(self) -> ToyStateHandle:
        t = self.target
        rel = (f"shared/{self.backend.operator}-{t.subtask}-{t.run_id}-"
               f"{t.checkpoint_id}.{NAME}")
        handle = await t.storage.write_file(rel, [self.data])
        return ToyStateHandle(self.kinds, self.entries, self.backend.key_groups, handle,
                              new_files=frozenset({rel}))


class ToyKeyedStateBackend(KeyedStateBackend):
    """The toy's keyed state of one operator subtask."""

    def __init__(self, operator: str, key_groups: range, max_parallelism: int) -> None:
        super().__init__(operator, key_groups, max_parallelism)
        self._tables: dict[str, dict[Any, Any]] = {}
        self._changes: dict[str, Changes] = {}

    def _table(self, name: str) -> dict[Any, Any]:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = {}
            # Every snapshot is full: nobody needs the keys written.
            self._changes[name] = Changes(False)
        return table

    def capabilities(self, name: str) -> TableCapabilities:
        return TableCapabilities()

    def changes(self, name: str) -> Changes:
        return self._changes[name]

    def tables(self) -> dict[str, dict[Any, Any]]:
        return dict(self._tables)

    def snapshot(self, target: SnapshotTarget) -> KeyedSnapshot:
        self._check_open()
        self.expire_ttl()
        return ToySnapshot(self, target)


class ToyStateBackend(StateBackend):
    """What ``env.set_state_backend`` takes."""

    def create_keyed_backend(self, operator: str, subtask: int, key_groups: range,
                             max_parallelism: int, *, checkpointing: bool = False
                             ) -> ToyKeyedStateBackend:
        return ToyKeyedStateBackend(operator, key_groups, max_parallelism)


class ToyKind(BackendKind):
    """The toy's registration: how its handles are read."""

    name = NAME
    handle_type = ToyStateHandle
    backend_type = ToyStateBackend

    def read(self, root: str, handle: KeyedStateHandle, *, key_groups: range | None = None,
             max_parallelism: int = 0, with_groups: bool = False
             ) -> Iterator[tuple[int, str, Any, Any]]:
        assert isinstance(handle, ToyStateHandle)
        if handle.file is None:
            return
        with open(os.path.join(root, handle.file.path), "rb") as f:
            tables: dict[str, dict[Any, Any]] = pickle.load(f)
        for name, table in tables.items():
            for key, value in table.items():
                kg = key_group_for(key, max_parallelism) if max_parallelism else -1
                if key_groups is None or kg in key_groups:
                    yield kg, name, key, value

    def offline_backend(self, workdir: str, settings: Any) -> StateBackend:
        return ToyStateBackend()


register(ToyKind())
