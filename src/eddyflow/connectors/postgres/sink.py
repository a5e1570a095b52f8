"""``PostgresSink``: rows into a PostgreSQL table, upserted or appended,
exactly once by two-phase commit (docs/connectors.md, PostgreSQL).

Exactly once (the default): each sink subtask writes a checkpoint's
records in one transaction of its own connection. At the checkpoint's
barrier the writer ends it with ``PREPARE TRANSACTION '<gid>'``: durable,
invisible, and no longer tied to the connection; the committable is the
gid (with the transaction's id). When the checkpoint completes, the sink
``COMMIT PREPARED``s the gids it recorded; one that is gone was committed
already (the transaction's status says so: a commit is idempotent, and one
that was rolled back is an error, not silence). Before every (re)start,
``recover`` commits the gids of the restored checkpoint and rolls back
every other prepared transaction of this job's sink: those of checkpoints
that never completed, whose records are read again.

A gid is ``eddyflow:<job>:<uid>:<subtask>:<checkpoint>`` (job and uid
percent-encoded; hashed if that would pass PostgreSQL's 200 bytes), and
``recover`` looks for the prefix of its job and uid in
``pg_prepared_xacts``: another job's, or another sink's, are never touched.

A prepared transaction keeps its row locks until it is committed: the
next checkpoint's write of the same key waits for the commit, which comes
as soon as the checkpoint completes. A checkpoint that is aborted after
its barrier reached the sink leaves its transaction prepared until a later
one completes; a write that waits for it longer than ``lock_timeout``
seconds fails the job, whose restart rolls the transaction back and
replays its records, instead of waiting for ever.

``exactly_once=False``: a checkpoint's transaction is committed at its
barrier, without prepared transactions: at-least-once (a restart replays
the records after the last completed checkpoint). With ``mode="upsert"``
the replay writes the same rows again, so the table ends the same.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql

from eddyflow.connectors.postgres.sink_sql import (
    CopyStream,
    PostgresSinkError,
    Statements,
    TableInfo,
    check_key,
    check_server,
    connect,
    load_table,
    write_batch,
)
from eddyflow.connectors.sink import Sink, SinkWriter

__all__ = ["PostgresSink", "PostgresSinkError"]

_GID_BYTES = 200  # PostgreSQL's limit on a prepared transaction's identifier


class PostgresSink(Sink):
    """Writes dicts of column -> value into ``table`` (see the module docstring).

    ``mode="upsert"`` inserts a row or updates the row with its ``key``
    (``INSERT ... ON CONFLICT (key) DO UPDATE``; the table needs a primary
    key or unique constraint on exactly those columns); a record
    ``{"__op": "d", **key}`` deletes by key. ``mode="append"`` inserts.
    Every record names each column of the table that has no default.
    """

    def __init__(self, dsn: str, table: str, mode: str = "upsert",
                 key: Sequence[str] | None = None, exactly_once: bool = True,
                 lock_timeout: float = 60.0) -> None:
        if mode not in ("upsert", "append"):
            raise ValueError(f"PostgresSink: mode must be \"upsert\" or \"append\", got {mode!r}")
        keys = [key] if isinstance(key, str) else list(key or ())
        if mode == "upsert" and not keys:
            raise ValueError(f"PostgresSink({table}): mode=\"upsert\" needs key=[column, ...]")
        if not all(isinstance(k, str) and k for k in keys):
            raise ValueError(f"PostgresSink({table}): key must name columns, got {key!r}")
        if not isinstance(table, str) or not table:
            raise ValueError(f"PostgresSink: table must be a table name, got {table!r}")
        self.dsn = dsn
        self.table = table
        self.mode = mode
        self.key = keys
        self.exactly_once = exactly_once
        self.lock_timeout = lock_timeout
        #: The job and operator uid it runs under (``for_job``): its gids' prefix.
        self.job = ""
        self.uid = self.name

    @property
    def name(self) -> str:
        return f"postgres:{self.table}"

    @property
    def who(self) -> str:
        """How errors name this sink."""
        return f"PostgresSink({self.table})"

    def for_job(self, job: str, uid: str) -> Sink:
        bound = copy.copy(self)
        bound.job, bound.uid = job, uid
        return bound

    def gid_prefix(self) -> str:
        """The prefix of every prepared transaction of this job's sink."""
        ident = f"{quote(self.job, safe='')}:{quote(self.uid, safe='')}"
        if len(ident.encode()) > _GID_BYTES - 60:
            ident = hashlib.sha256(ident.encode()).hexdigest()[:32]
        return f"eddyflow:{ident}:"

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return PostgresWriter(self, subtask)

    async def commit(self, committables: list[Any]) -> None:
        if not committables:
            return
        async with await connect(self.dsn, self.who, autocommit=True) as conn:
            await self._commit(conn, committables)

    async def _commit(self, conn: psycopg.AsyncConnection[Any], committables: list[Any]) -> None:
        for gid, xid in committables:
            try:
                await conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
            except psycopg.errors.UndefinedObject:
                # Gone: committed before (a commit retried after a failure),
                # unless it was rolled back, which would lose its rows.
                cur = await conn.execute("SELECT pg_xact_status(%s::xid8)", [xid])
                row = await cur.fetchone()
                if row is not None and row[0] == "aborted":
                    raise PostgresSinkError(
                        f"{self.who}: prepared transaction {gid} of a completed checkpoint "
                        "was rolled back outside the job; its rows are lost") from None

    async def recover(self, committed: list[Any]) -> None:
        async with await connect(self.dsn, self.who, autocommit=True) as conn:
            await check_server(conn, self.who, self.exactly_once, self.mode)
            info = await load_table(conn, self.table, self.who)
            if self.mode == "upsert":
                check_key(info, self.key, self.who)
            if not self.exactly_once:
                return
            await self._commit(conn, committed)
            keep = {gid for gid, _ in committed}
            prefix = self.gid_prefix()
            cur = await conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                "AND left(gid, %s) = %s", [len(prefix), prefix])
            for (gid,) in await cur.fetchall():
                if gid not in keep:  # a checkpoint that never completed: replayed
                    await conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))

    def __repr__(self) -> str:
        return (f"PostgresSink(table={self.table!r}, mode={self.mode!r}, key={self.key!r}, "
                f"exactly_once={self.exactly_once})")


