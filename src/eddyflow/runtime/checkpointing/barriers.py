"""Checkpoint modes, and the barrier handler: how a task's inputs take part
in a checkpoint.

``exactly_once`` aligns: a task that has barrier ``n`` on one input blocks
that input until ``n`` has come on all of them, then snapshots
(docs/concepts/checkpoints.md). ``at_least_once`` never blocks. ``synchronous`` aligns and stops the
sources until the checkpoint is complete (the baseline ABS is measured
against). ``unaligned`` lets barriers overtake records: a task snapshots at
the first barrier ``n``, and what the barrier overtook becomes the
checkpoint's channel state (``runtime/checkpointing/channel_state.py``); an aligned
checkpoint switches to it after ``aligned_timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum
from typing import Any, Protocol

from eddyflow.errors import StateSerializationError
from eddyflow.runtime.checkpointing.channel_state import ChannelStateLog
from eddyflow.runtime.exchange.channel import InputGate
from eddyflow.runtime.exchange.events import Barrier, EndOfInput, RecordBatch
from eddyflow.runtime.faults import fault_point

__all__ = ["MODES", "BarrierHandler", "CheckpointHost", "CheckpointMode", "HandlerState"]


class CheckpointMode(StrEnum):
    # A StrEnum: configuration, metadata and the API speak these strings.
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"
    UNALIGNED = "unaligned"
    SYNCHRONOUS = "synchronous"

    @property
    def blocks(self) -> bool:
        """Whether an input that delivered the barrier waits for the others."""
        return self is not CheckpointMode.AT_LEAST_ONCE


MODES = tuple(m.value for m in CheckpointMode)


class HandlerState(Enum):
    """Where a task's inputs stand in the checkpoint in flight."""

    #: No checkpoint under way at the inputs.
    IDLE = "idle"
    #: Barrier ``n`` came on some regular inputs, which wait (blocked, unless
    #: at-least-once) for it on the others; no snapshot yet.
    ALIGNING = "aligning"
    #: Snapshot ``n`` is taken; records arriving on the inputs still without
    #: barrier ``n`` (an unaligned checkpoint's, a loop head's back-edges)
    #: are logged as channel state until it comes on each.
    LOGGING = "logging"


class CheckpointHost(Protocol):
    """What a :class:`BarrierHandler` asks of the task it serves."""

    async def take_checkpoint(self, barrier: Barrier, *, alignment: float, unaligned: bool,
                              waiting: set[int], taken: dict[int, list[RecordBatch]]) -> None:
        """Snapshot for ``barrier``, forward it, and write (now, or once the
        log of ``waiting`` is complete: :meth:`BarrierHandler.open_log`)."""

    def spawn_write(self, write: Callable[[], Awaitable[None]]) -> None:
        """Run a snapshot's asynchronous write."""

    def state_error(self, exc: StateSerializationError) -> BaseException:
        """``exc`` (a record that cannot be pickled) as the task's failure."""


@dataclass
class _Alignment:
    barrier: Barrier
    started: float
    seen: set[int] = field(default_factory=set)


