"""Exceptions users see."""

from __future__ import annotations

__all__ = [
    "CheckpointFolderInUse",
    "EddyflowError",
    "IncompatibleCheckpoint",
    "JobFailed",
    "RestoreRefused",
]


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


class IncompatibleCheckpoint(RestoreRefused):
    """A restore refused before anything ran: the checkpoint does not fit
    the job. Its state of an operator the job does not have (by uid), or
    has as another kind of operator, would otherwise be dropped or read
    into the wrong operator; sources restored at another parallelism, or
    another ``max_parallelism``, cannot be mapped at all.

    ``unmatched`` names the operators whose state
    ``allow_non_restored_state=True`` would drop (empty when the refusal
    has other reasons only); ``problems`` holds one sentence per reason.
    A ``ValueError``, as every other restore that does not fit the job.

    A keyed state the checkpoint holds as another kind (value, list, ...)
    than the job declares it is found only when the operator has declared
    its states, as its task starts: that one arrives as the cause of a
    :class:`JobFailed` (``checkpoint_id`` ``None``).
    """

    def __init__(self, message: str, *, checkpoint_id: int | None = None,
                 unmatched: tuple[str, ...] = (), problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.unmatched = unmatched
        self.problems = problems
