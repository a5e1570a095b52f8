"""Split sources (after Flink's FLIP-27): a source is a set of *splits*,
each read by a :class:`~eddyflow.connectors.source.SourceReader` of its own
and each with its own position in checkpoints, so that a job restores at any
parallelism (docs/architecture/sources.md).

Which subtask reads a split is a pure function of the split and the
parallelism (:func:`split_owner`): its ``index`` (a log partition's number,
a byte range's ordinal) modulo the parallelism, or a CRC-32 of its id for a
split without one. So every subtask agrees on the owner of any split
without asking the others, whenever it comes to know it: among the splits
found when the job starts (once, on the caller's side, for all subtasks),
among those a restored checkpoint recorded (all subtasks' splits, dealt out
anew at the new parallelism), or found by its own periodic discovery while
the job runs (every subtask looks, and takes what is its own: Flink's
legacy Kafka consumer discovered partitions the same way). No split moves
between subtasks while the job runs, so no position ever has to travel.
"""

from __future__ import annotations

import asyncio
import functools
import zlib
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from eddyflow.checkpoint.metadata import OperatorState, SplitInfo
from eddyflow.connectors.source import Source, SourceReader

__all__ = ["RestoredSplit", "SourceSplit", "SplitAt", "SplitPositions", "SplitSource",
           "SplitsReader", "checkpointed_splits", "split_owner"]


@dataclass(frozen=True)
class SourceSplit:
    """One split of a :class:`SplitSource`.

    ``split_id`` names it, unique within the source and the same in every
    run (a checkpoint records positions by it); ``data`` is what a reader
    needs to read it (JSON: it is written into checkpoints, and a restore
    rebuilds the split from it); ``index``, if given, picks its subtask
    (``index % parallelism``), else a hash of the id does."""

    split_id: str
    data: Any = None
    index: int | None = None

    def info(self, finished: bool = False) -> SplitInfo:
        """The split as a checkpoint records it."""
        return SplitInfo(self.data, self.index, finished)


@dataclass(frozen=True)
class RestoredSplit:
    """A split a restore starts from: where to continue (``None``: at its
    start) and whether it had been read to its end."""

    split: SourceSplit
    position: Any = None
    finished: bool = False


def split_owner(split: SourceSplit, parallelism: int) -> int:
    """The source subtask that reads ``split`` (see the module docstring)."""
    if split.index is not None:
        return split.index % parallelism
    return zlib.crc32(split.split_id.encode()) % parallelism


class SplitSource(Source):
    """A replayable source made of splits; ``env.from_source`` takes any
    subclass, and the runtime restores it at any parallelism.

    A subclass implements :meth:`discover_splits` (which splits there are)
    and :meth:`create_split_reader` (a reader of one of them, with its own
    ``position``/``seek``). ``discovery_interval``: seconds between two
    discoveries while the job runs (new partitions, new files), or ``None``
    for a source whose splits are all known when the job starts; a subtask
    of such a source ends when its splits are read to their end, while one
    that keeps discovering runs until the job is cancelled."""

    #: Seconds between discoveries while the job runs; ``None``: only at the start.
    discovery_interval: float | None = None

    @abstractmethod
    def discover_splits(self, known: Sequence[SourceSplit], parallelism: int
                        ) -> list[SourceSplit]:
        """The splits there are now that are not among ``known`` (by id,
        or by what they cover: a file already split is not split again).

        Called once when the job starts, on the caller's side, with the
        splits a restored checkpoint recorded (none on a fresh start), and
        then, if ``discovery_interval`` is set, by every source subtask in a
        worker thread with the splits it knows. Two calls that see the same
        input must return the same splits (ids, data and index), whichever
        subtask makes them: each keeps those :func:`split_owner` gives it.
        ``parallelism``: the source's, for a source that cuts its input in
        as many pieces (a file in byte ranges)."""

    @abstractmethod
    def create_split_reader(self, split: SourceSplit) -> SourceReader:
        """A reader of ``split``, at its start; the runtime ``seek``\\ s it
        to a restored position before its first read. Its ``read_batch``
        returns ``None`` once the split is read to its end (a split of an
        unbounded input never ends: it returns ``[]`` while there is
        nothing to read, and is idle meanwhile)."""

    def splits_of_subtask(self, subtask: int, parallelism: int, position: Any
                          ) -> list[RestoredSplit]:
        """The splits a checkpoint written before this source was a split
        source recorded as one subtask's ``position`` (of ``parallelism``):
        old checkpoints restore at any parallelism too. The default refuses:
        a new source has no such checkpoints."""
        raise ValueError(
            f"{self.name} recorded positions per subtask, and cannot map them to splits")

    def initial_splits(self, subtask: int, parallelism: int) -> list[SourceSplit]:
        """The splits subtask ``subtask`` of ``parallelism`` reads on a fresh
        start, in id order."""
        found = self.discover_splits([], parallelism)
        return sorted((s for s in found if split_owner(s, parallelism) == subtask),
                      key=lambda s: s.split_id)

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        """What subtask ``subtask`` of ``parallelism`` reads on a fresh
        start (offline, and in tests; a job builds its readers from the
        runtime's assignment of splits): the reader of its split if it has
        one (positions are that split's), else a :class:`SplitsReader` of
        them all (positions are :class:`SplitPositions`)."""
        mine = self.initial_splits(subtask, parallelism)
        if len(mine) == 1:
            return self.create_split_reader(mine[0])
        return SplitsReader(self, subtask, parallelism, [RestoredSplit(s) for s in mine])


