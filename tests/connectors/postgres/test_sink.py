"""PostgresSink against a real server: upsert, delete and append semantics,
the two-phase commit's recovery (prepared transactions of completed
checkpoints committed, the job's others rolled back, other jobs' left
alone), exactly once across failures compared with a failure-free run, and
the one-line errors."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

import eddyflow as ef
from eddyflow.connectors.postgres import PostgresSink, PostgresSinkError
from eddyflow.connectors.postgres.server import TemporaryPostgres


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def _prepared(dsn: str) -> list[str]:
    return [g for (g,) in _rows(dsn, "SELECT gid FROM pg_prepared_xacts "
                                     "WHERE database = current_database()")]


@pytest.mark.parametrize("exactly_once", [True, False])
def test_upsert_inserts_updates_and_deletes_by_key(postgres_dsn: str, exactly_once: bool) -> None:
    _sql(postgres_dsn, "CREATE TABLE kv (k text, n int, v text, extra text DEFAULT 'x', "
                       "PRIMARY KEY (k, n))")
    records: list[Any] = [
        {"k": "a", "n": 1, "v": "first"},
        {"k": "b", "n": 1, "v": "b"},
        {"k": "a", "n": 1, "v": "second"},        # an update, in the same batch
        {"k": "c", "n": 2, "v": "gone soon"},
        {"__op": "d", "k": "c", "n": 2},           # a delete by key
        {"__op": "d", "k": "zz", "n": 9},          # a delete of nothing
        {"k": "d", "n": 3, "v": "deleted, then back"},
    ]
    later = [{"__op": "d", "k": "d", "n": 3}, {"k": "d", "n": 3, "v": "back"},
             {"k": "b", "n": 1, "v": "b2"}]
    env = ef.StreamEnvironment(parallelism=1, batch_size=3)
    env.from_collection(records + later).sink_to(
        PostgresSink(postgres_dsn, "kv", key=["k", "n"], exactly_once=exactly_once))
    env.execute("upsert")
    assert sorted(_rows(postgres_dsn, "SELECT k, n, v, extra FROM kv")) == [
        ("a", 1, "second", "x"), ("b", 1, "b2", "x"), ("d", 3, "back", "x")]
    assert _prepared(postgres_dsn) == []


def test_append_inserts_every_record_with_its_column_types(postgres_dsn: str) -> None:
    _sql(postgres_dsn, "CREATE TABLE events (id bigserial PRIMARY KEY, name text NOT NULL, "
                       "amount numeric(12, 2), at timestamptz, doc jsonb, tags text[], "
                       "meta json)")
    at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    records = [{"name": f"n{i}", "amount": Decimal(i) / 4, "at": at, "doc": {"i": i, "l": [i]},
                "tags": ["a", str(i)], "meta": [i]} for i in range(50)]
    records.append({"name": "nulls", "amount": None, "at": None, "doc": None, "tags": None,
                    "meta": None})
    same = {"name": "same", "amount": 1, "at": at, "doc": [], "tags": [], "meta": {}}
    records += [same, same]  # append: both
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    env.from_collection(records).sink_to(PostgresSink(postgres_dsn, "events", mode="append"))
    env.execute("append")
    got = _rows(postgres_dsn, "SELECT name, amount, at, doc, tags, meta FROM events "
                              "WHERE name LIKE 'n%' AND name <> 'nulls' ORDER BY id")
    assert sorted(got, key=lambda r: int(r[0][1:])) == [
        (f"n{i}", Decimal(i) / 4, at, {"i": i, "l": [i]}, ["a", str(i)], [i])
        for i in range(50)]
    assert _rows(postgres_dsn, "SELECT count(*) FROM events WHERE name = 'same'") == [(2,)]
    assert _rows(postgres_dsn, "SELECT amount, doc FROM events WHERE name = 'nulls'") == [
        (None, None)]


def _bind(sink: PostgresSink, job: str, uid: str) -> PostgresSink:
    bound = sink.for_job(job, uid)
    assert isinstance(bound, PostgresSink)
    return bound


async def _prepare(dsn: str, gid: str, value: int) -> list[Any]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("INSERT INTO t (id) VALUES (%s)", [value])
        cur = await conn.execute("SELECT pg_current_xact_id()::text")
        row = await cur.fetchone()
        assert row is not None
        await conn.execute(f"PREPARE TRANSACTION '{gid}'")
        return [gid, row[0]]


def test_recover_commits_the_restored_checkpoint_and_rolls_back_the_jobs_others(
        postgres_dsn: str) -> None:
    _sql(postgres_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    sink = _bind(PostgresSink(postgres_dsn, "t", key=["id"]), "orders job", "totals")
    other_uid = _bind(PostgresSink(postgres_dsn, "t", key=["id"]), "orders job", "totals2")
    other_job = _bind(PostgresSink(postgres_dsn, "t", key=["id"]), "orders", "job:totals")
    p = sink.gid_prefix()
    assert p == "eddyflow:orders%20job:totals:"

    async def scenario() -> None:
        done = await _prepare(postgres_dsn, f"{p}0:3", 1)       # checkpoint 3 completed
        await _prepare(postgres_dsn, f"{p}1:4", 2)              # 4 never completed
        await _prepare(postgres_dsn, f"{p}0:4", 3)
        await _prepare(postgres_dsn, f"{other_uid.gid_prefix()}0:4", 4)
        await _prepare(postgres_dsn, f"{other_job.gid_prefix()}0:4", 5)
        await sink.recover([done])
        await sink.recover([done])  # again (a restart that failed at once): a no-op
        await sink.commit([done])   # committed already: fine

    asyncio.run(scenario())
    assert _rows(postgres_dsn, "SELECT id FROM t") == [(1,)]
    assert sorted(_prepared(postgres_dsn)) == sorted(
        [f"{other_uid.gid_prefix()}0:4", f"{other_job.gid_prefix()}0:4"])
    _sql(postgres_dsn, *(f"ROLLBACK PREPARED '{g}'" for g in _prepared(postgres_dsn)))


def test_a_prepared_transaction_rolled_back_behind_the_jobs_back_is_an_error(
        postgres_dsn: str) -> None:
    _sql(postgres_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    sink = _bind(PostgresSink(postgres_dsn, "t", key=["id"]), "j", "s")

    async def scenario() -> None:
        c = await _prepare(postgres_dsn, f"{sink.gid_prefix()}0:1", 1)
        _sql(postgres_dsn, f"ROLLBACK PREPARED '{c[0]}'")
        await sink.commit([c])

    with pytest.raises(PostgresSinkError, match="was rolled back outside the job"):
        asyncio.run(scenario())


class Pace:
    """Identity, sleeping a millisecond every ``every`` records: several
    checkpoints happen before the failures."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.seen = 0

    def __call__(self, record: Any) -> Any:
        self.seen += 1
        if self.seen % self.every == 0:
            import time
            time.sleep(0.001)
        return record


