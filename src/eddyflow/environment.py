"""``StreamEnvironment``: where a job is declared, configured and executed."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import AsyncIterable, Iterable
from typing import Any

from eddyflow.checkpoint.commits import commit_record_ids, next_checkpoint_id
from eddyflow.checkpoint.lock import FolderLock
from eddyflow.checkpoint.metadata import read_checkpoint
from eddyflow.checkpoint.storage import (
    METADATA,
    CheckpointCorrupted,
    CheckpointStorage,
    parse_checkpoint_dir,
)
from eddyflow.connectors.asynciter import AsyncIterableSource
from eddyflow.connectors.collection import CollectionSource
from eddyflow.connectors.log import LogSource
from eddyflow.connectors.sink import Sink
from eddyflow.connectors.source import Source
from eddyflow.connectors.textfile import TextFileSource
from eddyflow.datastream import DataStream
from eddyflow.errors import JobFailed, RestoreRefused, is_retryable
from eddyflow.graph.logical import LogicalGraph, Partitioning
from eddyflow.graph.plan import ExecutionPlan, build_plan
from eddyflow.keygroups import MAX_PARALLELISM
from eddyflow.restart import NoRestart, RestartStrategy
from eddyflow.result import JobResult
from eddyflow.runtime.checkpointing.barriers import MODES, CheckpointMode
from eddyflow.runtime.checkpointing.coordinator import CheckpointConfig
from eddyflow.runtime.job import JobRunner, RuntimeConfig
from eddyflow.runtime.metrics import MetricsCallback, MetricsReporter
from eddyflow.runtime.operators.io import SinkSpec, SourceSpec
from eddyflow.runtime.recovery.restore import RestoredCheckpoint
from eddyflow.runtime.recovery.supersede import supersede_later_output
from eddyflow.runtime.time.clock import WALL_CLOCK, Clock
from eddyflow.state.abc import StateBackend
from eddyflow.state.memory import MemoryStateBackend

__all__ = ["StreamEnvironment"]

log = logging.getLogger("eddyflow")


def _latest_or_refuse(storage: CheckpointStorage) -> RestoredCheckpoint | None:
    """The latest checkpoint of ``storage`` that verifies; ``None`` for a
    folder where no checkpoint ever completed; refused where some did but
    none verifies: a fresh start there would write the sinks' output again."""
    latest = RestoredCheckpoint.latest(storage)
    if latest is not None:
        return latest
    completed = sorted(set(storage.completed_ids()) | set(commit_record_ids(storage)))
    if not completed:
        return None
    raise RestoreRefused(
        f"restore='latest': no checkpoint in {storage.root} verifies (checkpoints "
        f"{', '.join(map(str, completed))} completed; the warnings above say what is "
        "wrong with each); pass restore=None to start afresh deliberately")


def _base_of(restored: RestoredCheckpoint | None, own: str | None) -> tuple[str, int] | None:
    """The ``base`` of a run's checkpoints (checkpoint/commits.py): a restore from
    the job's own folder inherits its checkpoint's, one from another folder
    is based on that checkpoint; a fresh start has none."""
    if restored is None:
        return None
    if restored.storage.root == own:
        return restored.meta.base
    return (restored.storage.root, restored.checkpoint_id)


def _report_lost_metadata(storage: CheckpointStorage) -> None:
    """A ``chk-<n>`` folder without ``_metadata`` cannot be restored and is
    removed at start. Say so: normally a checkpoint a crash interrupted
    (its state files may live in ``shared/``), but possibly one whose
    ``_metadata`` was lost — certainly that when its sinks had committed (a
    commit record exists)."""
    committed = set(commit_record_ids(storage))
    for n in storage.checkpoint_ids():
        folder = storage.checkpoint_dir(n)
        meta = os.path.join(folder, METADATA)
        if os.path.exists(meta) or os.path.exists(meta + ".superseded"):
            continue
        if n in committed:
            log.warning("checkpoint %d had completed (its sinks committed its output) but "
                        "%s is missing: it cannot be restored and is removed", n, meta)
        else:
            log.warning("%s has no _metadata (a checkpoint a crash interrupted, or one "
                        "whose _metadata was lost): it cannot be restored and is removed",
                        folder)


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    return value


