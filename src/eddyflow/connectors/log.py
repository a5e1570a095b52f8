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
from collections.abc import Iterator
from typing import IO, Any

from eddyflow.connectors.source import Source, SourceReader

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
            meta = os.path.join(self.path, _META)
            with open(meta + ".tmp", "w") as f:
                json.dump({"partitions": partitions}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(meta + ".tmp", meta)
        self._files: dict[int, IO[bytes]] = {}
        self._next = 0

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


class LogSource(Source):
    """Reads a :class:`Log`; subtask ``s`` of ``p`` reads partitions
    ``s, s+p, s+2p, …``. Bounded by default: stops at the end of the data;
    with ``bounded=False`` it waits for new records."""

    def __init__(self, path: str | os.PathLike[str], *, bounded: bool = True,
                 poll_interval: float = 0.05) -> None:
        self.log = Log.open_existing(path)
        self.path = self.log.path
        self.max_parallelism = self.log.partitions
        self.bounded = bounded
        self.poll_interval = poll_interval

    @property
    def name(self) -> str:
        return f"log:{os.path.basename(self.path.rstrip('/'))}"

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        parts = list(range(subtask, self.log.partitions, parallelism))
        return _LogReader(self.path, parts, self.bounded, self.poll_interval)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _LogReader(SourceReader):
    def __init__(self, path: str, partitions: list[int], bounded: bool, poll: float) -> None:
        self._readers = [_PartitionReader(path, p) for p in partitions]
        self._bounded = bounded
        self._poll = poll
        self._turn = 0
        self._last: list[tuple[int, int]] = []  # (partition, offset) per record of last batch
        self._poll_due: asyncio.Future[None] | None = None

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if not self._readers:
            return None
        out: list[Any] = []
        last: list[tuple[int, int]] = []
        n = len(self._readers)
        for k in range(n):
            r = self._readers[(self._turn + k) % n]
            start = r.offset
            got = r.read(max_records - len(out))
            out.extend(got)
            last.extend((r.partition, start + i) for i in range(len(got)))
            if len(out) >= max_records:
                break
        self._turn = (self._turn + 1) % n
        self._last = last
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

    def position(self) -> dict[str, int]:
        return {str(r.partition): r.offset for r in self._readers}

    def seek(self, position: Any) -> None:
        if not isinstance(position, dict):
            raise ValueError(f"log position must map partition -> offset, got {position!r}")
        for r in self._readers:
            r.seek(int(position.get(str(r.partition), 0)))

    def position_of(self, index: int) -> Any:
        return self._last[index] if 0 <= index < len(self._last) else None

    def split_at(self, batch: list[Any], position: Any) -> tuple[list[Any], bool]:
        # Batches interleave partitions, so the records before a position
        # (one offset per partition) are not a prefix of a batch read now:
        # keep each record whose offset is below its partition's.
        target = {str(k): int(v) for k, v in dict(position).items()}
        kept = [r for r, (part, offset) in zip(batch, self._last, strict=True)
                if offset < target.get(str(part), 0)]
        reached = all(r.offset >= target.get(str(r.partition), 0) for r in self._readers)
        return kept, reached

    def describe_position(self, position: Any) -> str:
        if isinstance(position, tuple):
            return f"log partition {position[0]} offset {position[1]}"
        return f"log offsets {position}"

    async def close(self) -> None:
        for r in self._readers:
            r.close()
