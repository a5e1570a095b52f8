"""PostgreSQL CDC end to end under SIGKILL: while a workload of inserts,
updates and deletes runs, the job of ``cdc_sigkill_job.py`` (initial
snapshot, then changes -> per-customer totals with retractions, and every
change's identity) is killed three times at random moments and restored
with ``--restore latest``; a last run ends at the WAL position after the
workload. Its committed output must be exactly once: each customer's totals
numbered 1..n without a gap or repeat, the last equal to the SQL aggregate
of the table, and no change identity (id, op, lsn) twice."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from cdc_support import cdc_position, sql, wal_lsn
from sigkill_support import RUN_TIMEOUT, JobProcess, latest_checkpoint, wait_for_checkpoint_after

import eddyflow as ef
from eddyflow.checkpoint.storage import CheckpointCorrupted

JOB = Path(__file__).parent / "cdc_sigkill_job.py"
CUSTOMERS = 20


def committed(folder: Path) -> list[list[Any]]:
    out: list[list[Any]] = []
    if folder.exists():
        for path in sorted(folder.iterdir()):
            if path.name.startswith("part-"):
                out.extend(json.loads(line) for line in path.read_text().splitlines())
    return out


def snapshot_done(chk: Path) -> bool:
    """Whether a completed checkpoint holds a position after the snapshot."""
    for c in reversed(ef.list_checkpoints(chk)):
        try:
            pos = cdc_position(chk, c.id)
        except CheckpointCorrupted:  # removed by retention meanwhile
            continue
        return pos["lsn"] is not None and pos["snapshot"] is None
    return False


def workload(dsn: str, stop: threading.Event, rnd: random.Random) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_id = 100_000
        while not stop.is_set():
            with conn.transaction():
                for _ in range(rnd.randint(1, 3)):
                    what = rnd.random()
                    k = rnd.randrange(next_id)
                    if what < 0.4:
                        next_id += 1
                        conn.execute("INSERT INTO orders VALUES (%s, %s, %s)",
                                     (next_id, f"c{rnd.randrange(CUSTOMERS)}", rnd.randint(1, 99)))
                    elif what < 0.7:
                        conn.execute("UPDATE orders SET amount = amount + 1, customer = %s "
                                     "WHERE id = %s", (f"c{rnd.randrange(CUSTOMERS)}", k))
                    else:
                        conn.execute("DELETE FROM orders WHERE id = %s", (k,))
            time.sleep(0.001)


def test_cdc_totals_exactly_once_under_sigkill(postgres_dsn: str, tmp_path: Path) -> None:
    rnd = random.Random(28)
    sql(postgres_dsn,
        "CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, amount int NOT NULL)",
        "ALTER TABLE orders REPLICA IDENTITY FULL",
        "INSERT INTO orders SELECT g, 'c' || (g % 20), g % 97 FROM generate_series(1, 20000) g")
    out, changes, chk = tmp_path / "out", tmp_path / "changes", tmp_path / "chk"
    job = JobProcess(JOB, tmp_path, tmp_path / "unused-log", out, chk, 0.0)
    job.env.update(EF_CDC_SLOT="kill_totals",
                   EF_CDC_DSN=postgres_dsn, EF_CDC_CHANGES=str(changes), EF_CDC_CHUNK="500")
    stop = threading.Event()
    writer = threading.Thread(target=workload, args=(postgres_dsn, stop, rnd))
    writer.start()
    until = tmp_path / "until"
    try:
        for _ in range(3):
            proc, stderr = job.start()
            before = latest_checkpoint(chk)
            if wait_for_checkpoint_after(proc, chk, before):
                time.sleep(rnd.uniform(0.0, 0.3))
            assert proc.poll() is None, stderr.read_text()[-2000:]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        # The last run: restored while the workload still runs, it ends at
        # the WAL position after the workload.
        job.env["EF_CDC_UNTIL"] = str(until)
        proc, stderr = job.start()
        deadline = time.monotonic() + RUN_TIMEOUT
        while not snapshot_done(chk) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # changes after the snapshot, streamed
    finally:
        stop.set()
        writer.join()
    until.write_text(str(wal_lsn(postgres_dsn)))
    assert proc.wait(RUN_TIMEOUT) == 0, stderr.read_text()[-3000:]

    totals: dict[str, list[tuple[int, int]]] = {}
    for customer, seq, amount in committed(out):
        totals.setdefault(customer, []).append((seq, amount))
    expected = dict(sql(postgres_dsn, "SELECT customer, sum(amount)::int FROM orders "
                                      "GROUP BY customer"))
    for customer, seen in totals.items():
        seqs = sorted(s for s, _ in seen)
        assert seqs == list(range(1, len(seqs) + 1)), f"{customer}: totals not exactly once"
        assert max(seen)[1] == expected.get(customer, 0), customer
    assert set(expected) <= set(totals)
    ids = [tuple(c) for c in committed(changes)]
    assert len(ids) == len(set(ids)), "a change was emitted twice"
    assert {op for _, op, _ in ids} == {"r", "c", "u", "d"}
    assert latest_checkpoint(chk) > 0