ORDERS = 3000
CUSTOMERS = 37


def _orders() -> list[dict[str, Any]]:
    return [{"id": i, "customer": f"c{i % CUSTOMERS}", "amount": i % 11 - 3}
            for i in range(ORDERS)]


def _total(order: dict[str, Any], state: Any) -> tuple[Any, Any]:
    total = (state or 0) + order["amount"]
    if total < 0:  # a retraction: the customer's row goes while negative
        return {"__op": "d", "customer": order["customer"]}, total
    return {"customer": order["customer"], "total": total}, total


def _orders_job(env: ef.StreamEnvironment, dsn: str, failing: Any | None) -> None:
    orders = env.from_collection(_orders()).name("orders").map(Pace(16))
    if failing is not None:
        orders = orders.map(failing)
    orders.sink_to(PostgresSink(dsn, "changes", mode="append")).name("changes-out")
    (orders.key_by(lambda o: o["customer"]).map_with_state(_total).name("totals")
     .sink_to(PostgresSink(dsn, "totals", key=["customer"])).name("totals-out"))


def _tables(dsn: str) -> None:
    _sql(dsn, "CREATE TABLE changes (id int, customer text, amount int)",
         "CREATE TABLE totals (customer text PRIMARY KEY, total int)")


def _expected() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    totals: dict[str, int] = {}
    for o in _orders():
        totals[o["customer"]] = totals.get(o["customer"], 0) + o["amount"]
    return (sorted((c, t) for c, t in totals.items() if t >= 0),
            sorted((o["id"], o["customer"], o["amount"]) for o in _orders()))


