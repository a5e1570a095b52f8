"""The PostgreSQL example end to end under SIGKILL (issue 28's Must show):
while a workload of inserts, updates and deletes runs, the job of
``examples/postgres_orders.py`` (CDC of ``orders`` -> per-customer totals
with retractions -> ``PostgresSink`` upsert; every change -> ``PostgresSink``
append) is killed three times and restored with ``--restore latest``; a
last run ends at the WAL position after the workload. The totals table must
equal the SQL aggregate of ``orders``, the changes table must hold no
(id, op, lsn) twice, no prepared transaction of the job may be left, and
the slot's confirmed position must advance as checkpoints complete."""

from __future__ import annotations

import importlib.util
import random
import signal
import threading
import time
from pathlib import Path
from types import ModuleType

import psycopg
from cdc_support import cdc_position, confirmed_flush, sql, wal_lsn
from sigkill_support import RUN_TIMEOUT, JobProcess, latest_checkpoint, wait_for_checkpoint_after

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "postgres_orders.py"
SLOT = "orders_sigkill"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("postgres_orders_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workload(dsn: str, stop: threading.Event, rnd: random.Random) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_id = 5_000
        while not stop.is_set():
            with conn.transaction():
                for _ in range(rnd.randint(1, 4)):
                    what, k = rnd.random(), rnd.randint(1, next_id)
                    if what < 0.4:
                        next_id += 1
                        conn.execute("INSERT INTO orders VALUES (%s, %s, %s)",
                                     (next_id, f"c{rnd.randrange(30):02d}",
                                      rnd.randint(100, 9_999) / 100))
                    elif what < 0.7:
                        conn.execute("UPDATE orders SET amount = amount + 1, customer = %s "
                                     "WHERE id = %s", (f"c{rnd.randrange(30):02d}", k))
                    else:
                        conn.execute("DELETE FROM orders WHERE id = %s", (k,))
            time.sleep(0.002)


def snapshot_done(chk: Path) -> bool:
    """Whether the newest checkpoint's CDC position is past the snapshot."""
    latest = latest_checkpoint(chk)
    if not latest:
        return False
    try:
        position = cdc_position(chk, latest, "orders-cdc")
    except OSError:  # removed meanwhile (a newer one is retained): look again
        return False
    return position["lsn"] is not None and position["snapshot"] is None


def slot_position(dsn: str) -> int:
    rows = sql(dsn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", params=(SLOT,))
    return confirmed_flush(dsn, SLOT) if rows else 0


def test_orders_example_exactly_once_under_sigkill(postgres_dsn: str, tmp_path: Path) -> None:
    orders = example()
    orders.create_tables(postgres_dsn)
    sql(postgres_dsn, "INSERT INTO orders SELECT g, 'c' || lpad((g % 30)::text, 2, '0'), "
                      "(g % 997) / 10.0 FROM generate_series(1, 5000) g")
    chk = tmp_path / "chk"
    job = JobProcess(EXAMPLE, tmp_path, tmp_path / "unused-log", tmp_path / "unused-out", chk, 0.0)
    job.env.update(EDDYFLOW_PG_DSN=postgres_dsn, EDDYFLOW_PG_SLOT=SLOT,
                   EDDYFLOW_PG_CHECKPOINTS=str(chk), EDDYFLOW_PG_INTERVAL="0.1")
    rnd = random.Random(2028)
    stop = threading.Event()
    writer = threading.Thread(target=workload, args=(postgres_dsn, stop, rnd))
    writer.start()
    until = tmp_path / "until"
    positions: list[int] = []
    try:
        for _ in range(3):
            proc, stderr = job.start()
            before = latest_checkpoint(chk)
            assert wait_for_checkpoint_after(proc, chk, before), stderr.read_text()[-3000:]
            time.sleep(rnd.uniform(0.0, 0.4))
            assert proc.poll() is None, stderr.read_text()[-3000:]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            positions.append(slot_position(postgres_dsn))
        job.env["EDDYFLOW_PG_UNTIL"] = str(until)
        proc, stderr = job.start()
        # An insert, update and delete that the stream must carry (as "c",
        # "u", "d"): made once a checkpoint shows the snapshot read. While
        # the snapshot still runs, the workload's new rows (keys past its
        # chunks) are read by it, as "r": on a loaded machine it can last
        # as long as the workload.
        deadline = time.monotonic() + RUN_TIMEOUT
        while not snapshot_done(chk):
            assert proc.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "the snapshot never completed"
            time.sleep(0.05)
        sql(postgres_dsn, "INSERT INTO orders VALUES (0, 'c00', 1.0)")
        sql(postgres_dsn, "UPDATE orders SET amount = 2.0 WHERE id = 0")
        sql(postgres_dsn, "DELETE FROM orders WHERE id = 0")
        time.sleep(1.0)  # the last run also streams changes made while it runs
    finally:
        stop.set()
        writer.join()
    until.write_text(str(wal_lsn(postgres_dsn)))
    assert proc.wait(RUN_TIMEOUT) == 0, stderr.read_text()[-3000:]
    positions.append(slot_position(postgres_dsn))

    assert orders.mismatches(postgres_dsn) == []
    duplicates = sql(postgres_dsn, "SELECT id, op, lsn, count(*) FROM order_changes "
                                   "GROUP BY id, op, lsn HAVING count(*) > 1")
    assert duplicates == [], f"changes appended twice: {duplicates[:5]}"
    ops = {op for (op,) in sql(postgres_dsn, "SELECT DISTINCT op FROM order_changes")}
    assert ops == {"r", "c", "u", "d"}
    streamed = sql(postgres_dsn, "SELECT op FROM order_changes WHERE id = 0 ORDER BY lsn")
    assert [op for (op,) in streamed] == ["c", "u", "d"]
    assert sql(postgres_dsn, "SELECT gid FROM pg_prepared_xacts") == []
    # The slot is acknowledged only as checkpoints complete: it never goes
    # back, and it moved on over the runs.
    assert positions == sorted(positions), positions
    assert positions[-1] > positions[0] > 0, positions


def test_the_example_runs_with_one_command(tmp_path: Path) -> None:
    # `python examples/postgres_orders.py` on a fresh machine: its own
    # temporary server, a workload while the job runs, the totals checked.
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parents[1] / "src")}
    done = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "totals equal the SQL aggregate of orders" in done.stdout
