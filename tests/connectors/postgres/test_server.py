"""The temporary PostgreSQL server the connector's tests run against."""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg

from eddyflow.connectors.postgres.server import TemporaryPostgres


def test_server_is_configured_for_the_connector(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn) as conn:
        settings = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('wal_level', 'max_prepared_transactions', 'max_replication_slots', "
            "'listen_addresses')").fetchall())
    assert settings["wal_level"] == "logical"
    assert int(settings["max_prepared_transactions"]) > 0
    assert int(settings["max_replication_slots"]) > 0
    assert settings["listen_addresses"] == "127.0.0.1"


def test_each_test_gets_its_own_database(postgres_dsn: str, postgres: TemporaryPostgres) -> None:
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        name = conn.execute("SELECT current_database()").fetchone()
    assert name is not None and name[0].startswith("test_")
    assert postgres_dsn != postgres.dsn()


def _postgres_pids() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "eddyflow-pg-" in line]


def test_a_killed_caller_takes_its_server_along() -> None:
    # A test run killed with SIGKILL must not leave a server behind.
    caller = subprocess.Popen(
        [sys.executable, "-c",
         "import signal\n"
         "from eddyflow.connectors.postgres.server import TemporaryPostgres\n"
         "s = TemporaryPostgres().start()\n"
         "print(s.folder, flush=True)\n"
         "signal.pause()\n"],
        stdout=subprocess.PIPE, text=True)
    assert caller.stdout is not None
    folder = caller.stdout.readline().strip()
    assert any(folder in line for line in _postgres_pids())
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 10
    while any(folder in line for line in _postgres_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(folder in line for line in _postgres_pids())


def test_stop_leaves_nothing_running() -> None:
    server = TemporaryPostgres().start()
    folder = str(server.folder)
    server.stop()
    assert not any(folder in line for line in _postgres_pids())
