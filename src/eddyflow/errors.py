"""Exceptions users see."""

from __future__ import annotations

__all__ = ["CheckpointFolderInUse", "EddyflowError", "JobFailed", "RestoreRefused"]


class EddyflowError(Exception):
    """Base of eddyflow's own errors."""


class JobFailed(EddyflowError):
    """A job failed and will not be restarted; ``__cause__`` is the root cause.

    The message names the operator, the subtask and, where it is known, the
    record and the source position it came from.
    """

    def __init__(self, message: str, *, operator: str | None = None,
                 subtask: int | None = None, position: str | None = None) -> None:
        super().__init__(message)
        self.operator = operator
        self.subtask = subtask
        self.position = position


class RestoreRefused(EddyflowError, ValueError):
    """A restore that would be silently wrong is refused before anything
    runs: nothing to restore from where something should be, or output a
    sink committed after the restored checkpoint that it cannot take back."""


class CheckpointFolderInUse(EddyflowError, RuntimeError):
    """Another live job holds the checkpoint folder's lock; ``pid`` is its
    process id when known."""

    def __init__(self, message: str, *, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid
