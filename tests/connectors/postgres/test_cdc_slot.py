"""PostgresCdcSource acknowledges a position to its replication slot only
once a checkpoint holding it completes: the slot's confirmed_flush_lsn never
passes the newest completed checkpoint's position, and follows it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from cdc_support import cdc_position, confirmed_flush, run_cdc, sql, wal_lsn

import eddyflow as ef
from eddyflow.connectors.postgres import PostgresCdcSource


def checkpointed_lsns(chk: Path) -> list[int]:
    """The WAL position each completed checkpoint holds for the source."""
    if not chk.exists():
        return []
    out = []
    for c in ef.list_checkpoints(chk):
        pos = cdc_position(chk, c.id)
        if pos["lsn"] is not None:
            out.append(pos["lsn"])
    return out


def test_without_checkpoints_the_slot_stays(postgres_dsn: str) -> None:
    sql(postgres_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    src = PostgresCdcSource(postgres_dsn, ["t"], slot="stay", snapshot=False, until_lsn=0)
    run_cdc(src)
    start = confirmed_flush(postgres_dsn, "stay")
    sql(postgres_dsn, "INSERT INTO t SELECT generate_series(1, 100)")
    src.until_lsn = wal_lsn(postgres_dsn)
    assert len(run_cdc(src)) == 100
    assert confirmed_flush(postgres_dsn, "stay") == start


def test_slot_follows_completed_checkpoints(postgres_dsn: str, tmp_path: Path) -> None:
    sql(postgres_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    chk = tmp_path / "chk"
    src = PostgresCdcSource(postgres_dsn, ["t"], slot="follow", snapshot=False, until_lsn=0)
    run_cdc(src)
    start = confirmed_flush(postgres_dsn, "follow")
    src.until_lsn = None
    result: list[list[dict[str, Any]]] = []
    job = threading.Thread(target=lambda: result.append(run_cdc(src, chk=chk)))
    job.start()
    seen = [start]
    try:
        for batch in range(5):
            sql(postgres_dsn, f"INSERT INTO t SELECT generate_series({batch * 100 + 1}, "
                              f"{batch * 100 + 100})")
            written = wal_lsn(postgres_dsn)
            deadline = time.monotonic() + 60
            while True:
                confirmed = confirmed_flush(postgres_dsn, "follow")
                done = checkpointed_lsns(chk)  # read after: a superset of those then complete
                # Never past the newest completed checkpoint's position.
                assert confirmed == start or confirmed in done, (confirmed, done)
                assert confirmed <= max(done, default=start)
                if confirmed >= written:
                    break
                assert time.monotonic() < deadline, "the slot did not follow the checkpoints"
                time.sleep(0.02)
            seen.append(confirmed)
    finally:
        src.until_lsn = wal_lsn(postgres_dsn)
        job.join(60)
    assert not job.is_alive()
    assert seen == sorted(seen) and len(set(seen)) == len(seen), seen
    assert sorted(r["after"]["id"] for r in result[0]) == list(range(1, 501))
