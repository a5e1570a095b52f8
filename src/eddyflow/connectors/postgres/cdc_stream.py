"""The replication connection: ``START_REPLICATION`` of a logical slot over
the streaming replication protocol, frames received without blocking the
event loop, and status updates that acknowledge a position.

Why the streaming protocol and not ``pg_logical_slot_peek_binary_changes``:
a slot is only advanced when a checkpoint completes, and ``peek`` always
decodes from the slot's confirmed position, so every poll between two
checkpoints would decode again all the changes since the last one (work
growing with the square of the changes per checkpoint interval), and a poll
returns only what had been committed when it started. The stream decodes
each change once, pushes it as it commits, and keeps the slot where the
client's status updates say (``benchmarks/postgres_cdc.py`` measures the
stream against a plain ``peek`` of the same changes).

psycopg 3 has no replication API, but a connection opened with
``replication=database`` runs replication commands, and after
``START_REPLICATION`` its libpq connection (``psycopg.pq.PGconn``, a public
API) is in COPY BOTH mode: frames are read with ``get_copy_data`` and status
updates written with ``put_copy_data``, the socket watched by the event loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
from psycopg import pq

from eddyflow.connectors.postgres.cdc_protocol import format_lsn, standby_status

__all__ = ["SESSION_OPTIONS", "ReplicationStream"]

#: Session settings of every connection of the source: values in the text
#: forms psycopg's loaders read, and identical between the stream (whose
#: values the walsender prints in its session) and the snapshot's SELECTs.
SESSION_OPTIONS = "-c DateStyle=ISO -c IntervalStyle=postgres -c extra_float_digits=3"


class ReplicationStream:
    """One ``START_REPLICATION`` of ``slot`` from ``lsn`` with ``pgoutput``."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn
        self._pg: pq.abc.PGconn = conn.pgconn
        self._loop = asyncio.get_running_loop()
        self.last_status = 0.0

    @classmethod
    async def start(cls, dsn: str, slot: str, publication: str, lsn: int) -> ReplicationStream:
        """Connects and starts streaming the slot's changes after ``lsn``."""
        conn = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, replication="database", options=SESSION_OPTIONS)
        try:
            quoted_pub = publication.replace("'", "''")
            await conn.execute(
                f'START_REPLICATION SLOT "{slot}" LOGICAL {format_lsn(lsn)} '
                f"(proto_version '1', publication_names '\"{quoted_pub}\"')")
        except BaseException:
            await conn.close()
            raise
        return cls(conn)

    def read(self) -> memoryview | bytes | None:
        """The next frame received, or ``None`` when none is (call
        :meth:`wait_readable`)."""
        size, data = self._pg.get_copy_data(1)
        if size > 0:
            return data
        if size == 0:
            return None
        result = self._pg.get_result()
        message = "the server ended the replication stream"
        if result is not None and result.error_message:
            message += ": " + result.error_message.decode(errors="replace").strip()
        raise psycopg.OperationalError(message)

    async def wait_readable(self) -> None:
        """Waits until the socket has data, then takes it in."""
        fd = self._pg.socket
        ready: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_reader(fd, _resolve, ready)
        try:
            await ready
        finally:
            self._loop.remove_reader(fd)
        self._pg.consume_input()

    async def send_status(self, flush_lsn: int) -> None:
        """Acknowledges ``flush_lsn``: the slot's confirmed position moves
        there (the server keeps no WAL before it)."""
        self._pg.put_copy_data(standby_status(flush_lsn, time.time()))
        while self._pg.flush():
            ready: asyncio.Future[None] = self._loop.create_future()
            fd = self._pg.socket
            self._loop.add_writer(fd, _resolve, ready)
            try:
                await ready
            finally:
                self._loop.remove_writer(fd)
        self.last_status = time.monotonic()

    async def close(self) -> None:
        """Ends the stream and the connection."""
        await self._conn.close()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
