"""PostgresCdcSource's initial snapshot: read in key-ordered chunks while
transactions change the table, every row once, followed by exactly the
changes its chunk did not see; a restore resumes where the checkpoint was."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import psycopg
from cdc_support import run_cdc, sql, wal_lsn

import eddyflow as ef
from eddyflow.connectors.postgres import PostgresCdcSource
from eddyflow.connectors.postgres.cdc_snapshot import PgSnapshot

ROWS = 6_000


def replay(records: list[dict[str, Any]], table: str) -> dict[Any, dict[str, Any]]:
    """The table the envelopes describe; fails on a change that does not fit
    the history before it (an insert of a present key, an update or delete of
    an absent one, a second read of a key)."""
    rows: dict[Any, dict[str, Any]] = {}
    read: set[Any] = set()
    for r in records:
        if r["table"] != table:
            continue
        op, before, after = r["op"], r["before"], r["after"]
        if op == "t":
            rows.clear()
            read.clear()
        elif op == "r":
            assert after["id"] not in read, f"row {after['id']} read twice"
            assert after["id"] not in rows, f"row {after['id']} read while present: {r}"
            read.add(after["id"])
            rows[after["id"]] = after
        elif op == "c":
            assert after["id"] not in rows, f"insert of a present row: {r}"
            rows[after["id"]] = after
        elif op == "u":
            assert before["id"] in rows, f"update of an absent row: {r}"
            del rows[before["id"]]
            assert after["id"] not in rows, f"update onto a present row: {r}"
            rows[after["id"]] = after
        else:
            assert op == "d" and before["id"] in rows, f"delete of an absent row: {r}"
            del rows[before["id"]]
    return rows


def workload(dsn: str, stop: threading.Event, seed: int, done: list[int]) -> None:
    """Random single- and multi-row transactions until ``stop``."""
    rnd = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_id = ROWS * 10
        while not stop.is_set():
            with conn.transaction():
                for _ in range(rnd.randint(1, 4)):
                    what = rnd.random()
                    k = rnd.randrange(ROWS * 2)
                    if what < 0.4:
                        conn.execute("UPDATE t SET v = v + 1 WHERE id = %s", (k,))
                    elif what < 0.6:
                        conn.execute("DELETE FROM t WHERE id = %s", (k,))
                    elif what < 0.9:
                        next_id += 1
                        conn.execute("INSERT INTO t VALUES (%s, 0) ON CONFLICT DO NOTHING",
                                     (rnd.choice([k, next_id]),))
                    else:  # a key moves
                        next_id += 1
                        conn.execute("UPDATE t SET id = %s WHERE id = %s", (next_id, k))
        done.append(next_id)


def table_rows(dsn: str) -> dict[Any, dict[str, Any]]:
    return {r[0]: {"id": r[0], "v": r[1]} for r in sql(dsn, "SELECT id, v FROM t")}


def setup(dsn: str) -> None:
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)",
        f"INSERT INTO t SELECT g * 2, 0 FROM generate_series(0, {ROWS - 1}) g")


def run_with_workload(dsn: str, src: PostgresCdcSource, **kw: Any) -> list[dict[str, Any]]:
    stop = threading.Event()
    done: list[int] = []
    worker = threading.Thread(target=workload, args=(dsn, stop, 7, done))
    result: list[list[dict[str, Any]]] = []
    job = threading.Thread(target=lambda: result.append(run_cdc(src, **kw)))
    worker.start()
    job.start()
    # Stop writing once the snapshot is half read, then let the job catch up.
    while sum(n for _, _, n in src.chunks_read) < ROWS // 2 and job.is_alive():
        job.join(0.01)
    stop.set()
    worker.join()
    src.until_lsn = wal_lsn(dsn)
    job.join(120)
    assert not job.is_alive() and result, "the CDC job did not end"
    return result[0]


def test_snapshot_under_concurrent_writes_reads_each_row_once(postgres_dsn: str) -> None:
    setup(postgres_dsn)
    src = PostgresCdcSource(postgres_dsn, ["public.t"], slot="snap", chunk_size=97)
    records = run_with_workload(postgres_dsn, src)
    assert replay(records, "public.t") == table_rows(postgres_dsn)
    assert any(r["op"] != "r" for r in records), "no change was streamed during the snapshot"
    ops = [r["op"] for r in records]
    assert ops.count("r") <= ROWS * 2


def test_restore_resumes_the_snapshot_without_rereading_chunks(postgres_dsn: str,
                                                                tmp_path: Path) -> None:
    setup(postgres_dsn)
    src = PostgresCdcSource(postgres_dsn, ["public.t"], slot="resume", chunk_size=50)
    fail = ef.testing.FailingMap(after=ROWS // 3, times=2)
    records = run_with_workload(postgres_dsn, src, chk=tmp_path / "chk", fail=fail)
    assert fail.failures == 2
    assert replay(records, "public.t") == table_rows(postgres_dsn)
    # Restarts continue the snapshot from the restored checkpoint: a chunk
    # read after a restart starts after a key of the table, not at its start,
    # and only the chunks read between that checkpoint and the failure
    # (a few checkpoint intervals) are read again.
    starts = [after for _, after, _ in src.chunks_read]
    assert starts.count(None) == 1, "a restore read the table from its start again"
    rows_read = sum(n for _, _, n in src.chunks_read)
    distinct = len({tuple(a) if a else None for a in starts})
    assert len(starts) - distinct <= 2 * 40, (len(starts), distinct)
    assert rows_read < ROWS * 1.5, rows_read


def test_visibility_of_stream_xids_across_the_epoch() -> None:
    snap = PgSnapshot.parse("100:105:101,103")
    assert [snap.visible(x) for x in (99, 100, 101, 102, 103, 104, 105, 900)] == \
        [True, True, False, True, False, True, False, False]
    # xmax just past an epoch boundary: 32-bit xids before it are older.
    epoch = 1 << 32
    snap = PgSnapshot.parse(f"{epoch - 3}:{epoch + 2}:{epoch - 1}")
    assert snap.visible((epoch - 5) & 0xFFFFFFFF)
    assert snap.visible((epoch - 2) & 0xFFFFFFFF)
    assert not snap.visible((epoch - 1) & 0xFFFFFFFF)
    assert snap.visible(1)
    assert not snap.visible(2)
    assert not snap.visible(7)


def test_truncate_during_the_snapshot_reads_the_table_again(postgres_dsn: str) -> None:
    setup(postgres_dsn)
    src = PostgresCdcSource(postgres_dsn, ["public.t"], slot="trunc", chunk_size=200)
    result: list[list[dict[str, Any]]] = []
    job = threading.Thread(target=lambda: result.append(run_cdc(src)))
    job.start()
    while len(src.chunks_read) < 5 and job.is_alive():
        job.join(0.005)
    # Mid-snapshot: the table emptied and refilled in one transaction, then changed.
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("TRUNCATE t")
            conn.execute("INSERT INTO t SELECT g, 1 FROM generate_series(1, 500) g")
        conn.execute("UPDATE t SET v = 2 WHERE id <= 100")
        conn.execute("DELETE FROM t WHERE id > 450")
    src.until_lsn = wal_lsn(postgres_dsn)
    job.join(120)
    assert not job.is_alive() and result
    records = result[0]
    assert "t" in [r["op"] for r in records], "the truncate came after the snapshot"
    assert replay(records, "public.t") == table_rows(postgres_dsn)
