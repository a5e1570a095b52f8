"""What ``PostgresSink`` needs from the server besides its rows: connecting
(errors that name the DSN without its password), the target table's columns
and unique keys, the checks run before a job starts, and the statements
that write one batch.

Appended rows go into one ``COPY ... FROM STDIN`` per transaction
(:class:`CopyStream`). An upsert batch is one statement per column set and
one for its deletes: the rows as one JSON text (``json.dumps``, in C) into
``INSERT ... SELECT FROM jsonb_to_recordset(...) ON CONFLICT (key) DO
UPDATE``, the deleted keys as arrays into ``DELETE ... WHERE (key) IN
(SELECT * FROM unnest(...))``: a round trip per batch, no await per
record. ``benchmarks/postgres_sink.py --methods`` measures the ways to
upsert a batch: the JSON text is the fastest; ``unnest`` of the columns as
arrays pays for psycopg's dumping of each element in Python (it is kept
for values JSON cannot carry: bytes, a NaN); pipelined ``executemany`` is
much slower (a statement per row, however pipelined); ``COPY`` into a
temporary table merged by ``INSERT ... SELECT`` is no faster, and unusable
here: PostgreSQL refuses to ``PREPARE`` a transaction that touched a
temporary table. A column of an array type goes through ``VALUES`` and
``executemany`` (``unnest`` would flatten it).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from decimal import Decimal
from operator import itemgetter
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Json, Jsonb

from eddyflow.errors import EddyflowError

__all__ = ["Column", "CopyStream", "PostgresSinkError", "Statements", "TableInfo",
           "by_columns", "check_key", "check_server", "connect", "display_dsn", "load_table",
           "row_values", "write_batch"]


class PostgresSinkError(EddyflowError):
    """A ``PostgresSink`` that cannot work as configured (a missing table,
    key or setting, a record that does not fit the table): restarting does
    not change that, so it is not retried."""

    retryable = False


def display_dsn(dsn: str) -> str:
    """``dsn`` without its password, for error messages."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<a DSN that does not parse>"
    user = parts.get("user")
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    port = parts.get("port")
    db = parts.get("dbname", "")
    return f"postgresql://{f'{user}@' if user else ''}{host}{f':{port}' if port else ''}/{db}"


async def connect(dsn: str, who: str, *, autocommit: bool = False) -> psycopg.AsyncConnection[Any]:
    """An async connection to ``dsn``; a failure is one line that names
    ``who`` and the DSN without its password (retryable: the server may come back)."""
    try:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit)
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split())
        raise ConnectionError(f"{who}: cannot connect to {display_dsn(dsn)}: {reason}") from exc


@dataclass(frozen=True)
class Column:
    """A column of the target table."""

    name: str
    #: Its type as SQL spells it (``numeric(12,2)``): the cast of its array.
    type: str
    #: Has a default (or is an identity or generated column): records may leave it out.
    has_default: bool
    generated: bool
    is_array: bool
    is_json: bool


@dataclass(frozen=True)
class TableInfo:
    """The target table as the sink writes it."""

    #: As the user named it (``public.totals``), for messages.
    label: str
    ident: sql.Composable
    columns: dict[str, Column]
    #: Column sets of its unique indexes (primary key included).
    unique_keys: tuple[frozenset[str], ...]


_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod),
       a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '',
       a.attgenerated <> '', t.typcategory = 'A', t.typname IN ('json', 'jsonb')
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_UNIQUE = """
SELECT array_agg(a.attname::text)
FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
GROUP BY i.indexrelid
"""


async def load_table(conn: psycopg.AsyncConnection[Any], table: str, who: str) -> TableInfo:
    """The columns and unique keys of ``table``; an error naming it if it
    does not exist (read in the connection's transaction, if one is open)."""
    cur = await conn.execute("SELECT to_regclass(%s)::oid", [table])
    row = await cur.fetchone()
    if row is None or row[0] is None:
        raise PostgresSinkError(
            f"{who}: table {table} does not exist in {display_dsn(_dsn_of(conn))}")
    oid = row[0]
    cur = await conn.execute(_COLUMNS, [oid])
    columns = {name: Column(name, typ, bool(dflt), bool(gen), bool(arr), bool(js))
               for name, typ, dflt, gen, arr, js in await cur.fetchall()}
    cur = await conn.execute(_UNIQUE, [oid])
    keys = tuple(frozenset(names) for (names,) in await cur.fetchall())
    schema, _, name = table.rpartition(".")
    ident = sql.Identifier(schema, name) if schema else sql.Identifier(name)
    return TableInfo(table, ident, columns, keys)


