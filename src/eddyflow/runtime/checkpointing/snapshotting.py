"""The snapshot half of a task, mixed into ``Task`` as :class:`Snapshotting`.

It takes the synchronous phase of every operator's snapshot, forwards the
barrier (ahead of the output in flight for an unaligned checkpoint, whose
overtaken records it captures), writes the snapshot asynchronously and
acknowledges it (``AcknowledgeCheckpoint``, ``runtime/checkpointing/messages.py``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from eddyflow.checkpoint.layout import CheckpointLayout
from eddyflow.checkpoint.metadata import BackEdgeLog, ChannelState, OperatorList, SubtaskState
from eddyflow.checkpoint.storage import CheckpointStorage, FileHandle
from eddyflow.connectors.source import SourceReader
from eddyflow.connectors.splits import SplitPositions, SplitsReader
from eddyflow.errors import StateSerializationError
from eddyflow.keygroups import key_group_range
from eddyflow.runtime.checkpointing.backedge_log import BackEdgeRecords, write_backedge_log
from eddyflow.runtime.checkpointing.barriers import BarrierHandler
from eddyflow.runtime.checkpointing.channel_state import (
    ChannelStateLog,
    encode_batches,
    write_channel_state,
)
from eddyflow.runtime.checkpointing.messages import (
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    SubtaskCheckpointStats,
    SubtaskId,
    TaskStateSnapshot,
)
from eddyflow.runtime.exchange.channel import InputGate
from eddyflow.runtime.exchange.events import Barrier, RecordBatch
from eddyflow.runtime.exchange.writers import RecordWriter
from eddyflow.runtime.faults import fault_point
from eddyflow.runtime.operators.base import Operator, OperatorSnapshot
from eddyflow.state.abc import SnapshotAbandoned, SnapshotTarget

if TYPE_CHECKING:
    from eddyflow.runtime.checkpointing.coordinator import CheckpointCoordinator
    from eddyflow.runtime.recovery.restore import RestoredCheckpoint

__all__ = ["Snapshotting"]


@dataclass
class _Captured:
    """What unaligned barriers overtook on a task's outputs for one
    checkpoint: per channel key, the batches (pickled) and their records."""

    blobs: dict[str, list[bytes]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


class Snapshotting:
    """Mixed into ``Task``: snapshots, their writes and acknowledgements."""

    coordinator: CheckpointCoordinator | None
    operators: list[Operator]
    writers: list[RecordWriter]
    gate: InputGate | None
    reader: SourceReader | None
    source_uid: str | None
    subtask_id: SubtaskId
    subtask: int
    parallelism: int
    spawn: Callable[[Callable[[], Awaitable[None]]], None] | None
    barriers: BarrierHandler
    finished: bool

    def _init_snapshots(self) -> None:
        self._captured: dict[int, _Captured] = {}
        self._unaligned_ids: set[int] = set()  # checkpoints this task took unaligned
        self._snapshots: dict[int, dict[str, OperatorSnapshot | None]] = {}
        # Each operator's watermark at the synchronous phase of checkpoint n.
        self._snapshot_watermarks: dict[int, dict[str, float]] = {}
        # The source's position at its end, recorded in every checkpoint
        # this task acknowledges once finished.
        self._final_position: Any = None

    # what Task provides
    def _serialization_failure(self, exc: StateSerializationError) -> BaseException:
        raise NotImplementedError

    def _operator_failure(self, op: Operator, exc: BaseException) -> BaseException:
        raise NotImplementedError

    # -- the barrier handler's callbacks (CheckpointHost) ----------------------

    def spawn_write(self, write: Callable[[], Awaitable[None]]) -> None:
        """Run a snapshot's asynchronous write in the job's task group."""
        if self.spawn is not None:
            self.spawn(write)

    def state_error(self, exc: StateSerializationError) -> BaseException:
        """``exc`` (a record that cannot be pickled) as this task's failure."""
        return self._serialization_failure(exc)

    async def _acknowledge_finished(self, n: int) -> None:
        """Acknowledge checkpoint ``n`` with this finished task's final state
        (sources at their end, keyed state as it ended, pending sink
        transactions)."""
        coordinator = self.coordinator
        assert coordinator is not None and self.finished
        self.barriers.mark_done(n)
        await self._prepare_snapshots(n)
        snaps = self._snapshot_operators(n)
        await self._write_and_ack(n, snaps, self._final_position, 0.0, 0.0)

    def _keep_final_position(self, position: Any) -> None:
        """The input has ended at ``position`` (a source's; ``None`` for a
        task with inputs): the final state's acknowledgements record it."""
        self._final_position = position

    @property
    def state_owner(self) -> str:
        """The operator this task's channel state belongs to: its source,
        or the first operator of its chain."""
        return str(self.source_uid) if self.reader is not None else self.operators[0].uid

    def _capture(self, n: int, overtaken: dict[str, list[RecordBatch]],
                 *, unaligned: bool = False) -> None:
        """Keep what barrier ``n`` overtook on the outputs as channel state;
        ``unaligned``: the checkpoint is taken unaligned here from now on
        (a barrier being forwarded aligned was switched)."""
        if unaligned:
            self._unaligned_ids.add(n)
        cap = self._captured.setdefault(n, _Captured())
        try:
            for key, batches in overtaken.items():
                cap.blobs.setdefault(key, []).extend(
                    encode_batches(batches, self.state_owner, n))
                cap.counts[key] = cap.counts.get(key, 0) + sum(map(len, batches))
        except StateSerializationError as exc:
            raise self._serialization_failure(exc) from exc

    # -- snapshots -----------------------------------------------------------

    async def take_checkpoint(self, barrier: Barrier, *, alignment: float = 0.0,
                              position: Any = None, forward: bool = True,
                              unaligned: bool = False, waiting: set[int] | None = None,
                              taken: dict[int, list[RecordBatch]] | None = None) -> None:
        """Snapshot for ``barrier`` and forward it. Unaligned: it overtakes
        this task's output in flight, and the inputs in ``waiting`` are
        logged until their barrier comes (``taken``: records already
        captured on inputs whose barrier was taken out of the queue)."""
        n = barrier.checkpoint_id
        coordinator = self.coordinator
        if coordinator is None:
            return
        t0 = time.monotonic()
        await self._prepare_snapshots(n)
        snaps = self._snapshot_operators(n)
        sync_duration = time.monotonic() - t0
        if unaligned:
            self._unaligned_ids.add(n)

        async def write(backlog: ChannelStateLog | None = None) -> None:
            await self._write_and_ack(n, snaps, position, alignment, sync_duration, backlog)

        back_edges, release = self.barriers.take_early(n)
        if not (forward and coordinator.storage is not None):
            back_edges = []
        waiting = waiting or set()
        if waiting or back_edges or taken:
            # A loop head: the snapshot is written once the barrier has come
            # back on every back-edge, with the records logged meanwhile; an
            # unaligned checkpoint: once it has come on every input.
            self.barriers.open_log(n, waiting, back_edges, taken or {}, write)
            if forward:
                await self._forward(barrier, unaligned)
            self.barriers.close_log_if_complete()
        elif (coordinator.synchronous or self.spawn is None) and not unaligned:
            await write()
            if forward:
                await self._forward(barrier, unaligned)
        else:
            if forward:
                await self._forward(barrier, unaligned)
            if self.spawn is None:
                await write()
            else:
                self.spawn(write)
        self.barriers.release(release)

    async def _forward(self, barrier: Barrier, unaligned: bool) -> None:
        if unaligned:
            for w in self.writers:
                self._capture(barrier.checkpoint_id, w.overtake(barrier))
        else:
            for w in self.writers:
                await w.emit_event(barrier)

    async def _prepare_snapshots(self, n: int) -> None:
        """The awaited part of the barrier's work (a sink's asynchronous
        pre-commit), operator by operator, before the synchronous phase."""
        for op in self.operators:
            if op.awaits:
                try:
                    await op.prepare_snapshot(n)
                except Exception as exc:
                    raise self._operator_failure(op, exc) from exc

    def _snapshot_operators(self, n: int) -> dict[str, OperatorSnapshot | None]:
        """The synchronous half of every operator's snapshot for checkpoint
        ``n``. Without storage (no checkpointing) only the sinks'
        transactions matter: keyed state is not snapshotted."""
        coordinator = self.coordinator
        assert coordinator is not None
        storage = coordinator.storage
        target = None if storage is None else SnapshotTarget(
            storage, n, coordinator.run_id, self.subtask,
            at_end=coordinator.all_finished)
        snaps: dict[str, OperatorSnapshot | None] = {}
        for op in self.operators:
            try:
                snaps[op.uid] = op.snapshot(n, target)
            except Exception as exc:
                # Name the operator and subtask whose snapshot failed (a
                # value that cannot be pickled, mostly); the half-taken
                # snapshots of the operators before it are given up.
                self._cancel_snapshots(snaps)
                raise self._operator_failure(op, exc) from exc
        # Until written: an abort stops their work (a forked child, say).
        self._snapshots[n] = snaps
        self._snapshot_watermarks[n] = {op.uid: op.watermark for op in self.operators
                                        if op.watermark > -math.inf}
        return snaps

    async def _write_and_ack(self, n: int, snaps: dict[str, OperatorSnapshot | None],
                             position: Any, alignment: float, sync_duration: float,
                             backlog: ChannelStateLog | None = None) -> None:
        try:
            await self._write_and_ack_now(n, snaps, position, alignment, sync_duration, backlog)
        except SnapshotAbandoned as exc:
            # A later snapshot of this subtask subsumes it (its final one):
            # checkpoint n cannot complete, the task has nothing to repair.
            self._cancel_snapshots(snaps)
            coordinator = self.coordinator
            if coordinator is not None:
                coordinator.decline(DeclineCheckpoint(n, self.subtask_id, str(exc)))
        except OSError:
            self._cancel_snapshots(snaps)
            coordinator = self.coordinator
            if coordinator is not None and await coordinator.aborted_meanwhile(n):
                return  # the abort removed the folder under our write: nothing lost
            raise
        except StateSerializationError as exc:  # a forked snapshot's, or the checkpoint thread's
            self._cancel_snapshots(snaps)
            raise self._serialization_failure(exc) from exc
        except BaseException:
            self._cancel_snapshots(snaps)
            raise
        finally:
            self._snapshots.pop(n, None)
            self._snapshot_watermarks.pop(n, None)
            self._captured.pop(n, None)
            self._unaligned_ids.discard(n)

    def _forget_checkpoint(self, n: int) -> None:
        """Checkpoint ``n`` was aborted: its snapshots still being written
        stop, and nothing taken for it is kept."""
        self._captured.pop(n, None)
        self._unaligned_ids.discard(n)
        self._snapshot_watermarks.pop(n, None)
        snaps = self._snapshots.pop(n, None)
        if snaps is not None:
            self._cancel_snapshots(snaps)

    @staticmethod
    def _cancel_snapshots(snaps: dict[str, OperatorSnapshot | None]) -> None:
        for snap in snaps.values():
            if snap is not None and snap.keyed is not None:
                snap.keyed.cancel()

    async def _write_and_ack_now(self, n: int, snaps: dict[str, OperatorSnapshot | None],
                                 position: Any, alignment: float, sync_duration: float,
                                 backlog: ChannelStateLog | None) -> None:
        coordinator = self.coordinator
        assert coordinator is not None
        storage = coordinator.storage
        t0 = time.monotonic()
        parts: dict[str, SubtaskState] = {}
        files: list[FileHandle] = []
        if self.source_uid is not None:
            if isinstance(position, SplitPositions):
                parts[self.source_uid] = SubtaskState(is_source=True, position=position.positions,
                                                      splits=position.splits)
            else:
                parts[self.source_uid] = SubtaskState(is_source=True, position=position)
        if storage is not None:
            fault_point("snapshot.async_write")
        watermarks = self._snapshot_watermarks.get(n, {})
        for uid in snaps:
            # The operator's event time at the barrier, if it has any yet.
            parts[uid] = SubtaskState(watermark=watermarks.get(uid))
        # The records in flight and the keyed state go to the writer process
        # together, without a task per part: each round trip, and a task's
        # start and end, wait for turns of a busy loop (the deep pipeline of
        # ``benchmarks/backpressure.py`` counts them).
        flight = self._start_in_flight_files(n, storage, backlog, parts, files)
        try:
            await self._keyed_files(snaps, parts, files)
            await self._operator_list_files(n, storage, snaps, parts, files)
        except BaseException:
            with contextlib.suppress(Exception):
                await flight  # under way: let it land or fail before giving up
            raise
        state_records, state_size = await flight
        await coordinator.acknowledge(AcknowledgeCheckpoint(
            n, self.subtask_id, TaskStateSnapshot(parts, tuple(files)),
            SubtaskCheckpointStats(
                alignment, sync_duration, time.monotonic() - t0,
                unaligned=n in self._unaligned_ids, channel_state_records=state_records,
                channel_state_bytes=state_size)))

    @staticmethod
    async def _keyed_files(snaps: dict[str, OperatorSnapshot | None],
                           parts: dict[str, SubtaskState], files: list[FileHandle]) -> None:
        for uid, snap in snaps.items():
            if snap is None:
                continue
            keyed = None
            if snap.keyed is not None:
                keyed = await snap.keyed.write()
                files.extend(keyed.file_handles())
            part = parts.get(uid, SubtaskState())  # read after the write's await
            if keyed is not None:
                part = replace(part, keyed=keyed)
            if snap.committables:
                part = replace(part, committables=tuple(snap.committables))
            parts[uid] = part

    async def _operator_list_files(self, n: int, storage: CheckpointStorage | None,
                                   snaps: dict[str, OperatorSnapshot | None],
                                   parts: dict[str, SubtaskState], files: list[FileHandle]
                                   ) -> None:
        """Write each operator's list state (pickled at the barrier) to a
        file of its own in checkpoint ``n``."""
        if storage is None:
            return
        for uid, snap in snaps.items():
            if snap is None or snap.operator_list is None:
                continue
            rel = CheckpointLayout.operator_list_file(n, uid, self.subtask)
            handle = await storage.start_write_file(rel, [snap.operator_list])
            files.append(handle)
            parts[uid] = replace(parts.get(uid, SubtaskState()),
                                 operator_list=OperatorList(handle, snap.operator_list_records))

    def _start_in_flight_files(self, n: int, storage: CheckpointStorage | None,
                               backlog: ChannelStateLog | None,
                               parts: dict[str, SubtaskState], files: list[FileHandle]
                               ) -> Coroutine[Any, Any, tuple[int, int]]:
        """Start writing checkpoint ``n``'s records in flight: a loop head's
        back-edge log, and the channel state of an unaligned checkpoint (the
        requests go to the writer process now). Await the result: the
        channel state's records and bytes, once the files are durable."""
        inputs: dict[str, list[bytes]] = {}
        in_counts: dict[str, int] = {}
        backedge: tuple[str, int, Coroutine[Any, Any, FileHandle]] | None = None
        if backlog is not None and storage is not None and backlog.back_edges:
            # The back-edge log belongs to the head operator, first in this task.
            head = self.operators[0].uid
            rel = CheckpointLayout.backedge_log_file(n, head, self.subtask)
            back = {i: backlog.records.get(i, []) for i in backlog.back_edges}
            logged = sum(backlog.counts.get(i, 0) for i in backlog.back_edges)
            backedge = head, logged, write_backedge_log(storage, rel,
                                                        BackEdgeRecords(back, logged))
        if backlog is not None and self.gate is not None:
            for i, blobs in backlog.records.items():
                if i not in backlog.back_edges and blobs:
                    key = self.gate.channels[i].key
                    inputs[key] = blobs
                    in_counts[key] = backlog.counts.get(i, 0)
        captured = self._captured.pop(n, None)
        outputs = {k: v for k, v in captured.blobs.items() if v} if captured else {}
        out_counts = {k: captured.counts[k] for k in outputs} if captured else {}
        owner = self.state_owner
        channel_state = None
        if (inputs or outputs) and storage is not None:
            rel = CheckpointLayout.channel_state_file(n, owner, self.subtask)
            try:
                channel_state = write_channel_state(storage, rel, inputs, outputs)
            except BaseException:
                if backedge is not None:
                    backedge[2].close()
                raise

        async def written() -> tuple[int, int]:
            # Both awaited, even if the first fails: neither is left behind.
            try:
                if backedge is not None:
                    head, logged, pending = backedge
                    log_handle = await pending
                    files.append(log_handle)
                    parts[head] = replace(parts.get(head, SubtaskState()),
                                          backedge=BackEdgeLog(log_handle, logged))
            finally:
                handle = await channel_state if channel_state is not None else None
            if handle is None:
                return 0, 0
            files.append(handle)
            parts[owner] = replace(parts.get(owner, SubtaskState()),
                                   channel_state=ChannelState(handle, in_counts, out_counts))
            return sum(in_counts.values()) + sum(out_counts.values()), handle.size

        return written()

    def _restore(self, restored: RestoredCheckpoint) -> None:
        for op in self.operators:
            c = op.ctx
            wm = restored.watermark(op.uid, key_group_range(c.subtask, c.max_parallelism,
                                                            c.parallelism))
            if wm is not None:
                op.watermark = wm
            if op.keyed:
                c = op.ctx
                groups = key_group_range(c.subtask, c.max_parallelism, c.parallelism)
                op.restore_keyed(restored.storage.root, restored.keyed_kinds(op.uid),
                                 restored.keyed_handles(op.uid, groups))
                if op.reads_every_key_group:
                    op.restore_broadcast(restored.storage.root,
                                         restored.keyed_handles(op.uid, range(c.max_parallelism)))
            if restored.has_operator_list(op.uid):
                op.restore_operator_list(restored.operator_list(op.uid, c.subtask, c.parallelism))
        if self.reader is not None and not isinstance(self.reader, SplitsReader):
            # (A split source's reader was given its restored splits when
            # the job was built: runtime/job.py.)
            assert self.source_uid is not None
            pos = restored.source_position(self.source_uid, self.subtask, self.parallelism)
            if pos is not None:
                self.reader.seek(pos)

