"""Replaying a source split up to a checkpoint's recorded position.

A checkpoint records, for every source split (a subtask of a source of the
``create_reader`` protocol, each split of a split source), the position of
the next record it would have read. Replaying the split from its beginning
up to that position gives exactly the records whose effects the
checkpoint's state must hold (docs/offline.md, Validation). Any replayable
:class:`~eddyflow.connectors.Source` works: the split is read through its
own reader, and the cut inside the last batch is found with
``SourceReader.position_of``; a reader that cannot tell record positions is
read one record at a time.

This module runs on Spark executors but imports nothing of Spark.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

from eddyflow.connectors.source import Source, SourceReader, same_position
from eddyflow.connectors.splits import RestoredSplit, SplitPositions, SplitSource, SplitsReader

__all__ = ["ReplayError", "replay_split", "replay_splits"]

_BATCH = 4096
#: How long an unbounded source may return nothing before the replay gives up
#: (its input no longer reaches the recorded position).
_IDLE_LIMIT = 10.0


class ReplayError(RuntimeError):
    """A source split cannot be replayed up to the recorded position."""


def replay_split(source: Source, uid: str, subtask: int, parallelism: int,
                 target: Any) -> Iterator[list[Any]]:
    """Batches of the records of split ``subtask`` of ``parallelism``, from the
    split's start up to (not including) the record at ``target``. For a split
    source whose subtask reads several splits on a fresh start, ``target``
    maps each split to its position (:class:`SplitPositions`, or the
    ``{split id: position}`` a checkpoint records), and each split is
    replayed in turn."""
    if not source.replayable:
        raise ReplayError(f"source '{uid}' ({type(source).__name__}) is not replayable")
    where = f"source '{uid}' subtask {subtask}/{parallelism}"
    if isinstance(source, SplitSource):
        mine = source.initial_splits(subtask, parallelism)
        if len(mine) != 1:
            positions = target.positions if isinstance(target, SplitPositions) else target
            if not isinstance(positions, dict):
                raise ReplayError(f"{where}: expected a position per split, got {target!r}")
            yield from replay_splits(source, uid, [
                RestoredSplit(s, positions.get(s.split_id)) for s in mine])
            return
    yield from _replay(source.create_reader(subtask, parallelism), where, target)


def replay_splits(source: SplitSource, uid: str, splits: list[RestoredSplit]
                  ) -> Iterator[list[Any]]:
    """Batches of the records of each split of ``splits`` in turn, from its
    start up to its position (all of it if the split was finished; none if
    it has no position)."""
    if not source.replayable:
        raise ReplayError(f"source '{uid}' ({type(source).__name__}) is not replayable")
    for r in splits:
        if r.position is None:
            continue  # never read from
        reader = source.create_split_reader(r.split)
        assert not isinstance(reader, SplitsReader)
        yield from _replay(reader, f"source '{uid}' split '{r.split.split_id}'", r.position)


def _replay(reader: SourceReader, where: str, target: Any) -> Iterator[list[Any]]:
    """``reader``'s records up to ``target``; closes it."""
    loop = asyncio.new_event_loop()
    try:
        if same_position(reader.position(), target):
            return
        size = _BATCH
        idle_since: float | None = None
        while True:
            before = reader.position()
            batch = loop.run_until_complete(reader.read_batch(size))
            if batch is None:
                raise ReplayError(
                    f"{where}: the input ended at {reader.describe_position(reader.position())} "
                    f"before the checkpoint's {reader.describe_position(target)}; the input "
                    "changed since the checkpoint was taken")
            if not batch:
                now = time.monotonic()
                idle_since = idle_since or now
                if now - idle_since > _IDLE_LIMIT:
                    raise ReplayError(
                        f"{where}: no input for {_IDLE_LIMIT:.0f} s at "
                        f"{reader.describe_position(reader.position())}, before the checkpoint's "
                        f"{reader.describe_position(target)}")
                time.sleep(0.01)
                continue
            idle_since = None
            cut = reader.split_at(batch, target)
            if cut is None:  # no per-record positions: re-read this batch one by one
                if size == 1:
                    raise ReplayError(f"{where}: the reader cannot locate its records")
                reader.seek(before)
                size = 1
                continue
            records, reached = cut
            if records:
                yield records
            if reached:
                return
    finally:
        loop.run_until_complete(reader.close())
        loop.close()
