"""PostgresCdcSource's errors: one line naming the setting, table,
publication, role or slot at fault, raised as the job's failure."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import psycopg
import pytest
from cdc_support import cdc_position, run_cdc, sql, wal_lsn

import eddyflow as ef
from eddyflow.connectors.postgres import PostgresCdcSource
from eddyflow.connectors.postgres.server import TemporaryPostgres


def failure(src: PostgresCdcSource, **kw: object) -> str:
    with pytest.raises(ef.JobFailed) as info:
        run_cdc(src, **kw)  # type: ignore[arg-type]
    return str(info.value)


def test_wal_level_not_logical(postgres: TemporaryPostgres) -> None:
    with TemporaryPostgres(settings={"wal_level": "replica"}) as other:
        dsn = other.create_database("replica_only")
        sql(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
        msg = failure(PostgresCdcSource(dsn, ["t"], slot="s"))
    assert "wal_level is 'replica'" in msg and "wal_level = logical" in msg


def test_missing_table(postgres_dsn: str) -> None:
    msg = failure(PostgresCdcSource(postgres_dsn, ["public.nope"], slot="s"))
    assert "table 'public.nope' does not exist" in msg


def test_missing_publication(postgres_dsn: str) -> None:
    sql(postgres_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    msg = failure(PostgresCdcSource(postgres_dsn, ["t"], slot="s", publication="pub"))
    assert "publication 'pub' does not exist" in msg
    sql(postgres_dsn, "CREATE TABLE u (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE u")
    msg = failure(PostgresCdcSource(postgres_dsn, ["t"], slot="s", publication="pub"))
    assert "publication 'pub' does not include table(s) t" in msg


def test_missing_privileges(postgres_dsn: str) -> None:
    sql(postgres_dsn, "CREATE TABLE t (id int PRIMARY KEY)",
        "DO $$ BEGIN CREATE ROLE cdc_plain LOGIN; EXCEPTION WHEN duplicate_object THEN END $$",
        "DO $$ BEGIN CREATE ROLE cdc_repl LOGIN REPLICATION; "
        "EXCEPTION WHEN duplicate_object THEN END $$",
        "GRANT SELECT ON t TO cdc_plain, cdc_repl")
    as_plain = re.sub(r"//\w+@", "//cdc_plain@", postgres_dsn)
    msg = failure(PostgresCdcSource(as_plain, ["t"], slot="s"))
    assert "role 'cdc_plain' lacks the REPLICATION attribute" in msg
    as_repl = re.sub(r"//\w+@", "//cdc_repl@", postgres_dsn)
    msg = failure(PostgresCdcSource(as_repl, ["t"], slot="s"))
    assert "role 'cdc_repl' does not own table 'public.t'" in msg and "publication=" in msg


def test_slot_held_by_another_reader(postgres_dsn: str) -> None:
    sql(postgres_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    src = PostgresCdcSource(postgres_dsn, ["t"], slot="held", snapshot=False, until_lsn=0,
                            slot_wait=0.2)
    run_cdc(src)
    other = psycopg.connect(postgres_dsn, autocommit=True, replication="database")
    try:
        other.pgconn.send_query(b"START_REPLICATION SLOT held LOGICAL 0/0 "
                                b"(proto_version '1', publication_names 'held')")
        pid = None
        while pid is None:
            pid = sql(postgres_dsn, "SELECT active_pid FROM pg_replication_slots "
                                    "WHERE slot_name = 'held'")[0][0]
        msg = failure(src)
    finally:
        other.pgconn.finish()
    assert f"replication slot 'held' is in use by server process {pid}" in msg


@pytest.mark.parametrize("how", ["dropped", "advanced"])
def test_restore_needing_wal_the_server_no_longer_keeps(postgres_dsn: str, tmp_path: Path,
                                                        how: str) -> None:
    sql(postgres_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    src = PostgresCdcSource(postgres_dsn, ["t"], slot="gone", snapshot=False, until_lsn=0)
    run_cdc(src)
    before = wal_lsn(postgres_dsn)
    sql(postgres_dsn, "INSERT INTO t VALUES (1)")
    chk = tmp_path / "chk"
    # A checkpoint taken while the job runs, past the insert: its split is
    # open, so a restore from it opens the slot at its LSN. (The final
    # checkpoint's split is read to its end, and a restore does not open
    # it again; on a loaded machine the job could read the insert and end
    # before any periodic checkpoint.) The job ends once one is taken.
    src.until_lsn = None
    out: list[list[dict[str, object]]] = []
    job = threading.Thread(target=lambda: out.append(run_cdc(src, chk=chk)))
    job.start()
    try:
        deadline = time.monotonic() + 120
        while (first := _past(chk, before)) is None:
            assert job.is_alive() and time.monotonic() < deadline, "no checkpoint past the insert"
            time.sleep(0.02)
    finally:
        src.until_lsn = wal_lsn(postgres_dsn)
        job.join(120)
    assert [len(o) for o in out] == [1]
    if how == "dropped":
        sql(postgres_dsn, "SELECT pg_drop_replication_slot('gone')")
        expected = r"at the checkpoint's LSN [0-9A-F]+/[0-9A-F]+: replication slot 'gone' " \
                   r"does not exist"
    else:
        # Flushed at once: the slot cannot be advanced past the flushed WAL.
        sql(postgres_dsn, "SET synchronous_commit = on", "INSERT INTO t VALUES (2)")
        sql(postgres_dsn,
            "SELECT pg_replication_slot_advance('gone', pg_current_wal_insert_lsn())")
        expected = r"at the checkpoint's LSN [0-9A-F]+/[0-9A-F]+: replication slot 'gone' " \
                   r"is at [0-9A-F]+/[0-9A-F]+, past it"
    msg = failure(src, chk=chk, restore=str(first))
    assert re.search(expected, msg), msg


def _past(chk: Path, lsn: int) -> Path | None:
    """A completed checkpoint whose CDC position is past ``lsn``, if any."""
    for c in ef.list_checkpoints(chk) if chk.exists() else []:
        try:
            position = cdc_position(chk, c.id)["lsn"]
        except OSError:  # removed meanwhile
            continue
        if position is not None and position > lsn:
            return Path(c.path)
    return None


def test_snapshot_of_a_table_without_primary_key(postgres_dsn: str) -> None:
    sql(postgres_dsn, "CREATE TABLE nokey (v int)")
    msg = failure(PostgresCdcSource(postgres_dsn, ["nokey"], slot="nokey"))
    assert "table 'public.nokey' has no primary key" in msg and "snapshot=False" in msg
    # Its changes stream without a snapshot (a delete's before-image needs
    # REPLICA IDENTITY FULL without a key).
    sql(postgres_dsn, "ALTER TABLE nokey REPLICA IDENTITY FULL")
    src = PostgresCdcSource(postgres_dsn, ["nokey"], slot="nokey", snapshot=False, until_lsn=0)
    run_cdc(src)
    sql(postgres_dsn, "INSERT INTO nokey VALUES (1)", "DELETE FROM nokey")
    src.until_lsn = wal_lsn(postgres_dsn)
    assert [(r["op"], r["before"], r["after"]) for r in run_cdc(src)] == [
        ("c", None, {"v": 1}), ("d", {"v": 1}, None)]
