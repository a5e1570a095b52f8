"""Settings and fixtures for the whole suite.

``backend_name``: the state backends the suites run against, by name (the
list is ``job_support.BACKENDS``), ``[memory]`` and ``[rocksdb]`` in test
ids; ``state_backend``: a :class:`job_support.StateBackendFactory` of it:
``state_backend.make(folder)`` (or ``state_backend(folder)``) makes a new
backend for one run, ``state_backend.use(env, folder)`` sets it on an
environment, ``state_backend.name`` says which it is. Modules that
parametrize over the backends themselves use ``job_support.BACKENDS``.

Hypothesis's per-example deadline is a timing assertion: on a loaded 2-core
machine an example that writes files can take longer than 200 ms and fail
for no fault of the code (it did, in the RocksDB cache property test).
The suite makes no timing assertions, so the deadline is off everywhere;
``HYPOTHESIS_PROFILE`` may pick another registered profile.

``postgres``: one private PostgreSQL server for the whole run (started from
the PostgreSQL installed on the machine, stopped at the end, nothing left
running); ``postgres_dsn``: a fresh database on it for one test. Without an
installed server these tests skip with one line, unless
``EDDYFLOW_REQUIRE_POSTGRES=1`` (set by ``.ci/run``) makes that an error.

``make test`` runs the suite over two pytest processes (pytest-xdist,
``--dist loadgroup``): the suite waits more than it computes (checkpoint
intervals, subprocesses, servers starting), so two processes share two
cores well. Every test that uses Spark (the ``spark`` session, the
``standalone`` cluster, the offline folder) is marked as one group, so that
one process starts the JVMs. With pytest 9.2 the groups are not honoured
(pytest-dev/pytest-xdist#1386: its structured node ids drop the group
suffix), and each process may start its own Spark session and cluster:
slower, not wrong (each is private to its process). Each process has its
own PostgreSQL server.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator

import pytest
from hypothesis import settings
from job_support import BACKENDS, StateBackendFactory

from eddyflow.connectors.postgres.server import PostgresNotInstalled, TemporaryPostgres

settings.register_profile("eddyflow", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "eddyflow"))


#: Fixtures that start JVMs: their tests form one xdist group (see above).
SPARK_FIXTURES = frozenset({"spark", "standalone"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group the tests that start Spark (see the module docstring): those
    using its fixtures, and the offline folder, whose CLI tests start their
    own ``local[2]`` drivers."""
    for item in items:
        if (SPARK_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                or item.nodeid.startswith("tests/offline/")):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """Each state backend the suites run against, by name."""
    name: str = request.param
    return name


@pytest.fixture
def state_backend(backend_name: str) -> StateBackendFactory:
    """A factory of the state backend ``backend_name``."""
    return StateBackendFactory(backend_name)


@pytest.fixture(scope="session")
def postgres() -> Iterator[TemporaryPostgres]:
    """A private PostgreSQL server shared by the run's tests."""
    try:
        server = TemporaryPostgres().start()
    except PostgresNotInstalled as e:
        if os.environ.get("EDDYFLOW_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"EDDYFLOW_REQUIRE_POSTGRES=1 but {e}")
        pytest.skip(f"PostgreSQL tests skipped: {e}")
    pid = server.pid
    try:
        yield server
    finally:
        server.stop()
        # Nothing left running: the postmaster and its children are gone.
        assert pid is not None
        alive = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid), "-p", str(pid)],
                               capture_output=True, text=True).stdout.split()
        assert not alive, f"PostgreSQL processes left running: {alive}"


_databases = itertools.count()


@pytest.fixture
def postgres_dsn(postgres: TemporaryPostgres) -> str:
    """The DSN of a new, empty database on the shared server, for one test."""
    return postgres.create_database(f"test_{os.getpid()}_{next(_databases)}")
