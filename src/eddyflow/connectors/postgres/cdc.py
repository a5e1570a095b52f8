"""``PostgresCdcSource``: the changes of PostgreSQL tables, read by logical
decoding (``pgoutput``) from a replication slot, after an initial snapshot
of their rows; one record per row change, in Debezium's envelope.

The reader's :meth:`~PostgresCdcReader.fetch` does the I/O: it streams the
slot (:mod:`.cdc_stream`), decodes (:mod:`.cdc_protocol`), reads snapshot
chunks and reconciles them with the stream (:mod:`.cdc_snapshot`), and
queues *units* (a transaction's records, a chunk's reads) for
``read_batch``, which only takes from the queue: reads never wait.

Position: ``{"lsn": L, "skip": k, "snapshot": progress | None}``: the stream
restarts at WAL position ``L`` (the end of the last transaction emitted, or
the commit of one emitted in part, of which ``k`` records were), and the
snapshot's progress (:class:`.cdc_snapshot.SnapshotProgress`). The slot is
acknowledged up to ``L`` only when a checkpoint that holds it completes, so
the server keeps exactly the WAL a restore may need.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
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
from eddyflow.connectors.postgres.cdc_protocol import (
    XLOGDATA_PAYLOAD,
    Begin,
    Change,
    Commit,
    Decoder,
    RelationCache,
    format_lsn,
    keepalive,
    xlogdata_start,
)
from eddyflow.connectors.postgres.cdc_snapshot import (
    Chunk,
    Decision,
    PgSnapshot,
    SnapshotProgress,
    TableInfo,
    describe_table,
    read_chunk,
)
from eddyflow.connectors.postgres.cdc_stream import SESSION_OPTIONS, ReplicationStream
from eddyflow.connectors.source import Source, SourceReader

__all__ = ["PostgresCdcError", "PostgresCdcReader", "PostgresCdcSource"]

#: Each snapshot chunk read is logged here at DEBUG level.
_log = logging.getLogger("eddyflow.postgres.cdc")


class PostgresCdcSource(Source):
    """Row changes of ``tables`` (``schema.table``) from replication slot
    ``slot`` (created with ``pgoutput`` if missing), each a dict
    ``{"op", "table", "before", "after", "lsn", "commit_time"}`` (API.md
    "PostgreSQL"); a truncate is ``op`` ``"t"`` with no rows.

    ``publication``: an existing publication to read; ``None``: one named
    after the slot, created (or extended) for the tables. ``snapshot``: first
    the tables' rows (``op`` ``"r"``), read in key order ``chunk_size`` rows
    at a time. ``until_lsn``: end once every change committed before this
    WAL position is emitted (a bounded read; ``None``: never end).
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

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return PostgresCdcReader(self)


class _Unit:
    """Records queued for ``read_batch`` with the positions inside and after them."""

    __slots__ = ("after", "before", "chunk", "end_lsn", "lsn", "records", "skip")

    def __init__(self, records: list[dict[str, Any]], lsn: int, end_lsn: int, skip: int,
                 before: SnapshotProgress | None, after: SnapshotProgress | None,
                 chunk: Chunk | None = None) -> None:
        self.records = records
        self.lsn = lsn
        self.end_lsn = end_lsn
        self.skip = skip
        self.before = before
        self.after = after
        self.chunk = chunk

    def end(self) -> dict[str, Any]:
        """The position after the unit."""
        snap = None if self.after is None or self.after.finished else self.after.to_json()
        skip = self.skip if self.chunk is not None else 0
        return {"lsn": self.end_lsn, "skip": skip, "snapshot": snap}

    def at(self, k: int) -> dict[str, Any]:
        """The position after the unit's first ``k`` records (``0 < k < len``)."""
        if self.chunk is not None:
            assert self.before is not None
            progress = self.before.copy()
            progress.add_chunk(self.chunk, k)
            return {"lsn": self.lsn, "skip": self.skip, "snapshot": progress.to_json()}
        snap = None if self.before is None or self.before.finished else self.before.to_json()
        return {"lsn": self.lsn, "skip": self.skip + k, "snapshot": snap}


class _Buffer:
    """What the reader's two sides share: the queued units, the position
    the fetch loop is to acknowledge, and the futures each side waits on."""

    def __init__(self, capacity: int) -> None:
        self.units: collections.deque[_Unit] = collections.deque()
        self.buffered = 0
        self.capacity = capacity
        self.ack = 0
        self.done = False
        self.error: Exception | None = None
        #: Resolved when read_batch has something: handed to the task.
        self.ready: asyncio.Future[None] | None = None
        #: Resolved when records were taken or a checkpoint completed.
        self.wake_fetch: asyncio.Future[None] | None = None

    @property
    def room(self) -> bool:
        """Whether the fetch loop may queue more."""
        return self.buffered < self.capacity

    def queue(self, unit: _Unit) -> None:
        """Hands a unit to read_batch."""
        self.units.append(unit)
        self.buffered += len(unit.records)
        self.wake_task()

    def wake_task(self) -> None:
        """Tells the task that read_batch has something (or the end, or an error)."""
        ready = self.ready
        if ready is not None and not ready.done():
            ready.set_result(None)

    def poke_fetch(self) -> None:
        """Tells the fetch loop that there is room, or a position to acknowledge."""
        wake = self.wake_fetch
        if wake is not None and not wake.done():
            wake.set_result(None)


