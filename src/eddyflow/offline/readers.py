"""Checkpoints as Spark DataFrames: metadata, source positions, keyed state
and back-edge logs — the State Processor API of eddyflow (docs/offline.md).

Reading is distributed: the driver reads only the (small) metadata; each
Spark task reads and verifies one subtask's state file, i.e. that subtask's
key groups, on its executor. The checkpoint folder must therefore be
readable at the same path from every executor (a local folder for
``local[*]``, a shared file system on a cluster).

Keys, values and records are arbitrary Python objects; the DataFrames give
them typed columns where they are simple (long, double, string, boolean,
binary, and structs, arrays and maps of those), inferred from every object
of the column, and text otherwise — a ``str`` as itself, anything else as
its ``repr`` (``offline/typed.py``). ``as_text=True`` gives the text view of
every such column. ``state_rdd`` gives the objects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from eddyflow.checkpoint.storage import FileHandle
from eddyflow.offline.checkpoint import (
    CheckpointRef,
    KeyedFile,
    keyed_files,
    open_checkpoint,
    read_keyed_file,
    read_verified_backedge_log,
    read_verified_channel_state,
)
from eddyflow.offline.shipping import ship_to_executors
from eddyflow.offline.typed import Column, frame, text_of
from eddyflow.runtime.checkpointing.channel_state import split_channel_key
from eddyflow.runtime.operators.windows import WINDOW_STATE
from eddyflow.runtime.time.timers import TIMERS_STATE
from eddyflow.state.ttl import ABSENT, has_ttl, unwrap

__all__ = ["as_text", "backedge_rdd", "channel_state_exchanges", "channel_state_rdd",
           "read_backedge_log",
           "read_channel_state", "read_metadata", "read_positions", "read_state", "read_timers",
           "read_windows", "state_rdd"]

CheckpointLike = str | os.PathLike[str] | CheckpointRef


def as_text(x: Any) -> str | None:
    """How a key or value shows in a text column (``as_text=True``)."""
    return text_of(x)


def _ref(chk: CheckpointLike) -> CheckpointRef:
    return chk if isinstance(chk, CheckpointRef) else open_checkpoint(chk)


def read_metadata(spark: Any, directory: str | os.PathLike[str]) -> Any:
    """One row per completed checkpoint and operator of a checkpoint
    directory; a checkpoint whose metadata does not verify is left out (and
    logged), as it does not exist for recovery either."""
    ship_to_executors(spark)
    from pyspark.sql import types as T

    from eddyflow.checkpoint.listing import list_checkpoints

    rows = []
    for info in list_checkpoints(directory):
        for uid, op in sorted(info.meta.operators.items()):
            parts = op.subtasks.values()
            handles = [p.keyed for p in parts if p.keyed is not None]
            entries = sum(h.entries for h in handles)
            size = sum(f.size for h in handles for f in h.file_handles())
            logged = sum(p.backedge.records for p in parts if p.backedge is not None)
            rows.append((info.id, info.path, info.completed_at, info.duration, info.final,
                         uid, op.kind, op.parallelism, entries, size, logged))
    schema = T.StructType([
        T.StructField("checkpoint_id", T.LongType(), False),
        T.StructField("path", T.StringType(), False),
        T.StructField("completed_at", T.DoubleType(), False),
        T.StructField("duration", T.DoubleType(), False),
        T.StructField("final", T.BooleanType(), False),
        T.StructField("operator", T.StringType(), False),
        T.StructField("kind", T.StringType(), False),
        T.StructField("parallelism", T.IntegerType(), False),
        T.StructField("state_entries", T.LongType(), False),
        T.StructField("state_bytes", T.LongType(), False),
        T.StructField("backedge_records", T.LongType(), False),
    ])
    return spark.createDataFrame(rows, schema)


def read_positions(spark: Any, chk: CheckpointLike) -> Any:
    """The source positions a checkpoint recorded: ``operator, subtask,
    parallelism, position`` (the position as JSON; a split source's subtask
    records ``{split id: position}`` for its splits)."""
    ship_to_executors(spark)
    from pyspark.sql import types as T

    ref = _ref(chk)
    rows = []
    for uid, op in sorted(ref.meta.operators.items()):
        for s, part in sorted(op.subtasks.items()):
            if part.is_source:
                rows.append((uid, s, op.parallelism, json.dumps(part.position, sort_keys=True)))
    schema = T.StructType([
        T.StructField("operator", T.StringType(), False),
        T.StructField("subtask", T.IntegerType(), False),
        T.StructField("parallelism", T.IntegerType(), False),
        T.StructField("position", T.StringType(), False),
    ])
    return spark.createDataFrame(rows, schema)


def _read_file(kf: KeyedFile) -> Any:
    for kg, name, key, value in read_keyed_file(kf):
        yield kg, (kf.operator, kf.subtask, name, kf.kinds.get(name, "value"), key, value)


def _read_user_file(kf: KeyedFile) -> Any:
    for kg, (uid, subtask, name, kind, key, value) in _read_file(kf):
        if has_ttl(kind):
            value = unwrap(kind, value)
            if value is ABSENT:
                continue
        yield kg, (uid, subtask, name, kind, key, value)


def state_rdd(sc: Any, chk: CheckpointLike, operator: str | None = None, *,
              raw: bool = False) -> Any:
    """Keyed state as an RDD of ``(key_group, (operator, subtask, state,
    kind, key, value))`` with the Python objects; one Spark task per state
    file.

    A state with a time-to-live (kind ``value+ttl`` ...) shows its values
    as user code reads them: without the write times they are stored with
    (``state/ttl.py``); ``raw=True`` gives the stored form (what a restore
    takes). Nothing in a checkpoint is expired as of its barrier: expired
    entries are dropped at the synchronous phase of every snapshot, so
    nothing is left out here (and the checkpoint's time, not the reader's,
    is what a checkpoint's state is as of)."""
    ref = _ref(chk)
    ship_to_executors(sc, checkpoint=ref)
    files = keyed_files(ref, operator)
    if not files:
        return sc.emptyRDD()
    return sc.parallelize(files, len(files)).flatMap(_read_file if raw else _read_user_file)


def _state_row(t: tuple[int, tuple[Any, ...]]) -> tuple[Any, ...]:
    kg, (operator, subtask, name, _, key, value) = t
    return operator, subtask, kg, key, name, value


def read_state(spark: Any, chk: CheckpointLike, operator: str | None = None, *,
               as_text: bool = False) -> Any:
    """Keyed state: ``operator, subtask, key_group, key, state, value``
    (the values of a state with a time-to-live without their write times:
    see :func:`state_rdd`); ``key`` and ``value`` typed where they are
    simple, else text (``as_text=True``: text). A window operator's windows
    are its map state ``_windows`` and every operator's timers its map state
    ``_timers`` (one row per key here; :func:`read_windows` and
    :func:`read_timers` give one per window and per timer): read together
    with other states they make the value column text; name the
    ``operator`` whose values you want typed."""
    from pyspark.sql import types as T

    rows = state_rdd(spark.sparkContext, chk, operator).map(_state_row)
    return frame(spark, rows, [
        Column("operator", T.StringType(), False),
        Column("subtask", T.IntegerType(), False),
        Column("key_group", T.IntegerType(), False),
        Column("key"),
        Column("state", T.StringType(), False),
        Column("value"),
    ], as_text=as_text)


def _window_rows(t: tuple[int, tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    kg, (operator, subtask, name, kind, key, value) = t
    if name == WINDOW_STATE and kind == "map" and isinstance(value, dict):
        for (start, end), acc in sorted(value.items()):
            yield (operator, subtask, kg, key, float(start), float(end), name, acc)


def read_windows(spark: Any, chk: CheckpointLike, operator: str | None = None, *,
                 as_text: bool = False) -> Any:
    """The open windows of window operators, one row per (key, window):
    ``operator, subtask, key_group, key, window_start, window_end, state,
    value`` (``value``: the window's accumulator — the running reduce,
    sum, count or aggregate, or the elements for ``process``); ``key`` and
    ``value`` typed where they are simple (``as_text=True``: text)."""
    from pyspark.sql import types as T

    rows = state_rdd(spark.sparkContext, chk, operator).flatMap(_window_rows)
    return frame(spark, rows, [
        Column("operator", T.StringType(), False),
        Column("subtask", T.IntegerType(), False),
        Column("key_group", T.IntegerType(), False),
        Column("key"),
        Column("window_start", T.DoubleType(), False),
        Column("window_end", T.DoubleType(), False),
        Column("state", T.StringType(), False),
        Column("value"),
    ], as_text=as_text)


def _timer_rows(t: tuple[int, tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    kg, (operator, subtask, name, kind, key, value) = t
    if name == TIMERS_STATE and kind == "map" and isinstance(value, dict):
        for domain, at in sorted(value):
            yield operator, subtask, kg, key, domain, float(at)


def read_timers(spark: Any, chk: CheckpointLike, operator: str | None = None, *,
                as_text: bool = False) -> Any:
    """Registered timers (of process functions and window operators), one
    row each: ``operator, subtask, key_group, key, domain, timestamp``
    (``domain``: ``event`` or ``processing``); ``key`` typed where the keys
    are simple (``as_text=True``: text)."""
    from pyspark.sql import types as T

    rows = state_rdd(spark.sparkContext, chk, operator).flatMap(_timer_rows)
    return frame(spark, rows, [
        Column("operator", T.StringType(), False),
        Column("subtask", T.IntegerType(), False),
        Column("key_group", T.IntegerType(), False),
        Column("key"),
        Column("domain", T.StringType(), False),
        Column("timestamp", T.DoubleType(), False),
    ], as_text=as_text)


def _backedge_parts(ref: CheckpointRef, operator: str | None
                    ) -> list[tuple[str, int, str, FileHandle]]:
    out = []
    for uid, op in sorted(ref.meta.operators.items()):
        if operator is not None and uid != operator:
            continue
        for s, part in sorted(op.subtasks.items()):
            if part.backedge is not None:
                out.append((uid, s, ref.root, part.backedge.file))
    return out


def _read_log(part: tuple[str, int, str, FileHandle]) -> Any:
    uid, subtask, root, handle = part
    channels = read_verified_backedge_log(root, handle)
    for channel in sorted(channels):
        for seq, record in enumerate(channels[channel]):
            yield uid, subtask, channel, seq, record


def backedge_rdd(sc: Any, chk: CheckpointLike, operator: str | None = None) -> Any:
    """Back-edge log records: ``(head operator, subtask, channel, seq,
    record)`` with the Python objects, in logged order; of loop head
    ``operator`` only, if given."""
    ship_to_executors(sc)
    parts = _backedge_parts(_ref(chk), operator)
    if not parts:
        return sc.emptyRDD()
    return sc.parallelize(parts, len(parts)).flatMap(_read_log)


def read_backedge_log(spark: Any, chk: CheckpointLike, *, as_text: bool = False) -> Any:
    """The records a checkpoint holds on loop back-edges: ``operator,
    subtask, channel, seq, record``; ``record`` typed where the records are
    simple (``as_text=True``: text)."""
    from pyspark.sql import types as T

    return frame(spark, backedge_rdd(spark.sparkContext, chk), [
        Column("operator", T.StringType(), False),
        Column("subtask", T.IntegerType(), False),
        Column("channel", T.IntegerType(), False),
        Column("seq", T.LongType(), False),
        Column("record"),
    ], as_text=as_text)



def channel_state_exchanges(chk: CheckpointLike) -> set[str]:
    """The exchanges (``source->target``) a checkpoint holds records in
    flight on, from its metadata."""
    return {split_channel_key(key)[0]
            for op in _ref(chk).meta.operators.values() for part in op.subtasks.values()
            if part.channel_state is not None
            for key in (*part.channel_state.inputs, *part.channel_state.outputs)}


_Part = tuple[str, FileHandle, frozenset[str] | None]


def _channel_state_parts(ref: CheckpointRef, exchanges: frozenset[str] | None) -> list[_Part]:
    """The channel-state files holding records of ``exchanges`` (all if
    ``None``): a file is read only where it is needed."""
    out = []
    for _, op in sorted(ref.meta.operators.items()):
        for _, part in sorted(op.subtasks.items()):
            cs = part.channel_state
            if cs is None:
                continue
            if exchanges is None or any(split_channel_key(k)[0] in exchanges
                                        for k in (*cs.inputs, *cs.outputs)):
                out.append((ref.root, cs.file, exchanges))
    return out


def _read_channel_state(part: _Part) -> Iterator[Any]:
    root, handle, exchanges = part
    inputs, outputs = read_verified_channel_state(root, handle)
    for side, channels in (("input", inputs), ("output", outputs)):
        for key, batches in sorted(channels.items()):
            exchange, up, down = split_channel_key(key)
            if exchanges is not None and exchange not in exchanges:
                continue
            seq = 0
            for records, stamps in batches:
                for i, record in enumerate(records):
                    yield (exchange, up, down, side, seq, record,
                           None if stamps is None else stamps[i])
                    seq += 1


def channel_state_rdd(sc: Any, chk: CheckpointLike,
                      exchanges: Iterable[str] | None = None) -> Any:
    """The records an unaligned checkpoint holds in flight: ``(exchange
    ("source->target"), upstream subtask, downstream subtask, side, seq,
    record, timestamp)`` with the Python objects; of ``exchanges`` only, if
    given. ``side`` is ``"input"`` (logged by the downstream subtask after
    its snapshot) or ``"output"`` (overtaken by the barrier); a channel's
    input records come before its output records, each side in ``seq``
    order."""
    ship_to_executors(sc)
    parts = _channel_state_parts(_ref(chk), None if exchanges is None else frozenset(exchanges))
    if not parts:
        return sc.emptyRDD()
    return sc.parallelize(parts, len(parts)).flatMap(_read_channel_state)


def read_channel_state(spark: Any, chk: CheckpointLike, *, as_text: bool = False) -> Any:
    """The records a checkpoint holds in flight on its channels (an
    unaligned checkpoint's channel state): ``exchange, upstream,
    downstream, side, seq, record, timestamp``; ``record`` typed where the
    records are simple (``as_text=True``: text)."""
    from pyspark.sql import types as T

    return frame(spark, channel_state_rdd(spark.sparkContext, chk), [
        Column("exchange", T.StringType(), False),
        Column("upstream", T.IntegerType(), False),
        Column("downstream", T.IntegerType(), False),
        Column("side", T.StringType(), False),
        Column("seq", T.LongType(), False),
        Column("record"),
        Column("timestamp", T.DoubleType(), True),
    ], as_text=as_text)
