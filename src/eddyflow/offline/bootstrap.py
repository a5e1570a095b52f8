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
* The executors (``offline/bootstrap_executors.py``) convert each row
  (``key`` and ``value`` columns to Python objects, then
  ``key_fn``/``value_fn`` if given), record the rows as given
  in the checkpoint (``bootstrap/`` files: what ``validate`` starts from),
  and shuffle them by key group (``keygroups``' stable hash, never Python's
  ``hash``) into the operator's subtasks. Each subtask's rows are loaded into
  the state backend the job would use (``backend``) for exactly that
  subtask's key groups, and that backend's own snapshot writes the files: a
  full memory-format file in ``shared/``, or a RocksDB checkpoint (SST files
  in ``shared/``, the small files in ``chk-<n>/<operator>-<subtask>/``). So
  the files are those a job's checkpoint holds, by the same code.
* The driver writes ``_metadata`` last and atomically, built as the
  checkpoint coordinator builds a job's (``checkpoint/metadata_builder.py``),
  with the size and SHA-256 of every file: sources at their start, the other
  keyed operators empty, sinks with no pending transactions, and the rows
  given as ``bootstrap`` inputs.

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
import contextlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle, StateFile
from eddyflow.checkpoint.lock import FolderLock
from eddyflow.checkpoint.metadata import BootstrapInput, CheckpointMetadata, SubtaskState
from eddyflow.checkpoint.metadata_builder import MetadataBuilder
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.connectors.splits import RestoredSplit, SplitPositions, SplitSource, SplitsReader
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.jobfile import build_environment
from eddyflow.keygroups import key_group_range
from eddyflow.offline.bootstrap_executors import (
    BootstrapTarget,
    RecordInput,
    RowConverter,
    SubtaskPartitioner,
    WriteSubtask,
)
from eddyflow.offline.errors import BootstrapError, spark_errors
from eddyflow.offline.shipping import ship_to_executors
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.runtime.operators.io import SourceSpec
from eddyflow.runtime.operators.windows import WINDOW_STATE
from eddyflow.runtime.time.timers import TIMERS_STATE
from eddyflow.state import registry
from eddyflow.state.memory import MemoryStateBackend, MemoryStateHandle
from eddyflow.state.ttl import has_ttl

__all__ = ["bootstrap"]

log = logging.getLogger("eddyflow.offline")

#: The kinds of state whose value per key a row can give as it is: a value
#: (or a reduce's running value), a map as a ``dict``, a list as a ``list``.
_KINDS = ("value", "reducing", "map", "list")


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

    ``backend``: the name of a registered state backend (``"memory"`` or
    ``"rocksdb"``, ``state/registry.py``), the format of the state files
    (any restores into any backend); default the job's configured state
    backend's. A job's RocksDB serializer is used.

    ``job_name``: the job's name in the metadata (default: the job file's
    name without ``.py``).

    Raises :class:`BootstrapError` for an operator, state or column that does
    not exist (naming those that do), a duplicate or null key, a key without
    a stable hash, and a value that the state's kind cannot hold."""
    with spark_errors():
        return _bootstrap(spark, df, job=job, operator=operator, key=key, state=state,
                          value=value, directory=directory, parallelism=parallelism,
                          backend=backend, key_fn=key_fn, value_fn=value_fn, job_name=job_name)


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
    backend_kind = registry.kind_named(backend_name)
    settings = backend_kind.offline_settings(env.state_backend)
    positions = _initial_positions(plan)
    # (Also how user functions, key_fn and value_fn, and the job's reach them.)
    ship_to_executors(spark, job=module, modules=backend_kind.executor_modules)

    storage = CheckpointStorage(directory)
    os.makedirs(storage.root, exist_ok=True)
    name = job_name or os.path.splitext(os.path.basename(os.fspath(job)))[0]
    lock = FolderLock(storage.root, f"bootstrap of {name}")
    lock.acquire()
    try:
        storage.ensure()
        n = storage.next_id()
        folder = storage.layout.checkpoint_dir(n)
        try:
            os.mkdir(folder)  # never over another checkpoint's folder
        except FileExistsError:
            raise BootstrapError(f"{folder} exists: a bootstrap never replaces a "
                                 "checkpoint") from None
        target = BootstrapTarget(storage.root, n, f"bootstrap{secrets.token_hex(4)}", operator,
                                 state, kind, kinds, p, mp, backend_name, settings)
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


