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
    "XLOGDATA_PAYLOAD",
    "Begin",
    "Change",
    "Commit",
    "Relation",
    "RelationCache",
    "format_lsn",
    "keepalive",
    "parse_lsn",
    "standby_status",
    "xlogdata_start",
]

#: Seconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
POSTGRES_EPOCH = 946_684_800.0

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_BEGIN = struct.Struct("!QqI")
_COMMIT = struct.Struct("!BQQq")
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
    #: The replica identity columns (the primary key by default).
    key_columns: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        self.key_columns = tuple(c for c, k in zip(self.columns, self.key_flags, strict=True)
                                 if k)


#: A row change as the source emits it (Debezium's envelope): ``op``
#: (``c`` insert, ``u`` update, ``d`` delete, ``t`` truncate), ``table``,
#: ``before``, ``after``, ``lsn``, ``commit_time``.
Change = dict[str, Any]


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


def _string(buf: bytes, at: int) -> tuple[str, int]:
    end = buf.index(b"\0", at)
    return buf[at:end].decode(), end + 1


def _tuple(buf: bytes, at: int, rel: Relation,
           old: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
    """TupleData: a row as column -> value. An unchanged TOASTed value
    (``u``, not sent) is taken from ``old`` when the old row was sent whole
    (REPLICA IDENTITY FULL); otherwise the column is left out.

    The hot loop of the source (``benchmarks/postgres_cdc.py``): bytes
    sliced (a loader reads bytes fastest), columns and loaders zipped."""
    n = (buf[at] << 8) | buf[at + 1]
    if n != len(rel.columns):
        raise ValueError(f"pgoutput: a row of {rel.name} has {n} columns, its relation "
                         f"message {len(rel.columns)}")
    at += 2
    row: dict[str, Any] = {}
    for column, load in zip(rel.columns, rel.loaders):  # noqa: B905 - lengths checked
        kind = buf[at]
        if kind == 116:  # 't': text
            size = int.from_bytes(buf[at + 1:at + 5], "big")
            at += 5
            row[column] = load(buf[at:at + size])
            at += size
        elif kind == 110:  # 'n': null
            row[column] = None
            at += 1
        elif kind == 117:  # 'u': unchanged TOAST value, not sent
            if old is not None and column in old:
                row[column] = old[column]
            at += 1
        else:
            raise ValueError(f"pgoutput: unexpected tuple column kind {chr(kind)!r} "
                             f"in a row of {rel.name}")
    return row, at


def _key_only(rel: Relation, row: dict[str, Any]) -> dict[str, Any]:
    return {c: row.get(c) for c in rel.key_columns}


class Decoder:
    """Turns ``pgoutput`` messages into :class:`Begin`, :class:`Commit`,
    :class:`Relation` and row changes (envelopes, with the commit time of
    the transaction begun last); ``None`` for what the reader has no use for."""

    def __init__(self, relations: RelationCache) -> None:
        self.relations = relations
        self.commit_time: float | None = None

    def decode(self, buf: bytes, at: int, lsn: int) -> Begin | Commit | Relation | Change | \
            list[Change] | None:
        """The message at offset ``at`` of ``buf`` (an ``XLogData`` frame at
        WAL position ``lsn``)."""
        kind = buf[at]
        if kind == 73:  # 'I'
            rel = self.relations.by_oid[int.from_bytes(buf[at + 1:at + 5], "big")]
            after, _ = _tuple(buf, at + 6, rel)
            return {"op": "c", "table": rel.name, "before": None, "after": after, "lsn": lsn,
                    "commit_time": self.commit_time}
        if kind == 85:  # 'U'
            rel = self.relations.by_oid[int.from_bytes(buf[at + 1:at + 5], "big")]
            at += 5
            before: dict[str, Any] | None = None
            if buf[at] in (75, 79):  # 'K' key / 'O' old row
                whole = buf[at] == 79
                before, at = _tuple(buf, at + 1, rel)
                if not whole:
                    before = _key_only(rel, before)
            after, _ = _tuple(buf, at + 1, rel, before)
            if before is None:
                # The key did not change and the old row is not sent
                # (REPLICA IDENTITY DEFAULT): the key columns of the new row.
                before = _key_only(rel, after)
            return {"op": "u", "table": rel.name, "before": before, "after": after, "lsn": lsn,
                    "commit_time": self.commit_time}
        if kind == 68:  # 'D'
            rel = self.relations.by_oid[int.from_bytes(buf[at + 1:at + 5], "big")]
            whole = buf[at + 5] == 79
            before, _ = _tuple(buf, at + 6, rel)
            return {"op": "d", "table": rel.name,
                    "before": before if whole else _key_only(rel, before), "after": None,
                    "lsn": lsn, "commit_time": self.commit_time}
        if kind == 66:  # 'B'
            final_lsn, ts, xid = _BEGIN.unpack_from(buf, at + 1)
            begin = Begin(final_lsn, ts / 1_000_000 + POSTGRES_EPOCH, xid)
            self.commit_time = begin.commit_time
            return begin
        if kind == 67:  # 'C'
            _, commit_lsn, end_lsn, _ = _COMMIT.unpack_from(buf, at + 1)
            return Commit(commit_lsn, end_lsn)
        if kind == 82:  # 'R'
            return self._relation(buf, at)
        if kind == 84:  # 'T'
            (n,) = _U32.unpack_from(buf, at + 1)
            oids = [_U32.unpack_from(buf, at + 6 + 4 * i)[0] for i in range(n)]
            return [{"op": "t", "table": self.relations.by_oid[o].name, "before": None,
                     "after": None, "lsn": lsn, "commit_time": self.commit_time} for o in oids]
        # 'Y' (a type: its values are loaded by OID anyway), 'O' (origin),
        # 'M' (logical decoding message): nothing the reader needs.
        return None

    def _relation(self, buf: bytes, at: int) -> Relation:
        (oid,) = _U32.unpack_from(buf, at + 1)
        nsp, at = _string(buf, at + 5)
        name, at = _string(buf, at)
        at += 1  # replica identity setting
        (n,) = _U16.unpack_from(buf, at)
        at += 2
        columns: list[str] = []
        types: list[int] = []
        keys: list[bool] = []
        for _ in range(n):
            flags = buf[at]
            column, at = _string(buf, at + 1)
            (type_oid,) = _U32.unpack_from(buf, at)
            at += 8  # type OID, type modifier
            columns.append(column)
            types.append(type_oid)
            keys.append(bool(flags & 1))
        return self.relations.add(Relation(oid, f"{nsp}.{name}", tuple(columns), tuple(types),
                                           tuple(keys)))


#: Offset of the message in an ``XLogData`` frame ('w', start, end, clock).
XLOGDATA_PAYLOAD = 25


def xlogdata_start(frame: bytes) -> int:
    """The WAL position of an ``XLogData`` frame's message."""
    start: int = _U64.unpack_from(frame, 1)[0]
    return start


def keepalive(frame: bytes) -> tuple[int, bool]:
    """A Primary Keepalive frame's WAL end and whether it asks for a reply."""
    end, _, reply = _KEEPALIVE.unpack_from(frame, 1)
    return end, bool(reply)
