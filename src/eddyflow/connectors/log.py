"""``ef.Log``: an embedded, append-only, partitioned record log on local disk,
the single-host stand-in for a Kafka topic, and its source.

One file per partition (``partition-<i>.jsonl``, all created with the log, so
an empty partition still counts) and ``log.json`` with the partition count;
one JSON document per line;
a record's offset is its index in the partition. A line without its final
newline (a torn append from a crash) is not a record: readers stop before it,
and the next writer truncates it before appending, so a partition is always a
sequence of whole lines.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator, Sequence
from typing import IO, Any

from eddyflow.connectors.source import SourceReader
from eddyflow.connectors.splits import RestoredSplit, SourceSplit, SplitSource

__all__ = ["Log", "LogSource"]


_META = "log.json"


def _recorded_partitions(path: str) -> int | None:
    try:
        with open(os.path.join(path, _META)) as f:
            n = json.load(f)["partitions"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"log {path!r}: unreadable {_META}: {exc}") from exc
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"log {path!r}: {_META} records {n!r} partitions")
    return n


def _write_meta(path: str, partitions: int) -> None:
    meta = os.path.join(path, _META)
    with open(meta + ".tmp", "w") as f:
        json.dump({"partitions": partitions}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(meta + ".tmp", meta)


def _partition_path(path: str, partition: int) -> str:
    return os.path.join(path, f"partition-{partition}.jsonl")


class Log:
    """An embedded, append-only, partitioned record log in a folder: one
    JSON Lines file per partition (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], partitions: int = 4) -> None:
        self.path = os.fspath(path)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(
                f"Log {self.path!r}: partitions must be an int >= 1, got {partitions!r}"
            )
        existing = _recorded_partitions(self.path)
        if existing is not None and existing != partitions:
            raise ValueError(
                f"Log {self.path!r} already has {existing} partitions, not {partitions}"
            )
        self.partitions = partitions
        if existing is None:
            os.makedirs(self.path, exist_ok=True)
            for i in range(partitions):
                open(_partition_path(self.path, i), "ab").close()
            _write_meta(self.path, partitions)
        self._files: dict[int, IO[bytes]] = {}
        self._next = 0

    def add_partitions(self, count: int) -> None:
        """Grow the log to ``count`` partitions (Kafka's partition increase):
        the new ones start empty, and a running unbounded ``from_log``
        finds them at its next partition discovery. Existing records keep
        their partitions; round-robin appends use the new ones too."""
        if isinstance(count, bool) or not isinstance(count, int) or count < self.partitions:
            raise ValueError(f"Log {self.path!r} has {self.partitions} partitions; "
                             f"add_partitions needs a larger count, got {count!r}")
        for i in range(self.partitions, count):
            open(_partition_path(self.path, i), "ab").close()
        # The files first, then the count readers discover them by.
        _write_meta(self.path, count)
        self.partitions = count

    @staticmethod
    def open_existing(path: str | os.PathLike[str]) -> Log:
        """A log folder as written earlier, with its number of partitions."""
        p = os.fspath(path)
        if not os.path.isdir(p):
            raise FileNotFoundError(f"log {p!r} does not exist")
        n = _recorded_partitions(p)
        if n is None:
            raise FileNotFoundError(f"{p!r} is not a log (no {_META})")
        return Log(p, n)

    def _file(self, partition: int) -> IO[bytes]:
        f = self._files.get(partition)
        if f is None:
            path = _partition_path(self.path, partition)
            f = open(path, "a+b")  # noqa: SIM115 - kept open until close()
            # Drop a torn last line so that appends always start a new line.
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(max(0, size - 1))
                if f.read(1) != b"\n":
                    f.seek(0)
                    data = f.read()
                    f.truncate(data.rfind(b"\n") + 1)
            self._files[partition] = f
        return f

    def append(self, record: Any, partition: int | None = None) -> int:
        """Append ``record`` (JSON-serialisable); returns its partition.
        Without a partition, records go round-robin."""
        if partition is None:
            partition = self._next
            self._next = (self._next + 1) % self.partitions
        elif not 0 <= partition < self.partitions:
            raise ValueError(f"Log {self.path!r}: no partition {partition}")
        line = json.dumps(record).encode() + b"\n"
        f = self._file(partition)
        f.write(line)
        return partition

    def flush(self, fsync: bool = False) -> None:
        """Write the appended records out (``fsync``: durably)."""
        for f in self._files.values():
            f.flush()
            if fsync:
                os.fsync(f.fileno())

    def close(self) -> None:
        """Flush and close the partition files."""
        self.flush()
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, partition: int, offset: int = 0) -> Iterator[Any]:
        """Records of ``partition`` from ``offset`` on."""
        self.flush()
        reader = _PartitionReader(self.path, partition)
        reader.seek(offset)
        try:
            while True:
                batch = reader.read(1024)
                if not batch:
                    return
                yield from batch
        finally:
            reader.close()


