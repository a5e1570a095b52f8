"""Orders in, per-customer totals out, exactly once, with PostgreSQL at both ends.

The job reads every change of ``public.orders`` (its current rows first,
then inserts, updates and deletes, by logical decoding), turns each into
amount deltas per customer (an update or delete retracts its old row),
keeps a running total per customer and upserts it into
``customer_totals``; every change's identity (id, op, lsn) is appended to
``order_changes``. Both sinks commit by two-phase commit when a checkpoint
completes, so a crash and ``--restore latest`` never count an order twice.

    python examples/postgres_orders.py      # a temporary PostgreSQL, a workload, the totals
    python examples/postgres_orders.py --dsn postgresql://app@127.0.0.1/shop
    EDDYFLOW_PG_DSN=postgresql://... eddyflow run examples/postgres_orders.py --restore latest

With ``--dsn`` the tables are created if missing and the job runs until
interrupted. Without it the script starts its own PostgreSQL server, runs
a short workload of orders while the job runs, stops the job at the WAL
position after the workload, and checks the totals against SQL.

Settings of ``build`` (environment): ``EDDYFLOW_PG_DSN`` (the database),
``EDDYFLOW_PG_SLOT`` (replication slot, default ``eddyflow_orders``),
``EDDYFLOW_PG_CHECKPOINTS`` (default ``checkpoints/postgres_orders``),
``EDDYFLOW_PG_INTERVAL`` (seconds between checkpoints, default 0.5),
``EDDYFLOW_PG_UNTIL`` (a file: once it exists, the WAL position in it is
where the job ends; unset, the job runs until stopped).
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

import eddyflow as ef
from eddyflow.connectors.postgres import PostgresCdcSource, PostgresSink

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, customer text NOT NULL, "
    "amount numeric(12, 2) NOT NULL)",
    # The old row of an update or delete, whole: its amount is retracted.
    "ALTER TABLE orders REPLICA IDENTITY FULL",
    "CREATE TABLE IF NOT EXISTS customer_totals (customer text PRIMARY KEY, "
    "total numeric(14, 2) NOT NULL, changes bigint NOT NULL)",
    "CREATE TABLE IF NOT EXISTS order_changes (id bigint NOT NULL, op text NOT NULL, "
    "lsn bigint NOT NULL)",
)


def deltas(change: dict[str, Any]) -> list[tuple[str, Any]]:
    """(customer, amount delta) of a change: an update or delete retracts its old row."""
    out = []
    if change["op"] in ("u", "d"):
        out.append((change["before"]["customer"], -change["before"]["amount"]))
    if change["after"] is not None:
        out.append((change["after"]["customer"], change["after"]["amount"]))
    return out


def add(delta: tuple[str, Any], state: tuple[Any, int] | None
        ) -> tuple[dict[str, Any], tuple[Any, int]]:
    """The customer's running total and number of changes, as a row of customer_totals."""
    total, changes = state or (0, 0)
    total, changes = total + delta[1], changes + 1
    return {"customer": delta[0], "total": total, "changes": changes}, (total, changes)


def identity(change: dict[str, Any]) -> dict[str, Any]:
    """A row of order_changes: what identifies a change."""
    row = change["after"] if change["after"] is not None else change["before"]
    return {"id": row["id"], "op": change["op"], "lsn": change["lsn"]}


def _end_at(source: PostgresCdcSource, path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)
    source.until_lsn = int(path.read_text())


def build(env: ef.StreamEnvironment) -> None:
    dsn = os.environ["EDDYFLOW_PG_DSN"]
    env.enable_checkpointing(
        interval=float(os.environ.get("EDDYFLOW_PG_INTERVAL", "0.5")),
        directory=os.environ.get("EDDYFLOW_PG_CHECKPOINTS", "checkpoints/postgres_orders"))
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0.5))
    source = PostgresCdcSource(dsn, tables=["public.orders"],
                               slot=os.environ.get("EDDYFLOW_PG_SLOT", "eddyflow_orders"))
    until = os.environ.get("EDDYFLOW_PG_UNTIL")
    if until:
        threading.Thread(target=_end_at, args=(source, Path(until)), daemon=True).start()
    changes = env.from_source(source).name("orders-cdc")
    (
        changes.flat_map(deltas).name("deltas")
        .key_by(0)
        .map_with_state(add).name("totals")
        .sink_to(PostgresSink(dsn, table="public.customer_totals", mode="upsert",
                              key=["customer"])).name("totals-sink")
    )
    (
        changes.map(identity).name("identity")
        .sink_to(PostgresSink(dsn, table="public.order_changes", mode="append"))
        .name("changes-sink")
    )


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in SCHEMA:
            conn.execute(statement.encode())


