"""What the calling process and its worker processes say to each other.

The checkpoint protocol's own messages
(:mod:`eddyflow.runtime.checkpointing.messages`) travel inside these: the
coordinator in the calling process addresses a task by its
:class:`~eddyflow.runtime.checkpointing.messages.SubtaskId`, a worker answers
with the task's acknowledgement. All are frozen dataclasses that pickle.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from eddyflow.runtime.checkpointing.messages import (
    AbortCheckpoint,
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    NotifyCheckpointComplete,
    SubtaskId,
    SwitchToUnaligned,
    TriggerCheckpoint,
)

__all__ = [
    "AcknowledgeFinal",
    "Acknowledged",
    "Counters",
    "EndLoop",
    "LoopCounts",
    "LoopIdle",
    "ProbeLoop",
    "Shutdown",
    "SourceCredit",
    "SourceEnd",
    "SourceRecords",
    "TaskFinished",
    "ToTask",
    "WorkerDone",
    "WorkerFailed",
    "dump_exception",
    "load_exception",
]

def dump_exception(exc: BaseException) -> tuple[bytes | None, str]:
    """``exc`` for a message: pickled (``None`` if it does not pickle) and
    named (``Type: message``), which is what survives either way."""
    try:
        pickled: bytes | None = pickle.dumps(exc, protocol=5)
    except Exception:
        pickled = None
    return pickled, f"{type(exc).__name__}: {exc}"


def load_exception(pickled: bytes | None, text: str) -> BaseException:
    """The exception :func:`dump_exception` sent: itself if it unpickles,
    else a ``RuntimeError`` with its name and message."""
    loaded = None
    if pickled is not None:
        try:
            loaded = pickle.loads(pickled)
        except Exception:
            loaded = None
    return loaded if isinstance(loaded, BaseException) else RuntimeError(text)


# -- caller -> worker ----------------------------------------------------------


@dataclass(frozen=True)
class ToTask:
    """A coordinator's message for one task of the worker."""

    subtask: SubtaskId
    message: TriggerCheckpoint | SwitchToUnaligned | NotifyCheckpointComplete | AbortCheckpoint


@dataclass(frozen=True)
class AcknowledgeFinal:
    """The finished task acknowledges ``trigger`` with its final state;
    ``all_finished``: every task of the job has finished (the final checkpoint)."""

    subtask: SubtaskId
    trigger: TriggerCheckpoint
    all_finished: bool


@dataclass(frozen=True)
class Shutdown:
    """The job is over (its final checkpoint complete): close and report."""


@dataclass(frozen=True)
class SourceRecords:
    """Records of source ``uid``, read from an async iterable in the calling
    process, for its reader in the worker (within the credit it gave)."""

    uid: str
    records: list[Any]


@dataclass(frozen=True)
class SourceEnd:
    """Source ``uid``'s iterable in the calling process is exhausted, or
    raised (``error``: pickled, ``None`` if it does not pickle;
    ``error_text`` names it either way)."""

    uid: str
    error: bytes | None = None
    error_text: str | None = None


# -- worker -> caller ----------------------------------------------------------


@dataclass(frozen=True)
class SourceCredit:
    """The worker's task took ``records`` of source ``uid``'s records: the
    caller may send that many more."""

    uid: str
    records: int



@dataclass(frozen=True)
class Acknowledged:
    """A task's answer to a checkpoint, with the records its ``ListSink``
    writers prepared for it (by sink uid), which the caller's sink commits."""

    answer: AcknowledgeCheckpoint | DeclineCheckpoint
    staged: dict[str, dict[tuple[int, str], list[Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Counters:
    """A task's counters for the metrics: records read (a source), records
    in and out per operator, and its bounded inputs' fill (records queued,
    capacity)."""

    subtask: SubtaskId
    records_read: int
    operators: tuple[tuple[str, int, int], ...]
    queued: int
    capacity: int


@dataclass(frozen=True)
class TaskFinished:
    """A task has run its end of input; ``seen``: the latest checkpoint it took part in."""

    subtask: SubtaskId
    seen: int


@dataclass(frozen=True)
class WorkerFailed:
    """The worker's tasks failed: the job failure, as ``JobFailed`` has it,
    and its root cause pickled (``None`` if it does not pickle)."""

    message: str
    operator: str | None
    subtask: int | None
    position: str | None
    cause: bytes | None
    cause_text: str


@dataclass(frozen=True)
class WorkerDone:
    """The worker's tasks ended and closed: their counts and final keyed state."""

    records_in: dict[str, int]
    records_out: dict[str, int]
    state: dict[str, dict[str, dict[Any, Any]]]


# -- loop termination (runtime/workers/termination.py) -------------------------


@dataclass(frozen=True)
class ProbeLoop:
    """Caller -> worker: report your counts of loop ``loop`` for wave ``wave``."""

    loop: int
    wave: int


@dataclass(frozen=True)
class LoopCounts:
    """Worker -> caller: the worker's counts of loop ``loop`` when it read
    wave ``wave``'s probe: records it put into the loop and records of the
    loop it consumed (both ever), and its channels into the loop still open."""

    loop: int
    wave: int
    sent: int
    done: int
    open_entries: int


@dataclass(frozen=True)
class LoopIdle:
    """Worker -> caller: a task of loop ``loop`` ran out of input here, the
    worker's entries into the loop have all ended, and its counts changed
    since it last said so: a moment to probe the loop."""

    loop: int
    sent: int
    done: int


@dataclass(frozen=True)
class EndLoop:
    """Caller -> worker: loop ``loop`` is empty in every worker: its heads end it."""

    loop: int
