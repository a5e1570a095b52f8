"""Exceptions users see."""

from __future__ import annotations

__all__ = [
    "CheckpointFolderInUse",
    "EddyflowError",
    "IncompatibleCheckpoint",
    "JobFailed",
    "RestoreFailed",
    "RestoreRefused",
    "StateSerializationError",
    "is_retryable",
    "one_line",
]


class EddyflowError(Exception):
    """Base of eddyflow's own errors."""

    #: Whether restarting the job from its latest checkpoint may get past
    #: this failure (the restart strategy is not consulted when it cannot).
    retryable = True


class RestoreFailed(EddyflowError):
    """A checkpoint cannot be restored into the job as it stands: a sink
    cannot recover the transactions the checkpoint recorded (a committed
    file was removed since, say). ``__cause__`` is the sink's error.

    Raised by ``execute`` before any record is processed, and not retried:
    the checkpoint and the sink's output disagree until someone looks.
    """

    retryable = False


class StateSerializationError(EddyflowError):
    """A value the runtime must serialize cannot be pickled: a keyed-state
    value (at a snapshot, or when the RocksDB backend writes it), a record
    of a back-edge log, or a record a feedback channel spills to disk.

    The message names what, where and why: ``cannot snapshot keyed state
    'seen' of operator 'dedup' for key 'abc' in checkpoint 3: Can't pickle
    local object ...``. Restarting cannot help (the value is made again by
    the same code), so the restart strategy does not retry it.
    """

    retryable = False

    def __init__(self, reason: str, *, verb: str = "snapshot", subject: str = "",
                 operator: str | None = None, state: str | None = None,
                 key: str | None = None, checkpoint: int | None = None,
                 where: str | None = None) -> None:
        # Every argument but the reason has a default, and all are plain
        # attributes: the error crosses a pipe from a forked snapshot
        # process by pickle (BaseException pickles as cls(*args) + __dict__).
        super().__init__(reason)
        self.reason = reason
        self.verb = verb
        self.subject = subject or (f"keyed state '{state}'" if state is not None else "a value")
        self.operator = operator
        self.state = state
        #: ``repr`` of the key (text: the error must stay picklable).
        self.key = key
        self.checkpoint = checkpoint
        self.where = where

    def __str__(self) -> str:
        msg = f"cannot {self.verb} {self.subject}"
        if self.operator is not None:
            msg += f" of operator '{self.operator}'"
        if self.key is not None:
            msg += f" for key {self.key}"
        if self.checkpoint is not None:
            msg += f" in checkpoint {self.checkpoint}"
        elif self.where:
            msg += f" {self.where}"
        return one_line(f"{msg}: {self.reason}")


def is_retryable(exc: BaseException) -> bool:
    """False if ``exc`` or an exception it was raised from (``__cause__``,
    else an unsuppressed ``__context__``) is one that restarting cannot get
    past (its ``retryable`` is False)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if getattr(e, "retryable", True) is False:
            return False
        seen.add(id(e))
        if e.__cause__ is not None:
            e = e.__cause__
        else:
            e = None if e.__suppress_context__ else e.__context__
    return True


def one_line(text: str) -> str:
    """``text`` on one line: its lines joined with `` | `` (an exception's
    message may span lines; a report of it is read, and grepped, by line)."""
    if "\n" not in text and "\r" not in text:
        return text
    return " | ".join(part.strip() for part in text.splitlines() if part.strip())


class JobFailed(EddyflowError):
    """A job failed and will not be restarted; ``__cause__`` is the root cause.

    The message is one line: it names the operator, the subtask and the
    root cause's exception, and, where they are known, the record and the
    source position it came from.
    """

    def __init__(self, message: str, *, operator: str | None = None,
                 subtask: int | None = None, position: str | None = None) -> None:
        super().__init__(one_line(message))
        self.operator = operator
        self.subtask = subtask
        self.position = position


class RestoreRefused(EddyflowError, ValueError):
    """A restore that would be silently wrong is refused before anything
    runs: nothing to restore from where something should be, or output a
    sink committed after the restored checkpoint that it cannot take back.
    Restarting cannot change that: never retried."""

    retryable = False


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
    :class:`JobFailed` (``checkpoint_id`` ``None``). A state with a
    time-to-live is a kind of its own (``value+ttl`` ...): a TTL switched on
    or off across a restore is refused the same way, naming the operator
    and the state (Flink's ``StateMigrationException``); a TTL of another
    duration is not (the write times are stored, not the expiry times).
    """

    def __init__(self, message: str, *, checkpoint_id: int | None = None,
                 unmatched: tuple[str, ...] = (), problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.unmatched = unmatched
        self.problems = problems
