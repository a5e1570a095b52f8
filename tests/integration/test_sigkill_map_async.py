"""Crash recovery of a job with a ``map_async``: SIGKILL while calls are in
flight, then ``--restore latest`` (the harness of ``test_sigkill.py``).

``jobs/sigkill_job.py`` with ``EF_SIGKILL_ASYNC``: ``from_log -> map_async
(ordered, 10 ms a call, capacity 100) -> key_by -> map_with_state ->
FileSink``, parallelism 2, a checkpoint every 50 ms. Its records in flight at
each barrier are in the checkpoint; after each kill the next run restores
them and calls them again. The committed output must be exactly the
failure-free one (no duplicate, nothing missing, the final running counts
right), compared with a computation in plain Python. The same with the
loop job of ``test_sigkill_loop.py`` whose loop body is a ``map_async``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from job_support import StateBackendFactory
from sigkill_support import seed
from test_sigkill import kill_and_restart
from test_sigkill_loop import kill_and_restart as kill_loop_and_restart


def test_sigkill_while_async_calls_are_in_flight_then_restore_latest_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory) -> None:
    kill_and_restart(tmp_path, state_backend, records=60_000, keys=300, kills=6, slow=0.0,
                     seed=seed(28), settings={"EF_SIGKILL_ASYNC": "0.01"})


def test_sigkill_while_async_calls_are_in_flight_in_a_loop_then_restore_latest_is_exactly_once(
        tmp_path: Path, state_backend: StateBackendFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``jobs/sigkill_loop_job.py`` with its loop body a ``map_async``
    (unordered, 5 ms a step): killed while records go round the loop,
    some in calls, some on the back-edge; the harness of
    ``test_sigkill_loop.py`` checks the committed output."""
    monkeypatch.setenv("EF_SIGKILL_ASYNC", "0.005")
    kill_loop_and_restart(tmp_path, state_backend, records=40_000, keys=200, max_rounds=4,
                          kills=6, slow=0.0, seed=seed(29))