def checkpointed_splits(source: SplitSource, uid: str, op: OperatorState
                        ) -> list[RestoredSplit]:
    """Every split source ``uid`` recorded in a checkpoint (``op``), over all
    its subtasks, in split id order: from its splits, or, for a checkpoint
    of the per-subtask form (an older eddyflow), through
    :meth:`SplitSource.splits_of_subtask`. Raises ``ValueError`` naming the
    source when a position cannot be mapped."""
    out: dict[str, RestoredSplit] = {}
    for s, part in sorted(op.subtasks.items()):
        if not part.is_source:
            continue
        if part.splits is None:
            try:
                restored = source.splits_of_subtask(s, op.parallelism, part.position)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"source '{uid}': subtask {s} of {op.parallelism}: "
                                 f"{exc}") from exc
            for r in restored:
                out[r.split.split_id] = r
            continue
        positions = part.position if isinstance(part.position, dict) else {}
        for sid, info in part.splits.items():
            out[sid] = RestoredSplit(SourceSplit(sid, info.data, info.index),
                                     positions.get(sid), info.finished)
    return [out[k] for k in sorted(out)]


@dataclass(frozen=True)
class SplitPositions:
    """The position of a split source's subtask: each of its splits'
    position and the splits themselves, by split id (a checkpoint records
    them as the subtask's ``source`` and ``splits``)."""

    positions: dict[str, Any]
    splits: dict[str, SplitInfo]


@dataclass(frozen=True)
class SplitAt:
    """A record's position within a split (``SourceReader.position_of`` of
    a split source's subtask)."""

    split_id: str
    position: Any


class _Split:
    """One split a subtask reads: its reader, a restored position not yet
    sought to, and its final position once read to its end."""

    __slots__ = ("finished", "pending", "position", "reader", "scope", "split")

    def __init__(self, split: SourceSplit, reader: SourceReader | None, position: Any,
                 finished: bool) -> None:
        self.split = split
        self.reader = reader
        #: The restored position until sought to; the final one once finished.
        self.position = position
        self.pending = position is not None and not finished
        self.finished = finished
        self.scope: anyio.CancelScope | None = None

    def current(self) -> Any:
        if self.finished or self.pending or self.reader is None:
            return self.position
        return self.reader.position()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _when_done(fut: asyncio.Future[None], _done: asyncio.Future[None]) -> None:
    _resolve(fut)


