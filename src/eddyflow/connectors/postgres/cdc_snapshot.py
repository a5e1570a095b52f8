"""The initial snapshot, read in key-ordered chunks alongside the change
stream (after DBLog and Flink CDC's incremental snapshot), and its progress.

A chunk is read in a ``REPEATABLE READ`` transaction whose snapshot the
server reports (``pg_current_snapshot()``: ``xmin``, ``xmax``, the xids in
progress). Each transaction of the change stream carries its xid (``pgoutput``
Begin), so whether a chunk already holds the effect of a streamed
transaction is decided exactly, by the chunk snapshot's visibility rule,
not by comparing WAL positions (a transaction's commit record can precede a
watermark LSN while the transaction is not yet visible to snapshots: a
watermark comparison would miss its change). A change of the stream to a
row of the table is then

* dropped when its transaction is visible to the snapshot of the chunk that
  read that row (the read holds it),
* emitted when it is not (it follows the read),
* for a row no chunk has read yet: dropped when its transaction is visible
  to the newest chunk snapshot (every later chunk sees it too: snapshots
  taken later see at least what earlier ones saw), and otherwise *blocked*:
  the reader reads further chunks (newer snapshots) before it goes on.

So every row is read once, at one snapshot, and followed by exactly the
changes its snapshot does not hold. A chunk's rule (a *filter*) is kept
until the stream has passed the WAL position the chunk was read at (no
later transaction can be visible to it).

The progress (per table: not started, the last key read, or done; the live
filters; the newest snapshot) is part of the reader's position: a restore
never reads a finished chunk again.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, sql

from eddyflow.connectors.postgres.cdc_protocol import Loader, RelationCache, parse_lsn

__all__ = ["Chunk", "Decision", "Filter", "PgSnapshot", "SnapshotProgress", "TableInfo",
           "read_chunk"]

_XID_WRAP = 1 << 32


@dataclass(frozen=True, slots=True)
class PgSnapshot:
    """A transaction snapshot as ``pg_current_snapshot()`` reports it
    (64-bit transaction ids)."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> PgSnapshot:
        """From the text form ``xmin:xmax:xip,xip``."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def text(self) -> str:
        """The text form (as stored in positions)."""
        return f"{self.xmin}:{self.xmax}:{','.join(str(x) for x in sorted(self.xip))}"

    def visible(self, xid: int) -> bool:
        """Whether the committed transaction ``xid`` (32 bits, as the
        stream carries it) is visible to this snapshot."""
        # The stream's xids are 32 bits: widened with xmax's epoch, to the
        # one within half the xid space of xmax (as PostgreSQL compares them).
        full = (self.xmax & ~(_XID_WRAP - 1)) | xid
        if full > self.xmax + _XID_WRAP // 2:
            full -= _XID_WRAP
        elif full < self.xmax - _XID_WRAP // 2:
            full += _XID_WRAP
        return full < self.xmin or (full < self.xmax and full not in self.xip)

    def settled_after(self, earlier: PgSnapshot) -> bool:
        """Whether every transaction in progress at ``earlier`` has ended by this one."""
        return not (self.xip & earlier.xip)


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A captured table: its columns as the stream sends them (generated
    columns left out), its primary key (the chunk order) and the loaders of
    its key columns' types."""

    name: str
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    key: tuple[str, ...]
    key_types: tuple[str, ...]
    key_collatable: tuple[bool, ...]
    loaders: tuple[Loader, ...]
    key_loaders: tuple[Loader, ...]

    def key_of(self, row: dict[str, Any]) -> tuple[Any, ...]:
        """A row's key, comparable with the chunk bounds."""
        return tuple(row.get(c) for c in self.key)

    def load_key(self, texts: Sequence[str]) -> tuple[Any, ...]:
        """A key from its text form (as positions store it)."""
        return tuple(load(t.encode()) for load, t in zip(self.key_loaders, texts, strict=True))

    def chunk_query(self, after: bool, size: int) -> sql.Composed:
        """``SELECT`` of the next ``size`` rows in key order (after a key when
        ``after``). Text keys compare byte-wise (``COLLATE "C"``), as Python
        compares the strings the stream's keys are checked against."""
        def k(i: int, item: sql.Composable) -> sql.Composable:
            return sql.SQL("{} COLLATE \"C\"").format(item) if self.key_collatable[i] else item

        keys = [k(i, sql.Identifier(c)) for i, c in enumerate(self.key)]
        schema, _, table = self.name.partition(".")
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in self.columns),
            sql.Identifier(schema, table))
        if after:
            params = [k(i, sql.SQL("%s::{}").format(sql.SQL(t)))
                      for i, t in enumerate(self.key_types)]
            query += sql.SQL(" WHERE ({}) > ({})").format(sql.SQL(", ").join(keys),
                                                       sql.SQL(", ").join(params))
        query += sql.SQL(" ORDER BY {} LIMIT {}").format(sql.SQL(", ").join(keys),
                                                        sql.Literal(size))
        return query


