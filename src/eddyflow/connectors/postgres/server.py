"""A private, temporary PostgreSQL server from the PostgreSQL installed on this
machine: for tests, benchmarks and the examples that run with one command.

``TemporaryPostgres()`` runs ``initdb`` in a temporary folder and starts
``postgres`` on 127.0.0.1 at a free port, configured for what the connector
needs (``wal_level=logical``, prepared transactions, replication slots).
``stop()`` shuts the server down, waits for it and removes the folder:
nothing is left running. The server is also told to quit when the process
that started it dies (``PR_SET_PDEATHSIG``), so a test run killed with
SIGKILL takes its server with it.

PostgreSQL refuses to run as root; as root, the server runs as the
``postgres`` user that the Debian packages create (or ``EDDYFLOW_PG_USER``).

Command line: ``python -m eddyflow.connectors.postgres.server`` starts one
and prints its DSN until interrupted.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

__all__ = ["PostgresNotInstalled", "TemporaryPostgres", "find_postgres_bin"]

#: Settings for a server the connector's tests and examples can use: logical
#: decoding, two-phase commit, a few slots. Durability is traded for speed
#: (``fsync=off``): the server is thrown away after use; a crash of the
#: *job* (what the tests inject) does not depend on it.
DEFAULT_SETTINGS: Mapping[str, str] = {
    "listen_addresses": "127.0.0.1",
    "wal_level": "logical",
    "max_prepared_transactions": "64",
    "max_replication_slots": "32",
    "max_wal_senders": "32",
    "max_connections": "200",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "log_min_messages": "warning",
}


class PostgresNotInstalled(RuntimeError):
    """No PostgreSQL server binaries (``initdb``, ``postgres``) were found."""


def find_postgres_bin() -> Path:
    """The folder holding ``initdb`` and ``postgres``: ``EDDYFLOW_PG_BIN``, the
    ``PATH``, or the newest ``/usr/lib/postgresql/<version>/bin``."""
    configured = os.environ.get("EDDYFLOW_PG_BIN")
    if configured:
        return Path(configured)
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(os.path.realpath(on_path)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parent.parent.name)
                        if Path(p).parent.parent.name.isdigit() else 0)
    if candidates:
        return Path(candidates[-1]).parent
    raise PostgresNotInstalled(
        "no PostgreSQL server installed (initdb not on PATH nor in /usr/lib/postgresql/*/bin; "
        "set EDDYFLOW_PG_BIN to its bin folder)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    # Runs in the child between fork and exec (after the user switch, which
    # would clear it): the server gets SIGQUIT, PostgreSQL's immediate
    # shutdown, when the process that started it dies.
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGQUIT, 0, 0, 0)


class TemporaryPostgres:
    """A PostgreSQL server of its own in a temporary folder (see the module docstring).

    Use it as a context manager, or call :meth:`start` and :meth:`stop`.
    ``settings`` are added to (and override) :data:`DEFAULT_SETTINGS`.
    """

    def __init__(self, *, settings: Mapping[str, str] | None = None,
                 port: int | None = None, startup_timeout: float = 30.0) -> None:
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.port = port or _free_port()
        self.startup_timeout = startup_timeout
        self.user = "postgres"
        self._folder: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while the server runs."""
        return self._process.pid if self._process is not None else None

    @property
    def folder(self) -> Path:
        """The server's temporary folder (data, socket and log)."""
        if self._folder is None:
            raise RuntimeError("the server is not started")
        return self._folder

    def dsn(self, database: str = "postgres") -> str:
        """A libpq connection URI for ``database`` as the superuser."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its DSN."""
        import psycopg  # the connector's dependency; the launcher itself needs none

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.dsn(name)

    @staticmethod
    def _remove_orphans() -> None:
        # A caller killed with SIGKILL takes its server along (PDEATHSIG) but
        # cannot remove the folder: remove folders of servers no longer running.
        for folder in glob.glob(os.path.join(tempfile.gettempdir(), "eddyflow-pg-*")):
            pidfile = Path(folder) / "data" / "postmaster.pid"
            try:
                if time.time() - os.stat(folder).st_mtime < 300:
                    continue
                pid = int(pidfile.read_text().split()[0]) if pidfile.exists() else None
                if pid is not None:
                    os.kill(pid, 0)
                    continue
            except ProcessLookupError:
                pass
            except (OSError, ValueError, IndexError):
                continue
            shutil.rmtree(folder, ignore_errors=True)

    def _run_as(self) -> tuple[str | None, int | None]:
        if os.geteuid() != 0:
            return None, None
        name = os.environ.get("EDDYFLOW_PG_USER", "postgres")
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise PostgresNotInstalled(
                f"PostgreSQL refuses to run as root and there is no user {name!r} to run it as "
                "(set EDDYFLOW_PG_USER to an unprivileged user)") from None
        return name, entry.pw_gid

    def start(self) -> TemporaryPostgres:
        """initdb and start the server; returns once it accepts connections."""
        bindir = find_postgres_bin()
        run_user, run_group = self._run_as()
        self._remove_orphans()
        self._folder = Path(tempfile.mkdtemp(prefix="eddyflow-pg-"))
        data = self._folder / "data"
        if run_user is not None:
            shutil.chown(self._folder, user=run_user, group=run_group)
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", self.user,
             "-E", "UTF8", "--no-sync", "--locale=C"],
            check=True, capture_output=True, user=run_user, group=run_group)
        args = [str(bindir / "postgres"), "-D", str(data), "-p", str(self.port),
                "-k", str(self._folder)]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        log = open(self._folder / "server.log", "wb")  # noqa: SIM115 - kept for the server's life
        with log:
            self._process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                user=run_user, group=run_group, preexec_fn=_die_with_parent)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        import psycopg

        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._process.poll() is not None:
                log = (self.folder / "server.log").read_text(errors="replace")
                self.stop()
                raise RuntimeError(f"PostgreSQL exited at start-up:\n{log[-2000:]}")
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Shut the server down (fast shutdown, then kill), wait, remove its folder."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # fast shutdown: roll back, disconnect
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __enter__(self) -> TemporaryPostgres:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def main() -> None:
    """Start a temporary server and print its DSN until interrupted."""
    with TemporaryPostgres() as server:
        print(server.dsn(), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