class SplitsReader(SourceReader):
    """What one subtask of a :class:`SplitSource` reads: the splits
    :func:`split_owner` gives it, each through its own reader, a batch from
    one split at a time in turn.

    A split with nothing to read now is skipped (idle: the subtask returns
    ``[]`` only when all of its splits have nothing, and is then ready again
    as soon as any of them is); a split read to its end is closed and keeps
    its final position. With ``discovery_interval`` the subtask looks for
    new splits in :meth:`fetch`, in a worker thread, and never ends."""

    def __init__(self, source: SplitSource, subtask: int, parallelism: int,
                 splits: Sequence[RestoredSplit]) -> None:
        self.source = source
        self.subtask = subtask
        self.parallelism = parallelism
        #: Every split this subtask knows of, its own or not (discovery skips them).
        self._seen: dict[str, SourceSplit] = {}
        #: Its own splits, by id.
        self._splits: dict[str, _Split] = {}
        self._active: list[_Split] = []
        #: Found by discovery, read from the next batch on.
        self._new: list[_Split] = []
        self._turn = 0
        self._opened = False
        self._last: _Split | None = None
        self._current: _Split | None = None
        #: The last batch's split, and its positions before and after it.
        self.last_span: tuple[str, Any, Any] | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._discovered: asyncio.Future[None] | None = None
        self._waiting: asyncio.Future[None] | None = None
        self._error: Exception | None = None
        #: Its splits not read yet (a per-split watermark waits for them),
        #: and those read to their end, by id.
        self.unread: set[str] = set()
        self.finished: set[str] = set()
        for r in splits:
            sp = self._add(r.split, r.position, r.finished)
            if sp is not None and not sp.finished:
                self._active.append(sp)

    @property
    def discovering(self) -> bool:
        """Whether new splits may still come (the subtask does not end)."""
        return self.source.discovery_interval is not None

    def _add(self, split: SourceSplit, position: Any, finished: bool) -> _Split | None:
        """Know ``split``; if it is this subtask's, make its reader."""
        self._seen[split.split_id] = split
        if split_owner(split, self.parallelism) != self.subtask:
            return None
        reader = None if finished else self.source.create_split_reader(split)
        sp = self._splits[split.split_id] = _Split(split, reader, position, finished)
        (self.finished if finished else self.unread).add(split.split_id)
        return sp

    def _open(self) -> None:
        """Seek every restored split to its position (in the task's run, so
        that a failure is the task's, with the source named)."""
        self._opened = True
        for sp in self._active:
            if sp.pending:
                self._current = sp
                assert sp.reader is not None
                sp.reader.seek(sp.position)
                sp.pending = False

    # -- reading ------------------------------------------------------------

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self._error is not None:
            raise self._error
        if not self._opened:
            self._open()
        if self._new:
            self._active.extend(self._new)
            self._new.clear()
        active = self._active
        n = len(active)
        ended: list[_Split] = []
        for k in range(n):
            sp = active[(self._turn + k) % n]
            reader = sp.reader
            assert reader is not None
            self._current = sp
            start = reader.position()
            got = await reader.read_batch(max_records)
            self.unread.discard(sp.split.split_id)
            if got is None:
                ended.append(sp)
                continue
            if got:
                self._turn = (self._turn + k + 1) % n
                self._last = sp
                self.last_span = (sp.split.split_id, start, reader.position())
                if ended:
                    await self._retire(ended)
                return got
        if ended:
            await self._retire(ended)
        if not self._active and not self._new and not self.discovering:
            return None
        return []

    async def _retire(self, ended: list[_Split]) -> None:
        """Splits read to their end: keep their final position, close them."""
        for sp in ended:
            reader = sp.reader
            assert reader is not None
            sp.position, sp.finished, sp.reader = reader.position(), True, None
            self._active.remove(sp)
            self.finished.add(sp.split.split_id)
            if sp.scope is not None:
                sp.scope.cancel()
            await reader.close()
        self._turn = self._turn % len(self._active) if self._active else 0

    def available(self) -> asyncio.Future[None] | None:
        if self._error is not None or self._new:
            return None
        futures = []
        for sp in self._active:
            assert sp.reader is not None
            f = sp.reader.available()
            if f is None or f.done():
                return None
            futures.append(f)
        if self.discovering:
            if self._discovered is None or self._discovered.done():
                self._discovered = asyncio.get_running_loop().create_future()
            futures.append(self._discovered)
        if len(futures) <= 1:
            return futures[0] if futures else None
        waiting = self._waiting
        if waiting is None or waiting.done():
            # Done as soon as any split has something (or a split is found).
            waiting = self._waiting = asyncio.get_running_loop().create_future()
            resolve = functools.partial(_when_done, waiting)
            for f in futures:
                f.add_done_callback(resolve)
        return waiting

    async def fetch(self) -> None:
        """Run each split reader's ``fetch`` (a split found later gets its
        own when it is added) and, for a discovering source, discovery."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for sp in self._active:
                self._start_fetch(sp)
            if self.discovering:
                tg.start_soon(self._discover, name=f"{self.source.name} split discovery")
            await anyio.sleep_forever()  # until the task ends and cancels it

    def _start_fetch(self, sp: _Split) -> None:
        tg, reader = self._tg, sp.reader
        if tg is None or reader is None:
            return  # not fetching (a reader used offline), or finished
        scope = sp.scope = anyio.CancelScope()

        async def run() -> None:
            with scope:
                await reader.fetch()

        tg.start_soon(run, name=f"{self.source.name} split {sp.split.split_id} fetch")

    async def _discover(self) -> None:
        interval = self.source.discovery_interval
        assert interval is not None
        while True:
            await anyio.sleep(interval)
            known = list(self._seen.values())
            try:
                found = await anyio.to_thread.run_sync(
                    self.source.discover_splits, known, self.parallelism)
            except Exception as exc:  # handed to read_batch: the error names the source
                self._error = exc
                if self._discovered is not None:
                    _resolve(self._discovered)
                return
            added = False
            for split in found:
                if split.split_id in self._seen:
                    continue
                sp = self._add(split, None, False)
                if sp is not None:
                    self._new.append(sp)
                    self._start_fetch(sp)
                    added = True
            if added and self._discovered is not None:
                _resolve(self._discovered)

    # -- positions ------------------------------------------------------------

    def position(self) -> SplitPositions:
        return SplitPositions({sid: sp.current() for sid, sp in self._splits.items()},
                              {sid: sp.split.info(sp.finished) for sid, sp in self._splits.items()})

    def snapshot_position(self, checkpoint_id: int) -> SplitPositions:
        positions = {}
        for sid, sp in self._splits.items():
            reader = sp.reader
            if reader is None or sp.pending:
                positions[sid] = sp.position
            else:
                positions[sid] = reader.snapshot_position(checkpoint_id)
        return SplitPositions(positions, {sid: sp.split.info(sp.finished)
                                          for sid, sp in self._splits.items()})

    def seek(self, position: Any) -> None:
        if not isinstance(position, SplitPositions):
            raise ValueError(f"{self.source.name}: a split source's subtask continues at "
                             f"split positions, not at {position!r}")
        for sid, pos in position.positions.items():
            sp = self._splits.get(sid)
            if sp is not None and not sp.finished:
                sp.position, sp.pending = pos, True
        if self._opened:
            self._open()

    def position_of(self, index: int) -> SplitAt | None:
        sp = self._last
        if sp is None or sp.reader is None:
            return None
        pos = sp.reader.position_of(index)
        return None if pos is None else SplitAt(sp.split.split_id, pos)

    def split_at(self, batch: list[Any], position: Any) -> tuple[list[Any], bool] | None:
        # Offline replay reads split by split (offline/replay.py), never a
        # subtask's splits together.
        return None

    def describe_position(self, position: Any) -> str:
        if isinstance(position, SplitAt):
            sp = self._splits.get(position.split_id)
            if sp is not None and sp.reader is not None:
                where = sp.reader.describe_position(position.position)
            else:
                where = f"position {position.position!r}"
            return f"split '{position.split_id}', {where}"
        if isinstance(position, SplitPositions):
            sp = self._current
            if sp is not None and sp.split.split_id in position.positions:
                return self.describe_position(
                    SplitAt(sp.split.split_id, position.positions[sp.split.split_id]))
            return f"splits {sorted(position.positions)}"
        return f"position {position!r}"

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for sp in self._active:
            assert sp.reader is not None
            sp.reader.notify_checkpoint_complete(checkpoint_id)

    async def close(self) -> None:
        readers = [sp.reader for sp in self._splits.values() if sp.reader is not None]
        errors = []
        for reader in readers:
            try:
                await reader.close()
            except Exception as exc:  # close every reader, then report
                errors.append(exc)
        if errors:
            raise errors[0]