def workload(dsn: str, seconds: float, seed: int = 7) -> int:
    """Inserts, updates and deletes orders for ``seconds``; the number of transactions."""
    rnd = random.Random(seed)
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_id = conn.execute("SELECT coalesce(max(id), 0) FROM orders").fetchone()[0]  # type: ignore[index]
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with conn.transaction():
                for _ in range(rnd.randint(1, 5)):
                    what, k = rnd.random(), rnd.randint(1, next_id)
                    if what < 0.5:
                        next_id += 1
                        conn.execute("INSERT INTO orders VALUES (%s, %s, %s)",
                                     (next_id, f"c{rnd.randrange(50):02d}",
                                      rnd.randint(100, 99_999) / 100))
                    elif what < 0.8:
                        conn.execute("UPDATE orders SET amount = amount + 1, customer = %s "
                                     "WHERE id = %s", (f"c{rnd.randrange(50):02d}", k))
                    else:
                        conn.execute("DELETE FROM orders WHERE id = %s", (k,))
            done += 1
    return done


def mismatches(dsn: str) -> list[str]:
    """Customers whose total differs from the SQL aggregate of orders."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT coalesce(a.customer, t.customer), a.total, t.total FROM "
            "(SELECT customer, sum(amount) AS total FROM orders GROUP BY customer) a "
            "FULL JOIN customer_totals t ON a.customer = t.customer "
            "WHERE coalesce(a.total, 0) <> coalesce(t.total, 0)").fetchall()
    return [f"{c}: orders say {a}, totals say {t}" for c, a, t in rows]


def demo(dsn: str, folder: Path) -> None:
    """The one-command run: a workload while the job runs, then the check."""
    create_tables(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO orders SELECT g, 'c' || lpad((g % 50)::text, 2, '0'), "
                     "(g % 997) / 10.0 FROM generate_series(1, 20000) g")
    until = folder / "until"
    os.environ.update(EDDYFLOW_PG_DSN=dsn, EDDYFLOW_PG_UNTIL=str(until),
                      EDDYFLOW_PG_CHECKPOINTS=str(folder / "checkpoints"))
    env = ef.StreamEnvironment(parallelism=2)
    build(env)
    job = threading.Thread(target=lambda: results.append(env.execute("postgres-orders")))
    results: list[ef.JobResult] = []
    job.start()
    transactions = workload(dsn, seconds=3.0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # A WAL position after every committed transaction: the job ends there.
        mark = conn.execute("SELECT pg_logical_emit_message(false, 'eddyflow', 'end')::text"
                            ).fetchone()[0]  # type: ignore[index]
    hi, lo = mark.split("/")
    until.write_text(str((int(hi, 16) << 32) + int(lo, 16)))
    job.join()
    result = results[0]
    with psycopg.connect(dsn) as conn:
        customers, total = conn.execute(
            "SELECT count(*), sum(total) FROM customer_totals").fetchone()  # type: ignore[misc]
        changes = conn.execute("SELECT count(*) FROM order_changes").fetchone()[0]  # type: ignore[index]
        top = conn.execute("SELECT customer, total FROM customer_totals "
                           "ORDER BY total DESC LIMIT 3").fetchall()
    print(f"20,000 orders, then {transactions:,} transactions of inserts, updates and deletes; "
          f"{changes:,} changes in {result.duration:.1f} s, "
          f"{len(result.completed_checkpoints)} checkpoints")
    print(f"{customers} customers, total {total:,}; top: "
          + ", ".join(f"{c} {t:,}" for c, t in top))
    wrong = mismatches(dsn)
    print("totals equal the SQL aggregate of orders" if not wrong else "\n".join(wrong))
    if wrong:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", help="a PostgreSQL database (default: a temporary server)")
    args = parser.parse_args()
    if args.dsn:
        create_tables(args.dsn)
        os.environ["EDDYFLOW_PG_DSN"] = args.dsn
        env = ef.StreamEnvironment(parallelism=2)
        build(env)
        env.execute("postgres-orders", restore="latest")
        return
    import tempfile

    from eddyflow.connectors.postgres.server import TemporaryPostgres

    with TemporaryPostgres() as server, tempfile.TemporaryDirectory() as folder:
        demo(server.create_database("shop"), Path(folder))


if __name__ == "__main__":
    main()