@pytest.mark.parametrize("failure", ["records", "sink.before_commit"])
def test_exactly_once_across_failures_equals_a_failure_free_run(
        postgres: TemporaryPostgres, tmp_path: Path, failure: str) -> None:
    """``records``: a map fails twice, after checkpoints committed rows;
    ``sink.before_commit``: a checkpoint is complete but not committed when
    the job fails, and the restart's recover commits its prepared
    transactions."""
    clean = postgres.create_database(f"clean_{failure.replace('.', '_')}")
    _tables(clean)
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    _orders_job(env, clean, None)
    env.execute("orders")
    expected_totals, expected_changes = _expected()
    assert sorted(_rows(clean, "SELECT customer, total FROM totals")) == expected_totals
    assert sorted(_rows(clean, "SELECT * FROM changes")) == expected_changes

    dsn = postgres.create_database(f"failing_{failure.replace('.', '_')}")
    _tables(dsn)
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.enable_checkpointing(0.02, tmp_path / "chk")
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0))
    failing = None
    if failure == "records":
        failing = ef.testing.FailingMap(after=ORDERS // 3, times=2)
    else:
        ef.testing.arm(failure, after=2)
    try:
        _orders_job(env, dsn, failing)
        result = env.execute("orders")
    finally:
        ef.testing.disarm_all()
    assert result.restarts == 2 if failure == "records" else result.restarts == 1
    assert len(result.completed_checkpoints) >= 2
    assert sorted(_rows(dsn, "SELECT customer, total FROM totals")) == expected_totals
    changes = _rows(dsn, "SELECT * FROM changes")
    assert not [k for k, n in Counter(changes).items() if n > 1]  # no duplicates
    assert sorted(changes) == expected_changes
    assert _prepared(dsn) == []  # none of the job's left


def test_max_prepared_transactions_0_is_refused_naming_the_setting_and_the_alternative(
        tmp_path: Path) -> None:
    with TemporaryPostgres(settings={"max_prepared_transactions": "0"}) as pg:
        dsn = pg.create_database("no2pc")
        _sql(dsn, "CREATE TABLE totals (customer text PRIMARY KEY, total int)")
        env = ef.StreamEnvironment(parallelism=1)
        env.from_collection([{"customer": "a", "total": 1}]).sink_to(
            PostgresSink(dsn, "totals", key=["customer"]))
        with pytest.raises(PostgresSinkError) as err:
            env.execute("no-2pc")
        msg = str(err.value)
        assert "max_prepared_transactions = 0" in msg
        assert 'exactly_once=False (with mode="upsert"' in msg and "\n" not in msg
        # The alternative it names works on that server.
        env = ef.StreamEnvironment(parallelism=1)
        env.from_collection([{"customer": "a", "total": 1}]).sink_to(
            PostgresSink(dsn, "totals", key=["customer"], exactly_once=False))
        env.execute("idempotent")
        assert _rows(dsn, "SELECT * FROM totals") == [("a", 1)]


def _run(dsn: str, records: list[Any], sink: PostgresSink) -> None:
    env = ef.StreamEnvironment(parallelism=1)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=0, delay=0))
    env.from_collection(records).sink_to(sink)
    env.execute("errors")


def _error(dsn: str, records: list[Any], sink: PostgresSink) -> str:
    with pytest.raises(Exception) as err:
        _run(dsn, records, sink)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_one_line_errors(postgres_dsn: str) -> None:
    _sql(postgres_dsn, "CREATE TABLE totals (customer text PRIMARY KEY, total int NOT NULL, "
                       "note text DEFAULT '')",
         "CREATE TABLE nokey (customer text, total int)")
    ok = {"customer": "a", "total": 1}
    msg = _error(postgres_dsn, [ok], PostgresSink(postgres_dsn, "public.missing", key=["id"]))
    assert "PostgresSink(public.missing): table public.missing does not exist" in msg
    msg = _error(postgres_dsn, [ok], PostgresSink(postgres_dsn, "nokey", key=["customer"]))
    assert "table nokey has no primary key or unique constraint on (customer)" in msg
    msg = _error(postgres_dsn, [ok], PostgresSink(postgres_dsn, "totals", key=["id"]))
    assert "key column 'id' is not a column of table totals" in msg
    msg = _error(postgres_dsn, [{**ok, "colour": "red"}],
                 PostgresSink(postgres_dsn, "totals", key=["customer"]))
    assert "has column 'colour', which table totals lacks" in msg
    msg = _error(postgres_dsn, [{"customer": "a"}],
                 PostgresSink(postgres_dsn, "totals", key=["customer"]))
    assert "lacks column 'total' of table totals (it has no default)" in msg
    msg = _error(postgres_dsn, [{"total": 3}],
                 PostgresSink(postgres_dsn, "totals", key=["customer"]))
    assert "lacks key column 'customer' of table totals" in msg
    msg = _error(postgres_dsn, [{"customer": "a"}],
                 PostgresSink(postgres_dsn, "totals", mode="append"))
    assert "lacks column 'total' of table totals" in msg
    msg = _error(postgres_dsn, [("a", 1)], PostgresSink(postgres_dsn, "totals", mode="append"))
    assert "a record must be a dict of column -> value, got ('a', 1)" in msg
    msg = _error(postgres_dsn, [{"customer": "a", "total": "many"}],
                 PostgresSink(postgres_dsn, "totals", key=["customer"]))
    assert "PostgresSink(totals)" in msg and "invalid input syntax for type integer" in msg
    refused = "postgresql://app:s3cret@127.0.0.1:1/shop"
    msg = _error(refused, [ok], PostgresSink(refused, "totals", key=["customer"]))
    assert "PostgresSink(totals): cannot connect to postgresql://app@127.0.0.1:1/shop" in msg
    assert "s3cret" not in msg and "Connection refused" in msg
    with pytest.raises(ValueError, match="needs key"):
        PostgresSink(postgres_dsn, "totals")
    with pytest.raises(ValueError, match="mode must be"):
        PostgresSink(postgres_dsn, "totals", mode="merge", key=["customer"])
    assert json.loads(json.dumps(_prepared(postgres_dsn))) == []