def _dsn_of(conn: psycopg.AsyncConnection[Any]) -> str:
    return conn.info.dsn


async def check_server(conn: psycopg.AsyncConnection[Any], who: str,
                       exactly_once: bool, mode: str) -> None:
    """Refuse a server that cannot prepare transactions when they are needed."""
    if not exactly_once:
        return
    cur = await conn.execute("SHOW max_prepared_transactions")
    row = await cur.fetchone()
    if row is not None and int(row[0]) == 0:
        alternative = ("exactly_once=False (with mode=\"upsert\" a replay rewrites the same "
                       "rows: idempotent)" if mode == "upsert" else
                       "exactly_once=False with mode=\"upsert\" and a key (idempotent: a "
                       "replay rewrites the same rows)")
        raise PostgresSinkError(
            f"{who}: the server at {display_dsn(_dsn_of(conn))} has max_prepared_transactions "
            "= 0, and exactly_once=True prepares a transaction per checkpoint: set "
            f"max_prepared_transactions > 0 (a restart of the server), or use {alternative}")


def check_key(info: TableInfo, key: Sequence[str], who: str) -> None:
    """The key columns exist and a unique index (or the primary key) is on exactly them."""
    missing = [k for k in key if k not in info.columns]
    if missing:
        raise PostgresSinkError(
            f"{who}: key column {missing[0]!r} is not a column of table {info.label} "
            f"(its columns: {', '.join(info.columns)})")
    if frozenset(key) not in info.unique_keys:
        cols = ", ".join(key)
        raise PostgresSinkError(
            f"{who}: table {info.label} has no primary key or unique constraint on ({cols}), "
            f"which mode=\"upsert\" needs (INSERT ... ON CONFLICT ({cols})): add one, e.g. "
            f"ALTER TABLE {info.label} ADD UNIQUE ({cols})")


@dataclass(frozen=True)
class Inserts:
    """How rows of one column set are written."""

    #: ``INSERT ... SELECT FROM jsonb_to_recordset``: the rows as one JSON
    #: text, which ``json.dumps`` makes in C (``None``: a column of an array
    #: type, which ``unnest`` would flatten too).
    from_json: sql.Composed | None
    #: ``INSERT ... SELECT FROM unnest`` of the columns' arrays (``arrays``),
    #: or ``VALUES`` for ``executemany``: for rows JSON cannot carry.
    values: sql.Composed
    arrays: bool


