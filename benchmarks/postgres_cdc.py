"""PostgreSQL CDC: changes/s of ``PostgresCdcSource`` against a plain psycopg
read of the same changes, in one run.

A temporary server (``TemporaryPostgres``) gets a table and two slots on one
publication; then a workload of ``--changes`` row changes (inserts in
transactions of ``--txn`` rows, then updates and deletes of some of them).
Two reads of the same changes follow:

* plain: ``pg_logical_slot_peek_binary_changes`` of the second slot fetched
  by psycopg (the pgoutput messages as bytes, counted, not decoded), the
  cheapest read of the changes from Python;
* stream: the same changes received over the streaming replication
  protocol as the source receives them, not decoded (the transport alone);
* eddyflow: a job ``PostgresCdcSource -> ListSink`` (``snapshot=False``)
  ending at the WAL position after the workload: the stream decoded into
  envelopes with Python values, through the job's operators, committed.

The ratio eddyflow / plain is printed (goal: at least 0.5).

    python benchmarks/postgres_cdc.py                # 200,000 changes
    python benchmarks/postgres_cdc.py --changes 50000
"""

from __future__ import annotations

import argparse
import asyncio
import time

import psycopg

import eddyflow as ef
from eddyflow.connectors.postgres import PostgresCdcSource
from eddyflow.connectors.postgres.cdc_protocol import XLOGDATA_PAYLOAD, keepalive, parse_lsn
from eddyflow.connectors.postgres.cdc_stream import ReplicationStream
from eddyflow.connectors.postgres.server import TemporaryPostgres


def workload(dsn: str, changes: int, txn: int) -> int:
    """Inserts (3/5 of the changes), updates (1/5), deletes (1/5); returns
    the number of row changes made."""
    inserts = changes * 3 // 5
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, inserts, txn):
            conn.execute("INSERT INTO orders SELECT g, 'c' || (g %% 100), g %% 97 "
                         "FROM generate_series(%s::int, %s::int) g",
                         (start, min(start + txn, inserts) - 1))
        third = inserts // 3
        for start in range(0, third, txn):
            conn.execute("UPDATE orders SET amount = amount + 1 WHERE id >= %s AND id < %s",
                         (start, min(start + txn, third)))
        for start in range(third, 2 * third, txn):
            conn.execute("DELETE FROM orders WHERE id >= %s AND id < %s",
                         (start, min(start + txn, 2 * third)))
    return inserts + 2 * third


def plain_read(dsn: str) -> tuple[int, float]:
    """Row changes peeked from slot 'plain' by psycopg, and the seconds it took."""
    t0 = time.perf_counter()
    n = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes('plain', NULL, NULL, "
            "'proto_version', '1', 'publication_names', 'cdc')")
        while rows := cur.fetchmany(10_000):
            n += sum(1 for (data,) in rows if data[:1] in (b"I", b"U", b"D"))
    return n, time.perf_counter() - t0


def stream_receive(dsn: str, until: int) -> tuple[int, float]:
    """Frames of slot 'stream' received over the streaming replication
    protocol as the source does (``ReplicationStream``), not decoded: the
    source's transport alone, against peek's."""
    async def receive() -> int:
        stream = await ReplicationStream.start(dsn, "stream", "cdc", 0)
        n = 0
        try:
            while True:
                frame = stream.read()
                if frame is None:
                    await stream.wait_readable()
                    continue
                frame = bytes(frame)
                if frame[0] == 107 and keepalive(frame)[0] >= until:
                    return n
                n += frame[0] == 119 and frame[XLOGDATA_PAYLOAD] in b"IUD"
        finally:
            await stream.close()

    t0 = time.perf_counter()
    n = asyncio.run(receive())
    return n, time.perf_counter() - t0


def cdc_read(dsn: str, until: int) -> tuple[int, float]:
    """Row changes read by a PostgresCdcSource job, and the seconds it took."""
    env = ef.StreamEnvironment(parallelism=1)
    sink = ef.ListSink()
    env.from_source(PostgresCdcSource(dsn, ["public.orders"], slot="cdc", snapshot=False,
                                      until_lsn=until)).sink_to(sink)
    t0 = time.perf_counter()
    env.execute("postgres-cdc benchmark")
    return len(sink.results), time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--txn", type=int, default=1_000, help="rows per transaction")
    args = parser.parse_args()
    with TemporaryPostgres() as pg:
        dsn = pg.create_database("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer text, amount int)")
        # Creates publication 'cdc' and slot 'cdc'; then the plain slot.
        env = ef.StreamEnvironment(parallelism=1)
        env.from_source(PostgresCdcSource(dsn, ["public.orders"], slot="cdc", snapshot=False,
                                          until_lsn=0)).sink_to(ef.ListSink())
        env.execute("create the slot")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('plain', 'pgoutput')")
            conn.execute("SELECT pg_create_logical_replication_slot('stream', 'pgoutput')")
        made = workload(dsn, args.changes, args.txn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            # A synchronous commit: the WAL is flushed, and peek (which
            # reads the flushed WAL only) sees every change.
            conn.execute("SET synchronous_commit = on")
            row = conn.execute("SELECT pg_logical_emit_message(true, 'bench', 'end')::text"
                               ).fetchone()
        assert row is not None
        until = parse_lsn(row[0])
        plain_n, plain_s = plain_read(dsn)
        stream_n, stream_s = stream_receive(dsn, until)
        cdc_n, cdc_s = cdc_read(dsn, until)
        assert plain_n == made == cdc_n == stream_n, (plain_n, made, cdc_n, stream_n)
        plain_rate, cdc_rate = plain_n / plain_s, cdc_n / cdc_s
        print(f"{made:,} row changes ({args.txn} per transaction)")
        print(f"plain psycopg peek_binary_changes (bytes, not decoded): "
              f"{plain_rate:>10,.0f} changes/s ({plain_s:.2f} s)")
        print(f"replication stream received (bytes, not decoded):     "
              f"{stream_n / stream_s:>10,.0f} changes/s ({stream_s:.2f} s)")
        print(f"eddyflow PostgresCdcSource -> ListSink (envelopes):    "
              f"{cdc_rate:>10,.0f} changes/s ({cdc_s:.2f} s)")
        print(f"ratio eddyflow / plain: {cdc_rate / plain_rate:.2f}x (goal >= 0.5x)")


if __name__ == "__main__":
    main()
