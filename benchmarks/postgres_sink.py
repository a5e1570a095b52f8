"""Exactly-once ``PostgresSink`` rows/s against a plain ``COPY`` of the same rows.

One run measures both, on a temporary PostgreSQL server (``--dsn`` for
another): rows of ``(id int PRIMARY KEY, customer text, total numeric)``
from memory into an empty table, by

* **copy**: psycopg's ``COPY ... FROM STDIN`` on one connection, one
  transaction (``write_row`` per row): the plain bulk load;
* **sink**: an eddyflow job ``from_collection(tuples) -> map(to a dict)
  -> PostgresSink``, with
  checkpoints every ``--interval`` seconds and ``exactly_once=True``
  (a transaction per checkpoint, prepared and committed), timed from
  ``execute`` to its return: the job's start, its source, every
  checkpoint and the final commit included. (The rows are made by a map
  from tuples, as a job computes them: a ``from_collection`` of the dicts
  themselves would add the unpickling of its snapshot of them.)

Rounds alternate the two (drift on a shared machine hits both alike); the
figure is the median over rounds of the ratio sink/copy, for ``append``
and ``upsert`` (the goal: >= 0.5x).

``--methods`` measures the ways a sink can write a batch instead (why
``connectors/postgres/sink_sql.py`` upserts JSON and appends by one
``COPY``): ``INSERT ... SELECT FROM jsonb_to_recordset(json)`` and ``FROM
unnest(arrays)``, pipelined ``executemany``, ``COPY`` into a temporary
table merged by ``INSERT ... SELECT`` (which PostgreSQL refuses to
``PREPARE``), each with ``ON CONFLICT``; for appends ``COPY`` into the
table per batch, or once for all batches (what the sink does); batches of
``--batch`` rows.

    python benchmarks/postgres_sink.py                  # 200,000 rows, 3 rounds
    python benchmarks/postgres_sink.py --rows 50000 --rounds 1
    python benchmarks/postgres_sink.py --methods
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

import eddyflow as ef
from eddyflow.connectors.postgres import PostgresSink
from eddyflow.connectors.postgres.server import TemporaryPostgres

TABLE = "(id int PRIMARY KEY, customer text NOT NULL, total numeric(14, 2))"


def make_rows(n: int) -> list[tuple[Any, ...]]:
    """The rows both sides load: ``(id, customer, total)``; immutable values
    (a ``Decimal`` total would make ``from_collection`` pickle a snapshot
    of the rows, and the job unpickle it: source work, not the sink's)."""
    return [(i, f"customer-{i % 997}", i % 100_000) for i in range(n)]


def as_dict(row: tuple[Any, ...]) -> dict[str, Any]:
    """A row as the sink takes it."""
    return {"id": row[0], "customer": row[1], "total": row[2]}


def fresh_table(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")
        conn.execute(f"CREATE TABLE {name} {TABLE}")


def plain_copy(dsn: str, rows: list[tuple[Any, ...]]) -> float:
    """Seconds of a plain COPY of ``rows`` into a fresh table."""
    fresh_table(dsn, "plain")
    t0 = time.perf_counter()
    with psycopg.connect(dsn) as conn:
        with conn.cursor().copy("COPY plain (id, customer, total) FROM STDIN") as copy:
            for v in rows:
                copy.write_row(v)
        conn.commit()
    return time.perf_counter() - t0


def sink_job(dsn: str, rows: list[tuple[Any, ...]], mode: str, interval: float,
             batch: int) -> float:
    """Seconds of an exactly-once job writing ``rows`` into a fresh table."""
    fresh_table(dsn, "sunk")
    with tempfile.TemporaryDirectory() as chk:
        env = ef.StreamEnvironment(parallelism=1, batch_size=batch)
        env.enable_checkpointing(interval, chk)
        env.from_collection(rows).map(as_dict).sink_to(
            PostgresSink(dsn, "sunk", mode=mode, key=["id"] if mode == "upsert" else None))
        t0 = time.perf_counter()
        env.execute(f"postgres-sink-{mode}")
        took = time.perf_counter() - t0
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM sunk").fetchone()
    assert row is not None and row[0] == len(rows), f"{row} rows written, not {len(rows)}"
    return took


def compare(dsn: str, n: int, rounds: int, interval: float, batch: int) -> None:
    rows = make_rows(n)
    print(f"{n:,} rows; checkpoints every {interval} s; batches of {batch}")
    for mode in ("append", "upsert"):
        ratios, copies, sinks = [], [], []
        for r in range(rounds):
            if r % 2 == 0:
                c = plain_copy(dsn, rows)
                s = sink_job(dsn, rows, mode, interval, batch)
            else:
                s = sink_job(dsn, rows, mode, interval, batch)
                c = plain_copy(dsn, rows)
            copies.append(n / c)
            sinks.append(n / s)
            ratios.append(c / s)
        print(f"{mode:>7}: sink {statistics.median(sinks):>10,.0f} rows/s, plain COPY "
              f"{statistics.median(copies):>10,.0f} rows/s, ratio "
              f"{statistics.median(ratios):.2f}x (goal >= 0.5x)")


async def methods(dsn: str, n: int, batch: int) -> None:
    rows = make_rows(n)
    upsert = ("ON CONFLICT (id) DO UPDATE SET customer = EXCLUDED.customer, "
              "total = EXCLUDED.total")

    async def from_json(conn: psycopg.AsyncConnection[Any], b: list[Any]) -> None:
        text = json.dumps([as_dict(r) for r in b])
        await conn.execute("INSERT INTO m SELECT * FROM jsonb_to_recordset(%s::jsonb) AS "
                           f"r(id int, customer text, total numeric(14,2)) {upsert}", [text])

    async def unnest(conn: psycopg.AsyncConnection[Any], b: list[Any]) -> None:
        columns = [list(c) for c in zip(*b, strict=True)]
        await conn.execute("INSERT INTO m SELECT * FROM unnest(%s::int[], %s::text[], "
                           f"%s::numeric(14,2)[]) {upsert}", columns)

    async def executemany(conn: psycopg.AsyncConnection[Any], b: list[Any]) -> None:
        async with conn.cursor() as cur:
            await cur.executemany(f"INSERT INTO m VALUES (%s, %s, %s) {upsert}", b)

    async def temp_merge(conn: psycopg.AsyncConnection[Any], b: list[Any]) -> None:
        await conn.execute("CREATE TEMP TABLE IF NOT EXISTS stage (LIKE m)")
        async with conn.cursor().copy("COPY stage FROM STDIN") as copy:
            for v in b:
                await copy.write_row(v)
        await conn.execute(f"INSERT INTO m SELECT * FROM stage {upsert}")
        await conn.execute("TRUNCATE stage")

    async def copy_append(conn: psycopg.AsyncConnection[Any], b: list[Any]) -> None:
        async with conn.cursor().copy("COPY m FROM STDIN") as copy:
            for v in b:
                await copy.write_row(v)

    async def held_copy(conn: psycopg.AsyncConnection[Any]) -> None:
        # What the sink's CopyStream does: one COPY for the transaction,
        # its formatter's buffer sent when full.
        async with conn.cursor().copy("COPY m FROM STDIN") as copy:
            fmt = copy.formatter
            for s in range(0, n, batch):
                for v in rows[s:s + batch]:
                    data = fmt.write_row(v)
                    if data:
                        await copy.write(data)

    ways: list[tuple[str, Callable[[psycopg.AsyncConnection[Any], list[Any]],
                                   Awaitable[None]]]] = [
        ("JSON INSERT ... SELECT (upsert)", from_json),
        ("unnest INSERT ... SELECT (upsert)", unnest),
        ("pipelined executemany (upsert)", executemany),
        ("COPY into temp + merge (upsert)", temp_merge),
        ("a COPY per batch (append)", copy_append),
    ]
    print(f"{n:,} rows in batches of {batch}, one transaction")
    for name, write in ways:
        fresh_table(dsn, "m")
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            t0 = time.perf_counter()
            for s in range(0, n, batch):
                await write(conn, rows[s:s + batch])
            await conn.commit()
            took = time.perf_counter() - t0
        print(f"{name:>36}: {n / took:>10,.0f} rows/s")
    fresh_table(dsn, "m")
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        t0 = time.perf_counter()
        await held_copy(conn)
        await conn.commit()
        took = time.perf_counter() - t0
    print(f"{'one COPY for all batches (append)':>36}: {n / took:>10,.0f} rows/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0,
                        help="seconds between checkpoints")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dsn", help="a server to use (default: a temporary one)")
    parser.add_argument("--methods", action="store_true",
                        help="compare the ways of writing a batch instead")
    args = parser.parse_args()

    def run(dsn: str) -> None:
        if args.methods:
            asyncio.run(methods(dsn, args.rows, args.batch))
        else:
            compare(dsn, args.rows, args.rounds, args.interval, args.batch)

    if args.dsn:
        run(args.dsn)
    else:
        with TemporaryPostgres() as pg:
            run(pg.create_database("bench"))


if __name__ == "__main__":
    main()
