"""Offline reading, replay and validation of checkpoints on PySpark
(DESIGN.md §8, API.md "Offline").

* ``read_metadata``, ``read_positions``, ``read_state``,
  ``read_backedge_log``, ``read_channel_state``: a checkpoint as
  DataFrames, read by the executors.
* ``bootstrap``: a checkpoint whose keyed state is a DataFrame's rows, for
  a streaming job to start from.
* ``validate``: replay a job's input up to a checkpoint and prove its state
  consistent, key by key.

Spark is imported only when one of these runs, so ``import eddyflow`` never
starts a JVM.
"""

from eddyflow.offline.bootstrap import bootstrap
from eddyflow.offline.checkpoint import open_checkpoint
from eddyflow.offline.errors import BootstrapError
from eddyflow.offline.readers import (
    read_backedge_log,
    read_channel_state,
    read_metadata,
    read_positions,
    read_state,
    read_timers,
    read_windows,
    state_rdd,
)
from eddyflow.offline.replay import ReplayError, replay_split
from eddyflow.offline.session import spark_session
from eddyflow.offline.validate import ValidationReport, validate

__all__ = [
    "BootstrapError",
    "ReplayError",
    "ValidationReport",
    "bootstrap",
    "open_checkpoint",
    "read_backedge_log",
    "read_channel_state",
    "read_metadata",
    "read_positions",
    "read_state",
    "read_timers",
    "read_windows",
    "replay_split",
    "spark_session",
    "state_rdd",
    "validate",
]