class Statements:
    """The statements of one sink's batches, made once per column set."""

    def __init__(self, info: TableInfo, mode: str, key: Sequence[str], who: str) -> None:
        self.info = info
        self.mode = mode
        self.key = tuple(key)
        self.who = who
        self._checked: dict[tuple[str, ...], Inserts] = {}
        required = [c.name for c in info.columns.values() if not c.has_default]
        self.required = frozenset(required)
        self._delete: sql.Composed | None = None

    def columns_error(self, cols: tuple[str, ...], record: Any) -> PostgresSinkError:
        """The one-line error of a record whose columns do not fit the table."""
        t = self.info
        for c in cols:
            if c not in t.columns:
                return PostgresSinkError(
                    f"{self.who}: record {record!r:.200} has column {c!r}, which table "
                    f"{t.label} lacks (its columns: {', '.join(t.columns)})")
            if t.columns[c].generated:
                return PostgresSinkError(
                    f"{self.who}: record {record!r:.200} sets column {c!r} of table "
                    f"{t.label}, which is generated")
        missing = sorted(self.required.difference(cols)) or sorted(set(self.key) - set(cols))
        return PostgresSinkError(
            f"{self.who}: record {record!r:.200} lacks column {missing[0]!r} of table "
            f"{t.label} (it has no default)" if missing[0] in self.required else
            f"{self.who}: record {record!r:.200} lacks key column {missing[0]!r} of table "
            f"{t.label}")

    def insert(self, cols: tuple[str, ...], record: Any) -> Inserts:
        """The statements that write rows of columns ``cols`` (checked
        against the table the first time)."""
        got = self._checked.get(cols)
        if got is not None:
            return got
        t = self.info
        self._check(cols, record)
        targets = sql.SQL(", ").join(map(sql.Identifier, cols))
        arrays = not any(t.columns[c].is_array for c in cols)
        types = [sql.SQL(t.columns[c].type) for c in cols]
        from_json = None
        if arrays:
            source = sql.SQL("SELECT * FROM unnest({})").format(sql.SQL(", ").join(
                sql.SQL("{}::{}[]").format(sql.Placeholder(), typ) for typ in types))
            from_json = self._upsert(sql.SQL(
                "INSERT INTO {} ({}) SELECT {} FROM jsonb_to_recordset(%s::jsonb) AS r({})"
            ).format(t.ident, targets, targets, sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(c), typ)
                for c, typ in zip(cols, types, strict=True))), cols)
        else:
            source = sql.SQL("VALUES ({})").format(
                sql.SQL(", ").join(sql.Placeholder() * len(cols)))
        stmt = self._upsert(sql.SQL("INSERT INTO {} ({}) {}").format(t.ident, targets, source),
                            cols)
        got = self._checked[cols] = Inserts(from_json, stmt, arrays)
        return got

    def _upsert(self, insert: sql.Composed, cols: tuple[str, ...]) -> sql.Composed:
        """``insert`` of rows of ``cols``, with ``ON CONFLICT`` in upsert mode."""
        if self.mode != "upsert":
            return insert
        conflict = sql.SQL(", ").join(map(sql.Identifier, self.key))
        rest = [c for c in cols if c not in self.key]
        if rest:
            sets = sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in rest)
            return sql.SQL("{} ON CONFLICT ({}) DO UPDATE SET {}").format(insert, conflict, sets)
        return sql.SQL("{} ON CONFLICT ({}) DO NOTHING").format(insert, conflict)

    def _check(self, cols: tuple[str, ...], record: Any) -> None:
        t = self.info
        if (any(c not in t.columns or t.columns[c].generated for c in cols)
                or not self.required.issubset(cols) or not set(self.key).issubset(cols)):
            raise self.columns_error(cols, record)

    def copy(self, cols: tuple[str, ...], record: Any) -> sql.Composed:
        """``COPY`` of rows of columns ``cols`` (checked against the table)."""
        self._check(cols, record)
        return sql.SQL("COPY {} ({}) FROM STDIN").format(
            self.info.ident, sql.SQL(", ").join(map(sql.Identifier, cols)))

    def delete(self) -> sql.Composed:
        """``DELETE`` of the rows whose keys are given as arrays."""
        if self._delete is None:
            t = self.info
            keys = sql.SQL(", ").join(map(sql.Identifier, self.key))
            arrays = sql.SQL(", ").join(
                sql.SQL("{}::{}[]").format(sql.Placeholder(), sql.SQL(t.columns[k].type))
                for k in self.key)
            self._delete = sql.SQL("DELETE FROM {} WHERE ({}) IN (SELECT * FROM unnest({}))"
                                   ).format(t.ident, keys, arrays)
        return self._delete


def _json_scalar(value: Any) -> str:
    """A value JSON has no type for, as the text its column's type reads
    (``jsonb_to_recordset`` gives a JSON string to the type's input function)."""
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, dt.date | dt.time):  # datetime included
        return value.isoformat()
    raise TypeError(f"no JSON text for {type(value).__name__}")


def _json(value: Any, jsonb: bool) -> Any:
    if value is None:
        return None
    return Jsonb(value) if jsonb else Json(value)


def by_columns(st: Statements, rows: list[Any]) -> dict[tuple[str, ...], list[Any]]:
    """``rows`` grouped by their columns (mostly one group)."""
    try:
        # C-level loops: a batch's rows mostly share their columns.
        columns = list(map(tuple, map(dict.keys, rows)))
    except TypeError:
        bad = next(r for r in rows if not isinstance(r, dict))
        raise PostgresSinkError(f"{st.who}: a record must be a dict of column -> value, "
                                f"got {bad!r:.200}") from None
    if len(set(columns)) == 1:
        return {columns[0]: rows}
    groups: dict[tuple[str, ...], list[Any]] = {}
    for cols, r in zip(columns, rows, strict=True):
        groups.setdefault(cols, []).append(r)
    return groups


def row_values(st: Statements, cols: tuple[str, ...], group: list[Any]) -> list[Any]:
    """The values of ``group`` (records of columns ``cols``) as tuples, in
    ``cols`` order, json values wrapped for their column."""
    get = itemgetter(*cols)
    values = list(map(get, group)) if len(cols) > 1 else [(v,) for v in map(get, group)]
    columns = st.info.columns
    json_at = [i for i, c in enumerate(cols) if columns[c].is_json]
    if json_at:
        jsonb = [columns[cols[i]].type == "jsonb" for i in range(len(cols))]
        values = [tuple(_json(v, jsonb[i]) if i in json_at else v for i, v in enumerate(row))
                  for row in values]
    return values


