"""Offline reading, replay and validation of checkpoints on PySpark
(docs/offline.md).

* ``read_metadata``, ``read_positions``, ``read_state``,
  ``read_backedge_log``, ``read_channel_state``: a checkpoint as
  DataFrames, read by the executors.
* ``bootstrap``: a checkpoint whose keyed state is a DataFrame's rows, for
  a streaming job to start from.
* ``read_changes``: the keyed-state changes between two checkpoints, read
  from the delta files where the chain allows, by a distributed diff
  otherwise (``plan_changes``: what it reads).
* ``validate``: replay a job's input up to a checkpoint and prove its state
  consistent, key by key.
* ``ship_to_executors``: what each of them does first — eddyflow, the job's
  modules and, for RocksDB checkpoints, ``rocksdict`` shipped to the
  session's executors once (any session, any master; ``shipping.py``).

Spark is imported only when one of these runs, so ``import eddyflow`` never
starts a JVM.
"""

from eddyflow.offline.bootstrap import bootstrap
from eddyflow.offline.changes import ChangesPlan, plan_changes, read_changes
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
from eddyflow.offline.shipping import ExecutorDependencyMissing, ship_to_executors
from eddyflow.offline.validate import ValidationReport, validate

__all__ = [
    "BootstrapError",
    "ChangesPlan",
    "ExecutorDependencyMissing",
    "ReplayError",
    "ValidationReport",
    "bootstrap",
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
    "ship_to_executors",
    "spark_session",
    "state_rdd",
    "validate",
]
