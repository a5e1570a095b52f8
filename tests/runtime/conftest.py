"""Fixtures shared by the runtime tests.

``state_backend``: the exactly-once suites (random DAGs and cyclic jobs
under random failures, snapshot isolation, SIGKILL, rescaling, retention)
run once per state backend, ``[memory]`` and ``[rocksdb]`` in their test
ids. The fixture is a :class:`job_support.StateBackendFactory`:
``state_backend.make(folder)`` (or ``state_backend(folder)``) makes a new
backend for one run, ``state_backend.use(env, folder)`` sets it on an
environment, ``state_backend.name`` says which it is.
"""

from __future__ import annotations

import pytest
from job_support import BACKENDS, StateBackendFactory


@pytest.fixture(params=BACKENDS)
def state_backend(request: pytest.FixtureRequest) -> StateBackendFactory:
    return StateBackendFactory(request.param)
