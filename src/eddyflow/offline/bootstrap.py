"""Bootstrapping a checkpoint from a Spark DataFrame: the State Processor
API's "bootstrap a savepoint" (Flink) for eddyflow.

``bootstrap(spark, df, job=..., operator=..., key=..., state=..., value=...,
directory=...)`` writes ``<directory>/chk-<n>``, a checkpoint of the job
as it would be at the start of every source with one state of one keyed
operator holding the DataFrame's rows; ``env.execute(restore=<that
path>)`` then starts the streaming job from state a batch job computed (a
backfill).

How it is written:

* The driver loads the job file and plans it (at ``parallelism`` if given),
  finds ``operator`` (by uid: the name ``.name()`` gave it), opens one
  instance of it to learn the states it declares (a built-in's internal
  state: ``count`` for ``count()``, ``sum``, ``reduce``, ``state`` for
  ``map_with_state``; a process function's own, as its ``open`` declares
  them), and reads every source's initial position (its readers' position
  before the first record).
* The executors convert each row (``key`` and ``value`` columns to Python
  objects, then ``key_fn``/``value_fn`` if given), record the rows as given
  in the checkpoint (``bootstrap/`` files: what ``validate`` starts from),
  and shuffle them by key group (``keygroups``' stable hash, never Python's
  ``hash``) into the operator's subtasks. Each subtask's rows are loaded into
  the state backend the job would use (``backend``) for exactly that
  subtask's key groups, and that backend's own snapshot writes the files: a
  full memory-format file in ``shared/``, or a RocksDB checkpoint (SST files
  in ``shared/``, the small files in ``chk-<n>/<operator>-<subtask>/``). So
  the files are those a job's checkpoint holds, by the same code.
* The driver writes ``_metadata`` last and atomically through the typed
  model (``checkpoint/metadata.py``), with the size and SHA-256 of every file:
  sources at their start, the other keyed operators empty, sinks with no
  pending transactions, and the rows given as ``bootstrap`` inputs.

The directory must be readable and writable at the same path by the driver
and every executor (a local folder for ``local[*]``, a shared file system on
a cluster). The checkpoint takes the next id after any ``chk-<n>`` there and
never replaces one; the folder is locked while it is written. Files are
named by the Spark task attempt that writes them, and what other attempts
left is removed before the metadata is written; a RocksDB subtask's small
files (``chk-<n>/<operator>-<subtask>/``) are not, so speculative execution
(``spark.speculation``, off by default) must stay off for the RocksDB
format.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from eddyflow.checkpoint.lock import FolderLock
from eddyflow.checkpoint.metadata import (
    BootstrapInput,
    CheckpointGraph,
    CheckpointMetadata,
    OperatorState,
    SubtaskState,
)
from eddyflow.checkpoint.storage import CheckpointStorage, FileHandle, checkpoint_dir_name
from eddyflow.checkpoint.writer_main import write_durably
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.jobfile import build_environment
from eddyflow.keygroups import (
    UnsupportedKeyError,
    key_group_range,
    key_groups_of,
    subtask_for_key_group,
)
from eddyflow.offline.errors import BootstrapError, spark_errors
from eddyflow.offline.shipping import import_on_executor, ship_to_executors
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.runtime.operators.io import SourceSpec
from eddyflow.runtime.operators.windows import WINDOW_STATE
from eddyflow.runtime.time.timers import TIMERS_STATE
from eddyflow.state.abc import KeyedStateHandle, SnapshotTarget, StateFile
from eddyflow.state.format import CHUNK, Frames
from eddyflow.state.memory.backend import MemoryStateBackend
from eddyflow.state.ttl import has_ttl
from eddyflow.values import SCALARS

__all__ = ["BACKENDS", "bootstrap"]

log = logging.getLogger("eddyflow.offline")

BACKENDS = ("memory", "rocksdb")
#: The kinds of state whose value per key a row can give as it is: a value
#: (or a reduce's running value), a map as a ``dict``, a list as a ``list``.
_KINDS = ("value", "reducing", "map", "list")
#: Subtask of the shuffle's records that carry an input file's handle.
_INPUT_MARK = -1


def bootstrap(spark: Any, df: Any, *, job: str | os.PathLike[str], operator: str, key: str,
              state: str, value: str | Iterable[str], directory: str | os.PathLike[str],
              parallelism: int | None = None, backend: str | None = None,
              key_fn: Callable[[Any], Any] | None = None,
              value_fn: Callable[[Any], Any] | None = None,
              job_name: str | None = None) -> str:
    """Write a checkpoint of ``job`` whose keyed operator ``operator`` holds
    in its state ``state`` one entry per row of ``df``; returns its path
    (``<directory>/chk-<n>``), for ``env.execute(restore=...)``.

    ``key``: the column of the keys. They must equal what the job's
    ``key_by`` gives (a word count keyed by the word: a string column).
    Spark values become Python ones: strings, ints (any integer type),
    floats, bools, ``bytes`` (binary), and a struct or array key becomes a
    tuple; a key must have a stable hash (``keygroups``). ``key_fn``, applied
    to that on the executors, converts anything else.

    ``value``: a column (a struct becomes a ``dict`` of its fields, an array
    a ``list``, a map a ``dict``), or several columns (a ``dict`` by column
    name); ``value_fn`` converts it further (to the object the job keeps).
    A map state takes a ``dict`` per key, a list state a ``list``. Null keys
    and values, and two rows of one key, are refused.

    ``parallelism``: the job's parallelism (as ``eddyflow run -p``; default
    the job file's own), which decides the operator's subtasks. A checkpoint
    restores at another parallelism of the keyed operator, not of its
    sources: bootstrap with the sources' parallelism the job will run with.

    ``backend``: ``"memory"`` or ``"rocksdb"``, the format of the state
    files (either restores into either backend); default the job's
    configured state backend. A job's RocksDB serializer is used.

    ``job_name``: the job's name in the metadata (default: the job file's
    name without ``.py``).

    Raises :class:`BootstrapError` for an operator, state or column that does
    not exist (naming those that do), a duplicate or null key, a key without
    a stable hash, and a value that the state's kind cannot hold."""
    with spark_errors():
        return _bootstrap(spark, df, job=job, operator=operator, key=key, state=state,
                          value=value, directory=directory, parallelism=parallelism,
                          backend=backend, key_fn=key_fn, value_fn=value_fn, job_name=job_name)


