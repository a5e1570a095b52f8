"""Writing a RocksDB backend's changes as sorted SST files, at the barrier
or in a forked child, and ingesting them: the rows of each value table's
keys written since the last snapshot (:class:`Part`), built, serialized and
ordered a key at a time in C (``map``), never in Python bytecode (the
end-of-input rows of ``benchmarks/state.py`` measure what that saves).
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from eddyflow.state.changes import Written, written_keys
from eddyflow.state.rocksdb.keys import StatePrefix, sort_order
from eddyflow.state.rocksdb.tables import (
    MISSING,
    Batch,
    Pickled,
    ValueTable,
    dump_all,
    new_batch,
    put_rows,
)
from eddyflow.state.serialization import raise_state_error, state_error
from eddyflow.values import SCALARS

__all__ = ["Part", "batch_of", "capture", "ingest_moved", "write_sorted_sst", "write_sst"]

_IMMUTABLE = SCALARS | {type(MISSING)}


class Part(NamedTuple):
    """The rows one value table contributes to a snapshot's SST file."""

    table: ValueTable
    prefix: StatePrefix
    written: Written
    #: Every key the table holds, not only those written (see
    #: ``RocksDBKeyedStateBackend.parts``).
    whole: bool


def part_items(part: Part, share: tuple[int, int]) -> tuple[list[Any], list[Any]]:
    """Share ``i`` of ``n`` of a part's keys and their values (``MISSING``:
    removed). The parent and a forked child each take their share of the
    same lists: both build them from the same image, in the same order."""
    table = part.table
    i, n = share
    if part.whole:
        size = -(-len(table) // n)
        start, stop = i * size, (i + 1) * size
        return (list(itertools.islice(table, start, stop)),
                list(itertools.islice(table.values(), start, stop)))
    keys = list(written_keys(part.written))
    if n > 1:
        size = -(-len(keys) // n)
        keys = keys[i * size:(i + 1) * size]
    return keys, list(map(table.get, keys, itertools.repeat(MISSING)))


def write_sst(path: str, parts: list[Part], dumps: Callable[[Any], bytes], operator: str,
               checkpoint: int, share: tuple[int, int] = (0, 1)) -> bool:
    """The rows of share ``i`` of ``n`` of ``parts``' keys, in order, as an
    SST file (``False``: there were none); in a forked child, or at the
    barrier. A value that cannot be serialized raises a
    :class:`~eddyflow.errors.StateSerializationError` naming ``operator``,
    its state and key, and ``checkpoint``.

    Every step runs a key at a time in C (``map``), none in Python bytecode:
    sorting ``(row, value)`` tuples by a key function and writing them in a
    Python loop costs several times as much (the end-of-input rows of
    ``benchmarks/state.py``)."""
    from rocksdict import Options, SstFileWriter

    rows: list[bytes] = []
    values: list[Any] = []
    for part in parts:
        keys, vs = part_items(part, share)
        rows += part.prefix.prefixes(keys)
        values += vs
    if not rows:
        return False
    # (By identity: a value's own __eq__ is not to be trusted.)
    gone = id(MISSING) in map(id, values)
    try:
        raws = ([None if v is MISSING else dumps(v) for v in values] if gone
                else dump_all(values, dumps))
    except Exception as exc:
        for part in parts:
            _check_values(exc, part, share, dumps, operator, checkpoint)
        raise
    order = sort_order(rows)
    rows = list(map(rows.__getitem__, order))
    raws = list(map(raws.__getitem__, order))
    writer = SstFileWriter(Options(raw_mode=True))
    partial = path + ".partial"
    writer.open(partial)
    if gone:
        for row, raw in zip(rows, raws, strict=True):
            if raw is None:
                del writer[row]
            else:
                writer[row] = raw
    else:
        collections.deque(map(writer.__setitem__, rows, raws), maxlen=0)
    writer.finish()
    os.replace(partial, path)  # its name says it is whole
    return True


def _check_values(exc: Exception, part: Part, share: tuple[int, int],
                  dumps: Callable[[Any], bytes], operator: str, checkpoint: int) -> None:
    """After ``exc``: raise the error naming the key of ``part`` whose
    value cannot be serialized, if it holds one."""
    keys, values = part_items(part, share)
    items = [(k, v) for k, v in zip(keys, values, strict=True) if v is not MISSING]
    error = state_error(exc, items, operator=operator, state=part.table.rows.name,
                        checkpoint=checkpoint, dumps=dumps)
    if error is not exc:
        raise error from exc


def capture(table: ValueTable, written: Written, dumps: Callable[[Any], bytes],
             operator: str, checkpoint: int) -> tuple[list[Any], list[Any]]:
    """The keys in ``written`` and their values as they are now."""
    listed = list(written_keys(written))
    values = list(map(table.get, listed, itertools.repeat(MISSING)))
    if not set(map(type, values)) <= _IMMUTABLE:
        try:
            values = [v if type(v) in SCALARS or v is MISSING else Pickled(dumps(v))
                      for v in values]
        except Exception as exc:
            raise_state_error(exc, ((k, v) for k, v in zip(listed, values, strict=True)
                                    if v is not MISSING),
                              operator=operator, state=table.rows.name,
                              checkpoint=checkpoint, dumps=dumps)
    return listed, values


def batch_of(deferred: list[tuple[ValueTable, list[Any], list[Any]]],
              dumps: Callable[[Any], bytes]) -> Batch:
    """A write batch of the values a snapshot captured at the barrier."""
    batch = new_batch()
    for table, keys, values in deferred:
        put_rows(batch, table.rows.prefixes(keys), values, dumps)
    return batch


def ingest_moved(db: Any, path: str) -> None:
    """Ingest the SST file ``path`` into ``db``, moving it (a hard link:
    no copy; the file is RocksDB's afterwards)."""
    from rocksdict import IngestExternalFileOptions

    opts = IngestExternalFileOptions()
    opts.set_move_files(True)
    db.ingest_external_file([path], opts)


def write_sorted_sst(path: str, name: str, max_parallelism: int, entries: Mapping[Any, Any],
                     dumps: Callable[[Any], bytes], operator: str) -> int:
    """The entries of value state ``name`` (key -> value as stored) as one
    sorted SST file at ``path``, for a bulk load; how many. A value that
    cannot be serialized raises the error naming ``operator``, the state
    and its key."""
    from rocksdict import Options, SstFileWriter

    keys = list(entries)
    rows = StatePrefix(name, max_parallelism).prefixes(keys)
    order = sort_order(rows)
    writer = SstFileWriter(Options(raw_mode=True))
    writer.open(path)
    try:
        for i in order:
            writer[rows[i]] = dumps(entries[keys[i]])
    except Exception as exc:
        raise_state_error(exc, entries.items(), operator=operator, state=name, dumps=dumps)
    writer.finish()
    return len(keys)