def _remove_unreferenced(storage: CheckpointStorage, target: BootstrapTarget,
                         keep: set[str]) -> None:
    """Remove the files of this bootstrap's run that ``keep`` does not name:
    in ``shared/`` (named by the run) and in its checkpoint's folder."""
    layout = storage.layout
    shared = layout.shared_dir
    for f in os.listdir(shared):
        path = os.path.join(shared, f)
        if f"-{target.run_id}" in f and layout.relative(path) not in keep:
            with contextlib.suppress(OSError):
                os.unlink(path)
    for here, _, names in os.walk(layout.checkpoint_dir(target.checkpoint_id)):
        for f in names:
            path = os.path.join(here, f)
            if layout.relative(path) not in keep:
                with contextlib.suppress(OSError):
                    os.unlink(path)


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
        # The configured backend's own format; a backend of no registered
        # kind gets the memory format, which restores into any backend.
        kind = registry.kind_of_backend(configured)
        return kind.name if kind is not None else MemoryStateHandle.backend
    if backend not in registry.names():
        raise BootstrapError(f"backend must be one of {', '.join(registry.names())}, "
                             f"not {backend!r}")
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
    reader reports when it is created (a split source's: its splits, as
    the job would deal them out on a fresh start, each at its start)."""
    out: dict[str, dict[int, Any]] = {}
    for node in plan.graph.nodes:
        if not node.is_source:
            continue
        assert isinstance(node.payload, SourceSpec)
        source = node.payload.source
        p = plan.parallelism[node.id]
        out[node.uid] = {}
        for s in range(p):
            reader = (SplitsReader(source, s, p, [RestoredSplit(x) for x in
                                                  source.initial_splits(s, p)])
                      if isinstance(source, SplitSource) else source.create_reader(s, p))
            try:
                out[node.uid][s] = reader.position()
            finally:
                asyncio.run(reader.close())
    return out


def _source_state(position: Any) -> SubtaskState:
    """A source subtask's part of the metadata, at ``position``."""
    if isinstance(position, SplitPositions):
        return SubtaskState(is_source=True, position=position.positions, splits=position.splits)
    return SubtaskState(is_source=True, position=position)


def _write(spark: Any, df: Any, target: BootstrapTarget, plan: ExecutionPlan, node_id: int,
           positions: dict[str, dict[int, Any]], key: str, values: list[str],
           key_fn: Callable[[Any], Any] | None, value_fn: Callable[[Any], Any] | None,
           name: str, t0: float, env: Any) -> CheckpointMetadata:
    """Write the state and input files on the executors; the metadata that
    names them."""
    rows = df.select(key, *[c for c in values if c != key]).rdd
    convert = RowConverter(key, values, key_fn, value_fn, target.kind, target.operator,
                           target.state)
    p = target.parallelism
    results = (rows.mapPartitionsWithIndex(RecordInput(target, convert))
               .partitionBy(p, SubtaskPartitioner())
               .mapPartitionsWithIndex(WriteSubtask(target))
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


def _metadata(target: BootstrapTarget, plan: ExecutionPlan, node_id: int,
              positions: dict[str, dict[int, Any]], handles: dict[int, KeyedStateHandle],
              given: BootstrapInput, name: str, t0: float, env: Any) -> CheckpointMetadata:
    """The metadata a job's checkpoint at the start of its input would have,
    with ``handles`` as operator ``node_id``'s state."""
    mp = plan.max_parallelism
    builder = MetadataBuilder(plan)
    for n in plan.graph.nodes:
        p = plan.parallelism[n.id]
        kinds = (_declared_states(plan, n.id)
                 if n.keyed and n.id != node_id else {})
        for s in range(p):
            if n.id == node_id:
                part = SubtaskState(keyed=handles[s])
            elif n.is_source:
                part = _source_state(positions[n.uid][s])
            elif n.keyed:
                # Declared, holding nothing: as a job's first checkpoint has them.
                part = SubtaskState(keyed=MemoryStateHandle(
                    kinds, 0, key_group_range(s, mp, p)))
            else:
                part = SubtaskState()  # stateless, or a sink with nothing pending
            builder.add(n.uid, s, part)
    for h in handles.values():
        builder.add_files(h.file_handles())
    builder.add_files(sf.handle for sf in given.files)
    cfg = env.checkpoint_config
    return builder.build(
        job=name,
        mode=str(cfg.mode) if cfg is not None else "exactly_once",
        final=False,
        trigger_time=t0,
        duration=time.time() - t0,
        # A history of its own starts here: the job restored from it continues it.
        lineage=secrets.token_hex(8),
        bootstrap=(given,),
    )