class PostgresWriter(SinkWriter):
    """One sink subtask's connection and its transaction of the checkpoint
    in progress."""

    def __init__(self, sink: PostgresSink, subtask: int) -> None:
        self.sink = sink
        self.subtask = subtask
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._statements: Statements | None = None
        self._copy: CopyStream | None = None
        #: Rows were written since the last prepare (a transaction is open).
        self._dirty = False

    async def _open(self) -> tuple[psycopg.AsyncConnection[Any], Statements]:
        conn, st = self._conn, self._statements
        if conn is not None and st is not None:
            return conn, st
        s = self.sink
        conn = self._conn = await connect(s.dsn, s.who)
        if s.exactly_once:
            # See the module docstring: a write that waits this long is
            # waiting for a transaction no checkpoint will commit.
            await conn.execute(sql.SQL("SET lock_timeout = {}").format(
                sql.Literal(f"{int(s.lock_timeout * 1000)}ms")))
        info: TableInfo = await load_table(conn, s.table, s.who)
        await conn.commit()
        st = self._statements = Statements(info, s.mode, s.key, s.who)
        if s.mode == "append":
            self._copy = CopyStream(st)
        return conn, st

    async def write(self, records: list[Any]) -> None:
        conn, st = await self._open()
        self._dirty = True
        try:
            if self._copy is not None:
                await self._copy.write(conn, records)
            else:
                await write_batch(conn, st, records)
        except psycopg.errors.LockNotAvailable as exc:
            raise PostgresSinkError(
                f"{self.sink.who}: a write waited more than lock_timeout="
                f"{self.sink.lock_timeout:g} s for a row lock (held by another session, or "
                "by this job's prepared transaction of a checkpoint that was aborted); the "
                "restart rolls it back") from exc
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            raise PostgresSinkError(f"{self.sink.who}: table {st.info.label} refused a "
                                    f"batch: {' '.join(str(exc).split())}") from exc

    async def prepare_commit(self, checkpoint_id: int) -> Any:
        conn = self._conn
        if conn is None or not self._dirty:
            return None
        self._dirty = False
        if self._copy is not None:
            try:
                await self._copy.finish()
            except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
                raise PostgresSinkError(
                    f"{self.sink.who}: table {self.sink.table} refused rows: "
                    f"{' '.join(str(exc).split())}") from exc
        if not self.sink.exactly_once:
            await conn.commit()
            return None
        gid = f"{self.sink.gid_prefix()}{self.subtask}:{checkpoint_id}"
        cur = await conn.execute("SELECT pg_current_xact_id()::text")
        row = await cur.fetchone()
        assert row is not None
        await conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        return [gid, row[0]]

    async def abort(self) -> None:
        # Closing the connection rolls back its open transaction (the
        # prepared ones are not its any more); it may be broken, or in the
        # middle of a statement the failure interrupted, where a ROLLBACK
        # could not be sent.
        self._dirty = False
        if self._copy is not None:
            await self._copy.discard()
        await self.close()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