def test_a_write_waiting_on_an_uncommitted_prepared_transaction_fails_after_lock_timeout(
        postgres_dsn: str) -> None:
    """What a checkpoint aborted after the sink's barrier leaves: its
    transaction prepared, holding the row, which the next write of the
    same key waits for; after ``lock_timeout`` the write fails (the job's
    restart then rolls that transaction back) instead of waiting for ever."""
    _sql(postgres_dsn, "CREATE TABLE totals (customer text PRIMARY KEY, total int)")
    sink = _bind(PostgresSink(postgres_dsn, "totals", key=["customer"], lock_timeout=0.2),
                 "j", "totals")

    async def scenario() -> None:
        await sink.recover([])
        writer = sink.create_writer(0, 1)
        try:
            await writer.write([{"customer": "a", "total": 1}])
            prepared = await writer.prepare_commit(1)  # checkpoint 1: never completes
            assert prepared is not None and prepared[0] == f"{sink.gid_prefix()}0:1"
            await writer.write([{"customer": "a", "total": 2}])
        finally:
            await writer.abort()
        await sink.recover([])  # the restart: rolled back

    with pytest.raises(PostgresSinkError, match=r"waited more than lock_timeout=0\.2 s"):
        asyncio.run(scenario())
    assert _prepared(postgres_dsn) != []  # the scenario stopped at the failure
    asyncio.run(sink.recover([]))
    assert _prepared(postgres_dsn) == []
    assert _rows(postgres_dsn, "SELECT * FROM totals") == []


def test_upsert_keeps_the_values_of_every_column_type(postgres_dsn: str) -> None:
    """A batch goes as JSON (jsonb_to_recordset) when ``json.dumps`` can
    carry its values, else as arrays (bytes, a NaN): the rows read back the
    same either way; a column of an array type goes through ``VALUES``."""
    _sql(postgres_dsn, "CREATE TABLE typed (k int PRIMARY KEY, amount numeric(12, 2), "
                       "at timestamptz, day date, doc jsonb, note text, raw bytea, f float8)",
         "CREATE TABLE tagged (k int PRIMARY KEY, tags text[])")
    at = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)

    def row(k: int, **extra: Any) -> dict[str, Any]:
        return {"k": k, "amount": Decimal("1.25") * k, "at": at, "day": at.date(),
                "doc": {"k": [k, None]}, "note": f"n'{k}\"\\", "raw": None, "f": 0.5, **extra}

    records = [row(1), row(2, doc=None, note=None),                # as JSON
               row(3, raw=b"\x00\xff"), row(4),                    # bytes: as arrays
               row(5, f=float("nan")), row(6, f=float("inf")),     # as arrays
               row(1, amount=Decimal("9.99"))]                     # an update
    env = ef.StreamEnvironment(parallelism=1, batch_size=2)
    env.from_collection(records).sink_to(PostgresSink(postgres_dsn, "typed", key=["k"]))
    env.from_collection([{"k": 1, "tags": ["a", "b"]}, {"k": 1, "tags": ["c"]},
                         {"k": 2, "tags": None}]).name("tags").sink_to(
        PostgresSink(postgres_dsn, "tagged", key=["k"]))
    env.execute("typed")
    got = {r[0]: r[1:] for r in _rows(postgres_dsn, "SELECT * FROM typed")}
    want = {r["k"]: (r["amount"], r["at"], r["day"], r["doc"], r["note"], r["raw"], r["f"])
            for r in records}
    nan = got[5][-1]
    assert nan != nan  # NaN
    del got[5], want[5]
    assert got == want
    assert sorted(_rows(postgres_dsn, "SELECT * FROM tagged")) == [(1, ["c"]), (2, None)]
