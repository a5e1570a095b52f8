"""``StreamEnvironment``: where a job is declared, configured and executed."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, Iterable
from typing import Any

from eddyflow.connectors.asynciter import AsyncIterableSource
from eddyflow.connectors.collection import CollectionSource
from eddyflow.connectors.source import Source
from eddyflow.connectors.textfile import TextFileSource
from eddyflow.datastream import DataStream
from eddyflow.graph.logical import LogicalGraph, Partitioning
from eddyflow.graph.plan import ExecutionPlan, build_plan
from eddyflow.result import JobResult
from eddyflow.runtime.job import JobRunner, RuntimeConfig
from eddyflow.runtime.operators import SourceSpec
from eddyflow.state.backend import MemoryStateBackend, StateBackend

__all__ = ["StreamEnvironment"]


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    return value


class StreamEnvironment:
    """Declares a job (sources, transformations, sinks) and runs it.

    ``batch_size`` (records per channel batch), ``buffer_timeout`` (seconds a
    record may wait in an output buffer while its task is busy) and
    ``channel_capacity`` (a channel holds ``channel_capacity * batch_size``
    records, plus at most one batch, before it back-pressures the producer)
    tune the runtime; the defaults favour throughput with a
    latency bound of about 10 ms.
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
    ) -> None:
        self.parallelism = _positive_int(parallelism, "parallelism")
        self.max_parallelism = _positive_int(max_parallelism, "max_parallelism")
        if self.parallelism > self.max_parallelism:
            raise ValueError(
                f"parallelism {parallelism} exceeds max_parallelism {max_parallelism}"
            )
        self.batch_size = _positive_int(batch_size, "batch_size")
        if not buffer_timeout >= 0:
            raise ValueError(f"buffer_timeout must be >= 0 seconds, got {buffer_timeout}")
        self.buffer_timeout = float(buffer_timeout)
        self.channel_capacity = _positive_int(channel_capacity, "channel_capacity")
        self.chaining = chaining
        self.state_backend: StateBackend = MemoryStateBackend()
        self._graph = LogicalGraph()

    # -- configuration -------------------------------------------------------

    def set_state_backend(self, backend: StateBackend) -> StreamEnvironment:
        if not isinstance(backend, StateBackend):
            raise TypeError(f"set_state_backend needs an ef.StateBackend, got {backend!r}")
        self.state_backend = backend
        return self

    def disable_operator_chaining(self) -> StreamEnvironment:
        """Run every operator in its own task (for debugging and measurements)."""
        self.chaining = False
        return self

    # -- sources -------------------------------------------------------------

    def from_source(self, source: Source, *, parallelism: int | None = None) -> DataStream:
        if not isinstance(source, Source):
            raise TypeError(f"from_source needs an ef.Source, got {source!r:.100}")
        node = self._graph.add_node(
            "source", SourceSpec(source), is_source=True, parallelism=parallelism,
            max_source_parallelism=source.max_parallelism,
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
            max_parallelism=self.max_parallelism,
            state_backend=self.state_backend,
        )

    async def execute_async(self, job_name: str = "eddyflow job", restore: str | None = None
                            ) -> JobResult:
        """Run the job inside the running event loop; cancelling the awaiting
        task cancels every task of the job."""
        if restore not in (None, "latest"):
            raise ValueError(
                f"restore={restore!r}: restoring from a checkpoint path needs checkpointing, "
                "which this environment does not have enabled"
            )
        plan = self.plan()
        runner = JobRunner(plan, self._runtime_config(), job_name)
        return await runner.run()

    def execute(self, job_name: str = "eddyflow job", restore: str | None = None) -> JobResult:
        """Run the job to completion (blocking)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.execute_async(job_name, restore=restore))
        raise RuntimeError(
            "execute() blocks and cannot run inside a running event loop; "
            "use `await env.execute_async(...)`"
        )