def _positive_seconds(value: Any, what: str) -> float:
    """``value`` as a finite, positive number of seconds, or ``ValueError``."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 < value < float("inf")):
        raise ValueError(f"{what} must be > 0 seconds, got {value!r}")
    return float(value)


class StreamEnvironment:
    """Declares a job (sources, transformations, sinks) and runs it.

    ``batch_size`` (records per channel batch), ``buffer_timeout`` (seconds a
    record may wait in an output buffer while its task is busy) and
    ``channel_capacity`` (a channel holds ``channel_capacity * batch_size``
    records, plus at most one batch, before it back-pressures the producer)
    tune the runtime; the defaults favour throughput with a
    latency bound of about 10 ms. ``buffer_debloat_target`` (seconds, 1 by
    default; ``None``: off) bounds the records in flight by time rather than
    by count, after Flink's buffer debloating: behind a slow consumer each
    channel holds, and its producer hands over at once, only what that
    consumer works off, at its measured rate, within the target, so an
    aligned barrier crosses a back-pressured stage in about that time.
    Channels never grow past ``channel_capacity`` and ``batch_size``.

    An environment runs its job once: a second ``execute()`` or
    ``execute_async()`` raises ``RuntimeError`` (the sinks and sources it
    declared belong to the first run, and a ``ListSink`` would get the
    output twice). Build a new environment for another run, with
    ``restore="latest"`` to resume from the first run's checkpoints.
    """

    def __init__(
        self,
        parallelism: int = 1,
        max_parallelism: int = 128,
        *,
        batch_size: int = 1024,
        buffer_timeout: float = 0.01,
        channel_capacity: int = 8,
        chaining: bool = True,
        buffer_debloat_target: float | None = 1.0,
    ) -> None:
        self.parallelism = _positive_int(parallelism, "parallelism")
        self.max_parallelism = _positive_int(max_parallelism, "max_parallelism")
        if self.max_parallelism > MAX_PARALLELISM:
            # Key groups are a two-byte prefix of RocksDB rows, and each one
            # costs bookkeeping in every keyed subtask (Flink's cap, too).
            raise ValueError(f"max_parallelism {max_parallelism} exceeds the limit of "
                             f"{MAX_PARALLELISM} key groups")
        if self.parallelism > self.max_parallelism:
            raise ValueError(
                f"parallelism {parallelism} exceeds max_parallelism {max_parallelism}"
            )
        self.batch_size = _positive_int(batch_size, "batch_size")
        if not buffer_timeout >= 0:
            raise ValueError(f"buffer_timeout must be >= 0 seconds, got {buffer_timeout}")
        self.buffer_timeout = float(buffer_timeout)
        self.channel_capacity = _positive_int(channel_capacity, "channel_capacity")
        self.buffer_debloat_target = (None if buffer_debloat_target is None else
                                      _positive_seconds(buffer_debloat_target,
                                                        "buffer_debloat_target"))
        self.chaining = chaining
        self.state_backend: StateBackend = MemoryStateBackend()
        self.checkpoint_config: CheckpointConfig | None = None
        self.restart_strategy: RestartStrategy = NoRestart()
        self.clock: Clock = WALL_CLOCK
        self.auto_watermark_interval = 0.2
        self._graph = LogicalGraph()
        #: The name of the job this environment ran (see the class docstring).
        self._executed: str | None = None
        self._metric_callbacks: list[tuple[MetricsCallback, float]] = []
        self._metrics_port: int | None = None
        #: Where ``expose_metrics`` serves, while the job runs: (host, port).
        self.metrics_address: tuple[str, int] | None = None

    # -- configuration -------------------------------------------------------

    def set_state_backend(self, backend: StateBackend) -> StreamEnvironment:
        if not isinstance(backend, StateBackend):
            raise TypeError(f"set_state_backend needs an ef.StateBackend, got {backend!r}")
        self.state_backend = backend
        return self

    def enable_checkpointing(
        self,
        interval: float = 1.0,
        directory: str | os.PathLike[str] = "checkpoints",
        mode: str = "exactly_once",
        retained: int = 3,
        timeout: float = 60.0,
        aligned_timeout: float | None = None,
    ) -> StreamEnvironment:
        """Take a checkpoint every ``interval`` seconds into ``directory``.

        ``mode="unaligned"``: barriers overtake the records queued in front
        of them, which become channel state, so checkpoints complete under
        back-pressure. ``aligned_timeout`` (with ``exactly_once``): each
        checkpoint starts aligned and switches to unaligned if it is not
        complete this many seconds after it started."""
        interval = _positive_seconds(interval, "checkpoint interval")
        if mode not in MODES:
            raise ValueError(f"checkpoint mode must be one of {', '.join(MODES)}; got {mode!r}")
        if aligned_timeout is not None:
            if mode != "exactly_once":
                raise ValueError(f"aligned_timeout switches aligned checkpoints to unaligned: "
                                 f"it needs mode 'exactly_once', not {mode!r}")
            if (isinstance(aligned_timeout, bool) or not isinstance(aligned_timeout, int | float)
                    or not aligned_timeout >= 0):
                raise ValueError(f"aligned_timeout must be >= 0 seconds, got {aligned_timeout!r}")
        _positive_int(retained, "retained")
        if not os.fspath(directory).strip():
            raise ValueError("checkpoint directory must not be empty (it would be the "
                             "current folder)")
        if not timeout > 0:
            raise ValueError(f"checkpoint timeout must be > 0 seconds, got {timeout!r}")
        self.checkpoint_config = CheckpointConfig(
            float(interval), os.fspath(directory), CheckpointMode(mode), retained, float(timeout),
            None if aligned_timeout is None else float(aligned_timeout),
        )
        return self

    def on_metrics(self, fn: MetricsCallback, every: float = 1.0) -> StreamEnvironment:
        """Call ``fn(metrics)`` (an ``ef.JobMetrics``) every ``every`` seconds
        while the job runs, and once more as it ends. An exception in ``fn``
        is logged; the job goes on."""
        if not callable(fn):
            raise TypeError(f"on_metrics needs a callable, got {fn!r}")
        self._metric_callbacks.append((fn, _positive_seconds(every, "metrics interval")))
        return self

    def expose_metrics(self, port: int = 9249) -> StreamEnvironment:
        """Serve the job's metrics to Prometheus on ``127.0.0.1:port`` while it
        runs (0: a free port, see ``metrics_address``). Off unless called."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"metrics port must be 0-65535, got {port!r}")
        self._metrics_port = port
        return self

    def set_clock(self, clock: Clock) -> StreamEnvironment:
        """Where processing time comes from (processing-time timers,
        idleness): the wall clock by default; ``ef.testing.ManualClock`` in
        tests."""
        if not all(callable(getattr(clock, m, None)) for m in ("now", "call_at")):
            raise TypeError(f"set_clock needs a clock with now() and call_at(), got {clock!r}")
        self.clock = clock
        return self

    def set_auto_watermark_interval(self, seconds: float) -> StreamEnvironment:
        """How often a watermark generator's watermark goes out while records
        keep coming (Flink's ``autoWatermarkInterval``, 0.2 s by default; 0:
        after every batch). It always goes out when the input runs dry."""
        if not seconds >= 0:
            raise ValueError(f"auto watermark interval must be >= 0 seconds, got {seconds!r}")
        self.auto_watermark_interval = float(seconds)
        return self

    def set_restart_strategy(self, strategy: RestartStrategy) -> StreamEnvironment:
        if not isinstance(strategy, RestartStrategy):
            raise TypeError(f"set_restart_strategy needs an ef.RestartStrategy, got {strategy!r}")
        self.restart_strategy = strategy
        return self

    def disable_operator_chaining(self) -> StreamEnvironment:
        """Run every operator in its own task (for debugging and measurements)."""
        self.chaining = False
        return self

    # -- sources -------------------------------------------------------------

    def from_source(self, source: Source, *, parallelism: int | None = None) -> DataStream:
        if not isinstance(source, Source):
            raise TypeError(f"from_source needs an ef.Source, got {source!r:.100}")
        # An unnamed source's uid derives from its description (its type
        # and file or log name: ``source.name``) and its ordinal among
        # equal sources, not from how many operators were declared before.
        node = self._graph.add_node(
            "source", SourceSpec(source), detail=source.name, is_source=True,
            parallelism=parallelism, max_source_parallelism=source.max_parallelism,
        )
        return DataStream(self, ((node.id, Partitioning.DEFAULT, None),), node)

    def from_collection(self, items: Iterable[Any]) -> DataStream:
        """Records of an in-memory collection; parallelism 1 unless set."""
        if isinstance(items, str | bytes) or not isinstance(items, Iterable):
            raise TypeError(f"from_collection needs an iterable of records, got {items!r:.100}")
        return self.from_source(CollectionSource(items), parallelism=1)

    def read_text_file(self, path: str | os.PathLike[str], encoding: str = "utf-8") -> DataStream:
        """One record per line; split over the source's parallel subtasks by byte range."""
        return self.from_source(TextFileSource(path, encoding))

    def from_log(self, path: str | os.PathLike[str], *, bounded: bool = True) -> DataStream:
        """Records of an :class:`ef.Log`, one source subtask per group of
        partitions; positions are per-partition offsets."""
        return self.from_source(LogSource(path, bounded=bounded))

    def from_async_iterable(self, aiterable: AsyncIterable[Any]) -> DataStream:
        """Records of an async iterator (not replayable: at-most-once)."""
        return self.from_source(AsyncIterableSource(aiterable), parallelism=1)

    # -- execution -----------------------------------------------------------

    def plan(self) -> ExecutionPlan:
        """The execution plan of the job declared so far."""
        return build_plan(self._graph, self.parallelism, self.max_parallelism,
                          chaining=self.chaining)

    def _runtime_config(self) -> RuntimeConfig:
        return RuntimeConfig(
            batch_size=self.batch_size,
            buffer_timeout=self.buffer_timeout,
            channel_capacity=self.channel_capacity,
            buffer_debloat_target=self.buffer_debloat_target,
            max_parallelism=self.max_parallelism,
            state_backend=self.state_backend,
            clock=self.clock,
            auto_watermark_interval=self.auto_watermark_interval,
        )

    def _storage(self) -> CheckpointStorage | None:
        cfg = self.checkpoint_config
        return CheckpointStorage(cfg.directory) if cfg is not None else None

    def _refuse_second_execution(self, job_name: str) -> None:
        """Refuse a second run of this environment, before anything is done
        (a refused run must not touch the checkpoint folder or the sinks of
        a first one, which may still be running). The run marks the
        environment as executed once its arguments are checked (an execute
        refused for a bad ``restore`` ran nothing: it may be called again),
        with no await in between: two concurrent ``execute_async`` cannot
        both get through."""
        if self._executed is not None:
            raise RuntimeError(
                f"this StreamEnvironment already executed job '{self._executed}'; build a "
                f"new environment to run '{job_name}' (its sinks hold the first run's output)")

    def _resolve_restore(self, restore: str | os.PathLike[str] | None
                         ) -> RestoredCheckpoint | None:
        if restore is None:
            return None
        storage = self._storage()
        if restore == "latest":
            if storage is None:
                return None  # nothing can have been checkpointed: a fresh start
            return _latest_or_refuse(storage)
        path = os.path.abspath(os.fspath(restore))
        n = parse_checkpoint_dir(path)
        if n is None:
            raise ValueError(f"restore={restore!r}: expected 'latest' or a chk-<n> folder")
        at = CheckpointStorage(os.path.dirname(path))
        try:
            meta = read_checkpoint(at, n, verify_files=True)
        except CheckpointCorrupted as exc:
            raise RestoreRefused(f"cannot restore from {path}: {exc}") from exc
        return RestoredCheckpoint(at, n, meta)

    async def execute_async(self, job_name: str = "eddyflow job",
                            restore: str | os.PathLike[str] | None = None, *,
                            allow_non_restored_state: bool = False) -> JobResult:
        """Run the job inside the running event loop; cancelling the awaiting
        task cancels every task of the job.

        ``restore``: ``None`` (fresh start), ``"latest"`` (the latest complete
        checkpoint in the checkpoint directory, or a fresh start if there is
        none; refused if the directory holds checkpoints none of which
        verifies) or the path of a ``chk-<n>`` folder. Failures restart the
        job from its latest complete checkpoint as the restart strategy
        allows. Sink output committed after the checkpoint a run resumes
        from is taken back first (``Sink.supersede``), so that nothing is
        written twice. The job holds the checkpoint directory's lock while
        it runs: a second job on the same directory is refused.

        State in the restored checkpoint that no operator of the job matches
        by uid and kind refuses the restore before anything runs
        (:class:`ef.IncompatibleCheckpoint`, a ``ValueError``), unless
        ``allow_non_restored_state`` drops it (with a warning naming it).
        """
        plan = self.plan()
        self._refuse_second_execution(job_name)
        config = self._runtime_config()
        storage = self._storage()
        lock = FolderLock(storage.root, job_name) if storage is not None else None
        if lock is not None:
            lock.acquire()
        try:
            return await self._execute_locked(plan, config, storage, job_name, restore,
                                              allow_non_restored_state)
        finally:
            if lock is not None:
                lock.release()

    async def _execute_locked(self, plan: ExecutionPlan, config: RuntimeConfig,
                              storage: CheckpointStorage | None, job_name: str,
                              restore: str | os.PathLike[str] | None,
                              allow_non_restored_state: bool) -> JobResult:
        if storage is not None:
            _report_lost_metadata(storage)
        restored = self._resolve_restore(restore)
        if restored is not None:
            restored.check_compatible(plan, allow_non_restored_state=allow_non_restored_state)
        # A fresh start draws a new lineage; a restore continues the one of
        # its checkpoint (checkpoint/commits.py).
        lineage = (restored.meta.lineage if restored is not None else None) \
            or secrets.token_hex(8)
        sinks = {n.uid: n.payload.sink for n in plan.graph.nodes
                 if isinstance(n.payload, SinkSpec)}
        journals = [s for s in (storage, restored.storage if restored else None)
                    if s is not None]
        own = storage.root if storage is not None else None
        if restored is not None:
            supersede_later_output(restored, lineage, journals, sinks, own=own)
        if storage is not None:
            storage.ensure()
            removed = storage.clean_incomplete()
            if removed:
                log.info("removed incomplete checkpoints %s", removed)
        self._executed = job_name  # (no await since the check: it holds)
        reporter = MetricsReporter.create(job_name, self._metric_callbacks, self._metrics_port)
        reporter.start_server()
        self.metrics_address = reporter.address
        watching = asyncio.ensure_future(reporter.run())
        ok = False
        try:
            result = await self._run_attempts(plan, config, storage, job_name, restored,
                                              lineage, sinks, journals, own, reporter)
            ok = True
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            # The callbacks see the end of a job that finished; a failed one
            # ends in its exception.
            result_metrics = reporter.finish(notify=ok)
            reporter.stop_server()
            self.metrics_address = None
        result.metrics = result_metrics
        return result

    async def _run_attempts(self, plan: ExecutionPlan, config: RuntimeConfig,
                            storage: CheckpointStorage | None, job_name: str,
                            restored: RestoredCheckpoint | None, lineage: str,
                            sinks: dict[str, Sink], journals: list[CheckpointStorage],
                            own: str | None, reporter: MetricsReporter) -> JobResult:
        strategy = self.restart_strategy
        restarts = 0
        completed: list[int] = []
        # A restart resumes from this execution's own checkpoints (or the one
        # it was restored from), never from those of an earlier, unrelated run
        # that happen to share the directory.
        initial = restored  # may live in another directory than our own checkpoints
        used_ids = 1  # ids are never reused within an execution, aborted ones included
        while True:
            next_id = max(next_checkpoint_id(storage) if storage is not None else 1, used_ids)
            runner = JobRunner(plan, config, job_name, checkpointing=self.checkpoint_config,
                               restore=restored, next_checkpoint_id=next_id,
                               completed_checkpoints=completed, lineage=lineage,
                               base=_base_of(restored, own))
            reporter.attach(runner, restarts)
            try:
                result = await runner.run()
            except JobFailed as exc:
                completed = list(runner.coordinator.completed)
                used_ids = runner.coordinator.next_id
                if restarts >= strategy.attempts or not is_retryable(exc):
                    # (A failure that a restart cannot get past, such as a
                    # state value that cannot be pickled, fails the job at
                    # once: retrying would only fail the same way again.)
                    if restarts:
                        exc.add_note(f"the job was restarted {restarts} times")
                    raise
                restarts += 1
                log.warning("job '%s' failed (%s); restart %d of %d", job_name, exc,
                            restarts, strategy.attempts)
                await asyncio.sleep(strategy.delay)
                restored = initial
                if storage is not None:
                    storage.clean_incomplete()  # the failed attempt's checkpoint in flight
                    latest = RestoredCheckpoint.latest(storage, among=completed)
                    if latest is not None:
                        restored = latest
                    # The latest completed checkpoint may not verify any more:
                    # what the sinks committed after the one resumed from goes.
                    supersede_later_output(restored, lineage, journals, sinks, own=own)
                continue
            result.restarts = restarts
            return result

    def execute(self, job_name: str = "eddyflow job", restore: str | None = None, *,
                allow_non_restored_state: bool = False) -> JobResult:
        """Run the job to completion (blocking); the arguments are those of
        :meth:`execute_async`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            running = False
        else:
            running = True
        if not running:
            # (Outside the except block: a job's failure must not arrive
            # chained to "no running event loop".)
            return asyncio.run(self.execute_async(
                job_name, restore=restore, allow_non_restored_state=allow_non_restored_state))
        raise RuntimeError(
            "execute() blocks and cannot run inside a running event loop; "
            "use `await env.execute_async(...)`"
        )
