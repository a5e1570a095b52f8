"""PostgresCdcSource: values as Python values of their column types, and the
envelopes of inserts, updates, deletes and truncates."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from pathlib import Path

from cdc_support import cdc_position, run_cdc, sql, wal_lsn

import eddyflow as ef
from eddyflow.connectors.postgres import PostgresCdcSource

TYPES = """CREATE TABLE public.typed (
    id bigint PRIMARY KEY, i int, s smallint, n numeric(12, 3), f double precision,
    r real, b boolean, t text, v varchar(10), ts timestamp, tz timestamptz, d date,
    tm time, by bytea, u uuid, j json, jb jsonb, ai int[], at text[], iv interval)"""

ROW = ("1, 7, 3, 12.345, 1.5, 0.25, true, 'héllo', 'v', '2024-01-02 03:04:05.123456', "
       "'2024-01-02 03:04:05+02', '2024-01-02', '12:34:56', '\\x00ff', "
       "'0b9a6c1e-4f0e-4d8a-9a46-0c4c7a4a1b2c', '{\"a\": [1, 2]}', '{\"b\": null}', "
       "'{1,2,3}', '{x,\"y z\"}', '1 day 02:00:00'")


def expected_row() -> dict[str, object]:
    return {
        "id": 1, "i": 7, "s": 3, "n": Decimal("12.345"), "f": 1.5, "r": 0.25, "b": True,
        "t": "héllo", "v": "v", "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
        "tz": dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=dt.UTC),
        "d": dt.date(2024, 1, 2), "tm": dt.time(12, 34, 56), "by": b"\x00\xff",
        "u": uuid.UUID("0b9a6c1e-4f0e-4d8a-9a46-0c4c7a4a1b2c"), "j": {"a": [1, 2]},
        "jb": {"b": None}, "ai": [1, 2, 3], "at": ["x", "y z"],
        "iv": dt.timedelta(days=1, hours=2)}


def test_types_decoded_alike_by_snapshot_and_stream(postgres_dsn: str) -> None:
    sql(postgres_dsn, TYPES, f"INSERT INTO typed VALUES ({ROW})")
    src = PostgresCdcSource(postgres_dsn, ["public.typed"], slot="typed", until_lsn=0)
    # The snapshot: the row as read; then the stream: the same row inserted again.
    first = run_cdc(src)
    assert [r["op"] for r in first] == ["r"]
    assert first[0]["after"] == expected_row()
    sql(postgres_dsn, "DELETE FROM typed", f"INSERT INTO typed VALUES ({ROW})")
    until = wal_lsn(postgres_dsn)
    src = PostgresCdcSource(postgres_dsn, ["public.typed"], slot="typed2", snapshot=False,
                            publication="typed", until_lsn=0)
    assert run_cdc(src) == []  # creates the slot
    sql(postgres_dsn, "UPDATE typed SET i = 8")
    src.until_lsn = wal_lsn(postgres_dsn)
    got = run_cdc(src)
    assert [r["op"] for r in got] == ["u"]
    assert got[0]["after"] == {**expected_row(), "i": 8}
    assert got[0]["before"] == {"id": 1}
    assert isinstance(got[0]["commit_time"], float)
    assert got[0]["lsn"] > until


def test_insert_update_delete_truncate_envelopes(postgres_dsn: str) -> None:
    sql(postgres_dsn, "CREATE TABLE public.a (id int PRIMARY KEY, v text)",
        "CREATE TABLE public.full_rows (id int PRIMARY KEY, v text, w int)",
        "ALTER TABLE full_rows REPLICA IDENTITY FULL")
    src = PostgresCdcSource(postgres_dsn, ["public.a", "full_rows"], slot="env",
                            snapshot=False, until_lsn=0)
    assert run_cdc(src) == []  # creates the publication and the slot
    sql(postgres_dsn,
        "INSERT INTO a VALUES (1, 'x'), (2, 'y')", "UPDATE a SET v = 'z' WHERE id = 1",
        "UPDATE a SET id = 3 WHERE id = 2", "DELETE FROM a WHERE id = 1",
        "INSERT INTO full_rows VALUES (1, 'p', 10)", "UPDATE full_rows SET w = 11",
        "DELETE FROM full_rows", "TRUNCATE a")
    src.until_lsn = wal_lsn(postgres_dsn)
    got = [(r["op"], r["table"], r["before"], r["after"]) for r in run_cdc(src)]
    assert got == [
        ("c", "public.a", None, {"id": 1, "v": "x"}),
        ("c", "public.a", None, {"id": 2, "v": "y"}),
        ("u", "public.a", {"id": 1}, {"id": 1, "v": "z"}),
        ("u", "public.a", {"id": 2}, {"id": 3, "v": "y"}),
        ("d", "public.a", {"id": 1}, None),
        ("c", "public.full_rows", None, {"id": 1, "v": "p", "w": 10}),
        ("u", "public.full_rows", {"id": 1, "v": "p", "w": 10}, {"id": 1, "v": "p", "w": 11}),
        ("d", "public.full_rows", {"id": 1, "v": "p", "w": 11}, None),
        ("t", "public.a", None, None),
    ]


def test_restores_inside_large_transactions_emit_each_change_once(postgres_dsn: str,
                                                                  tmp_path: Path) -> None:
    # Read 7 records at a time, checkpoints fall inside transactions of
    # 2,000 changes: a restore resumes at such a transaction's commit and
    # skips the changes of it that were emitted already.
    sql(postgres_dsn, "CREATE TABLE big (id int PRIMARY KEY, v int)")
    src = PostgresCdcSource(postgres_dsn, ["big"], slot="big", snapshot=False, until_lsn=0)
    run_cdc(src)
    for start in range(0, 10_000, 2_000):
        sql(postgres_dsn, f"INSERT INTO big SELECT g, 0 FROM generate_series({start}, "
                          f"{start + 1_999}) g")
    sql(postgres_dsn, "UPDATE big SET v = 1 WHERE id % 3 = 0")
    src.until_lsn = wal_lsn(postgres_dsn)
    fail = ef.testing.FailingMap(after=2_900, times=4)
    got = run_cdc(src, chk=tmp_path / "chk", fail=fail, batch_size=7)
    assert fail.failures == 4
    changes = [(r["op"], r["after"]["id"], r["lsn"]) for r in got]
    assert len(changes) == len(set(changes)) == 10_000 + 3_334
    assert sorted(i for op, i, _ in changes if op == "c") == list(range(10_000))
    skips = [cdc_position(tmp_path / "chk", c.id)["skip"]
             for c in ef.list_checkpoints(tmp_path / "chk")]
    assert any(skips), "no checkpoint fell inside a transaction"
