"""``PostgresCdcSource``: the changes of PostgreSQL tables, read by logical
decoding (``pgoutput``) from a replication slot, after an initial snapshot
of their rows; one record per row change, in Debezium's envelope.

The reader's :meth:`~PostgresCdcReader.fetch` does the I/O: it checks the
server (:mod:`.cdc_errors`), then runs the fetch loop (:mod:`.cdc_fetch`),
which streams the slot (:mod:`.cdc_stream`), decodes (:mod:`.cdc_protocol`),
reads snapshot chunks and reconciles them with the stream
(:mod:`.cdc_snapshot`), and queues *units* (a transaction's records, a
chunk's reads) for ``read_batch``, which only takes from the queue: reads
never wait.

Position: ``{"lsn": L, "skip": k, "snapshot": progress | None}``: the stream
restarts at WAL position ``L`` (the end of the last transaction emitted, or
the commit of one emitted in part, of which ``k`` records were), and the
snapshot's progress (:class:`.cdc_snapshot.SnapshotProgress`). The slot is
acknowledged up to ``L`` only when a checkpoint that holds it completes, so
the server keeps exactly the WAL a restore may need.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import anyio
import psycopg
from psycopg.adapt import Transformer

from eddyflow.connectors.postgres.cdc_errors import (
    PostgresCdcError,
    check_restore,
    check_server,
    ensure_publication,
    ensure_slot,
    qualified_names,
)
from eddyflow.connectors.postgres.cdc_fetch import Buffer, FetchLoop, settled_snapshot
from eddyflow.connectors.postgres.cdc_protocol import (
    Decoder,
    RelationCache,
    format_lsn,
)
from eddyflow.connectors.postgres.cdc_snapshot import (
    SnapshotProgress,
    TableInfo,
    describe_table,
)
from eddyflow.connectors.postgres.cdc_stream import SESSION_OPTIONS, ReplicationStream
from eddyflow.connectors.source import SourceReader
from eddyflow.connectors.splits import SourceSplit, SplitSource

__all__ = ["PostgresCdcError", "PostgresCdcReader", "PostgresCdcSource"]

class PostgresCdcSource(SplitSource):
    """Row changes of ``tables`` (``schema.table``) from replication slot
    ``slot`` (created with ``pgoutput`` if missing), each a dict
    ``{"op", "table", "before", "after", "lsn", "commit_time"}`` (API.md
    "PostgreSQL"); a truncate is ``op`` ``"t"`` with no rows.

    ``publication``: an existing publication to read; ``None``: one named
    after the slot, created (or extended) for the tables. ``snapshot``: first
    the tables' rows (``op`` ``"r"``), read in key order ``chunk_size`` rows
    at a time. ``until_lsn``: end once every change committed before this
    WAL position is emitted (a bounded read, whose split is then finished;
    ``None``: never end).
    ``status_interval``: seconds between status updates to the server (it
    drops a silent stream after ``wal_sender_timeout``). ``slot_wait``:
    seconds to wait for a slot held by another reader (the server process of
    a job that was just killed holds it until it notices) before failing.
    """

    max_parallelism = 1

    def __init__(self, dsn: str, tables: Sequence[str], slot: str, publication: str | None = None,
                 snapshot: bool = True, *, chunk_size: int = 8192, until_lsn: int | None = None,
                 status_interval: float = 10.0, slot_wait: float = 30.0) -> None:
        if isinstance(tables, str) or not tables:
            raise ValueError(f"PostgresCdcSource: tables must be a non-empty list of "
                             f"table names, got {tables!r}")
        if not slot or not slot.replace("_", "").isalnum() or slot.lower() != slot:
            raise ValueError(f"PostgresCdcSource: slot {slot!r} must be lower-case letters, "
                             "digits and underscores (PostgreSQL's rule for slot names)")
        if chunk_size < 1:
            raise ValueError(f"PostgresCdcSource: chunk_size must be at least 1, got {chunk_size}")
        self.dsn = dsn
        self.tables = list(tables)
        self.slot = slot
        self.publication = publication
        self.snapshot = snapshot
        self.chunk_size = chunk_size
        self.until_lsn = until_lsn
        self.status_interval = status_interval
        self.slot_wait = slot_wait
        #: Every snapshot chunk read by this source's readers: (table, key
        #: it was read after or ``None``, rows), for diagnostics and tests.
        self.chunks_read: list[tuple[str, list[str] | None, int]] = []

    @property
    def name(self) -> str:
        return f"postgres-cdc[{self.slot}]"

    def discover_splits(self, known: Sequence[SourceSplit], parallelism: int
                        ) -> list[SourceSplit]:
        """The one split: the slot (its changes are one ordered stream)."""
        split = SourceSplit(f"slot:{self.slot}", {"slot": self.slot}, 0)
        return [] if any(k.split_id == split.split_id for k in known) else [split]

    def create_split_reader(self, split: SourceSplit) -> SourceReader:
        """The reader of the slot."""
        return PostgresCdcReader(self)


class PostgresCdcReader(SourceReader):
    """Reads the source's slot: the reader of its one split."""

    def __init__(self, source: PostgresCdcSource, buffer: int = 65536) -> None:
        self.source = source
        self._buf = Buffer(buffer)
        self._offset = 0
        self._pos: dict[str, Any] = {"lsn": None, "skip": 0, "snapshot": None}
        self._positions: dict[int, int] = {}

    # -- the task's side -------------------------------------------------------

    async def read_batch(self, max_records: int) -> list[Any] | None:
        out: list[Any] = []
        buf = self._buf
        units = buf.units
        while units and len(out) < max_records:
            unit = units[0]
            start = self._offset
            take = unit.records[start:start + max_records - len(out)]
            out.extend(take)
            self._offset = start + len(take)
            if self._offset >= len(unit.records):
                self._pos = unit.end()
                units.popleft()
                buf.buffered -= len(unit.records)
                self._offset = 0
        if out:
            buf.poke_fetch()
            return out
        if buf.error is not None:
            raise buf.error
        return None if buf.done else []

    def available(self) -> asyncio.Future[None] | None:
        buf = self._buf
        if buf.units or buf.done or buf.error is not None:
            return None
        ready = buf.ready
        if ready is None or ready.done():
            ready = buf.ready = asyncio.get_running_loop().create_future()
        return ready

    def position(self) -> dict[str, Any]:
        if self._offset:
            return self._buf.units[0].at(self._offset)
        return self._pos

    def seek(self, position: Any) -> None:
        if not isinstance(position, dict) or "lsn" not in position:
            raise ValueError(f"{self.source.name}: not a position of this source: {position!r}")
        self._pos = dict(position)

    def snapshot_position(self, checkpoint_id: int) -> Any:
        pos = self.position()
        if pos["lsn"] is not None:
            self._positions[checkpoint_id] = pos["lsn"]
        return pos

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = [c for c in self._positions if c <= checkpoint_id]
        for c in done:
            self._buf.ack = max(self._buf.ack, self._positions.pop(c))
        if done:
            self._buf.poke_fetch()

    def describe_position(self, position: Any) -> str:
        if not isinstance(position, dict) or position.get("lsn") is None:
            return f"the start of slot {self.source.slot!r}"
        where = f"LSN {format_lsn(position['lsn'])} of slot {self.source.slot!r}"
        snap = position.get("snapshot")
        if snap:
            where += f" (snapshot progress {snap['progress']})"
        return where

    # -- the fetch side --------------------------------------------------------

    async def fetch(self) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        stream: ReplicationStream | None = None
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.source.dsn, autocommit=True, options=SESSION_OPTIONS)
            stream = await self._run(conn)
        except Exception as exc:  # handed to read_batch: the job's error names the source
            self._buf.error = exc
        finally:
            self._buf.wake_task()
            with anyio.CancelScope(shield=True):
                if stream is not None:
                    await stream.close()
                if conn is not None:
                    await conn.close()

    async def _prepare(self, conn: psycopg.AsyncConnection[Any]) -> tuple[
            list[TableInfo], RelationCache, str]:
        src = self.source
        await check_server(conn, src.tables, src.publication)
        tables = await qualified_names(conn, src.tables)
        publication = src.publication or src.slot
        if src.publication is None:
            await ensure_publication(conn, publication, tables)
        relations = RelationCache(Transformer(conn))
        infos: list[TableInfo] = []
        for name in tables:
            info = await describe_table(conn, name, relations)
            if not info.key and src.snapshot:
                raise PostgresCdcError(
                    f"PostgresCdcSource: table {name!r} has no primary key; the snapshot reads "
                    "a table in key order (add one, or pass snapshot=False)")
            infos.append(info)
        return infos, relations, publication

    async def _start_position(self, conn: psycopg.AsyncConnection[Any],
                              infos: list[TableInfo]) -> tuple[int, int, SnapshotProgress | None]:
        src = self.source
        pos = self._pos
        if pos["lsn"] is None:
            lsn, _ = await ensure_slot(conn, src.slot, src.slot_wait)
            progress = None
            if src.snapshot:
                progress = SnapshotProgress(infos)
                progress.latest = await settled_snapshot(conn)
            self._pos = {"lsn": lsn, "skip": 0,
                         "snapshot": None if progress is None else progress.to_json()}
            return lsn, 0, progress
        await check_restore(conn, src.slot, pos["lsn"], src.slot_wait)
        snap = pos.get("snapshot")
        if snap is None:
            return pos["lsn"], pos.get("skip", 0), None
        names = [t.name for t in infos]
        if snap["tables"] != names:
            raise PostgresCdcError(
                f"PostgresCdcSource: the checkpoint's snapshot is of tables {snap['tables']}, "
                f"not {names}; restore with the same tables")
        return pos["lsn"], pos.get("skip", 0), SnapshotProgress.from_json(snap, infos)

    async def _run(self, conn: psycopg.AsyncConnection[Any]) -> ReplicationStream | None:
        src = self.source
        infos, relations, publication = await self._prepare(conn)
        restored = self._pos["lsn"] is not None
        lsn, skip, progress = await self._start_position(conn, infos)
        stream = await ReplicationStream.start(src.dsn, src.slot, publication, lsn)
        if restored:
            # A restored position is a completed checkpoint's: acknowledged
            # now, also when the run that took it ended before it could.
            self._buf.ack = max(self._buf.ack, lsn)
        state = FetchLoop(self._buf, src, conn, stream, Decoder(relations), infos, lsn, skip,
                            progress)
        await state.run()
        return stream
