"""A split source over a table of an SQLite database: the second example of
docs/extending/connector.md, which copies this file (test_connector_guide.py
checks that the copy is this file, and runs it through failures and a
restore at another parallelism)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from typing import Any

import eddyflow as ef


def connect(path: str) -> closing[sqlite3.Connection]:
    """A connection that is closed, not only committed, by ``with``."""
    return closing(sqlite3.connect(path))


class ChunkedTableSource(ef.SplitSource):
    """The JSON values of ``table`` (``id INTEGER PRIMARY KEY, value TEXT``)
    in chunks of ``chunk`` ids: split ``k`` holds the ids ``k * chunk + 1``
    to ``(k + 1) * chunk``, and its position is the last id read in it.
    With ``discovery_interval`` the table may grow while the job runs: a
    chunk is read until it is full, and new chunks are found as ids grow."""

    def __init__(self, path: str, table: str, chunk: int = 1000,
                 discovery_interval: float | None = None) -> None:
        self.path = path
        self.table = table
        self.chunk = chunk
        self.discovery_interval = discovery_interval

    @property
    def name(self) -> str:
        return f"sqlite-chunks:{self.table}"

    def discover_splits(self, known: Sequence[ef.SourceSplit], parallelism: int
                        ) -> list[ef.SourceSplit]:
        # The chunks up to the highest id now; those known already are not
        # new. Any subtask finds the same chunks: the ids decide them.
        with connect(self.path) as db:
            (top,) = db.execute(f"SELECT COALESCE(MAX(id), 0) FROM {self.table}").fetchone()
        have = {split.split_id for split in known}
        chunks = -(-top // self.chunk)
        # The index deals chunk k to subtask k % parallelism.
        found = [ef.SourceSplit(f"chunk-{k}", [k * self.chunk, (k + 1) * self.chunk], k)
                 for k in range(chunks)]
        return [split for split in found if split.split_id not in have]

    def create_split_reader(self, split: ef.SourceSplit) -> ef.SourceReader:
        first, last = split.data
        return ChunkReader(self.path, self.table, first, last,
                           growing=self.discovery_interval is not None)


class ChunkReader(ef.SourceReader):
    """Reads one chunk: the rows with ``first < id <= last``."""

    def __init__(self, path: str, table: str, first: int, last: int, growing: bool) -> None:
        self.path = path
        self.query = f"SELECT id, value FROM {table} WHERE id > ? AND id <= ? ORDER BY id LIMIT ?"
        self.last = last
        self.last_id = first  # the position: the rows of the chunk up to it were read
        self.growing = growing

    async def read_batch(self, max_records: int) -> list[Any] | None:
        with connect(self.path) as db:
            rows = db.execute(self.query, (self.last_id, self.last, max_records)).fetchall()
        if rows:
            self.last_id = rows[-1][0]
            return [json.loads(value) for _, value in rows]
        if self.last_id >= self.last or not self.growing:
            return None  # the chunk is read to its end
        return []  # rows of this chunk may still come: idle until then

    def available(self) -> asyncio.Future[None] | None:
        # SQLite announces no inserts: look again in a moment (the task
        # answers checkpoints and timers meanwhile; other chunks are read).
        loop = asyncio.get_running_loop()
        later: asyncio.Future[None] = loop.create_future()
        loop.call_later(0.05, lambda: later.done() or later.set_result(None))
        return later

    def position(self) -> int:
        return self.last_id

    def seek(self, position: Any) -> None:
        if not isinstance(position, int) or position < 0:
            raise ValueError(f"a chunk position is a row id, got {position!r}")
        self.last_id = position

    def describe_position(self, position: Any) -> str:
        return f"after row {position}"
