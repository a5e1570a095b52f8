"""What the checkpoint coordinator needs from a task: :class:`CheckpointParticipant`.

The coordinator knows its tasks only through this protocol and the
messages of :mod:`eddyflow.runtime.checkpointing.messages`; a participant
answers through the coordinator's ``acknowledge`` and ``decline``.
"""

from __future__ import annotations

from typing import Protocol

from eddyflow.runtime.checkpointing.messages import (
    AbortCheckpoint,
    NotifyCheckpointComplete,
    SubtaskId,
    SwitchToUnaligned,
    TriggerCheckpoint,
)

__all__ = ["CheckpointParticipant"]


class CheckpointParticipant(Protocol):
    """One task as the checkpoint coordinator sees it."""

    @property
    def name(self) -> str:
        """The task's name (its chain's), for the metadata's statistics."""

    @property
    def subtask_id(self) -> SubtaskId:
        """Which task it is: acknowledgements name it so."""

    @property
    def finished(self) -> bool:
        """Whether it has run its end of input (it then acknowledges every
        checkpoint with its final state)."""

    def trigger_checkpoint(self, trigger: TriggerCheckpoint) -> bool:
        """Checkpoint ``trigger`` starts. A running source emits its barrier
        at its next batch boundary, and so does a loop head whose regular
        inputs have all ended (into its loop); a task that gets the barrier
        through its channels ignores this. False if the task has finished:
        the coordinator then asks it for :meth:`acknowledge_final_state`."""

    def acknowledge_final_state(self, trigger: TriggerCheckpoint) -> None:
        """Acknowledge ``trigger``'s checkpoint with this finished task's
        final state, asynchronously (the acknowledgement comes later)."""

    def saw_checkpoint(self, checkpoint_id: int) -> bool:
        """Whether it has taken part in checkpoint ``checkpoint_id`` (or a
        later one) already."""

    def switch_to_unaligned(self, switch: SwitchToUnaligned) -> None:
        """The checkpoint in flight takes the unaligned way from now on."""

    def notify_checkpoint_complete(self, complete: NotifyCheckpointComplete) -> None:
        """The checkpoint is complete: its operators learn it."""

    def abort_checkpoint(self, abort: AbortCheckpoint) -> None:
        """The checkpoint was aborted: whatever the task holds for it goes."""

    def describe_state(self) -> str:
        """What it is doing about checkpoints, for a timeout report."""
