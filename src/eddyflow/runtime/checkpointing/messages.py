"""The checkpoint protocol between the coordinator and its participants, as messages.

Each message is a frozen dataclass that pickles, so that the same protocol
can cross a process boundary: the coordinator sends :class:`TriggerCheckpoint`,
:class:`SwitchToUnaligned`, :class:`NotifyCheckpointComplete` and
:class:`AbortCheckpoint` to a
:class:`~eddyflow.runtime.checkpointing.participant.CheckpointParticipant`;
a participant answers with :class:`AcknowledgeCheckpoint` (its typed state)
or :class:`DeclineCheckpoint`. :class:`CheckpointStats` is what the
coordinator records of each completed checkpoint, for the metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from eddyflow.checkpoint.metadata import SubtaskState
from eddyflow.checkpoint.storage import FileHandle
from eddyflow.runtime.checkpointing.barriers import CheckpointMode
from eddyflow.runtime.exchange.events import Barrier

__all__ = [
    "AbortCheckpoint",
    "AcknowledgeCheckpoint",
    "CheckpointOptions",
    "CheckpointStats",
    "DeclineCheckpoint",
    "NotifyCheckpointComplete",
    "SubtaskCheckpointStats",
    "SubtaskId",
    "SwitchToUnaligned",
    "TaskStateSnapshot",
    "TriggerCheckpoint",
]


@dataclass(frozen=True, order=True)
class SubtaskId:
    """Which task a message is from: the subtask of one operator chain."""

    chain_index: int
    subtask: int


@dataclass(frozen=True)
class CheckpointOptions:
    """How a checkpoint is taken: the job's mode, and whether its barriers
    overtake records (``unaligned`` mode, or an aligned checkpoint switched
    after the aligned timeout)."""

    mode: CheckpointMode = CheckpointMode.EXACTLY_ONCE
    unaligned: bool = False


@dataclass(frozen=True)
class TriggerCheckpoint:
    """Coordinator: checkpoint ``checkpoint_id`` starts (``timestamp``: Unix time)."""

    checkpoint_id: int
    timestamp: float
    options: CheckpointOptions = CheckpointOptions()

    def barrier(self) -> Barrier:
        """The barrier a participant emits for this checkpoint."""
        return Barrier(self.checkpoint_id, self.timestamp, unaligned=self.options.unaligned)


@dataclass(frozen=True)
class SwitchToUnaligned:
    """Coordinator: the aligned checkpoint ``checkpoint_id`` is not aligned
    after the aligned timeout; take it unaligned from now on."""

    checkpoint_id: int


@dataclass(frozen=True)
class NotifyCheckpointComplete:
    """Coordinator: checkpoint ``checkpoint_id`` is complete and its sinks committed."""

    checkpoint_id: int


@dataclass(frozen=True)
class AbortCheckpoint:
    """Coordinator: checkpoint ``checkpoint_id`` was aborted, for ``reason``."""

    checkpoint_id: int
    reason: str = ""


@dataclass(frozen=True)
class SubtaskCheckpointStats:
    """How one task took one checkpoint: its alignment and the synchronous
    and asynchronous halves of its snapshot (seconds), whether it took it
    unaligned, and the channel state it wrote (records and bytes)."""

    alignment_duration: float = 0.0
    sync_duration: float = 0.0
    async_duration: float = 0.0
    unaligned: bool = False
    channel_state_records: int = 0
    channel_state_bytes: int = 0


@dataclass(frozen=True)
class TaskStateSnapshot:
    """A task's state in one checkpoint: per operator uid of its chain (and
    its source's), what that operator's subtask recorded; and every file
    that state references."""

    operators: Mapping[str, SubtaskState]
    files: tuple[FileHandle, ...] = ()


@dataclass(frozen=True)
class AcknowledgeCheckpoint:
    """Participant: its snapshot for ``checkpoint_id`` is durable."""

    checkpoint_id: int
    subtask: SubtaskId
    state: TaskStateSnapshot
    stats: SubtaskCheckpointStats = SubtaskCheckpointStats()


@dataclass(frozen=True)
class DeclineCheckpoint:
    """Participant: it cannot acknowledge ``checkpoint_id`` (its snapshot
    was abandoned, ``reason`` says why); the checkpoint is aborted."""

    checkpoint_id: int
    subtask: SubtaskId
    reason: str


@dataclass(frozen=True)
class CheckpointStats:
    """A completed checkpoint, as the coordinator records it for the
    metrics: its duration and longest alignment (seconds), the bytes it
    wrote (``checkpointed_size``; incremental state: its new files) and
    references (``full_size``), whether a task took it unaligned and
    whether it switched to unaligned after the aligned timeout, and its
    channel state (records and bytes)."""

    checkpoint_id: int
    duration: float
    alignment_duration: float
    checkpointed_size: int
    full_size: int
    unaligned: bool = False
    switched: bool = False
    channel_state_records: int = 0
    channel_state_bytes: int = 0
