"""The rows of one RocksDB database as the tables see them (:class:`Store`),
and the asynchronous half of its snapshots: the changes a snapshot took at
the barrier (:class:`Flush`) put into the database, and the database's own
checkpoint taken, in a worker thread (``rocksdb/snapshot.py`` uploads it).
Writes and checkpoints are ordered by the store's lock.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import anyio

from eddyflow.errors import StateSerializationError
from eddyflow.state import forked
from eddyflow.state.abc import SnapshotAbandoned
from eddyflow.state.changes import Written
from eddyflow.state.rocksdb.files import scan
from eddyflow.state.rocksdb.instance import LocalInstance
from eddyflow.state.rocksdb.sst import batch_of, ingest_moved
from eddyflow.state.rocksdb.tables import Batch, Serializer, ValueTable, new_batch

__all__ = ["Flush", "Store"]


class Store:
    """The rows of one database (see ``tables.RowStore``)."""

    def __init__(self, instance: LocalInstance, serializer: Serializer, operator: str) -> None:
        self.instance = instance
        self.serializer = serializer
        self.operator = operator
        #: See ``tables.RowStore.unwritable``.
        self.unwritable = False
        #: Snapshots whose RocksDB checkpoint is not taken yet.
        self.inflight: list[Flush] = []
        #: Orders writes against a checkpoint taken in a worker thread.
        self.lock = threading.Lock()
        #: The backend is closed: the database closes once no snapshot is
        #: in flight.
        self.closed = False

    @property
    def busy(self) -> bool:
        """A snapshot's checkpoint is not taken yet."""
        return bool(self.inflight)

    @property
    def db(self) -> Any:
        """The read-write database."""
        return self.instance.db

    def get(self, row: bytes) -> bytes | None:
        """The value of ``row``, if any."""
        value: bytes | None = self.db.get(row)
        return value

    def get_many(self, rows: list[bytes]) -> list[bytes | None]:
        """The values of ``rows`` (one multi-get)."""
        values: list[bytes | None] = self.db.get(rows)
        return values

    def scan(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The rows in ``[lower, upper)``, in order."""
        return scan(self.db, lower, upper)

    def last_row(self, lower: bytes, upper: bytes) -> bytes | None:
        """The last row in ``[lower, upper)``, if any."""
        it = self.db.iter()
        it.seek_for_prev(upper)
        while it.valid():
            row: bytes = it.key()
            if row < lower:
                return None
            if row < upper:
                return row
            it.prev()
        return None

    def write(self, batch: Batch) -> None:
        """Write ``batch`` (ordered against a checkpoint being taken)."""
        with self.lock:
            self.db.write(batch)

    def _ingest(self, flush: Flush, child: bool) -> None:
        """Put ``flush``'s changes into the database (under the store's
        lock): its cleared ranges, then its files, each on its own (the
        parent's and the child's files may overlap in key range; their rows
        never do)."""
        db = self.instance.db
        if flush.cleared:
            batch = new_batch()
            for lower, upper in flush.cleared:
                batch.delete_range(lower, upper)
            db.write(batch)
        for f in [*flush.inline, *([flush.sst] if child else [])]:
            ingest_moved(db, f)
        flush.ingested = True

    def ingest_now(self, flush: Flush) -> None:
        """Wait for ``flush``'s child and ingest its file now (or abandon
        the flush, if the child wrote none)."""
        assert flush.work is not None
        flush.work.wait_exit()
        if not os.path.exists(flush.sst):
            self.abandon(flush)  # it failed, or had nothing: its keys are rewritten
            return
        with self.lock:
            if flush.abandoned or flush.ingested:
                return
            self._ingest(flush, True)

    async def finish(self, flush: Flush) -> None:
        """The child's file ingested, the RocksDB checkpoint taken (in a
        worker thread: RocksDB releases the GIL while it flushes)."""
        child = False
        if flush.work is not None:
            try:
                child = bool(await flush.work.result())
            except BaseException as exc:
                if isinstance(exc, StateSerializationError):
                    self.unwritable = True
                self.abandon(flush)
                raise
        await anyio.to_thread.run_sync(self._checkpoint, flush, child)

    def _checkpoint(self, flush: Flush, child: bool) -> None:
        from rocksdict import Checkpoint

        with self.lock:
            if flush.abandoned:
                raise SnapshotAbandoned(f"operator '{self.operator}': snapshot "
                                        f"{flush.checkpoint_id} was abandoned")
            db = self.instance.db
            if flush.deferred and not flush.ingested:
                db.write(batch_of(flush.deferred, self.serializer.dumps))
                flush.ingested = True
            if not flush.ingested:
                self._ingest(flush, child)
            db.flush()
            shutil.rmtree(flush.local, ignore_errors=True)
            Checkpoint(db).create_checkpoint(flush.local)
            flush.done = True
            self.inflight.remove(flush)
        self.close_when_idle()

    def abandon(self, flush: Flush) -> None:
        """A snapshot that will not complete: its child stops, and the
        changes it was to write are written by the next flush."""
        with self.lock:
            if flush.done or flush.abandoned:
                return
            flush.abandoned = True
            if flush.work is not None:
                flush.work.cancel()
            if not flush.ingested:  # its changes are not in the database
                for t, w in flush.written:
                    t.rewrite(w)
            for f in (flush.sst, *flush.inline):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f)
            self.inflight.remove(flush)
        self.close_when_idle()


    def close_when_idle(self) -> None:
        """Close the database if the backend is closed and no snapshot is in
        flight (a snapshot still in flight needs it until it ends)."""
        with self.lock:
            if self.closed and not self.inflight:
                self.instance.close_db()


class Flush:
    """A snapshot between its two halves: the changes the barrier wrote at
    once, and those a forked child writes as an SST file, to be ingested
    before the database's checkpoint is taken."""

    def __init__(self, checkpoint_id: int, local: str, work: forked.ChildWork | None,
                 sst: str, written: list[tuple[ValueTable, Written]]) -> None:
        self.checkpoint_id = checkpoint_id
        self.local = local
        self.work = work
        #: The child's SST file (if it has rows).
        self.sst = sst
        self.written = written
        #: SST files written at the barrier, by this process.
        self.inline: list[str] = []
        #: ``[lower, upper)`` ranges deleted before the files are ingested
        #: (a state written whole: its rows that the cache no longer has).
        self.cleared: list[tuple[bytes, bytes]] = []
        #: Values taken at the barrier, written by the checkpoint's thread.
        self.deferred: list[tuple[ValueTable, list[Any], list[Any]]] = []
        #: Its changes (SST files, or deferred values) are in the database.
        self.ingested = False
        self.done = False
        self.abandoned = False
