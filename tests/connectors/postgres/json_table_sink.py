"""A two-phase-commit sink to PostgreSQL, written from scratch with async
methods: the example of docs/extending/connector.md, which shows this file
(test_sink_guide.py checks that it is this file, and runs it through
failures). eddyflow's ``PostgresSink`` is the full version: upserts,
``COPY``, checks and clear errors."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import psycopg
from psycopg import sql

import eddyflow as ef


class JsonTableSink(ef.Sink):
    """Appends each record, as JSON, to ``table`` (``value jsonb``), exactly
    once: a checkpoint's records are one transaction per subtask, prepared
    at the barrier (``PREPARE TRANSACTION``) and committed when the
    checkpoint completes (``COMMIT PREPARED``)."""

    def __init__(self, dsn: str, table: str, prefix: str = "") -> None:
        self.dsn = dsn
        self.table = table
        self.prefix = prefix  # of this job's transaction names

    @property
    def name(self) -> str:
        return f"json-table:{self.table}"

    def for_job(self, job: str, uid: str) -> ef.Sink:
        # Name the transactions after the job and the sink, so that recover
        # finds this job's and no other's. (PostgreSQL allows 200 bytes; a
        # real sink escapes the names and hashes long ones.)
        return JsonTableSink(self.dsn, self.table, prefix=f"ef:{job}:{uid}:")

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        return JsonTableWriter(self, subtask)

    async def commit(self, committables: list[Any]) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            for gid in committables:
                # Gone: committed before a failure; committing again changes nothing.
                with contextlib.suppress(psycopg.errors.UndefinedObject):
                    await conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))

    async def recover(self, committed: list[Any]) -> None:
        # Before a (re)start: the restored checkpoint's transactions are
        # committed; this job's other prepared ones never completed, and
        # their records will be read again.
        await self.commit(committed)
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT gid FROM pg_prepared_xacts "
                                     "WHERE starts_with(gid, %s)", [self.prefix])
            for (gid,) in await cur.fetchall():
                await conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


class JsonTableWriter(ef.SinkWriter):
    """One subtask's connection; its open transaction holds the records
    written since the last barrier."""

    def __init__(self, sink: JsonTableSink, subtask: int) -> None:
        self.sink = sink
        self.subtask = subtask
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.written = False

    async def write(self, records: list[Any]) -> None:
        if self.conn is None:
            self.conn = await psycopg.AsyncConnection.connect(self.sink.dsn)
        # One statement per batch: the records as an array.
        insert = sql.SQL("INSERT INTO {} (value) SELECT * FROM unnest(%s::jsonb[])").format(
            sql.Identifier(self.sink.table))
        await self.conn.execute(insert, [[json.dumps(r) for r in records]])
        self.written = True

    async def prepare_commit(self, checkpoint_id: int) -> Any:
        if self.conn is None or not self.written:
            return None
        gid = f"{self.sink.prefix}{self.subtask}:{checkpoint_id}"
        await self.conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        self.written = False
        return gid  # the committable: JSON, written into the checkpoint

    async def abort(self) -> None:
        await self.close()  # the server rolls back the open transaction

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None
