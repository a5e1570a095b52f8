"""What the CDC source checks before it reads, each failure one line naming
the setting, table, publication, role or slot at fault."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection, sql

from eddyflow.connectors.postgres.cdc_protocol import format_lsn, parse_lsn

__all__ = ["PostgresCdcError", "check_restore", "check_server", "ensure_publication",
           "ensure_slot"]


class PostgresCdcError(RuntimeError):
    """The PostgreSQL CDC source cannot read: the message says why and what to change."""


async def _one(conn: AsyncConnection[Any], query: str, params: Sequence[Any] = ()) -> Any:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    return None if row is None else row[0]


async def check_server(conn: AsyncConnection[Any], tables: Sequence[str],
                       publication: str | None) -> None:
    """``wal_level``, the role's REPLICATION attribute, the tables, and
    (given) the publication or (not) the right to create one."""
    level = await _one(conn, "SHOW wal_level")
    if level != "logical":
        raise PostgresCdcError(
            f"PostgresCdcSource: the server's wal_level is {level!r}; logical decoding needs "
            "wal_level = logical (set it in postgresql.conf and restart the server)")
    role = await _one(conn, "SELECT current_user")
    can_replicate = await _one(
        conn, "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user")
    if not can_replicate:
        raise PostgresCdcError(
            f"PostgresCdcSource: role {role!r} lacks the REPLICATION attribute needed for a "
            f"replication slot (ALTER ROLE {role} REPLICATION, as a superuser)")
    for table in tables:
        if await _one(conn, "SELECT to_regclass(%s)", (table,)) is None:
            db = await _one(conn, "SELECT current_database()")
            raise PostgresCdcError(
                f"PostgresCdcSource: table {table!r} does not exist in database {db!r}")
        if not await _one(conn, "SELECT has_table_privilege(%s, 'SELECT')", (table,)):
            raise PostgresCdcError(
                f"PostgresCdcSource: role {role!r} may not SELECT from table {table!r} "
                f"(GRANT SELECT ON {table} TO {role})")
    if publication is not None:
        if not await _one(conn, "SELECT count(*) FROM pg_publication WHERE pubname = %s",
                          (publication,)):
            raise PostgresCdcError(
                f"PostgresCdcSource: publication {publication!r} does not exist "
                f"(CREATE PUBLICATION {publication} FOR TABLE {', '.join(tables)})")
        cur = await conn.execute(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables "
            "WHERE pubname = %s", (publication,))
        published = {r[0] for r in await cur.fetchall()}
        missing = [t for t in tables if await _qualified(conn, t) not in published]
        if missing:
            raise PostgresCdcError(
                f"PostgresCdcSource: publication {publication!r} does not include table(s) "
                f"{', '.join(missing)} (ALTER PUBLICATION {publication} ADD TABLE ...)")


async def _qualified(conn: AsyncConnection[Any], table: str) -> str:
    name: str = await _one(
        conn, "SELECT n.nspname || '.' || c.relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s::regclass", (table,))
    return name


async def qualified_names(conn: AsyncConnection[Any], tables: Sequence[str]) -> list[str]:
    """``schema.table`` for each table as the user named it (as the stream names them)."""
    return [await _qualified(conn, t) for t in tables]


async def ensure_publication(conn: AsyncConnection[Any], name: str,
                             tables: Sequence[str]) -> None:
    """Creates publication ``name`` for ``tables`` unless it exists (then
    adds the tables it lacks); creating needs the tables' ownership."""
    role = await _one(conn, "SELECT current_user")
    for table in tables:
        if not await _one(conn, "SELECT pg_has_role(relowner, 'USAGE') FROM pg_class "
                          "WHERE oid = %s::regclass", (table,)):
            raise PostgresCdcError(
                f"PostgresCdcSource: role {role!r} does not own table {table!r}, so it cannot "
                f"create publication {name!r} for it; create one as the owner and pass "
                "publication=")
    idents = sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in tables)
    if not await _one(conn, "SELECT count(*) FROM pg_publication WHERE pubname = %s", (name,)):
        await conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(name), idents))
        return
    cur = await conn.execute("SELECT schemaname || '.' || tablename FROM pg_publication_tables "
                             "WHERE pubname = %s", (name,))
    have = {r[0] for r in await cur.fetchall()}
    lacking = [t for t in tables if t not in have]
    if lacking:
        await conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
            sql.Identifier(name),
            sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in lacking)))