async def describe_table(conn: AsyncConnection[Any], name: str,
                         relations: RelationCache) -> TableInfo:
    """The catalog's description of ``name`` (``key`` empty without a primary key)."""
    cur = await conn.execute(
        "SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod), "
        "t.typcollation <> 0 FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "AND a.attgenerated = '' ORDER BY a.attnum", (name,))
    cols = await cur.fetchall()
    cur = await conn.execute(
        "SELECT a.attname FROM pg_index i, unnest(i.indkey) WITH ORDINALITY k(attnum, ord) "
        "JOIN pg_attribute a ON a.attnum = k.attnum WHERE i.indrelid = %s::regclass "
        "AND a.attrelid = i.indrelid AND i.indisprimary ORDER BY k.ord", (name,))
    key = tuple(r[0] for r in await cur.fetchall())
    by_name = {c[0]: c for c in cols}
    types = tuple(int(c[1]) for c in cols)
    return TableInfo(
        name=name, columns=tuple(c[0] for c in cols), type_oids=types, key=key,
        key_types=tuple(by_name[c][2] for c in key),
        key_collatable=tuple(bool(by_name[c][3]) for c in key),
        loaders=relations.loaders(types),
        key_loaders=relations.loaders([int(by_name[c][1]) for c in key]))


@dataclass(slots=True)
class Chunk:
    """Rows of one table read at one snapshot, in key order; ``last``: the
    table has no rows after them."""

    table: int
    rows: list[dict[str, Any]]
    keys: list[list[str]]
    snapshot: PgSnapshot
    lsn: int
    last: bool


async def read_chunk(conn: AsyncConnection[Any], index: int, info: TableInfo,
                     after: list[str] | None, size: int) -> Chunk:
    """The next ``size`` rows of a table after key ``after`` (text form),
    with the snapshot they were read at and the WAL insert position after
    the read (no transaction committed after it is visible to the snapshot)."""
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cur = await conn.execute("SELECT pg_current_snapshot()::text")
        snap_row = await cur.fetchone()
        assert snap_row is not None
        cur = await conn.execute(info.chunk_query(after is not None, size),
                                 after)
        res = cur.pgresult
        assert res is not None
        rows: list[dict[str, Any]] = []
        keys: list[list[str]] = []
        columns = info.columns
        loaders = info.loaders
        key_at = [columns.index(c) for c in info.key]
        for r in range(res.ntuples):
            values = [res.get_value(r, c) for c in range(len(columns))]
            rows.append({col: None if v is None else load(v)
                         for col, load, v in zip(columns, loaders, values, strict=True)})
            keys.append([bytes(values[c] or b"").decode() for c in key_at])
    cur = await conn.execute("SELECT pg_current_wal_insert_lsn()::text")
    lsn_row = await cur.fetchone()
    assert lsn_row is not None
    return Chunk(index, rows, keys, PgSnapshot.parse(snap_row[0]), parse_lsn(lsn_row[0]),
                 len(rows) < size)


class Decision(enum.Enum):
    """What becomes of one change of the stream during the snapshot."""

    EMIT = 1
    DROP = 2
    BLOCK = 3
    RESTART = 4  # a truncate of a table being read: read it again from the start


@dataclass(frozen=True, slots=True)
class Filter:
    """Rows of a table in ``(lo, hi]`` (``None``: unbounded) were read at
    ``snapshot``, consistent with WAL position ``lsn``."""

    table: int
    lo: tuple[Any, ...] | None
    hi: tuple[Any, ...] | None
    lo_text: list[str] | None
    hi_text: list[str] | None
    snapshot: PgSnapshot
    lsn: int

    def covers(self, key: tuple[Any, ...]) -> bool:
        """Whether ``key`` is in the range."""
        return (self.lo is None or key > self.lo) and (self.hi is None or key <= self.hi)


DONE = "done"


class SnapshotProgress:
    """Where the snapshot is: per table ``None`` (not started), the text of
    the last key read, or ``"done"``; the live filters; the newest snapshot."""

    def __init__(self, tables: Sequence[TableInfo]) -> None:
        self.tables = list(tables)
        self.index = {t.name: i for i, t in enumerate(self.tables)}
        self.progress: list[list[str] | str | None] = [None] * len(self.tables)
        self.keys: list[tuple[Any, ...] | None] = [None] * len(self.tables)
        self.filters: list[Filter] = []
        self.latest: PgSnapshot | None = None

    @property
    def finished(self) -> bool:
        """Every table read and no filter left: the stream alone from now on."""
        return not self.filters and all(p == DONE for p in self.progress)

    def next_table(self) -> int | None:
        """The table whose next chunk is due (``None``: all read)."""
        for i, p in enumerate(self.progress):
            if p != DONE:
                return i
        return None

    def decide(self, table: str, key: tuple[Any, ...], xid: int) -> Decision:
        """What becomes of a change to row ``key`` of ``table`` made by transaction ``xid``."""
        i = self.index.get(table)
        if i is None:
            return Decision.EMIT
        for f in self.filters:
            if f.table == i and f.covers(key):
                return Decision.DROP if f.snapshot.visible(xid) else Decision.EMIT
        p = self.progress[i]
        if p == DONE:
            return Decision.EMIT
        read_to = self.keys[i]
        if read_to is not None and key <= read_to:
            return Decision.EMIT
        return self._unread(xid)

    def decide_truncate(self, table: str, xid: int) -> Decision:
        """What becomes of a truncate of ``table`` by transaction ``xid``."""
        i = self.index.get(table)
        if i is None:
            return Decision.EMIT
        touched = self.progress[i] is not None or any(f.table == i for f in self.filters)
        if self.progress[i] == DONE and not any(f.table == i for f in self.filters):
            return Decision.EMIT
        if not touched:
            return self._unread(xid)
        # Rows of the table were read, some maybe at snapshots that hold the
        # truncate already: emitted, it clears every row read, and the table
        # is read again from the start at snapshots that hold it.
        return Decision.RESTART if self.latest is not None and self.latest.visible(xid) \
            else Decision.BLOCK

    def _unread(self, xid: int) -> Decision:
        if self.latest is not None and self.latest.visible(xid):
            return Decision.DROP
        return Decision.BLOCK

    def restart(self, table: str) -> None:
        """After a truncate of a table being read: read it from the start."""
        i = self.index[table]
        self.progress[i] = None
        self.keys[i] = None
        self.filters = [f for f in self.filters if f.table != i]

    def add_chunk(self, chunk: Chunk, upto: int | None = None) -> None:
        """Rows ``[0, upto)`` of ``chunk`` (all by default) were emitted."""
        n = len(chunk.rows) if upto is None else upto
        i = chunk.table
        whole = n == len(chunk.rows)
        prog = self.progress[i]
        lo_text = prog if isinstance(prog, list) else None
        lo = self.keys[i]
        if whole and chunk.last:
            hi_text, hi = None, None
        elif n == 0:
            return
        else:
            hi_text = chunk.keys[n - 1]
            hi = self.tables[i].key_of(chunk.rows[n - 1])
        self.filters.append(Filter(i, lo, hi, lo_text, hi_text,
                                   chunk.snapshot, chunk.lsn))
        if hi_text is None:
            self.progress[i] = DONE
            self.keys[i] = None
        else:
            self.progress[i] = hi_text
            self.keys[i] = hi
        self.latest = chunk.snapshot

    def passed(self, lsn: int) -> None:
        """The stream has delivered every transaction committed before ``lsn``."""
        if self.filters:
            self.filters = [f for f in self.filters if f.lsn > lsn]

    def to_json(self) -> dict[str, Any]:
        """The progress as stored in a position."""
        return {
            "tables": [t.name for t in self.tables],
            "progress": list(self.progress),
            "filters": [[f.table, f.lo_text, f.hi_text, f.snapshot.text(), f.lsn]
                        for f in self.filters],
            "latest": None if self.latest is None else self.latest.text(),
        }

    def copy(self) -> SnapshotProgress:
        """An independent copy."""
        c = SnapshotProgress(self.tables)
        c.progress = list(self.progress)
        c.keys = list(self.keys)
        c.filters = list(self.filters)
        c.latest = self.latest
        return c

    @classmethod
    def from_json(cls, data: dict[str, Any], tables: Sequence[TableInfo]) -> SnapshotProgress:
        """Progress from a position (the tables checked by the caller)."""
        p = cls(tables)
        p.progress = list(data["progress"])
        for i, prog in enumerate(p.progress):
            if isinstance(prog, list):
                p.keys[i] = tables[i].load_key(prog)
        for ti, lo_text, hi_text, snap, lsn in data["filters"]:
            t = tables[ti]
            p.filters.append(Filter(ti, None if lo_text is None else t.load_key(lo_text),
                                    None if hi_text is None else t.load_key(hi_text),
                                    lo_text, hi_text, PgSnapshot.parse(snap), lsn))
        p.latest = None if data["latest"] is None else PgSnapshot.parse(data["latest"])
        return p