@dataclass(frozen=True)
class _Target:
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
    serializer: Any


def _bootstrap(spark: Any, df: Any, *, job: str | os.PathLike[str], operator: str, key: str,
               state: str, value: str | Iterable[str], directory: str | os.PathLike[str],
               parallelism: int | None, backend: str | None,
               key_fn: Callable[[Any], Any] | None, value_fn: Callable[[Any], Any] | None,
               job_name: str | None) -> str:
    t0 = time.time()
    env_options: dict[str, Any] = {} if parallelism is None else {"parallelism": parallelism}
    env, module = build_environment(job, **env_options)
    plan: ExecutionPlan = env.plan()
    node = _keyed_node(plan, operator, job)
    p = plan.parallelism[node.id]
    mp = plan.max_parallelism
    kinds = _declared_states(plan, node.id)
    if state not in kinds:
        raise BootstrapError(
            f"operator '{operator}' of {os.fspath(job)} has no state '{state}'; it declares "
            + (", ".join(f"'{n}' ({k})" for n, k in sorted(kinds.items())) or "none"))
    kind = kinds[state]
    if state in (TIMERS_STATE, WINDOW_STATE) or has_ttl(kind) or kind not in _KINDS:
        why = ("its values carry their write times (a time-to-live)" if has_ttl(kind)
               else "it is the operator's own bookkeeping" if state.startswith("_")
               else f"a {kind} state has no value per key a row can give")
        raise BootstrapError(f"state '{state}' ({kind}) of operator '{operator}' cannot be "
                             f"bootstrapped: {why}")
    values = [value] if isinstance(value, str) else list(value)
    _check_columns(df, key, values)
    backend_name = _backend_name(backend, env.state_backend)
    serializer = getattr(env.state_backend, "serializer", None) if backend_name == "rocksdb" \
        else None
    positions = _initial_positions(plan)
    # (Also how user functions, key_fn and value_fn, and the job's reach them.)
    ship_to_executors(spark, job=module, rocksdb=backend_name == "rocksdb")

    storage = CheckpointStorage(directory)
    os.makedirs(storage.root, exist_ok=True)
    name = job_name or os.path.splitext(os.path.basename(os.fspath(job)))[0]
    lock = FolderLock(storage.root, f"bootstrap of {name}")
    lock.acquire()
    try:
        storage.ensure()
        n = storage.next_id()
        folder = storage.checkpoint_dir(n)
        try:
            os.mkdir(folder)  # never over another checkpoint's folder
        except FileExistsError:
            raise BootstrapError(f"{folder} exists: a bootstrap never replaces a "
                                 "checkpoint") from None
        target = _Target(storage.root, n, f"bootstrap{secrets.token_hex(4)}", operator, state,
                         kind, kinds, p, mp, backend_name, serializer)
        try:
            meta = _write(spark, df, target, plan, node.id, positions, key, values, key_fn,
                          value_fn, name, t0, env)
            # What failed or lost task attempts wrote goes before the
            # metadata names the files that count.
            _remove_unreferenced(storage, target, {f.path for f in meta.files})
            asyncio.run(storage.write_metadata(n, meta.to_json()))
        except BaseException:
            # Nothing of a bootstrap that failed stays: its folder and the
            # shared files of its run (named by it).
            _remove_unreferenced(storage, target, set())
            shutil.rmtree(folder, ignore_errors=True)
            raise
    finally:
        lock.release()
    rows = sum(b.rows for b in meta.bootstrap)
    log.info("bootstrapped checkpoint %s: %d rows into state '%s' of operator '%s' "
             "(%d subtasks, %s backend) in %.1f s", folder, rows, state, operator, p,
             backend_name, time.time() - t0)
    return folder


