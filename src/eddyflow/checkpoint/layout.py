"""Where everything of a checkpoint folder lives: the one place that knows
its paths and names (docs/concepts/checkpoints.md, What a checkpoint holds).

```
<dir>/
  _lock                   the folder lock (checkpoint/lock.py)
  _commits/chk-<n>.json   what the sinks committed for checkpoint n (checkpoint/commits.py)
  shared/                 state files several checkpoints reference (incremental state)
  chk-<n>/
    _metadata             JSON, written last by atomic rename; checksums of every file
    _metadata.superseded  instead, once a restore took the checkpoint's output back
    <operator>-<subtask>/ a subtask's private files: back-edge log, channel state,
                          RocksDB's small files
    bootstrap/            rows a bootstrapped checkpoint was given (offline/bootstrap.py)
```

A file of a checkpoint is named in its metadata by its path relative to the
folder (``FileHandle.path``): the relative names are what the metadata of
every checkpoint written so far holds, so they never change. Every file is
written under :func:`temp_name` first and renamed.
"""

from __future__ import annotations

import os
import re

from eddyflow.checkpoint.writer_main import temp_name

__all__ = [
    "BACKEDGE_LOG",
    "BOOTSTRAP",
    "CHANNEL_STATE",
    "COMMITS",
    "LOCK",
    "METADATA",
    "OPERATOR_LIST",
    "SHARED",
    "SUPERSEDED",
    "CheckpointLayout",
    "checkpoint_dir_name",
    "parse_checkpoint_dir",
    "temp_name",
]

#: A checkpoint's metadata file: it exists once the file does.
METADATA = "_metadata"
#: The suffix a checkpoint's metadata takes once a restore took its output
#: back (runtime/recovery/supersede.py): it can no longer be restored.
SUPERSEDED = ".superseded"
#: The folder of files several checkpoints reference.
SHARED = "shared"
#: The folder of the sinks' commit records.
COMMITS = "_commits"
#: The folder lock's file.
LOCK = "_lock"
#: A loop head subtask's back-edge log, in its subtask folder.
BACKEDGE_LOG = "backedge-log"
#: A subtask's channel state (an unaligned checkpoint), in its subtask folder.
CHANNEL_STATE = "channel-state"
#: A subtask's operator list state (``map_async``'s records in flight).
OPERATOR_LIST = "operator-list"
#: The folder of a bootstrapped checkpoint's given rows, in its folder.
BOOTSTRAP = "bootstrap"

# Only the names checkpoint_dir_name gives (ASCII digits, no leading zero):
# "chk-07" would parse to 7, whose folder is "chk-7", another folder.
_CHECKPOINT_DIR = re.compile(r"chk-(0|[1-9][0-9]*)")
_COMMIT_RECORD = re.compile(r"chk-(0|[1-9][0-9]*)\.json")


def checkpoint_dir_name(checkpoint_id: int) -> str:
    """The folder name of checkpoint ``checkpoint_id``: ``chk-<n>``."""
    if checkpoint_id < 0:
        raise ValueError(f"a checkpoint id is a whole number >= 0, not {checkpoint_id!r}")
    return f"chk-{checkpoint_id}"


def parse_checkpoint_dir(name_or_path: str | os.PathLike[str]) -> int | None:
    """The id of a checkpoint folder, given its name or path (``…/chk-12``
    or ``…/chk-12/``: 12), or ``None`` if it is not named as
    :func:`checkpoint_dir_name` names one."""
    name = os.path.basename(os.path.normpath(os.fspath(name_or_path)))
    match = _CHECKPOINT_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


