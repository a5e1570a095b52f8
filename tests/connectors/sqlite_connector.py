"""A connector to a table of an SQLite database: the example of
docs/extending/connector.md, which copies this file (test_connector_guide.py
checks that the copy is this file, and runs it through a failure)."""

from __future__ import annotations

import json
import secrets
import sqlite3
from contextlib import closing
from typing import Any

import eddyflow as ef


def connect(path: str) -> closing[sqlite3.Connection]:
    """A connection that is closed, not only committed, by ``with``."""
    return closing(sqlite3.connect(path))


class TableSource(ef.Source):
    """The JSON values of ``table`` (``id INTEGER PRIMARY KEY, value TEXT``),
    in ``id`` order; subtask ``s`` of ``p`` reads the rows whose ``id % p``
    is ``s``. A position is the last ``id`` read."""

    def __init__(self, path: str, table: str) -> None:
        self.path = path
        self.table = table

    @property
    def name(self) -> str:
        # The same in every run of the job: an unnamed source's identity in
        # checkpoints derives from it.
        return f"sqlite:{self.table}"

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return TableReader(self.path, self.table, subtask, parallelism)


class TableReader(ef.SourceReader):
    """Reads one split of a :class:`TableSource`."""

    def __init__(self, path: str, table: str, subtask: int, parallelism: int) -> None:
        self.path = path
        self.query = (f"SELECT id, value FROM {table} WHERE id > ? AND id % {parallelism} = "
                      f"{subtask} ORDER BY id LIMIT ?")
        self.last_id = 0  # the position: rows up to this id were read

    async def read_batch(self, max_records: int) -> list[Any] | None:
        # A short local query: it returns at once, so it may run on the
        # event loop (a read must not wait for input that has not come).
        with connect(self.path) as db:
            rows = db.execute(self.query, (self.last_id, max_records)).fetchall()
        if not rows:
            return None  # a bounded table: the input is exhausted
        self.last_id = rows[-1][0]
        return [json.loads(value) for _, value in rows]

    def position(self) -> int:
        return self.last_id

    def seek(self, position: Any) -> None:
        if not isinstance(position, int) or position < 0:
            raise ValueError(f"a table position is a row id, got {position!r}")
        self.last_id = position

    def describe_position(self, position: Any) -> str:
        return f"after row {position}"


class TableSink(ef.Sink):
    """Appends each record, as JSON, to ``table`` (``value TEXT``), exactly
    once: a checkpoint's records are staged under a transaction id, and its
    commit moves them into ``table`` and records the id, in one SQLite
    transaction, so that committing again changes nothing."""

    def __init__(self, path: str, table: str) -> None:
        self.path = path
        self.table = table
        with connect(path) as db, db:
            db.execute(f"CREATE TABLE IF NOT EXISTS {table} (value TEXT)")
            db.execute(f"CREATE TABLE IF NOT EXISTS {table}_staged (txn TEXT, value TEXT)")
            db.execute(f"CREATE TABLE IF NOT EXISTS {table}_committed (txn TEXT PRIMARY KEY)")

    @property
    def name(self) -> str:
        return f"sqlite:{self.table}"

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        return TableWriter(self.path, self.table)

    def commit(self, committables: list[Any]) -> None:
        t = self.table
        with connect(self.path) as db, db:  # one transaction for them all
            for txn in committables:
                done = db.execute(f"SELECT 1 FROM {t}_committed WHERE txn = ?", (txn,))
                if done.fetchone() is not None:
                    continue  # committed before a failure: a no-op now
                db.execute(f"INSERT INTO {t} (value) SELECT value FROM {t}_staged "
                           "WHERE txn = ? ORDER BY rowid", (txn,))
                db.execute(f"DELETE FROM {t}_staged WHERE txn = ?", (txn,))
                db.execute(f"INSERT INTO {t}_committed (txn) VALUES (?)", (txn,))

    def recover(self, committed: list[Any]) -> None:
        # Before a (re)start no writer runs: what the restored checkpoint
        # recorded is committed, and every other staged record (a
        # checkpoint that never completed) is dropped; it is read again.
        self.commit(committed)
        with connect(self.path) as db, db:
            db.execute(f"DELETE FROM {self.table}_staged")


class TableWriter(ef.SinkWriter):
    """One sink subtask's writer: the pending transaction is in memory
    until a barrier stages it."""

    def __init__(self, path: str, table: str) -> None:
        self.path = path
        self.table = table
        self.pending: list[str] = []

    def write(self, records: list[Any]) -> None:
        self.pending.extend(json.dumps(r) for r in records)

    def prepare_commit(self, checkpoint_id: int) -> Any:
        if not self.pending:
            return None
        # A new id each time: unique over subtasks, checkpoints and runs.
        txn = f"chk-{checkpoint_id}-{secrets.token_hex(8)}"
        with connect(self.path) as db, db:
            db.executemany(f"INSERT INTO {self.table}_staged (txn, value) VALUES (?, ?)",
                           [(txn, value) for value in self.pending])
        self.pending = []
        return txn  # the committable: JSON, written into the checkpoint

    def abort(self) -> None:
        self.pending = []