def _remove_unreferenced(storage: CheckpointStorage, target: _Target, keep: set[str]) -> None:
    """Remove the files of this bootstrap's run that ``keep`` does not name:
    in ``shared/`` (named by the run) and in its checkpoint's folder."""
    shared = os.path.join(storage.root, "shared")
    for f in os.listdir(shared):
        if f"-{target.run_id}" in f and f"shared/{f}" not in keep:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(shared, f))
    folder = storage.checkpoint_dir(target.checkpoint_id)
    for here, _, names in os.walk(folder):
        for f in names:
            path = os.path.join(here, f)
            if os.path.relpath(path, storage.root) not in keep:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def _attempt() -> int:
    """This Spark task's attempt number: files an attempt writes are named
    by it, so that a retried or speculative attempt never overwrites the
    file whose checksum another attempt reported."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return 0 if ctx is None else int(ctx.attemptNumber())


def _keyed_node(plan: ExecutionPlan, operator: str, job: str | os.PathLike[str]) -> Any:
    nodes = {n.uid: n for n in plan.graph.nodes}
    keyed = sorted(f"'{n.uid}' ({n.kind})" for n in plan.graph.nodes if n.keyed)
    node = nodes.get(operator)
    if node is None:
        raise BootstrapError(
            f"{os.fspath(job)} has no operator '{operator}'; its keyed operators are "
            + (", ".join(keyed) or "none") + " (name one with .name() in the job)")
    if not node.keyed:
        raise BootstrapError(
            f"operator '{operator}' of {os.fspath(job)} is a {node.kind} operator, which "
            "holds no keyed state; its keyed operators are " + (", ".join(keyed) or "none"))
    return node


def _declared_states(plan: ExecutionPlan, node_id: int) -> dict[str, str]:
    """The states an instance of the operator declares when it opens (its
    kind by name), learnt by opening one on a memory backend."""
    node = plan.graph.nodes[node_id]
    ctx = OperatorContext(node.uid, 0, plan.parallelism[node_id], plan.max_parallelism,
                          MemoryStateBackend())
    op = node.payload.instantiate(ctx)
    try:
        op.open()
        backend = getattr(op, "backend", None)
        return dict(backend.kinds) if backend is not None else {}
    finally:
        op.close()


def _backend_name(backend: str | None, configured: Any) -> str:
    if backend is None:
        from eddyflow.state.rocksdb import RocksDBStateBackend

        return "rocksdb" if isinstance(configured, RocksDBStateBackend) else "memory"
    if backend not in BACKENDS:
        raise BootstrapError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    return backend


def _check_columns(df: Any, key: str, values: list[str]) -> None:
    columns = list(df.columns)
    missing = [c for c in (key, *values) if c not in columns]
    if missing:
        raise BootstrapError(
            "the DataFrame has no column " + ", ".join(f"'{c}'" for c in missing)
            + "; its columns are " + ", ".join(f"'{c}'" for c in columns))
    if not values:
        raise BootstrapError("value names no column")


def _initial_positions(plan: ExecutionPlan) -> dict[str, dict[int, Any]]:
    """Every source subtask's position before its first record: what its
    reader reports when it is created."""
    out: dict[str, dict[int, Any]] = {}
    for node in plan.graph.nodes:
        if not node.is_source:
            continue
        assert isinstance(node.payload, SourceSpec)
        source = node.payload.source
        p = plan.parallelism[node.id]
        out[node.uid] = {}
        for s in range(p):
            reader = source.create_reader(s, p)
            try:
                out[node.uid][s] = reader.position()
            finally:
                asyncio.run(reader.close())
    return out


def _write(spark: Any, df: Any, target: _Target, plan: ExecutionPlan, node_id: int,
           positions: dict[str, dict[int, Any]], key: str, values: list[str],
           key_fn: Callable[[Any], Any] | None, value_fn: Callable[[Any], Any] | None,
           name: str, t0: float, env: Any) -> CheckpointMetadata:
    """Write the state and input files on the executors; the metadata that
    names them."""
    rows = df.select(key, *[c for c in values if c != key]).rdd
    convert = _Convert(key, values, key_fn, value_fn, target.kind, target.operator, target.state)
    p = target.parallelism
    results = (rows.mapPartitionsWithIndex(_RecordInput(target, convert))
               .partitionBy(p, _Subtask())
               .mapPartitionsWithIndex(_WriteSubtask(target))
               .collect())
    handles: dict[int, KeyedStateHandle] = {}
    inputs: dict[int, tuple[StateFile, int]] = {}
    for what, index, body, count in results:
        if what == "state":
            handles[index] = KeyedStateHandle.from_json(body)
        else:
            inputs[index] = (StateFile.from_json(body), count)
    input_files = tuple(f for _, (f, _) in sorted(inputs.items()))
    given = sum(c for _, c in inputs.values())
    origin = (f"DataFrame[{', '.join(f'{c}: {t}' for c, t in df.dtypes)}]: key {key!r}, "
              f"value {values[0] if len(values) == 1 else values!r}")
    return _metadata(target, plan, node_id, positions, handles,
                     BootstrapInput(target.operator, target.state, target.kind, given,
                                    input_files, origin), name, t0, env)


def _metadata(target: _Target, plan: ExecutionPlan, node_id: int,
              positions: dict[str, dict[int, Any]], handles: dict[int, KeyedStateHandle],
              given: BootstrapInput, name: str, t0: float, env: Any) -> CheckpointMetadata:
    """The metadata a job's checkpoint at the start of its input would have,
    with ``handles`` as operator ``node_id``'s state."""
    mp = plan.max_parallelism
    operators: dict[str, OperatorState] = {}
    for n in plan.graph.nodes:
        p = plan.parallelism[n.id]
        parts: dict[int, SubtaskState] = {}
        kinds = (_declared_states(plan, n.id)
                 if n.keyed and n.id != node_id else {})
        for s in range(p):
            if n.id == node_id:
                parts[s] = SubtaskState(keyed=handles[s])
            elif n.is_source:
                parts[s] = SubtaskState(is_source=True, position=positions[n.uid][s])
            elif n.keyed:
                # Declared, holding nothing: as a job's first checkpoint has them.
                parts[s] = SubtaskState(keyed=KeyedStateHandle(
                    "memory", kinds, 0, key_group_range(s, mp, p)))
            else:
                parts[s] = SubtaskState()  # stateless, or a sink with nothing pending
        operators[n.uid] = OperatorState(n.kind, p, parts)
    files: dict[str, FileHandle] = {}
    for h in handles.values():
        for f in h.file_handles():
            files[f.path] = f
    for sf in given.files:
        files[sf.handle.path] = sf.handle
    size = sum(f.size for f in files.values())
    cfg = env.checkpoint_config
    now = time.time()
    return CheckpointMetadata(
        job=name,
        mode=str(cfg.mode) if cfg is not None else "exactly_once",
        final=False,
        trigger_time=t0,
        completed_at=now,
        duration=now - t0,
        alignment_duration=0.0,
        max_parallelism=mp,
        operators=operators,
        graph=CheckpointGraph.of_plan(plan),
        files=tuple(files.values()),
        checkpointed_size=size,
        full_size=size,
        tasks={},
        # A history of its own starts here: the job restored from it continues it.
        lineage=secrets.token_hex(8),
        bootstrap=(given,),
    )


