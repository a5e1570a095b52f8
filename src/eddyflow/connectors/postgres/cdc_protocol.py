"""Decoding of the logical replication stream: the streaming protocol's
frames (``XLogData``, keepalives) and the ``pgoutput`` messages inside them
(protocol version 1: Begin, Commit, Relation, Type, Insert, Update, Delete,
Truncate; Origin and logical decoding messages are skipped).

Column values arrive as text (``pgoutput`` without the ``binary`` option) and
are turned into Python values by psycopg's own loaders, picked by the
column's type OID, so a value read from the stream and the same value read
by the snapshot's ``SELECT`` (loaded by the same loaders) are equal.

No maintained library decodes ``pgoutput`` for psycopg 3 (the PyPI packages
for it are unmaintained or tied to psycopg2's replication support), so the
format is decoded here, after the PostgreSQL documentation's "Logical
Replication Message Formats".
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import pq
from psycopg.abc import Transformer

__all__ = [
    "POSTGRES_EPOCH",
    "Begin",
    "Change",
    "Commit",
    "Relation",
    "RelationCache",
    "format_lsn",
    "parse_lsn",
    "standby_status",
]

#: Seconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
POSTGRES_EPOCH = 946_684_800.0

_U8 = struct.Struct("!B")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_I32 = struct.Struct("!i")
_U64 = struct.Struct("!Q")
_I64 = struct.Struct("!q")
_BEGIN = struct.Struct("!QqI")
_COMMIT = struct.Struct("!BQQq")
_XLOGDATA = struct.Struct("!QQq")
_KEEPALIVE = struct.Struct("!QqB")
_STATUS = struct.Struct("!cQQQqB")

Loader = Callable[[Any], Any]


def format_lsn(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """An LSN from PostgreSQL's text form."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def standby_status(flush_lsn: int, now: float, reply: bool = False) -> bytes:
    """A Standby Status Update acknowledging ``flush_lsn`` as written,
    flushed and applied: the server moves the slot's ``confirmed_flush_lsn``
    there (and no further), so the WAL after it is kept."""
    micros = int((now - POSTGRES_EPOCH) * 1_000_000)
    return _STATUS.pack(b"r", flush_lsn, flush_lsn, flush_lsn, micros, 1 if reply else 0)


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction's start: its commit record's LSN, time and top-level xid."""

    final_lsn: int
    commit_time: float
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """A transaction's end: its commit record's start and end LSN."""

    commit_lsn: int
    end_lsn: int


@dataclass(slots=True)
class Relation:
    """A captured table as the stream describes it (sent before its first
    change and again after its definition changes)."""

    oid: int
    name: str
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    key_flags: tuple[bool, ...]
    loaders: tuple[Loader, ...] = field(default=())

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The replica identity columns (the primary key by default)."""
        return tuple(c for c, k in zip(self.columns, self.key_flags, strict=True) if k)


@dataclass(frozen=True, slots=True)
class Change:
    """One row change: ``op`` is ``c`` (insert), ``u`` (update), ``d``
    (delete) or ``t`` (truncate, with no rows)."""

    op: str
    relation: Relation
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    lsn: int


class RelationCache:
    """Relations by OID, with the loaders of their column types."""

    def __init__(self, transformer: Transformer) -> None:
        self._tx = transformer
        self._loaders: dict[int, Loader] = {}
        self.by_oid: dict[int, Relation] = {}

    def loader(self, type_oid: int) -> Loader:
        """psycopg's text loader of a type (its default: ``str``, for an
        unknown one)."""
        got = self._loaders.get(type_oid)
        if got is None:
            got = self._loaders[type_oid] = self._tx.get_loader(type_oid, pq.Format.TEXT).load
        return got

    def loaders(self, type_oids: Sequence[int]) -> tuple[Loader, ...]:
        """The loaders of a row's columns."""
        return tuple(self.loader(t) for t in type_oids)

    def add(self, relation: Relation) -> Relation:
        """Keeps a relation, with its loaders."""
        relation.loaders = self.loaders(relation.type_oids)
        self.by_oid[relation.oid] = relation
        return relation


def _string(buf: memoryview, at: int) -> tuple[str, int]:
    end = bytes(buf[at:at + 256]).find(b"\0")
    if end < 0:
        end = bytes(buf[at:]).index(b"\0")
    return bytes(buf[at:at + end]).decode(), at + end + 1


