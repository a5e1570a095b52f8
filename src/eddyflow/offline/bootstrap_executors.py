"""What ``offline/bootstrap.py`` runs on the Spark executors: rows converted
to keys and values (:class:`RowConverter`), recorded as given and shuffled to
their subtasks (:class:`RecordInput`, :class:`SubtaskPartitioner`), and each
subtask's rows loaded into the state backend the job would use, whose own
snapshot writes the files (:class:`WriteSubtask`). The driver's side, and
why it is written so, is ``offline/bootstrap.py``'s docstring."""

from __future__ import annotations

import asyncio
import collections
import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle, StateFile
from eddyflow.checkpoint.layout import CheckpointLayout
from eddyflow.checkpoint.storage import CheckpointStorage, FileHandle
from eddyflow.checkpoint.writer_main import write_durably
from eddyflow.keygroups import (
    UnsupportedKeyError,
    key_group_range,
    key_groups_of,
    subtask_for_key_group,
)
from eddyflow.offline.errors import BootstrapError
from eddyflow.offline.shipping import import_on_executor
from eddyflow.state import registry
from eddyflow.state.abc import SnapshotTarget
from eddyflow.state.format import CHUNK, Frames
from eddyflow.values import SCALARS

__all__ = [
    "BootstrapTarget",
    "RecordInput",
    "RowConverter",
    "SubtaskPartitioner",
    "WriteSubtask",
    "snapshot_subtask",
    "spark_to_python",
]


@dataclass(frozen=True)
class BootstrapTarget:
    """What the driver learnt of the job: where and how to write."""

    root: str
    checkpoint_id: int
    run_id: str
    operator: str
    state: str
    kind: str
    kinds: dict[str, str]
    parallelism: int
    max_parallelism: int
    backend: str
    #: What the backend's registration keeps of the job's configured
    #: backend (``BackendKind.offline_settings``).
    settings: Any