class CheckpointLayout:
    """The paths of one checkpoint folder (``root``, made absolute).

    It does no I/O. Methods named after a file give its absolute path; those
    ending in ``_file`` or ``_prefix`` give a path relative to the root, as a
    :class:`~eddyflow.checkpoint.storage.FileHandle` and the metadata name
    the file."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))

    def __repr__(self) -> str:
        return f"CheckpointLayout({self.root!r})"

    def path(self, relpath: str) -> str:
        """The absolute path of ``relpath`` (relative to the root)."""
        return os.path.join(self.root, relpath)

    def relative(self, path: str) -> str:
        """``path`` relative to the root."""
        return os.path.relpath(path, self.root)

    # -- the folder's own files --------------------------------------------

    @property
    def lock(self) -> str:
        """The folder lock's file."""
        return os.path.join(self.root, LOCK)

    @property
    def shared_dir(self) -> str:
        """The folder of files several checkpoints reference."""
        return os.path.join(self.root, SHARED)

    @property
    def commits_dir(self) -> str:
        """The folder of the sinks' commit records."""
        return os.path.join(self.root, COMMITS)

    # -- a checkpoint ------------------------------------------------------

    def checkpoint_dir(self, checkpoint_id: int) -> str:
        """Checkpoint ``checkpoint_id``'s folder."""
        return os.path.join(self.root, checkpoint_dir_name(checkpoint_id))

    def metadata(self, checkpoint_id: int) -> str:
        """Checkpoint ``checkpoint_id``'s metadata file."""
        return os.path.join(self.checkpoint_dir(checkpoint_id), METADATA)

    def superseded_metadata(self, checkpoint_id: int) -> str:
        """Where checkpoint ``checkpoint_id``'s metadata goes once its
        output was taken back."""
        return self.metadata(checkpoint_id) + SUPERSEDED

    def commit_record(self, checkpoint_id: int) -> str:
        """The sinks' commit record of checkpoint ``checkpoint_id``."""
        return os.path.join(self.root, self.commit_record_file(checkpoint_id))

    @staticmethod
    def commit_record_file(checkpoint_id: int) -> str:
        """:meth:`commit_record`, relative to the root."""
        return f"{COMMITS}/{checkpoint_dir_name(checkpoint_id)}.json"

    @staticmethod
    def parse_commit_record(name: str) -> int | None:
        """The checkpoint id of a commit record's file name (``chk-<n>.json``:
        n), or ``None`` for any other name."""
        match = _COMMIT_RECORD.fullmatch(name)
        return int(match.group(1)) if match else None

    # -- a subtask's files (relative to the root) --------------------------

    @staticmethod
    def subtask_prefix(checkpoint_id: int, operator: str, subtask: int) -> str:
        """The folder of a subtask's private files in checkpoint
        ``checkpoint_id``, with a trailing ``/``."""
        return f"{checkpoint_dir_name(checkpoint_id)}/{operator}-{subtask}/"

    @classmethod
    def backedge_log_file(cls, checkpoint_id: int, head: str, subtask: int) -> str:
        """A loop head subtask's back-edge log."""
        return cls.subtask_prefix(checkpoint_id, head, subtask) + BACKEDGE_LOG

    @classmethod
    def channel_state_file(cls, checkpoint_id: int, operator: str, subtask: int) -> str:
        """A subtask's channel state (records in flight at an unaligned barrier)."""
        return cls.subtask_prefix(checkpoint_id, operator, subtask) + CHANNEL_STATE

    @classmethod
    def operator_list_file(cls, checkpoint_id: int, operator: str, subtask: int) -> str:
        """A subtask's operator list state (``map_async``'s records in flight)."""
        return cls.subtask_prefix(checkpoint_id, operator, subtask) + OPERATOR_LIST

    @staticmethod
    def shared_prefix(checkpoint_id: int, operator: str, subtask: int, run_id: str) -> str:
        """The start of the names of the shared files a subtask's snapshot
        writes: unique per operator, subtask, run and checkpoint."""
        return f"{SHARED}/{operator}-{subtask}-{run_id}-{checkpoint_id}"

    @staticmethod
    def is_shared_file(relpath: str) -> bool:
        """Whether ``relpath`` (relative to the root) lies in ``shared/``."""
        return relpath.startswith(SHARED + "/")

    @staticmethod
    def bootstrap_input_file(checkpoint_id: int, operator: str, state: str, partition: int,
                             attempt: int) -> str:
        """The rows one Spark task attempt gave a bootstrapped checkpoint."""
        return (f"{checkpoint_dir_name(checkpoint_id)}/{BOOTSTRAP}/"
                f"{operator}-{state}-{partition}-{attempt}")
