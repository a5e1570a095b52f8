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
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
from job_support import BACKENDS, StateBackendFactory

settings.register_profile("eddyflow", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "eddyflow"))


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """Each state backend the suites run against, by name."""
    name: str = request.param
    return name


@pytest.fixture
def state_backend(backend_name: str) -> StateBackendFactory:
    """A factory of the state backend ``backend_name``."""
    return StateBackendFactory(backend_name)
