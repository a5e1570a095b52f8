"""A task's side of the checkpoint protocol, mixed into ``Task`` as :class:`Participation`.

It implements :class:`~eddyflow.runtime.checkpointing.participant.CheckpointParticipant`:
what the coordinator's messages do at a task (a trigger a source or a loop
head acts on at its next turn, a switch to unaligned, an abort, a
completion), on top of :class:`~eddyflow.runtime.checkpointing.snapshotting.Snapshotting`.
"""

from __future__ import annotations

from dataclasses import replace

from eddyflow.connectors.source import SourceReader
from eddyflow.runtime.checkpointing.messages import (
    AbortCheckpoint,
    NotifyCheckpointComplete,
    SwitchToUnaligned,
    TriggerCheckpoint,
)
from eddyflow.runtime.checkpointing.snapshotting import Snapshotting
from eddyflow.runtime.exchange.channel import Interrupt
from eddyflow.runtime.exchange.events import Barrier
from eddyflow.runtime.exchange.loops import LoopTracker

__all__ = ["Participation"]


class Participation(Snapshotting):
    """Mixed into ``Task``: the coordinator's messages, acted on."""

    name: str
    head_of: LoopTracker | None
    interrupt: Interrupt | None
    #: A source task has read its last batch (its triggers come too late).
    _source_done: bool

    def _init_participation(self) -> None:
        #: The barrier a source (or a loop head whose inputs ended) emits next.
        self._trigger: Barrier | None = None
        # Triggers that came after the source's last read: acknowledged with
        # the final state once the task has finished.
        self._late_triggers: list[TriggerCheckpoint] = []

    # what Task provides
    def _wake(self) -> None:
        """Wake the task's loop wherever it waits."""
        raise NotImplementedError

    # -- the coordinator's messages ---------------------------------------------

    def trigger_checkpoint(self, trigger: TriggerCheckpoint) -> bool:
        """Checkpoint ``trigger`` starts. A running source emits its barrier
        at its next batch boundary, and so does a loop head whose regular
        inputs have all ended (into its loop); a task that gets the barrier
        through its channels ignores this. False if the task has finished:
        the coordinator then has it acknowledge with its final state."""
        if self.finished:
            return False
        if self.reader is not None:
            if self._source_done:
                self._late_triggers.append(trigger)  # acknowledged once finished
                return True
        elif not (self.head_of is not None and self.barriers.regular_ended()):
            return True
        self._trigger = trigger.barrier()
        self._wake()
        if self.interrupt is not None and trigger.options.unaligned:
            self.interrupt.request()  # held up by back-pressure: inject at once
        return True

    def acknowledge_final_state(self, trigger: TriggerCheckpoint) -> None:
        """Acknowledge ``trigger``'s checkpoint with this finished task's
        final state, in a write of its own."""
        spawn = self.spawn
        assert spawn is not None
        n = trigger.checkpoint_id

        async def ack() -> None:
            await self._acknowledge_finished(n)

        spawn(ack)

    def saw_checkpoint(self, checkpoint_id: int) -> bool:
        """Whether this task took part in ``checkpoint_id`` (or a later one)."""
        return self.barriers.saw(checkpoint_id)

    def switch_to_unaligned(self, switch: SwitchToUnaligned) -> None:
        """Checkpoint ``switch.checkpoint_id`` is not aligned after the
        aligned timeout; take it unaligned from now on."""
        if self.finished:
            return
        self.barriers.request_switch(switch.checkpoint_id)
        if self.interrupt is not None:
            self.interrupt.request()
        self._wake()

    def abort_checkpoint(self, abort: AbortCheckpoint) -> None:
        """Checkpoint ``abort.checkpoint_id`` was aborted."""
        n = abort.checkpoint_id
        if self._trigger is not None and self._trigger.checkpoint_id == n:
            self._trigger = None
        self._forget_checkpoint(n)
        for op in self.operators:
            op.notify_checkpoint_aborted(n)
        self.barriers.abort(n)

    def notify_checkpoint_complete(self, complete: NotifyCheckpointComplete) -> None:
        """Checkpoint ``complete.checkpoint_id`` is complete: the source
        reader and the operators learn it."""
        if self.reader is not None:
            self.reader.notify_checkpoint_complete(complete.checkpoint_id)
        for op in self.operators:
            op.notify_checkpoint_complete(complete.checkpoint_id)

    def describe_state(self) -> str:
        """What this task is doing about checkpoints, for a timeout report."""
        parts = []
        if self._trigger is not None:
            parts.append(f"barrier {self._trigger.checkpoint_id} not yet emitted")
        parts.extend(self.barriers.describe())
        if self.gate is not None:
            queued = {ch.name: len(ch) for ch in self.gate.channels if len(ch)}
            blocked = [ch.name for i, ch in enumerate(self.gate.channels) if self.gate.blocked[i]]
            if queued:
                parts.append(f"queued {queued}")
            if blocked:
                parts.append(f"blocked {blocked}")
        if self.finished:
            parts.append("finished")
        ended = self.barriers.ended
        if self.gate is not None and any(ended):
            parts.append("ended " + str([self.gate.channels[i].name
                                         for i, e in enumerate(ended) if e]))
        parts.append(f"last checkpoint {self.barriers.done_id}")
        return f"{self.name}[{self.subtask}]: " + "; ".join(parts)

    # -- acting on them in the task's loop --------------------------------------

    async def _inject_barrier(self, reader: SourceReader) -> None:
        """A source emits the barrier it was triggered with, between two batches."""
        unaligned = self._unaligned_trigger()
        barrier, self._trigger = self._trigger, None
        assert barrier is not None
        self.barriers.on_injected(barrier.checkpoint_id)
        if unaligned:
            barrier = replace(barrier, unaligned=True)
        await self.take_checkpoint(barrier, position=reader.snapshot_position(
            barrier.checkpoint_id), unaligned=unaligned)
        coordinator = self.coordinator
        if coordinator is not None and coordinator.synchronous:
            await coordinator.wait_resumed()  # stop the world until it completes

    async def _on_loop_trigger(self, *, ended: bool) -> None:
        """A loop head whose inputs ended starts the checkpoint it was
        triggered with in its loop itself: nothing upstream sends it the
        barrier. Not once it has ``ended`` its loop (then it acknowledges
        with its final state)."""
        trigger, self._trigger = self._trigger, None
        assert trigger is not None
        if not ended and not self.barriers.saw(trigger.checkpoint_id):
            self.barriers.mark_done(trigger.checkpoint_id)
            await self.take_checkpoint(trigger, unaligned=trigger.unaligned)

    def _trigger_pending_in_loop(self) -> None:
        """This loop head's input ended before the barrier of the checkpoint
        in flight reached it: none will now. It starts it in the loop."""
        coordinator = self.coordinator
        pending = coordinator.pending_trigger() if coordinator else None
        if pending is not None and not self.barriers.saw(pending.checkpoint_id):
            self._trigger = pending.barrier()

    def _acknowledge_late_triggers(self) -> None:
        """The task has finished: acknowledge the checkpoints triggered after
        its source's last read with its final state."""
        for trigger in self._late_triggers:
            if not self.saw_checkpoint(trigger.checkpoint_id):
                self.acknowledge_final_state(trigger)
        self._late_triggers.clear()

    async def _on_switches(self) -> None:
        """Act on the coordinator's switches to unaligned."""
        for n in self.barriers.take_switch_requests():
            # Forwarding barrier n aligned, and held up by back-pressure:
            # overtake instead.
            for w in self.writers:
                em = w.emitting
                if type(em) is Barrier and em.checkpoint_id == n:
                    self._capture(n, w.overtake(replace(em, unaligned=True), replacing=em),
                                  unaligned=True)
            if self.reader is not None:
                trigger = self._trigger
                if trigger is not None and trigger.checkpoint_id == n:
                    self.barriers.mark_switched(n)  # injected unaligned, at once
            else:
                await self.barriers.on_switch(n)

    async def _on_interrupt(self) -> None:
        """While a put of this task waits for channel space: take part in
        checkpoints (priority barriers, source triggers, switches) without
        reading any record. Everything here overtakes, so nothing waits."""
        if self.barriers.has_switch_requests:
            await self._on_switches()
        gate = self.gate
        if gate is not None:
            while True:
                got = gate.poll_priority()
                if got is None:
                    break
                i, item = got
                await self.barriers.on_barrier(i, item)
        elif self.reader is not None and self._trigger is not None and self._unaligned_trigger():
            await self._inject_barrier(self.reader)

    def _unaligned_trigger(self) -> bool:
        trigger = self._trigger
        return trigger is not None and (trigger.unaligned
                                        or self.barriers.is_switched(trigger.checkpoint_id))