class _PartitionReader:
    """Reads whole lines of one partition file; offset = record index."""

    def __init__(self, path: str, partition: int) -> None:
        self.path = _partition_path(path, partition)
        self.partition = partition
        self.offset = 0
        self._f: IO[bytes] | None = None
        self._byte = 0

    def _open(self) -> IO[bytes]:
        if self._f is None:
            try:
                self._f = open(self.path, "rb")  # noqa: SIM115 - closed in close()
            except OSError as exc:
                raise OSError(f"cannot read log partition {self.path!r}: {exc}") from exc
            self._f.seek(self._byte)
        return self._f

    def seek(self, offset: int) -> None:
        f = self._open()
        f.seek(0)
        self._byte = 0
        self.offset = 0
        while self.offset < offset:
            line = f.readline()
            if not line.endswith(b"\n"):
                raise ValueError(
                    f"log partition {self.path!r} has only {self.offset} records; "
                    f"cannot seek to offset {offset}"
                )
            self._byte += len(line)
            self.offset += 1
        f.seek(self._byte)

    def read(self, max_records: int) -> list[Any]:
        f = self._open()
        f.seek(self._byte)
        out = []
        for _ in range(max_records):
            line = f.readline()
            if not line.endswith(b"\n"):
                break  # end of data, or a torn append not finished yet
            try:
                out.append(json.loads(line))
            except ValueError as exc:
                raise ValueError(
                    f"log partition {self.path!r}: record at offset {self.offset} "
                    f"is not valid JSON: {exc}"
                ) from exc
            self._byte += len(line)
            self.offset += 1
        return out

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class LogSource(SplitSource):
    """Reads a :class:`Log`, one split per partition (partition ``i`` goes
    to subtask ``i % p``). Bounded by default: each partition is read to the
    end of its data, and the source ends. With ``bounded=False`` it waits
    for new records (polling every ``poll_interval`` seconds) and looks for
    partitions added to the log (:meth:`Log.add_partitions`) every
    ``partition_discovery`` seconds."""

    def __init__(self, path: str | os.PathLike[str], *, bounded: bool = True,
                 poll_interval: float = 0.05, partition_discovery: float = 1.0) -> None:
        self.log = Log.open_existing(path)
        self.path = self.log.path
        self.max_parallelism = self.log.partitions
        self.bounded = bounded
        self.poll_interval = poll_interval
        if not partition_discovery > 0:
            raise ValueError(f"LogSource({self.path!r}): partition_discovery must be positive, "
                             f"got {partition_discovery!r}")
        self.discovery_interval = None if bounded else partition_discovery

    @property
    def name(self) -> str:
        return f"log:{os.path.basename(self.path.rstrip('/'))}"

    def discover_splits(self, known: Sequence[SourceSplit], parallelism: int
                        ) -> list[SourceSplit]:
        n = _recorded_partitions(self.path)
        if n is None:
            raise FileNotFoundError(f"log {self.path!r}: {_META} is gone")
        have = {s.split_id for s in known}
        return [split for split in map(_partition_split, range(n)) if split.split_id not in have]

    def create_split_reader(self, split: SourceSplit) -> SourceReader:
        partition = split.data
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise ValueError(f"log {self.path!r}: split {split.split_id!r} names no partition "
                             f"({partition!r})")
        return _PartitionSplitReader(self.path, partition, self.bounded, self.poll_interval)

    def splits_of_subtask(self, subtask: int, parallelism: int, position: Any
                          ) -> list[RestoredSplit]:
        # Before it was a split source, subtask s of p read partitions s,
        # s+p, ... and recorded {partition: offset} for them.
        if position is not None and not isinstance(position, dict):
            raise ValueError(f"log position must map partition -> offset, got {position!r}")
        offsets = position or {}
        return [RestoredSplit(_partition_split(i), int(offsets.get(str(i), 0)))
                for i in range(subtask, self.log.partitions, parallelism)]


def _partition_split(partition: int) -> SourceSplit:
    # Its id is the partition's number: a subtask's positions read as the
    # {partition: offset} they always were.
    return SourceSplit(str(partition), partition, partition)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _PartitionSplitReader(SourceReader):
    """Reads one partition: the position is the offset of its next record."""

    def __init__(self, path: str, partition: int, bounded: bool, poll: float) -> None:
        self._reader = _PartitionReader(path, partition)
        self._bounded = bounded
        self._poll = poll
        self._batch_start = 0
        self._poll_due: asyncio.Future[None] | None = None

    async def read_batch(self, max_records: int) -> list[Any] | None:
        r = self._reader
        self._batch_start = r.offset
        out = r.read(max_records)
        if out or not self._bounded:
            return out  # unbounded and nothing appended yet: [] until the next poll
        return None

    def available(self) -> asyncio.Future[None] | None:
        # Appends are not announced: look again after the poll interval (the
        # task answers checkpoint triggers and timers meanwhile).
        if self._bounded:
            return None
        if self._poll_due is None or self._poll_due.done():
            loop = asyncio.get_running_loop()
            due = self._poll_due = loop.create_future()
            loop.call_later(self._poll, _resolve, due)
        return self._poll_due

    def position(self) -> int:
        return self._reader.offset

    def seek(self, position: Any) -> None:
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"log partition offset must be an int >= 0, got {position!r}")
        self._reader.seek(position)

    def position_of(self, index: int) -> int:
        return self._batch_start + index

    def describe_position(self, position: Any) -> str:
        return f"log partition {self._reader.partition} offset {position}"

    async def close(self) -> None:
        self._reader.close()