class BarrierHandler:
    """The input side of checkpoints at one task, as Flink keeps it apart
    from the task (``CheckpointBarrierHandler``): alignment in the aligned
    modes, logging in unaligned ones and on a loop head's back-edges, the
    switch of an aligned checkpoint to unaligned after the aligned timeout,
    and the barriers that come back round a loop early.

    It reads nothing itself: the task hands it the barriers, records and
    ends its gate delivers, and it blocks and unblocks the gate's channels
    and calls back the task (:class:`CheckpointHost`) to snapshot."""

    def __init__(self, gate: InputGate | None, regular: list[bool], mode: CheckpointMode,
                 host: CheckpointHost, *, owner: str = "") -> None:
        self.gate = gate
        self.regular = regular
        self.ended = [False] * len(regular)
        self.mode = mode
        self.host = host
        self.owner = owner  # the operator channel state belongs to, for errors
        self.align: _Alignment | None = None
        self.log: ChannelStateLog | None = None
        #: Highest checkpoint this task aligned, aborted or skipped.
        self.done_id = 0
        # Back-edge channels on which barrier n came back before this head
        # took snapshot n (possible with parallel loops: a tail subtask may
        # depend on other head subtasks only). Blocked until the snapshot.
        self.early: dict[int, set[int]] = {}
        # Checkpoints switched to unaligned: requests not yet acted on, and
        # those whose barrier has not come here yet.
        self.switch_requests: list[int] = []
        self.switched: set[int] = set()
        self.loop_ended = False  # a head that ended: only draining its back-edges

    @property
    def state(self) -> HandlerState:
        """Where the inputs stand in the checkpoint in flight."""
        if self.align is not None:
            return HandlerState.ALIGNING
        if self.log is not None:
            return HandlerState.LOGGING
        return HandlerState.IDLE

    @property
    def aligning(self) -> bool:
        """Whether a checkpoint is being aligned at the inputs."""
        return self.align is not None

    def saw(self, checkpoint_id: int) -> bool:
        """Whether the task took part in ``checkpoint_id`` or a later one."""
        return self.done_id >= checkpoint_id

    def mark_done(self, checkpoint_id: int) -> None:
        """The task takes part in ``checkpoint_id`` (older barriers are late)."""
        self.done_id = max(self.done_id, checkpoint_id)

    def regular_ended(self) -> bool:
        """Whether every regular input has ended."""
        return all(self.ended[i] for i, r in enumerate(self.regular) if r)

    def on_injected(self, checkpoint_id: int) -> None:
        """A source emits barrier ``checkpoint_id`` itself (it has no inputs
        to align): it takes part, and a switch of it is acted on."""
        self.mark_done(checkpoint_id)
        self.switched.discard(checkpoint_id)

    def end_loop(self) -> None:
        """This loop head has ended its loop: from now on it only drains its
        back-edges, and acknowledges checkpoints with its final state."""
        self.loop_ended = True

    # -- what the gate delivers ------------------------------------------------

    def on_records(self, channel: int, batch: list[Any]) -> None:
        """A batch the task is about to process: logged (as it is now) if
        ``channel`` is one the log waits on."""
        log = self.log
        if log is not None and channel in log.waiting:
            try:
                log.log(channel, batch)
            except StateSerializationError as exc:
                raise self.host.state_error(exc) from exc

    async def on_barrier(self, channel: int, barrier: Barrier) -> None:
        """Barrier ``n`` on regular input ``channel``."""
        n = barrier.checkpoint_id
        if barrier.unaligned or n in self.switched:
            await self._on_unaligned_barrier(channel, barrier)
            return
        log = self.log
        if log is not None and log.checkpoint_id == n and channel in log.waiting:
            # Switched to unaligned here while this barrier was on its way.
            self._arrived(channel)
            return
        al = self.align
        if al is not None and n > al.barrier.checkpoint_id:
            # A newer barrier: the checkpoint being aligned was aborted.
            self._cancel_alignment()
            al = None
        if al is None:
            if n <= self.done_id:
                return  # late barrier of an aborted checkpoint
            al = self.align = _Alignment(barrier, time.monotonic())
        elif n < al.barrier.checkpoint_id:
            return
        al.seen.add(channel)
        if self.mode.blocks and self.gate is not None:
            self.gate.block(channel)
        await self._check_aligned()
        if self.align is al:
            fault_point("task.aligning")

    async def on_end(self, channel: int) -> None:
        """End of input on ``channel``: it counts as aligned, and as logged."""
        self.ended[channel] = True
        if not self.regular[channel]:
            self.on_back_edge_barrier(channel, None)
            return
        log = self.log
        if log is not None and channel in log.waiting:
            self._arrived(channel)
        if self.align is not None:
            await self._check_aligned()

    def on_back_edge_barrier(self, channel: int, barrier: Barrier | None) -> None:
        """Barrier ``n`` came back round the loop on a back-edge (or the
        back-edge ended): stop logging it; once all have, write the log."""
        log = self.log
        if self.loop_ended and log is None:
            # This head has ended: it acknowledges checkpoints with its final
            # state, and must not block the back-edges it is draining.
            return
        if (barrier is not None and barrier.checkpoint_id > self.done_id
                and (log is None or barrier.checkpoint_id != log.checkpoint_id)):
            # Back before this head's own snapshot n: what follows on this
            # channel is after the barrier, so it must wait (exactly-once)
            # and nothing on it belongs to n's back-edge log.
            self.early.setdefault(barrier.checkpoint_id, set()).add(channel)
            if self.gate is not None and self.mode.blocks:
                self.gate.block(channel)
            return
        if log is None or channel not in log.waiting:
            return
        if barrier is not None and barrier.checkpoint_id != log.checkpoint_id:
            return  # a stale barrier of an aborted checkpoint
        self._arrived(channel)

    # -- aligned ------------------------------------------------------------------

    async def _check_aligned(self) -> None:
        al = self.align
        assert al is not None
        for i in range(len(self.regular)):
            if self.regular[i] and not self.ended[i] and i not in al.seen:
                return
        self.align = None
        self.mark_done(al.barrier.checkpoint_id)
        await self.host.take_checkpoint(al.barrier, alignment=time.monotonic() - al.started,
                                        unaligned=False, waiting=set(), taken={})
        if self.gate is not None:
            self.gate.unblock_all()

    def _cancel_alignment(self) -> None:
        al, self.align = self.align, None
        if al is not None:
            self.mark_done(al.barrier.checkpoint_id)
            if self.gate is not None:
                self.gate.unblock_all()

    # -- unaligned ------------------------------------------------------------------

    async def _on_unaligned_barrier(self, channel: int, barrier: Barrier) -> None:
        """Barrier ``n`` overtook the records on ``channel`` (or ``n`` was
        switched to unaligned): the first one starts the checkpoint at
        once; each one ends the logging of its channel."""
        n = barrier.checkpoint_id
        # A barrier from another worker process overtook in this task's
        # queue, and its producer no longer has the records it jumped: they
        # are this channel's state, after whatever was logged on it.
        overtaken = (self.gate.channels[channel].take_overtaken(n)
                     if self.gate is not None else [])
        log = self.log
        if log is not None and log.checkpoint_id == n:
            if channel in log.waiting:
                if overtaken:
                    self._add_to_log(log, channel, overtaken)
                self._arrived(channel)
            return
        if n <= self.done_id:
            return  # late barrier of an aborted checkpoint, or one already logged
        await self.start_unaligned(barrier, {channel},
                                   overtaken={channel: overtaken} if overtaken else None)

    async def start_unaligned(self, barrier: Barrier, seen: set[int],
                              overtaken: dict[int, list[RecordBatch]] | None = None) -> None:
        """Snapshot for ``barrier`` now; log the regular inputs not in
        ``seen`` until their barrier comes. A barrier already queued behind
        records on one of them (sent aligned) is taken at once, with the
        records in front of it as that channel's state. ``overtaken``: per
        channel in ``seen``, the records its barrier overtook in this task's
        queue (a producer in another process), channel state too."""
        n = barrier.checkpoint_id
        al = self.align
        started = time.monotonic()
        if al is not None:
            if al.barrier.checkpoint_id == n:
                seen = seen | al.seen
                started = al.started
            self.align = None
            if self.gate is not None:
                self.gate.unblock_all()
        self.switched.discard(n)
        self.mark_done(n)
        waiting = {i for i, r in enumerate(self.regular)
                   if r and not self.ended[i] and i not in seen}
        taken: dict[int, list[RecordBatch]] = {}
        if self.gate is not None:
            for i in sorted(waiting):
                ch = self.gate.channels[i]
                found = ch.queued_before(lambda e: type(e) is EndOfInput or (
                    type(e) is Barrier and e.checkpoint_id == n))
                if found is None:
                    continue
                if type(found[0]) is Barrier:
                    before = ch.take_before(
                        lambda e: type(e) is Barrier and e.checkpoint_id == n)
                    assert before is not None
                    taken[i] = before
                elif not ch.has_priority:
                    # The producer ended before barrier n: it takes part
                    # with its final state, so what it sent and this task
                    # has not processed is all in flight, queued in front
                    # of its end. Recorded now, and left queued: waiting
                    # for that end would wait behind all of it (an upstream
                    # that ran ahead, as over worker processes, ends early).
                    # (Not past a priority barrier at the head: that one
                    # overtook those records, and they are its state.)
                    taken[i] = found[1]
        waiting -= set(taken)
        taken.update(overtaken or {})
        await self.host.take_checkpoint(replace(barrier, unaligned=True),
                                        alignment=time.monotonic() - started,
                                        unaligned=True, waiting=waiting, taken=taken)

    def request_switch(self, checkpoint_id: int) -> None:
        """The coordinator switched ``checkpoint_id`` to unaligned: the task
        acts on it at its next turn (:meth:`take_switch_requests`)."""
        self.switch_requests.append(checkpoint_id)

    @property
    def has_switch_requests(self) -> bool:
        """Whether switches to unaligned wait to be acted on."""
        return bool(self.switch_requests)

    def take_switch_requests(self) -> list[int]:
        """The switches to unaligned not yet acted on, in order; from now on
        the task's to act on."""
        requests, self.switch_requests = self.switch_requests, []
        return requests

    def mark_switched(self, checkpoint_id: int) -> None:
        """``checkpoint_id`` is taken unaligned when its barrier comes (or,
        at a source, when it emits it)."""
        self.switched.add(checkpoint_id)

    def is_switched(self, checkpoint_id: int) -> bool:
        """Whether ``checkpoint_id`` was switched to unaligned and is not yet taken."""
        return checkpoint_id in self.switched

    async def on_switch(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` switched to unaligned: if it is being
        aligned here, or its barrier is queued on an input, snapshot now;
        else take it unaligned when its barrier comes."""
        n = checkpoint_id
        if self.gate is None or n <= self.done_id:
            return
        al = self.align
        if al is not None and al.barrier.checkpoint_id == n:
            await self.start_unaligned(al.barrier, set())
            return
        barrier = self._queued_barrier(n)
        if barrier is not None:
            await self.start_unaligned(barrier, set())
        else:
            self.mark_switched(n)

    def _queued_barrier(self, n: int) -> Barrier | None:
        assert self.gate is not None
        for ch in self.gate.channels:
            found: Barrier | None = ch.find(
                lambda e: type(e) is Barrier and e.checkpoint_id == n)
            if found is not None:
                return found
        return None

    # -- the log --------------------------------------------------------------------

    def take_early(self, checkpoint_id: int) -> tuple[list[int], set[int]]:
        """Snapshot ``checkpoint_id`` is being taken: the back-edges to log
        for it, and the blocked ones to release once its barrier is
        forwarded (:meth:`release`) — those its barrier came back on before
        the snapshot (they need no log), and those blocked for older
        checkpoints this head never took."""
        early = self.early.pop(checkpoint_id, set())
        release = set(early)
        for old in [k for k in self.early if k < checkpoint_id]:
            release |= self.early.pop(old)
        to_log = [i for i, r in enumerate(self.regular)
                  if not r and not self.ended[i] and i not in early]
        return to_log, release

    def release(self, channels: set[int]) -> None:
        """The back-edges on which a barrier came back before its snapshot
        were blocked until it (:meth:`on_back_edge_barrier`); it is taken
        and the barrier forwarded, so what follows on them, which is after
        it, flows again. This must happen where the snapshot is taken, and
        not only at the end of an alignment (which unblocks the whole
        gate): a head whose regular inputs have ended snapshots at its own
        trigger, with no alignment. Left blocked, such a back-edge was never
        read again: the records after the barrier stayed in flight, or its
        end of input was never seen, so the head never finished, every
        later checkpoint and the final one timed out, and the job hung (the
        SIGKILL loop soak: head[0] read barrier n from head[1]'s side of the
        loop before its own log input's end of input, which is when it
        learnt of n, and then blocked again[1]->head[0] forever)."""
        if self.gate is not None:
            for i in sorted(channels):
                self.gate.unblock(i)

    def open_log(self, checkpoint_id: int, waiting: set[int], back_edges: list[int],
                 taken: dict[int, list[RecordBatch]],
                 write: Callable[[ChannelStateLog], Awaitable[None]]) -> ChannelStateLog:
        """Start logging ``waiting`` (and ``back_edges``) for the snapshot
        just taken; ``write`` runs once the barrier has come on all."""
        log = ChannelStateLog(checkpoint_id, waiting | set(back_edges), write, head=self.owner,
                              back_edges=frozenset(back_edges),
                              records={i: [] for i in back_edges})
        try:
            for i, batches in taken.items():
                log.add(i, batches)
        except StateSerializationError as exc:
            raise self.host.state_error(exc) from exc
        self.log = log
        return log

    def _add_to_log(self, log: ChannelStateLog, channel: int,
                    batches: list[RecordBatch]) -> None:
        try:
            log.add(channel, batches)
        except StateSerializationError as exc:
            raise self.host.state_error(exc) from exc

    def close_log_if_complete(self) -> None:
        log = self.log
        if log is not None and not log.waiting:
            self._complete(log)

    def _arrived(self, channel: int) -> None:
        log = self.log
        assert log is not None
        if log.arrived(channel):
            self._complete(log)

    def _complete(self, log: ChannelStateLog) -> None:
        self.log = None

        async def write() -> None:
            await log.write(log)

        self.host.spawn_write(write)

    # -- the coordinator ------------------------------------------------------------

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted."""
        if self.log is not None and self.log.checkpoint_id == checkpoint_id:
            self.log = None
        self.switched.discard(checkpoint_id)
        if self.early.pop(checkpoint_id, None) and self.gate is not None:
            self.gate.unblock_all()
        al = self.align
        if al is not None and al.barrier.checkpoint_id == checkpoint_id:
            self._cancel_alignment()
        self.mark_done(checkpoint_id)

    def describe(self) -> list[str]:
        """What the inputs are doing about checkpoints, for a timeout report."""
        gate = self.gate
        if gate is None:
            return []
        parts = []
        al = self.align
        if al is not None:
            missing = [gate.channels[i].name for i in range(len(self.regular))
                       if self.regular[i] and not self.ended[i] and i not in al.seen]
            parts.append(f"aligning {al.barrier.checkpoint_id}, waiting on {missing}")
        if self.log is not None:
            waiting = [gate.channels[i].name for i in sorted(self.log.waiting)]
            parts.append(f"logging channel state for {self.log.checkpoint_id}, "
                         f"waiting on {waiting}")
        return parts
