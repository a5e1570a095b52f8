"""Reading keyed state out of a RocksDB database or a RocksDB checkpoint
handle: rows decoded back into ``(state, key group, key, value)``, map and
list rows assembled into whole dicts and lists. Used by restores into
another backend, the offline (Spark) readers and ``JobResult.state``
(:class:`RocksStateView`).
"""

from __future__ import annotations

import itertools
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from eddyflow.state.rocksdb.files import materialise, open_db, scan
from eddyflow.state.rocksdb.keys import StatePrefix, decode_key, key_group_bounds, split_row
from eddyflow.state.ttl import base_kind

if TYPE_CHECKING:
    from eddyflow.state.rocksdb.handle import RocksDBStateHandle
    from eddyflow.state.rocksdb.instance import LocalInstance

__all__ = ["RocksStateView", "assemble", "read_handle", "read_rows"]


def read_rows(db: Any, kinds: Mapping[str, str], key_groups: range | None,
              loads: Callable[[bytes], Any] = pickle.loads, *,
              names: Container[str] | None = None) -> Iterator[tuple[str, int, Any, Any]]:
    """``(state, key group, key, value)`` of every row of ``db`` in
    ``key_groups`` (all of them when ``None``), of the states ``names``
    (all when ``None``: the others are not even deserialised), whole
    values assembled."""
    lower, upper = key_group_bounds(key_groups)
    # Rows come in (key group, state, key) order: assemble runs of one state.
    run: list[tuple[Any, bytes, Any]] = []
    last: tuple[int, str] = (-1, "")
    for row, v in scan(db, lower, upper):
        kg, name, key, rest = split_row(row)
        if names is not None and name not in names:
            continue
        if (kg, name) != last:
            if run:
                for k, value in assemble(kinds.get(last[1], "value"), run):
                    yield last[1], last[0], k, value
            run = []
            last = (kg, name)
        run.append((key, rest, loads(v)))
    if run:
        for k, value in assemble(kinds.get(last[1], "value"), run):
            yield last[1], last[0], k, value


def read_handle(root: str, handle: RocksDBStateHandle, key_groups: range | None = None,
                local_dir: str | None = None) -> Iterator[tuple[str, int, Any, Any]]:
    """The entries of a RocksDB checkpoint handle in ``key_groups``: its
    files are copied (and verified) into a temporary folder (under
    ``local_dir``, by default the system's) and opened read-only."""
    folder = tempfile.mkdtemp(prefix="eddyflow-read-", dir=local_dir)
    try:
        db_dir = os.path.join(folder, "db")
        materialise(root, dict(handle.db_files), db_dir)
        db = open_db(db_dir, read_only=True)
        try:
            yield from read_rows(db, handle.kinds, key_groups)
        finally:
            db.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def assemble(kind: str, key_rest_values: Iterable[tuple[Any, bytes, Any]]
             ) -> Iterator[tuple[Any, Any]]:
    """Whole values from rows in key order: ``(key, rest of the row key,
    value)`` -> ``(key, value)``, a dict for map state, a list for list state."""
    kind = base_kind(kind)  # a state with a TTL is stored as one without
    if kind not in ("map", "list"):
        for key, _, value in key_rest_values:
            yield key, value
        return
    for key, rows in itertools.groupby(key_rest_values, key=_first):
        if kind == "map":
            m = {decode_key(rest)[0]: v for _, rest, v in rows if rest}
            if m:
                yield key, m
        else:
            items = [v for _, rest, v in rows if rest]
            if items:
                yield key, items


def _first(t: tuple[Any, bytes, Any]) -> Any:
    return t[0]


class RocksStateView(Mapping[Any, Any]):
    """One state of a RocksDB backend, read from its database on demand."""

    def __init__(self, instance: LocalInstance, name: str, kind: str, max_parallelism: int,
                 loads: Callable[[bytes], Any]) -> None:
        self._instance = instance
        self._loads = loads
        self._rows = StatePrefix(name, max_parallelism)
        self.name = name
        self.kind = kind
        self._len: int | None = None

    def _items(self) -> Iterator[tuple[Any, Any]]:
        db = self._instance.reader()
        for name, _, key, value in read_rows(db, {self.name: self.kind}, None, self._loads):
            if name == self.name:
                yield key, value

    def __getitem__(self, key: Any) -> Any:
        db = self._instance.reader()
        p = self._rows.prefix(key)
        if base_kind(self.kind) not in ("map", "list"):
            raw = db.get(p)
            if raw is None:
                raise KeyError(key)
            return self._loads(raw)
        rows = [(key, row[len(p):], self._loads(v)) for row, v in scan(db, p, p + b"\xff")]
        for _, value in assemble(self.kind, rows):
            return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        for key, _ in self._items():
            yield key

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self._items())
        return self._len

    def items(self) -> Any:
        return list(self._items())

    def __repr__(self) -> str:
        return f"<RocksDB state '{self.name}' ({self.kind})>"