# -- on the executors ----------------------------------------------------------


def _python(x: Any, as_key: bool) -> Any:
    """A Spark value as the Python object a job would hold: a struct (a
    ``Row``) is a tuple as a key, a ``dict`` as a value; an array a tuple
    or a list; binary ``bytes``."""
    t = type(x)
    if x is None or t is str or t is int or t is float or t is bool:
        return x
    if isinstance(x, tuple) and hasattr(x, "asDict"):  # pyspark.sql.Row
        if as_key:
            return tuple(_python(v, True) for v in x)
        return {k: _python(v, False) for k, v in x.asDict().items()}
    if isinstance(x, bytearray):
        return bytes(x)
    if isinstance(x, list):
        items = [_python(v, as_key) for v in x]
        return tuple(items) if as_key else items
    if isinstance(x, dict):
        return {_python(k, True): _python(v, as_key) for k, v in x.items()}
    return x


_PLAIN = frozenset({str, int, float, bool})


@dataclass(frozen=True)
class _Convert:
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
        others = [c for c in self.values if c != self.key]
        return [0 if c == self.key else 1 + others.index(c) for c in self.values]

    def __call__(self, rows: list[Any]) -> tuple[list[Any], list[Any]]:
        keys = [r[0] for r in rows]
        types = set(map(type, keys))
        if type(None) in types:
            raise BootstrapError(f"column '{self.key}' is null in a row: a key is needed")
        if not types <= _PLAIN:
            keys = [_python(k, True) for k in keys]
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
                vals = [_python(v, False) for v in vals]
        else:
            names = list(zip(self.values, at, strict=True))
            vals = [{c: _python(r[i], False) for c, i in names} for r in rows]
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