class PostgresCdcReader(SourceReader):
    """Reads the source's slot (one reader: the source has one split)."""

    def __init__(self, source: PostgresCdcSource, buffer: int = 65536) -> None:
        self.source = source
        self._buf = _Buffer(buffer)
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
            if info is None:
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
                progress.latest = await _settled_snapshot(conn)
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
        state = _FetchState(self._buf, src, conn, stream, Decoder(relations), infos, lsn, skip,
                            progress)
        await state.run()
        return stream


async def _settled_snapshot(conn: psycopg.AsyncConnection[Any]) -> PgSnapshot:
    """A snapshot that sees every transaction committed before the slot was
    created: one taken once the transactions in progress just after the
    creation have ended (a transaction can have written its commit record
    before the slot's start while other sessions do not yet see it)."""
    first = await _current_snapshot(conn)
    delay = 0.001
    while True:
        now = await _current_snapshot(conn)
        if now.settled_after(first):
            return now
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def _current_snapshot(conn: psycopg.AsyncConnection[Any]) -> PgSnapshot:
    cur = await conn.execute("SELECT pg_current_snapshot()::text")
    row = await cur.fetchone()
    assert row is not None
    return PgSnapshot.parse(row[0])


class _FetchState:
    """The fetch loop: stream frames, snapshot chunks, status updates."""

    def __init__(self, buf: _Buffer, source: PostgresCdcSource,
                 conn: psycopg.AsyncConnection[Any],
                 stream: ReplicationStream, decoder: Decoder, infos: list[TableInfo], lsn: int,
                 skip: int, progress: SnapshotProgress | None) -> None:
        self.buf = buf
        self.source = source
        self.conn = conn
        self.stream = stream
        self.decoder = decoder
        self.infos = {t.name: t for t in infos}
        self.lsn = lsn
        self.skip = skip
        self.progress = progress
        self.begin: Begin | None = None
        self.changes: list[Change] = []
        self.held: tuple[Begin, list[Change], Commit] | None = None
        self.acked = 0
        self.ended = False

    async def run(self) -> None:
        buf = self.buf
        src = self.source
        loop = asyncio.get_running_loop()
        while not self.ended:
            # Made before the work: a poke (records taken, a checkpoint
            # completed) while working makes the wait below return at once.
            buf.wake_fetch = wake = loop.create_future()
            if buf.ack > self.acked or (
                    time.monotonic() - self.stream.last_status > src.status_interval):
                self.acked = max(self.acked, buf.ack)
                await self.stream.send_status(self.acked)
            room = buf.room
            worked = False
            if room and self.held is None:
                worked = await self._drain(4096)
            p = self.progress
            if p is not None and room and p.next_table() is not None:
                # One chunk per round of frames: the snapshot goes on while
                # the stream is busy, and the stream while the snapshot is.
                await self._read_chunk()
                worked = True
            elif p is not None and self.held is not None:
                # Every table read, but a truncate of one waits for a
                # snapshot that sees it: a newer one, without a chunk.
                await self._refresh_snapshot()
                worked = True
            until = src.until_lsn  # may be set while the job runs
            if until is not None and self.lsn >= until and self.begin is None \
                    and self.held is None and (p is None or p.next_table() is None):
                self.ended = True
                break
            if not worked:
                timeout = src.status_interval
                if room:
                    waiter = asyncio.ensure_future(self.stream.wait_readable())
                    await asyncio.wait((waiter, wake), timeout=timeout,
                                       return_when=asyncio.FIRST_COMPLETED)
                    if not waiter.done():
                        waiter.cancel()
                        await asyncio.gather(waiter, return_exceptions=True)
                    else:
                        waiter.result()  # the connection's failure, raised
                else:
                    await asyncio.wait((wake,), timeout=timeout)
        buf.done = True
        buf.wake_task()

    async def _drain(self, most: int) -> bool:
        """Handles up to ``most`` frames received; whether there were any."""
        n = 0
        until = self.source.until_lsn
        decode = self.decoder.decode
        infos = self.infos
        while n < most and self.held is None:
            frame = self.stream.read()
            if frame is None:
                break
            n += 1
            frame = bytes(frame)
            if frame[0] == 107:  # 'k': keepalive
                end, reply = keepalive(frame)
                if reply:
                    await self.stream.send_status(self.acked)
                if self.begin is None and self.held is None and end > self.lsn:
                    self._advance(end)
                continue
            if frame[0] != 119:  # 'w': XLogData
                raise ValueError(f"replication stream: unexpected message {frame[:1]!r}")
            msg = decode(frame, XLOGDATA_PAYLOAD, xlogdata_start(frame))
            if type(msg) is dict:
                if self.begin is not None and msg["table"] in infos:
                    self.changes.append(msg)
            elif isinstance(msg, list):
                if self.begin is not None:
                    self.changes.extend(c for c in msg if c["table"] in infos)
            elif isinstance(msg, Begin):
                self.begin = msg
                self.changes = []
            elif isinstance(msg, Commit):
                begin, self.begin = self.begin, None
                assert begin is not None
                if until is not None and msg.commit_lsn >= until:
                    self._advance(until)
                    continue
                self._commit(begin, self.changes, msg)
                self.changes = []
        return n > 0

    def _advance(self, lsn: int) -> None:
        """No transaction committed before ``lsn`` is left to come."""
        if until := self.source.until_lsn:
            lsn = min(lsn, max(until, self.lsn))
        before = self.progress
        after = before
        if before is not None:
            after = before.copy()
            after.passed(lsn)
            if after.finished:
                after = None
        self.buf.queue(_Unit([], self.lsn, lsn, 0, before, after))
        self.lsn = lsn
        self.progress = after

    def _commit(self, begin: Begin, changes: list[Change], commit: Commit) -> None:
        progress = self.progress
        records: list[dict[str, Any]] = []
        after = progress
        if progress is None:
            records = changes
        else:
            if self._blocked(begin, changes, progress):
                self.held = (begin, changes, commit)
                return
            after = progress.copy()
            for c in changes:
                self._decide(begin, c, after, records)
            after.passed(commit.commit_lsn)
            if after.finished:
                after = None
        skip = self.skip
        if skip:
            records = records[skip:]
            self.skip = 0
        self.buf.queue(_Unit(records, begin.final_lsn, commit.end_lsn, skip,
                                 progress, after))
        self.lsn = commit.end_lsn
        self.progress = after

    def _keys(self, c: Change) -> list[tuple[Any, ...]]:
        info = self.infos[c["table"]]
        keys = []
        if c["before"] is not None:
            keys.append(info.key_of(c["before"]))
        if c["after"] is not None:
            k = info.key_of(c["after"])
            if not keys or keys[0] != k:
                keys.append(k)
        return keys

    def _blocked(self, begin: Begin, changes: list[Change], p: SnapshotProgress) -> bool:
        for c in changes:
            if c["op"] == "t":
                if p.decide_truncate(c["table"], begin.xid) is Decision.BLOCK:
                    return True
            elif any(p.decide(c["table"], k, begin.xid) is Decision.BLOCK
                     for k in self._keys(c)):
                return True
        return False

    def _decide(self, begin: Begin, c: Change, p: SnapshotProgress,
                records: list[dict[str, Any]]) -> None:
        table = c["table"]
        if c["op"] == "t":
            d = p.decide_truncate(table, begin.xid)
            if d is Decision.RESTART:
                p.restart(table)
            if d is not Decision.DROP:
                records.append(c)
            return
        keys = self._keys(c)
        ds = [p.decide(table, k, begin.xid) for k in keys]
        if all(d is Decision.EMIT for d in ds):
            records.append(c)
        elif len(ds) == 2:
            # An update that moved a row to another key, one end read and one
            # not: its halves as a delete and an insert, each where due.
            if ds[0] is Decision.EMIT:
                records.append({**c, "op": "d", "after": None})
            if ds[1] is Decision.EMIT:
                records.append({**c, "op": "c", "before": None})

    async def _refresh_snapshot(self) -> None:
        p = self.progress
        assert p is not None and self.held is not None
        new = p.copy()
        new.latest = await _current_snapshot(self.conn)
        self.progress = new
        begin, changes, commit = self.held
        if not self._blocked(begin, changes, new):
            self.held = None
            self._commit(begin, changes, commit)
        else:
            await asyncio.sleep(0.001)  # not yet visible to new snapshots

    async def _read_chunk(self) -> None:
        p = self.progress
        assert p is not None
        i = p.next_table()
        assert i is not None, "a chunk is read only while a table is left"
        info = p.tables[i]
        after = p.progress[i]
        after_key = after if isinstance(after, list) else None
        chunk = await read_chunk(self.conn, i, info, after_key, self.source.chunk_size)
        self.source.chunks_read.append((info.name, after_key, len(chunk.rows)))
        _log.debug("%s: read %d rows of %s after key %s", self.source.name, len(chunk.rows),
                   info.name, json.dumps(after_key))
        records = [{"op": "r", "table": info.name, "before": None, "after": row,
                    "lsn": chunk.lsn, "commit_time": None} for row in chunk.rows]
        new = p.copy()
        new.add_chunk(chunk)
        self.buf.queue(_Unit(records, self.lsn, self.lsn, self.skip, p, new,
                                 chunk))
        self.progress = new
        if self.held is not None:
            begin, changes, commit = self.held
            if not self._blocked(begin, changes, new):
                self.held = None
                self._commit(begin, changes, commit)