class CopyStream:
    """An append transaction's rows as one ``COPY ... FROM STDIN``, open from
    its first batch to its prepare: a ``COPY`` per batch would cost two round
    trips a batch, and ``INSERT ... SELECT FROM unnest`` the dumping of its
    arrays (``benchmarks/postgres_sink.py --methods``). Rows are formatted
    by psycopg's formatter, which hands back data only once its buffer is
    full: an await per buffer, not per row."""

    def __init__(self, st: Statements) -> None:
        self.st = st
        self._stack: AsyncExitStack | None = None
        self._copy: psycopg.AsyncCopy | None = None
        self._cols: tuple[str, ...] | None = None

    async def write(self, conn: psycopg.AsyncConnection[Any], records: list[Any]) -> None:
        """Add ``records`` to the transaction's ``COPY`` (another one if their
        columns differ from the last batch's)."""
        st = self.st
        for cols, group in by_columns(st, records).items():
            copy = self._copy
            if copy is None or cols != self._cols:
                stmt = st.copy(cols, group[0])
                await self.finish()
                stack = AsyncExitStack()
                cur = await stack.enter_async_context(conn.cursor())
                copy = self._copy = await stack.enter_async_context(cur.copy(stmt))
                self._stack, self._cols = stack, cols
            fmt = copy.formatter
            for row in row_values(st, cols, group):
                data = fmt.write_row(row)
                if data:
                    await copy.write(data)

    async def finish(self) -> None:
        """End the ``COPY`` in progress, if any (its errors are raised here)."""
        stack, self._stack, self._copy, self._cols = self._stack, None, None, None
        if stack is not None:
            await stack.aclose()

    async def discard(self) -> None:
        """Give up the ``COPY`` in progress (the transaction is rolled back)."""
        stack, self._stack, self._copy, self._cols = self._stack, None, None, None
        if stack is not None:
            gone = ConnectionAbortedError("the sink's transaction is rolled back")
            with contextlib.suppress(Exception):  # a broken connection: nothing to end
                await stack.__aexit__(type(gone), gone, None)


async def write_batch(conn: psycopg.AsyncConnection[Any], st: Statements,
                      records: list[Any]) -> None:
    """Write ``records`` (dicts of column -> value; in upsert mode
    ``{"__op": "d", **key}`` deletes) in the connection's transaction, with
    a statement per column set (and one for the deletes)."""
    if st.mode == "upsert":
        rows, deletes = _last_per_key(st, records)
    else:
        rows, deletes = records, []
    if rows:
        for cols, group in by_columns(st, rows).items():
            how = st.insert(cols, group[0])
            if how.from_json is not None:
                try:
                    text = json.dumps(group, default=_json_scalar, allow_nan=False)
                except (TypeError, ValueError):
                    pass  # bytes, NaN, ...: the arrays below carry them
                else:
                    await conn.execute(how.from_json, [text])
                    continue
            values = row_values(st, cols, group)
            async with conn.cursor() as cur:
                if how.arrays:
                    await cur.execute(how.values,
                                      [list(col) for col in zip(*values, strict=True)])
                else:
                    await cur.executemany(how.values, values)
    if deletes:
        keys = list(zip(*deletes, strict=True))
        await conn.execute(st.delete(), [list(k) for k in keys])


def _last_per_key(st: Statements, records: list[Any]
                  ) -> tuple[list[Any], list[tuple[Any, ...]]]:
    """The batch as its net effect: the last record of each key (one
    ``ON CONFLICT DO UPDATE`` may not touch a row twice), split into rows
    to write and keys to delete."""
    key = st.key
    get = itemgetter(*key)
    last: dict[Any, Any] = {}
    try:
        for r in records:
            last[get(r)] = r
    except (KeyError, TypeError):
        for r in records:
            if not isinstance(r, dict):
                raise PostgresSinkError(f"{st.who}: a record must be a dict of column -> "
                                        f"value, got {r!r:.200}") from None
            for k in key:
                if k not in r:
                    raise PostgresSinkError(
                        f"{st.who}: record {r!r:.200} lacks key column {k!r} of table "
                        f"{st.info.label}") from None
        raise
    rows: list[Any] = []
    deletes: list[tuple[Any, ...]] = []
    single = len(key) == 1
    for k, r in last.items():
        op = r.get("__op")
        if op is None:
            rows.append(r)
        elif op == "d":
            deletes.append((k,) if single else k)
        else:
            raise PostgresSinkError(
                f"{st.who}: record {r!r:.200} has __op {op!r}; the only one is \"d\" "
                "(delete by key); leave it out to insert or update")
    return rows, deletes
