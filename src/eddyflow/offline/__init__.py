"""Offline reading, replay and validation of checkpoints on PySpark
(DESIGN.md §8, API.md "Offline").

* ``read_metadata``, ``read_positions``, ``read_state``,
  ``read_backedge_log``, ``read_channel_state``: a checkpoint as
  DataFrames, read by the executors.
* ``read_changes``: the keyed-state changes between two checkpoints, read
  from the delta files where the chain allows, by a distributed diff
  otherwise (``plan_changes``: what it reads).
* ``validate``: replay a job's input up to a checkpoint and prove its state
  consistent, key by key.

Spark is imported only when one of these runs, so ``import eddyflow`` never
starts a JVM.
"""

from eddyflow.offline.changes import ChangesPlan, plan_changes, read_changes
from eddyflow.offline.checkpoint import open_checkpoint
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
    "ChangesPlan",
    "ReplayError",
    "ValidationReport",
    "open_checkpoint",
    "plan_changes",
    "read_backedge_log",
    "read_changes",
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
