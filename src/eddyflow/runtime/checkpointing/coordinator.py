"""The checkpoint coordinator (docs/concepts/checkpoints.md, ABS on a DAG, steps 1 and 5).

It speaks to the tasks only through the messages of
:mod:`~eddyflow.runtime.checkpointing.messages` and the
:class:`~eddyflow.runtime.checkpointing.participant.CheckpointParticipant` protocol.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from eddyflow.checkpoint.commits import (
    CommitRecord,
    commit_record_write,
    remove_commit_records_before,
)
from eddyflow.checkpoint.metadata import (
    CheckpointMetadata,
    TaskStats,
    read_checkpoint,
)
from eddyflow.checkpoint.metadata_builder import MetadataBuilder
from eddyflow.checkpoint.shared import SharedStateRegistry
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage
from eddyflow.connectors.sink import Sink, awaited
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.runtime.checkpointing.barriers import CheckpointMode
from eddyflow.runtime.checkpointing.messages import (
    AbortCheckpoint,
    AcknowledgeCheckpoint,
    CheckpointOptions,
    CheckpointStats,
    DeclineCheckpoint,
    NotifyCheckpointComplete,
    SubtaskId,
    SwitchToUnaligned,
    TriggerCheckpoint,
)
from eddyflow.runtime.checkpointing.participant import CheckpointParticipant
from eddyflow.runtime.failures import TaskFailure
from eddyflow.runtime.faults import fault_point

__all__ = ["CheckpointConfig", "CheckpointCoordinator"]

log = logging.getLogger("eddyflow.checkpoint.listing")


@dataclass(frozen=True)
class CheckpointConfig:
    """How a job checkpoints: every ``interval`` seconds into ``directory``,
    in ``mode``, keeping the last ``retained`` checkpoints, aborting one not
    complete after ``timeout`` seconds."""

    interval: float
    directory: str
    mode: CheckpointMode = CheckpointMode.EXACTLY_ONCE
    retained: int = 3
    timeout: float = 60.0
    #: Seconds after which an aligned checkpoint still in flight switches
    #: to unaligned at every task that has not acknowledged it.
    aligned_timeout: float | None = None


@dataclass
class _Pending:
    id: int
    trigger_time: float
    started: float
    final: bool
    switched: bool = False  # to unaligned, after the aligned timeout
    acks: dict[SubtaskId, AcknowledgeCheckpoint] = field(default_factory=dict)
    done: anyio.Event = field(default_factory=anyio.Event)


class CheckpointCoordinator:
    """Triggers a job's checkpoints, completes or aborts each, and keeps the
    checkpoint folder (retention, shared files, commit records).

    It triggers checkpoint ``n`` every ``interval`` seconds, never with more
    than one periodic checkpoint in flight; collects each participant's
    acknowledgement (sent when its asynchronous write is durable); and when
    every participant has acknowledged, writes ``chk-<n>/_metadata`` last
    and atomically, commits the sinks' transactions recorded in it, and
    notifies every participant. A checkpoint not complete within
    ``timeout``, or declined by a participant, is aborted and every
    participant told.

    Checkpoints go on after sources finish: a finished task acknowledges
    each checkpoint with its final state, and a loop head whose inputs have
    ended emits the barrier into its loop. The end of a bounded input is a
    final checkpoint, taken when every task has finished, so all output is
    committed (and recorded, so a crash during the commits is repaired on
    restore) before ``execute`` returns. Without checkpointing (``config``
    ``None``) it still runs that final commit, with no storage behind it."""

    def __init__(
        self,
        config: CheckpointConfig | None,
        job_name: str,
        plan: ExecutionPlan,
        sinks: dict[str, Sink],
        next_id: int = 1,
        completed: Sequence[int] = (),
        lineage: str = "",
        base: tuple[str, int] | None = None,
    ) -> None:
        self.config = config
        #: The history the checkpoints of this run belong to, and the other
        #: folder's checkpoint it was last restored from (checkpoint/commits.py).
        self.lineage = lineage
        self.base = base
        self.mode = CheckpointMode(config.mode) if config else CheckpointMode.EXACTLY_ONCE
        self.storage = CheckpointStorage(config.directory) if config else None
        self.job_name = job_name
        self.plan = plan
        self.sinks = sinks
        self.tasks: Sequence[CheckpointParticipant] = ()
        # Completed checkpoints of this execution, earlier attempts included.
        self.completed: list[int] = list(completed)
        # The directory belongs to the job: retention covers every completed
        # checkpoint in it, earlier runs' included.
        self.retained: list[int] = (
            self.storage.completed_ids() if self.storage is not None else []
        )
        #: Names this attempt's new state files apart from every other run's.
        self.run_id = uuid.uuid4().hex[:12]
        self.registry: SharedStateRegistry | None = None
        if self.storage is not None:
            self.registry = self._load_registry(self.storage)
        self.aborted: list[int] = []
        #: Each completed checkpoint of this run, in order (the metrics read the last).
        self.stats: list[CheckpointStats] = []
        self._next_id = next_id
        self._pending: _Pending | None = None
        self._final: _Pending | None = None
        self._completing: set[int] = set()  # metadata being written: not incomplete
        # Taken at once when free: a plain acquire yields a turn of the loop.
        self._completion_lock = anyio.Lock(fast_acquire=True)
        self._finished: set[SubtaskId] = set()
        self._stopped = False
        self._resume = anyio.Event()
        self._resume.set()

    def _load_registry(self, storage: CheckpointStorage) -> SharedStateRegistry:
        """The shared files the checkpoints on disk reference; the others
        (of aborted checkpoints, or of a run that crashed) are removed."""
        registry = SharedStateRegistry(storage.layout)
        for n in self.retained:
            try:
                meta = read_checkpoint(storage, n)
            except CheckpointCorrupted:
                continue  # it cannot be restored: its files protect nothing
            registry.register(n, (f.path for f in meta.files))
        registry.collect_garbage()
        return registry

    def attach(self, tasks: Sequence[CheckpointParticipant]) -> None:
        """The participants of this run (every task of the job)."""
        self.tasks = tasks

    @property
    def synchronous(self) -> bool:
        """Sources wait for each checkpoint to complete (``synchronous`` mode)."""
        return self.mode is CheckpointMode.SYNCHRONOUS

    @property
    def may_go_unaligned(self) -> bool:
        """Whether barriers may overtake records in this job: tasks then
        take part in checkpoints while they wait for channel space."""
        cfg = self.config
        return cfg is not None and (self.mode is CheckpointMode.UNALIGNED
                                    or cfg.aligned_timeout is not None)

    # -- triggering --------------------------------------------------------

    async def run_periodic(self) -> None:
        """Trigger a checkpoint every interval, one at a time, until stopped;
        switch one to unaligned after the aligned timeout, abort one that
        times out."""
        cfg = self.config
        if cfg is None:
            return
        next_at = time.monotonic() + cfg.interval
        while not self._stopped:
            await anyio.sleep(max(0.0, next_at - time.monotonic()))
            if self._stopped:
                return
            next_at = time.monotonic() + cfg.interval
            pending = self._trigger()
            if pending is None:
                continue
            timeout = cfg.timeout
            if cfg.aligned_timeout is not None and cfg.aligned_timeout < timeout:
                with anyio.move_on_after(cfg.aligned_timeout):
                    await pending.done.wait()
                if not pending.done.is_set() and pending.id not in self._completing:
                    self._switch_to_unaligned(pending)
                timeout -= cfg.aligned_timeout
            with anyio.move_on_after(timeout):
                await pending.done.wait()
            if not pending.done.is_set():
                if pending.id in self._completing:
                    # Every task acknowledged and the metadata is being
                    # written: too late to abort, the sinks commit next.
                    await pending.done.wait()
                else:
                    missing = [t for t in self.tasks if t.subtask_id not in pending.acks]
                    log.warning("checkpoint %d: no acknowledgement from %d tasks:\n  %s",
                                pending.id, len(missing),
                                "\n  ".join(t.describe_state() for t in missing))
                    self._abort(pending, f"not complete after {cfg.timeout} s")
            # Never trigger sooner than one interval after the last one.
            next_at = max(next_at, time.monotonic())

    def _trigger(self) -> _Pending | None:
        n = self._next_id
        self._next_id += 1
        pending = _Pending(n, time.time(), time.monotonic(), final=False)
        self._pending = pending
        if self.synchronous:
            self._resume = anyio.Event()
        trigger = self._trigger_of(pending)
        # Checkpoints go on after sources finish (a loop outlives its input):
        # a finished task acknowledges with its final state; a running source
        # emits the barrier; so does a loop head whose inputs have all ended,
        # into its loop. Every other task gets the barrier through a channel.
        for t in self.tasks:
            if not t.trigger_checkpoint(trigger):
                t.acknowledge_final_state(trigger)
        return pending

    def _trigger_of(self, p: _Pending) -> TriggerCheckpoint:
        return TriggerCheckpoint(p.id, p.trigger_time, CheckpointOptions(
            self.mode, unaligned=self.mode is CheckpointMode.UNALIGNED or p.switched))

    def _switch_to_unaligned(self, p: _Pending) -> None:
        """The aligned timeout passed: every task that has not acknowledged
        ``p`` takes it unaligned from now on."""
        if self._pending is not p:
            return
        p.switched = True
        log.info("checkpoint %d: not aligned after %.3f s; switching to unaligned",
                 p.id, time.monotonic() - p.started)
        switch = SwitchToUnaligned(p.id)
        for t in self.tasks:
            if t.subtask_id not in p.acks and not t.finished:
                t.switch_to_unaligned(switch)

    @property
    def next_id(self) -> int:
        """The id the next checkpoint of this coordinator would get."""
        return self._next_id

    def pending_trigger(self) -> TriggerCheckpoint | None:
        """The trigger of the periodic checkpoint in flight, if any."""
        p = self._pending
        return None if p is None else self._trigger_of(p)

    def task_finished(self, task: CheckpointParticipant) -> None:
        """A task has run its end of input. It owes every checkpoint in
        flight whose barrier it did not see an acknowledgement with its final
        state; once all tasks have finished, the final checkpoint is taken."""
        key = task.subtask_id
        self._finished.add(key)
        p = self._pending
        if p is not None and key not in p.acks and not task.saw_checkpoint(p.id):
            task.acknowledge_final_state(self._trigger_of(p))
        if len(self._finished) == len(self.tasks) and self._final is None:
            # The end of input is a final checkpoint, with an id above every
            # periodic one, so that a restore after the job finished resumes
            # from the end, not from a checkpoint whose output was replayed.
            self._stopped = True
            p = self._pending
            if p is not None and p.id not in self._completing:
                # It would write (nearly) what the final one writes, and the
                # final one commits its transactions too: its snapshots'
                # work is only in the way of the end of the job.
                self._abort(p, "subsumed by the final checkpoint", logging.INFO)
            n = self._next_id
            self._next_id += 1
            final = self._final = _Pending(n, time.time(), time.monotonic(), final=True)
            trigger = TriggerCheckpoint(final.id, final.trigger_time, CheckpointOptions(self.mode))
            for t in self.tasks:
                t.acknowledge_final_state(trigger)

    @property
    def all_finished(self) -> bool:
        """Every task has run its end of input (the final checkpoint is next)."""
        return len(self._finished) == len(self.tasks)

    def stop(self) -> None:
        """Trigger no more periodic checkpoints."""
        self._stopped = True

    async def wait_resumed(self) -> None:
        """Synchronous mode: sources wait here until the checkpoint is done."""
        await self._resume.wait()

    # -- acknowledgements --------------------------------------------------

    def _pending_for(self, checkpoint_id: int) -> _Pending | None:
        for p in (self._pending, self._final):
            if p is not None and p.id == checkpoint_id:
                return p
        return None

    async def acknowledge(self, ack: AcknowledgeCheckpoint) -> None:
        """A participant's snapshot for ``ack.checkpoint_id`` is durable; the
        last acknowledgement completes the checkpoint. One for a checkpoint
        no longer in flight (aborted meanwhile) is ignored: its files go
        with its folder."""
        p = self._pending_for(ack.checkpoint_id)
        if p is None:
            return
        p.acks[ack.subtask] = ack
        if len(p.acks) == len(self.tasks):
            await self._complete(p)

    async def _complete(self, p: _Pending) -> None:
        if p.final:
            self._final = None
        elif self._pending is p:
            self._pending = None
        self._completing.add(p.id)
        try:
            # One at a time, in the order they were acknowledged: the metadata
            # write is awaited (the writer process), and the final checkpoint
            # may be acknowledged while a periodic one is still being written.
            async with self._completion_lock:
                await self._write_and_commit(p)
        finally:
            self._completing.discard(p.id)

    async def _write_and_commit(self, p: _Pending) -> None:
        fault_point("checkpoint.before_metadata")
        duration = time.monotonic() - p.started
        by_sink = self._committables(p)
        if self.storage is not None:
            meta = self._metadata(p, duration)
            writes = [self.storage.metadata_write(p.id, meta.to_json())]
            if by_sink:
                # Durable before any sink commits: a restore from an older
                # checkpoint must find out what to take back, even if this
                # checkpoint's _metadata is what gets lost. Written after the
                # metadata, in the same round trip to the writer process.
                writes.append(commit_record_write(self.storage, CommitRecord(
                    p.id, self.lineage, {uid: tuple(c) for uid, c in by_sink.items()},
                    base=self.base)))
            await self.storage.write_all(writes)
            if self.registry is not None:
                self.registry.register(p.id, (f.path for f in meta.files))
            self.completed.append(p.id)
            self.retained.append(p.id)
            self.stats.append(CheckpointStats(
                p.id, meta.duration, meta.alignment_duration, meta.checkpointed_size,
                meta.full_size, unaligned=meta.unaligned, switched=p.switched,
                channel_state_records=meta.channel_state_records,
                channel_state_bytes=meta.channel_state_size))
            log.info("checkpoint %d complete in %.3f s", p.id, duration)
        fault_point("sink.before_commit")
        for uid, committables in by_sink.items():
            try:
                await awaited(self.sinks[uid].commit(committables))
            except Exception as exc:
                # Retryable: the restart's recover() commits them again.
                raise TaskFailure(f"sink '{uid}' could not commit checkpoint {p.id}: "
                                  f"{type(exc).__name__}: {exc}", uid, None, None) from exc
        complete = NotifyCheckpointComplete(p.id)
        for t in self.tasks:
            t.notify_checkpoint_complete(complete)
        if self.storage is not None:
            await self._retain()
        p.done.set()
        self._resume.set()

    @staticmethod
    def _committables(p: _Pending) -> dict[str, list[Any]]:
        by_sink: dict[str, list[Any]] = {}
        for ack in p.acks.values():
            for uid, part in ack.state.operators.items():
                if part.committables:
                    by_sink.setdefault(uid, []).extend(part.committables)
        return by_sink

    def decline(self, decline: DeclineCheckpoint) -> None:
        """A participant cannot acknowledge ``decline.checkpoint_id`` (its
        snapshot was abandoned): the checkpoint is aborted, the job goes on."""
        p = self._pending_for(decline.checkpoint_id)
        if p is not None:
            who = decline.subtask
            self._abort(p, f"declined by subtask {who.subtask} of chain {who.chain_index}: "
                        f"{decline.reason}", logging.INFO)

    def is_aborted(self, checkpoint_id: int) -> bool:
        """Whether checkpoint ``checkpoint_id`` was aborted in this run."""
        return checkpoint_id in self.aborted

    async def aborted_meanwhile(self, checkpoint_id: int) -> bool:
        """Whether checkpoint ``checkpoint_id`` was aborted, as a task asks
        when a write of it failed (its folder removed under the write). A
        worker process's stand-in waits for the word from the caller."""
        return self.is_aborted(checkpoint_id)

    def _abort(self, p: _Pending, reason: str, level: int = logging.WARNING) -> None:
        if p.id in self._completing:
            return  # acknowledged by every task: it completes, whatever the clock says
        log.log(level, "checkpoint %d aborted: %s", p.id, reason)
        if self._pending is p:
            self._pending = None
        if self._final is p:
            self._final = None
        self.aborted.append(p.id)
        abort = AbortCheckpoint(p.id, reason)
        for t in self.tasks:
            t.abort_checkpoint(abort)
        if self.storage is not None:
            self.storage.discard(p.id)
        p.done.set()
        self._resume.set()

    async def _retain(self) -> None:
        assert self.storage is not None and self.config is not None
        keep = sorted(self.retained)[-self.config.retained:]
        # Decided before the first await: another checkpoint may complete
        # (and retain) while these are deleted.
        victims = [n for n in self.retained if n not in keep]
        self.retained = keep
        for n in victims:
            await self.storage.discard_async(n)
            if self.registry is not None:
                self.registry.unregister(n)
        if victims and keep:
            # No restore can go back past a retained checkpoint: nothing
            # committed before it can need taking back any more.
            remove_commit_records_before(self.storage, keep[0])
        self.sweep_aborted()
        self.collect_shared_garbage()

    def end_run(self) -> None:
        """The run is over, finished or failed, and every write of its tasks
        has landed: a checkpoint still in flight will never be acknowledged.
        Abort it, so that its folder goes and the shared files no retained
        checkpoint references can be collected (a failed run left them
        behind whenever a checkpoint was in flight at the failure)."""
        self._stopped = True
        for p in (self._pending, self._final):
            if p is not None:
                self._abort(p, "the run ended before it completed", logging.INFO)

    def collect_shared_garbage(self) -> None:
        """Remove shared files no retained checkpoint references, unless a
        checkpoint is in flight: its snapshots may build on one of them
        (then it waits for the next completion, or the end of the run)."""
        if self.registry is None:
            return
        if self._pending is not None or self._final is not None or self._completing:
            return
        self.registry.collect_garbage()

    def sweep_aborted(self) -> None:
        """Remove the folders of aborted checkpoints again: a state file
        that was being written when its checkpoint was aborted lands after
        the abort removed the folder, and creates it anew. (Only these: a
        scan of every ``chk-*`` folder at each checkpoint cost a stat per
        retained checkpoint; leftovers of earlier runs go at start-up.)"""
        storage = self.storage
        if storage is None:
            return
        in_flight = {p.id for p in (self._pending, self._final) if p is not None}
        in_flight |= self._completing
        for n in self.aborted:
            if n not in in_flight and os.path.isdir(storage.layout.checkpoint_dir(n)):
                storage.discard(n)

    # -- metadata ----------------------------------------------------------

    def _metadata(self, p: _Pending, duration: float) -> CheckpointMetadata:
        builder = MetadataBuilder(self.plan)
        for key, ack in sorted(p.acks.items()):
            for uid, part in ack.state.operators.items():
                builder.add(uid, key.subtask, part)
            builder.add_files(ack.state.files)
        # Files an earlier retained checkpoint already references were not
        # written by this one (incremental snapshots).
        registry = self.registry
        names = self.tasks_by_key()
        return builder.build(
            job=self.job_name,
            mode=self.mode,
            final=p.final,
            trigger_time=p.trigger_time,
            duration=duration,
            alignment_duration=max((a.stats.alignment_duration for a in p.acks.values()),
                                   default=0.0),
            lineage=self.lineage or None,
            base=self.base,
            unaligned=any(a.stats.unaligned for a in p.acks.values()),
            channel_state_records=sum(a.stats.channel_state_records for a in p.acks.values()),
            channel_state_size=sum(a.stats.channel_state_bytes for a in p.acks.values()),
            tasks={f"{names[k]}[{k.subtask}]": TaskStats(
                a.stats.alignment_duration, a.stats.sync_duration, a.stats.async_duration)
                for k, a in sorted(p.acks.items())},
            written=lambda path: registry is None or not registry.referenced(path),
        )

    def tasks_by_key(self) -> dict[SubtaskId, str]:
        """Each participant's name, by its identity."""
        return {t.subtask_id: t.name for t in self.tasks}
