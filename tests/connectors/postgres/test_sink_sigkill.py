"""PostgresSink exactly once under SIGKILL: the job process (jobs/pg_sink_job.py
under ``eddyflow run --restore latest``) is killed three times (more if
none of the kills came while a transaction was prepared: the last ones wait
for one), after checkpoints, and restored; the last run finishes. The tables then equal
a failure-free computation: ``totals`` the running totals' last values,
``changes`` every order once. Prepared transactions left by the killed runs
(of checkpoints that completed or not) are committed or rolled back by the
next run's recovery: none of the job's is left at the end."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

import eddyflow as ef
from eddyflow.connectors.postgres.server import TemporaryPostgres

JOB = Path(__file__).with_name("jobs") / "pg_sink_job.py"
SRC = Path(ef.__file__).resolve().parents[1]
ORDERS = 30_000
KILLS = 3
MAX_KILLS = 10  # kills until one of them leaves prepared transactions behind
RUN_TIMEOUT = 300.0


def _latest(chk: Path) -> int:
    done = ef.list_checkpoints(chk) if chk.exists() else []
    return max((c.id for c in done), default=0)


def _prepared(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [g for (g,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]


def _expected() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    sys.path.insert(0, str(JOB.parent))
    try:
        from pg_sink_job import orders
    finally:
        sys.path.pop(0)
    totals: dict[str, int] = {}
    for o in orders(ORDERS):
        totals[o["customer"]] = totals.get(o["customer"], 0) + o["amount"]
    return (sorted((c, t) for c, t in totals.items() if t >= 0),
            sorted((o["id"], o["customer"], o["amount"]) for o in orders(ORDERS)))


def test_sigkill_three_times_then_restore_is_exactly_once(
        postgres: TemporaryPostgres, tmp_path: Path) -> None:
    dsn = postgres.create_database("sigkill_sink")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE changes (id int, customer text, amount int)")
        conn.execute("CREATE TABLE totals (customer text PRIMARY KEY, total int)")
    chk = tmp_path / "chk"
    env = {**os.environ, "EF_PG_DSN": dsn, "EF_PG_CHK": str(chk),
           "EF_PG_ORDERS": str(ORDERS), "EF_PG_PACE": "10",
           "PYTHONPATH": os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])}
    rng = random.Random(int(os.environ.get("EF_SIGKILL_SEED", "28")))
    runs = 0
    effective = 0
    left_prepared = 0

    def start() -> tuple[subprocess.Popen[bytes], Path]:
        nonlocal runs
        runs += 1
        err = tmp_path / f"run-{runs}.stderr"
        with open(err, "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "eddyflow.cli.main", "run", str(JOB), "-p", "2",
                 "--restore", "latest"], env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        return proc, err

    kills = 0
    while kills < KILLS or (not left_prepared and kills < MAX_KILLS):
        before = _latest(chk)
        proc, err = start()
        deadline = time.monotonic() + 60
        while proc.poll() is None and _latest(chk) <= before and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        if kills >= KILLS - 1:
            # Between a sink's barrier and its checkpoint's completion its
            # transaction is prepared: kill then, for recovery to finish it.
            until = time.monotonic() + 5
            while proc.poll() is None and not _prepared(dsn) and time.monotonic() < until:
                time.sleep(0.002)
        if proc.poll() is not None:
            assert proc.wait() == 0, err.read_text(errors="replace")
            break  # finished before its kill
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL, err.read_text(errors="replace")
        kills += 1
        if _latest(chk) > before:
            effective += 1
        left_prepared += len(_prepared(dsn))

    proc, err = start()
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the final run did not finish in {RUN_TIMEOUT} s") from None
    assert rc == 0, err.read_text(errors="replace")
    # The kills did something: runs were cut after checkpoints, leaving
    # prepared transactions for the next run's recovery.
    assert effective >= 1, "no kill came after a checkpoint of its run"
    assert left_prepared >= 1, "no kill left a prepared transaction behind"

    expected_totals, expected_changes = _expected()
    with psycopg.connect(dsn) as conn:
        totals = sorted(conn.execute("SELECT customer, total FROM totals").fetchall())
        changes = conn.execute("SELECT id, customer, amount FROM changes").fetchall()
    duplicates = [row for row, n in Counter(changes).items() if n > 1]
    assert not duplicates, f"{len(duplicates)} orders written twice, e.g. {duplicates[:3]}"
    assert sorted(changes) == expected_changes
    assert totals == expected_totals
    assert _prepared(dsn) == []
    print(f"{len(changes):,} orders and {len(totals)} totals exactly once after {kills} "
          f"kills ({effective} after a checkpoint; {left_prepared} prepared transactions "
          "left behind for recovery)")