class _RecordInput:
    """One partition of the DataFrame: its rows converted, recorded as given
    (``chk-<n>/bootstrap/<operator>-<state>-<partition>``, keyed-state
    frames of up to ``CHUNK`` rows), and sent on to their subtasks a chunk
    at a time (``(subtask, (keys, values))``: a shuffle record per chunk and
    subtask, not per row); last, the file's handle (``_INPUT_MARK``)."""

    def __init__(self, target: _Target, convert: _Convert) -> None:
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
        rel = (f"{checkpoint_dir_name(t.checkpoint_id)}/bootstrap/"
               f"{t.operator}-{t.state}-{index}-{_attempt()}")
        done = write_durably(os.path.join(t.root, rel), frames.chunks)
        handle = FileHandle(rel, int(done["size"]), str(done["sha256"]))
        yield _INPUT_MARK, (index, StateFile(handle, frames.index, True, grouped=False).to_json(),
                            count)


class _Subtask:
    """The shuffle's partitioner: records are keyed by their subtask
    already (an input file's handle goes to subtask 0)."""

    def __call__(self, subtask: int) -> int:
        return max(subtask, 0)


class _WriteSubtask:
    """One subtask's rows into the state backend the job would use, for its
    key groups; the backend's snapshot writes its files."""

    def __init__(self, target: _Target) -> None:
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
        handle = _snapshot(t, subtask, groups, entries)
        yield "state", subtask, handle.to_json(), len(entries)
        for index, body, count in inputs:
            yield "input", index, body, count


def _snapshot(t: _Target, subtask: int, groups: range,
              entries: dict[Any, Any]) -> KeyedStateHandle:
    local = None
    factory: Any
    if t.backend == "rocksdb":
        import_on_executor("rocksdict")  # the driver's copy, where the executor lacks one
        from eddyflow.state.rocksdb import RocksDBStateBackend

        local = tempfile.mkdtemp(prefix="eddyflow-bootstrap-")
        factory = RocksDBStateBackend(local, serializer=t.serializer)
    else:
        factory = MemoryStateBackend()
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
        if local is not None:
            shutil.rmtree(local, ignore_errors=True)
    return handle