def _attempt() -> int:
    """This Spark task's attempt number: files an attempt writes are named
    by it, so that a retried or speculative attempt never overwrites the
    file whose checksum another attempt reported."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return 0 if ctx is None else int(ctx.attemptNumber())


#: Subtask of the shuffle's records that carry an input file's handle.
_INPUT_MARK = -1


def spark_to_python(x: Any, as_key: bool) -> Any:
    """A Spark value as the Python object a job would hold: a struct (a
    ``Row``) is a tuple as a key, a ``dict`` as a value; an array a tuple
    or a list; binary ``bytes``."""
    t = type(x)
    if x is None or t is str or t is int or t is float or t is bool:
        return x
    if isinstance(x, tuple) and hasattr(x, "asDict"):  # pyspark.sql.Row
        if as_key:
            return tuple(spark_to_python(v, True) for v in x)
        return {k: spark_to_python(v, False) for k, v in x.asDict().items()}
    if isinstance(x, bytearray):
        return bytes(x)
    if isinstance(x, list):
        items = [spark_to_python(v, as_key) for v in x]
        return tuple(items) if as_key else items
    if isinstance(x, dict):
        return {spark_to_python(k, True): spark_to_python(v, as_key) for k, v in x.items()}
    return x


_PLAIN = frozenset({str, int, float, bool})


@dataclass(frozen=True)
class RowConverter:
    """Rows (``key, *other value columns``, as ``_write`` selects them) to
    keys and values, checked, a chunk at a time: the common case (string or
    number keys, scalar values, no functions) costs a few passes at C
    speed, not a Python call per row."""

    key: str
    values: list[str]
    key_fn: Callable[[Any], Any] | None
    value_fn: Callable[[Any], Any] | None
    kind: str
    operator: str
    state: str

    def positions(self) -> list[int]:
        """Where each value column is in a selected row."""
        others = [c for c in self.values if c != self.key]
        return [0 if c == self.key else 1 + others.index(c) for c in self.values]

    def __call__(self, rows: list[Any]) -> tuple[list[Any], list[Any]]:
        keys = [r[0] for r in rows]
        types = set(map(type, keys))
        if type(None) in types:
            raise BootstrapError(f"column '{self.key}' is null in a row: a key is needed")
        if not types <= _PLAIN:
            keys = [spark_to_python(k, True) for k in keys]
        if self.key_fn is not None:
            keys = list(map(self.key_fn, keys))
        at = self.positions()
        if len(at) == 1:
            vals = [r[at[0]] for r in rows]
            types = set(map(type, vals))
            if type(None) in types:
                k = keys[vals.index(None)]
                raise BootstrapError(f"column '{self.values[0]}' is null for key {k!r}: a "
                                     "state holds no null value")
            if not types <= SCALARS:
                vals = [spark_to_python(v, False) for v in vals]
        else:
            names = list(zip(self.values, at, strict=True))
            vals = [{c: spark_to_python(r[i], False) for c, i in names} for r in rows]
        if self.value_fn is not None:
            vals = list(map(self.value_fn, vals))
            if any(v is None for v in vals):
                k = keys[[v is None for v in vals].index(True)]
                raise BootstrapError(f"value_fn gave None for key {k!r}: a state holds no "
                                     "null value")
        if self.kind in ("map", "list"):
            want = dict if self.kind == "map" else list
            for k, v in zip(keys, vals, strict=True):
                if not isinstance(v, want):
                    raise BootstrapError(
                        f"state '{self.state}' of operator '{self.operator}' is a "
                        f"{self.kind} state: key {k!r} needs a {want.__name__}, got "
                        f"{type(v).__name__}")
        return keys, vals


class RecordInput:
    """One partition of the DataFrame: its rows converted, recorded as given
    (``chk-<n>/bootstrap/<operator>-<state>-<partition>``, keyed-state
    frames of up to ``CHUNK`` rows), and sent on to their subtasks a chunk
    at a time (``(subtask, (keys, values))``: a shuffle record per chunk and
    subtask, not per row); last, the file's handle (``_INPUT_MARK``)."""

    def __init__(self, target: BootstrapTarget, convert: RowConverter) -> None:
        self.target = target
        self.convert = convert

    def __call__(self, index: int, rows: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        t = self.target
        p, mp = t.parallelism, t.max_parallelism
        owner = [subtask_for_key_group(kg, mp, p) for kg in range(mp)]
        frames = Frames()
        count = 0
        it = iter(rows)
        while True:
            chunk = list(itertools.islice(it, CHUNK))
            if not chunk:
                break
            keys, vals = self.convert(chunk)
            try:
                groups = key_groups_of(keys, mp)
            except UnsupportedKeyError as exc:
                raise BootstrapError(f"column '{self.convert.key}': {exc} (convert it "
                                     "with key_fn)") from None
            # Pickled now: what the shuffle does with the objects after
            # cannot change what was recorded.
            frames.add_columns(t.state, keys, vals, [])
            count += len(keys)
            if p == 1:
                yield 0, (keys, vals)
                continue
            by_subtask: list[tuple[list[Any], list[Any]]] = [([], []) for _ in range(p)]
            for s, k, v in zip(map(owner.__getitem__, groups), keys, vals, strict=True):
                part = by_subtask[s]
                part[0].append(k)
                part[1].append(v)
            for s, part in enumerate(by_subtask):
                if part[0]:
                    yield s, part
        if not count:
            return  # an empty partition records nothing
        layout = CheckpointLayout(t.root)
        rel = layout.bootstrap_input_file(t.checkpoint_id, t.operator, t.state, index,
                                          _attempt())
        done = write_durably(layout.path(rel), frames.chunks)
        handle = FileHandle(rel, int(done["size"]), str(done["sha256"]))
        yield _INPUT_MARK, (index, StateFile(handle, frames.index, True, grouped=False).to_json(),
                            count)


class SubtaskPartitioner:
    """The shuffle's partitioner: records are keyed by their subtask
    already (an input file's handle goes to subtask 0)."""

    def __call__(self, subtask: int) -> int:
        return max(subtask, 0)


class WriteSubtask:
    """One subtask's rows into the state backend the job would use, for its
    key groups; the backend's snapshot writes its files."""

    def __init__(self, target: BootstrapTarget) -> None:
        self.target = target

    def __call__(self, subtask: int, items: Iterable[tuple[int, Any]]
                 ) -> Iterator[tuple[str, int, Any, int]]:
        t = self.target
        inputs: list[tuple[int, Any, int]] = []
        keys: list[Any] = []
        vals: list[Any] = []
        for s, payload in items:
            if s == _INPUT_MARK:
                inputs.append(payload)
                continue
            if s != subtask:
                raise RuntimeError(f"subtask {subtask} was sent the rows of subtask {s}")
            keys.extend(payload[0])
            vals.extend(payload[1])
        entries = dict(zip(keys, vals, strict=True))
        if len(entries) != len(keys):
            twice = next(k for k, n in collections.Counter(keys).items() if n > 1)
            raise BootstrapError(f"key {twice!r} is given twice: a state holds one value "
                                 "per key (aggregate the DataFrame by key first)")
        del keys, vals
        groups = key_group_range(subtask, t.max_parallelism, t.parallelism)
        handle = snapshot_subtask(t, subtask, groups, entries)
        yield "state", subtask, handle.to_json(), len(entries)
        for index, body, count in inputs:
            yield "input", index, body, count


def snapshot_subtask(t: BootstrapTarget, subtask: int, groups: range,
                     entries: dict[Any, Any]) -> KeyedStateHandle:
    """Load ``entries`` into a keyed backend of ``t.backend``'s kind for
    ``subtask``'s key groups and write its first (full) snapshot into the
    checkpoint; the handle of its files."""
    kind = registry.kind_named(t.backend)
    for module in kind.executor_modules:
        import_on_executor(module)  # the driver's copy, where the executor lacks one
    local = tempfile.mkdtemp(prefix="eddyflow-bootstrap-")
    factory = kind.offline_backend(local, t.settings)
    try:
        keyed = factory.create_keyed_backend(t.operator, subtask, groups, t.max_parallelism,
                                             checkpointing=True)
        try:
            # Every state the operator declares, the one given filled.
            keyed.restore(t.kinds, ())
            keyed.bulk_load(t.state, t.kind, entries)
            # A first snapshot is full; at_end: written here, no fork.
            snap = keyed.snapshot(SnapshotTarget(CheckpointStorage(t.root), t.checkpoint_id,
                                                 f"{t.run_id}a{_attempt()}", subtask,
                                                 at_end=True))
            handle: KeyedStateHandle = asyncio.run(snap.write())
        finally:
            keyed.close()
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return handle