async def _slot(conn: AsyncConnection[Any], slot: str) -> tuple[Any, ...] | None:
    cur = await conn.execute(
        "SELECT plugin, active_pid, confirmed_flush_lsn::text, wal_status, database "
        "FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    return await cur.fetchone()


async def _wait_free(conn: AsyncConnection[Any], slot: str, wait: float) -> tuple[Any, ...] | None:
    """The slot's row once no process holds it, or after ``wait`` seconds:
    the server process of a reader that was just killed only lets go of the
    slot once it notices that its client is gone."""
    deadline = time.monotonic() + wait
    delay = 0.01
    while True:
        row = await _slot(conn, slot)
        if row is None or row[1] is None or time.monotonic() >= deadline:
            return row
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def _check_free(conn: AsyncConnection[Any], slot: str, row: tuple[Any, ...]) -> None:
    plugin, pid, _, wal_status, datname = row
    if plugin != "pgoutput":
        raise PostgresCdcError(
            f"PostgresCdcSource: replication slot {slot!r} uses plugin {plugin!r}, not pgoutput")
    db = await _one(conn, "SELECT current_database()")
    if datname != db:
        raise PostgresCdcError(
            f"PostgresCdcSource: replication slot {slot!r} belongs to database {datname!r}, "
            f"not {db!r}")
    if pid is not None:
        raise PostgresCdcError(
            f"PostgresCdcSource: replication slot {slot!r} is in use by server process {pid} "
            "(another job, or a client, reads it; a slot has one reader)")
    if wal_status == "lost":
        raise PostgresCdcError(
            f"PostgresCdcSource: replication slot {slot!r} has lost the WAL it needs "
            "(wal_status = lost: max_slot_wal_keep_size was exceeded); drop it and start over")


async def ensure_slot(conn: AsyncConnection[Any], slot: str, wait: float) -> tuple[int, bool]:
    """The slot's confirmed position, creating the slot (``pgoutput``) if
    missing; and whether it was created now. A slot in use is waited for up
    to ``wait`` seconds."""
    row = await _wait_free(conn, slot, wait)
    if row is None:
        created = await _one(
            conn, "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
            (slot,))
        return parse_lsn(created), True
    await _check_free(conn, slot, row)
    return parse_lsn(row[2]), False


async def check_restore(conn: AsyncConnection[Any], slot: str, lsn: int, wait: float) -> None:
    """A restore at checkpoint position ``lsn`` needs the slot, not advanced
    past it (and free: waited for up to ``wait`` seconds)."""
    row = await _wait_free(conn, slot, wait)
    if row is None:
        raise PostgresCdcError(
            f"PostgresCdcSource: cannot resume at the checkpoint's LSN {format_lsn(lsn)}: "
            f"replication slot {slot!r} does not exist (dropped?), so the WAL since the "
            "checkpoint is gone; restore without the checkpoint to start over")
    await _check_free(conn, slot, row)
    confirmed = parse_lsn(row[2])
    if confirmed > lsn:
        raise PostgresCdcError(
            f"PostgresCdcSource: cannot resume at the checkpoint's LSN {format_lsn(lsn)}: "
            f"replication slot {slot!r} is at {format_lsn(confirmed)}, past it; the server "
            "no longer keeps the WAL between (was the slot advanced by another job, or "
            "is this an older checkpoint than the last completed one?)")
