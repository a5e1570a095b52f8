"""The CDC reader's fetch loop and what it shares with ``read_batch``.

:class:`FetchLoop` serves the replication stream, reads snapshot chunks,
reconciles the two (:mod:`.cdc_snapshot`) and queues :class:`Unit` s (a
transaction's records, a chunk's reads, or a position advance alone) in a
:class:`Buffer`; the reader's ``read_batch`` takes records from it and its
``position()`` is the position inside or after the unit it took from last.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from typing import Any, Protocol

import psycopg

from eddyflow.connectors.postgres.cdc_protocol import (
    XLOGDATA_PAYLOAD,
    Begin,
    Change,
    Commit,
    Decoder,
    keepalive,
    xlogdata_start,
)
from eddyflow.connectors.postgres.cdc_snapshot import (
    Chunk,
    Decision,
    PgSnapshot,
    SnapshotProgress,
    TableInfo,
    read_chunk,
)
from eddyflow.connectors.postgres.cdc_stream import ReplicationStream

__all__ = ["Buffer", "CdcSettings", "FetchLoop", "Unit", "current_snapshot",
           "settled_snapshot"]

#: Each snapshot chunk read is logged here at DEBUG level.
_log = logging.getLogger("eddyflow.postgres.cdc")


class CdcSettings(Protocol):
    """What the fetch loop reads of its source (``PostgresCdcSource``)."""

    chunk_size: int
    until_lsn: int | None
    status_interval: float
    chunks_read: list[tuple[str, list[str] | None, int]]

    @property
    def name(self) -> str:
        """The source's name, for messages."""


class Unit:
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


class Buffer:
    """What the reader's two sides share: the queued units, the position
    the fetch loop is to acknowledge, and the futures each side waits on."""

    def __init__(self, capacity: int) -> None:
        self.units: collections.deque[Unit] = collections.deque()
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

    def queue(self, unit: Unit) -> None:
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


async def settled_snapshot(conn: psycopg.AsyncConnection[Any]) -> PgSnapshot:
    """A snapshot that sees every transaction committed before the slot was
    created: one taken once the transactions in progress just after the
    creation have ended (a transaction can have written its commit record
    before the slot's start while other sessions do not yet see it)."""
    first = await current_snapshot(conn)
    delay = 0.001
    warn_at = time.monotonic() + 10.0
    while True:
        now = await current_snapshot(conn)
        if now.settled_after(first):
            return now
        if time.monotonic() > warn_at:
            _log.warning("PostgresCdcSource: the snapshot waits for transactions %s, open "
                         "since the slot was created, to end (see pg_stat_activity)",
                         sorted(now.xip & first.xip))
            warn_at = float("inf")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def current_snapshot(conn: psycopg.AsyncConnection[Any]) -> PgSnapshot:
    cur = await conn.execute("SELECT pg_current_snapshot()::text")
    row = await cur.fetchone()
    assert row is not None
    return PgSnapshot.parse(row[0])


class FetchLoop:
    """The fetch loop: stream frames, snapshot chunks, status updates."""

    def __init__(self, buf: Buffer, source: CdcSettings,
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
        self.buf.queue(Unit([], self.lsn, lsn, 0, before, after))
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
        self.buf.queue(Unit(records, begin.final_lsn, commit.end_lsn, skip,
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
        new.latest = await current_snapshot(self.conn)
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
        self.buf.queue(Unit(records, self.lsn, self.lsn, self.skip, p, new,
                                 chunk))
        self.progress = new
        if self.held is not None:
            begin, changes, commit = self.held
            if not self._blocked(begin, changes, new):
                self.held = None
                self._commit(begin, changes, commit)
