"""``StreamEnvironment``: where a job is declared, configured and executed."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, Iterable
from typing import Any

from eddyflow.connectors.asynciter import AsyncIterableSource
from eddyflow.connectors.collection import CollectionSource
from eddyflow.connectors.log import LogSource
from eddyflow.connectors.source import Source
from eddyflow.connectors.textfile import TextFileSource
from eddyflow.datastream import DataStream
from eddyflow.graph.logical import LogicalGraph, Partitioning
from eddyflow.graph.plan import ExecutionPlan, build_plan
from eddyflow.keygroups import MAX_PARALLELISM
from eddyflow.restart import NoRestart, RestartStrategy
from eddyflow.result import JobResult
from eddyflow.runtime.checkpointing.barriers import MODES, CheckpointMode
from eddyflow.runtime.checkpointing.coordinator import CheckpointConfig
from eddyflow.runtime.job import JobRunner, RuntimeConfig
from eddyflow.runtime.metrics import MetricsCallback, MetricsReporter
from eddyflow.runtime.operators.io import SourceSpec
from eddyflow.runtime.recovery.restart import JobExecution
from eddyflow.runtime.time.clock import WALL_CLOCK, Clock
from eddyflow.runtime.workers.caller import WorkerJobRunner
from eddyflow.runtime.workers.placement import resolve_workers
from eddyflow.state.abc import StateBackend
from eddyflow.state.memory import MemoryStateBackend

__all__ = ["StreamEnvironment"]


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
        workers: int | str = 1,
    ) -> None:
        #: Worker processes that run the job's subtasks (docs/concepts/workers.md).
        self.workers = resolve_workers(workers)
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

    @property
    def graph(self) -> LogicalGraph:
        """The logical graph of the job declared so far: the DataStream API
        adds an operator to it per transformation."""
        return self._graph

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
            workers=self.workers,
        )

    def _refuse_second_execution(self, job_name: str) -> None:
        """Refuse a second run of this environment, before anything is done
        (a refused run must not touch the checkpoint folder or the sinks of
        a first one, which may still be running). The run marks the
        environment as executed with no await since this check, so two
        concurrent ``execute_async`` cannot both get through, and unmarks it
        if its ``restore`` is refused (that run ran nothing: it may be called
        again)."""
        if self._executed is not None:
            raise RuntimeError(
                f"this StreamEnvironment already executed job '{self._executed}'; build a "
                f"new environment to run '{job_name}' (its sinks hold the first run's output)")

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
        execution = JobExecution(plan, config, job_name,
                                 checkpointing=self.checkpoint_config,
                                 restart_strategy=self.restart_strategy,
                                 runner_class=JobRunner if config.workers == 1 else WorkerJobRunner)
        with execution.locked():
            # Marked before the first await since the check (a concurrent
            # run is refused), unmarked if the restore is refused.
            self._executed = job_name
            try:
                await execution.prepare(restore,
                                        allow_non_restored_state=allow_non_restored_state)
            except BaseException:
                self._executed = None
                raise
            reporter = MetricsReporter.create(job_name, self._metric_callbacks,
                                              self._metrics_port)
            reporter.start_server()
            self.metrics_address = reporter.address
            try:
                return await execution.run(reporter)
            finally:
                self.metrics_address = None

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