def _tuple(buf: memoryview, at: int, rel: Relation,
           old: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
    """TupleData: a row as column -> value. An unchanged TOASTed value
    (``u``, not sent) is taken from ``old`` when the old row was sent whole
    (REPLICA IDENTITY FULL); otherwise the column is left out."""
    (n,) = _U16.unpack_from(buf, at)
    at += 2
    row: dict[str, Any] = {}
    columns = rel.columns
    loaders = rel.loaders
    for i in range(n):
        kind = buf[at]
        at += 1
        if kind == 116:  # 't': text
            (size,) = _I32.unpack_from(buf, at)
            at += 4
            row[columns[i]] = loaders[i](buf[at:at + size])
            at += size
        elif kind == 110:  # 'n': null
            row[columns[i]] = None
        elif kind == 117:  # 'u': unchanged TOAST value, not sent
            if old is not None and columns[i] in old:
                row[columns[i]] = old[columns[i]]
        else:
            raise ValueError(f"pgoutput: unexpected tuple column kind {chr(kind)!r} "
                             f"in a row of {rel.name}")
    return row, at


def _key_only(rel: Relation, row: dict[str, Any]) -> dict[str, Any]:
    return {c: row.get(c) for c in rel.key_columns}


class Decoder:
    """Turns ``pgoutput`` messages into :class:`Begin`, :class:`Commit`,
    :class:`Relation` and lists of :class:`Change` (``None`` for what the
    reader has no use for)."""

    def __init__(self, relations: RelationCache) -> None:
        self.relations = relations

    def decode(self, msg: memoryview, lsn: int) -> Begin | Commit | Relation | Change | \
            list[Change] | None:
        """One message, the payload of an ``XLogData`` frame at WAL position ``lsn``."""
        kind = msg[0]
        if kind == 73:  # 'I'
            rel = self.relations.by_oid[_U32.unpack_from(msg, 1)[0]]
            after, _ = _tuple(msg, 6, rel)
            return Change("c", rel, None, after, lsn)
        if kind == 85:  # 'U'
            rel = self.relations.by_oid[_U32.unpack_from(msg, 1)[0]]
            at = 5
            before: dict[str, Any] | None = None
            if msg[at] in (75, 79):  # 'K' key / 'O' old row
                whole = msg[at] == 79
                before, at = _tuple(msg, at + 1, rel)
                if not whole:
                    before = _key_only(rel, before)
            after, _ = _tuple(msg, at + 1, rel, before)
            if before is None:
                # The key did not change and the old row is not sent
                # (REPLICA IDENTITY DEFAULT): the key columns of the new row.
                before = _key_only(rel, after)
            return Change("u", rel, before, after, lsn)
        if kind == 68:  # 'D'
            rel = self.relations.by_oid[_U32.unpack_from(msg, 1)[0]]
            whole = msg[5] == 79
            before, _ = _tuple(msg, 6, rel)
            return Change("d", rel, before if whole else _key_only(rel, before), None, lsn)
        if kind == 66:  # 'B'
            final_lsn, ts, xid = _BEGIN.unpack_from(msg, 1)
            return Begin(final_lsn, ts / 1_000_000 + POSTGRES_EPOCH, xid)
        if kind == 67:  # 'C'
            _, commit_lsn, end_lsn, _ = _COMMIT.unpack_from(msg, 1)
            return Commit(commit_lsn, end_lsn)
        if kind == 82:  # 'R'
            return self._relation(msg)
        if kind == 84:  # 'T'
            (n,) = _U32.unpack_from(msg, 1)
            oids = [_U32.unpack_from(msg, 6 + 4 * i)[0] for i in range(n)]
            return [Change("t", self.relations.by_oid[o], None, None, lsn) for o in oids]
        # 'Y' (a type: its values are loaded by OID anyway), 'O' (origin),
        # 'M' (logical decoding message): nothing the reader needs.
        return None

    def _relation(self, msg: memoryview) -> Relation:
        (oid,) = _U32.unpack_from(msg, 1)
        nsp, at = _string(msg, 5)
        name, at = _string(msg, at)
        at += 1  # replica identity setting
        (n,) = _U16.unpack_from(msg, at)
        at += 2
        columns: list[str] = []
        types: list[int] = []
        keys: list[bool] = []
        for _ in range(n):
            flags = msg[at]
            column, at = _string(msg, at + 1)
            (type_oid,) = _U32.unpack_from(msg, at)
            at += 8  # type OID, type modifier
            columns.append(column)
            types.append(type_oid)
            keys.append(bool(flags & 1))
        return self.relations.add(Relation(oid, f"{nsp}.{name}", tuple(columns), tuple(types),
                                           tuple(keys)))


def parse_frame(frame: memoryview) -> tuple[str, int, int, memoryview | None, bool]:
    """A CopyData frame of the replication stream: ``("w", wal_start,
    wal_end, payload, False)`` for XLogData, ``("k", 0, wal_end, None,
    reply_requested)`` for a keepalive."""
    kind = frame[0]
    if kind == 119:  # 'w'
        start, end, _ = _XLOGDATA.unpack_from(frame, 1)
        return "w", start, end, frame[25:], False
    if kind == 107:  # 'k'
        end, _, reply = _KEEPALIVE.unpack_from(frame, 1)
        return "k", 0, end, None, bool(reply)
    raise ValueError(f"replication stream: unexpected message {chr(kind)!r}")
