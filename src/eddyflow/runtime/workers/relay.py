"""Async-iterable sources with worker processes: read in the calling process.

``env.from_async_iterable`` reads an iterator of the embedding program (a
queue consumer, a websocket), which lives in the calling process's event
loop and cannot be forked or pickled into a worker. So the caller reads it,
with the same bounded buffer a single-process job uses
(:class:`~eddyflow.connectors.asynciter.AsyncIterableSource`), and sends
what it took, a batch per turn of its loop, to the worker that runs the
source's task, where a
:class:`~eddyflow.connectors.asynciter.RelayedReader` hands it to the task.
The worker returns credit as its task takes records, so no more than the
source's buffer is ever on its way or queued in the worker: a back-pressured
job stops the caller reading the iterator, as in one process.

The records' position (how many were emitted) is kept by the worker's
reader and checkpointed there; the guarantee is the source's own:
at-most-once, the iterator is not replayable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import anyio

from eddyflow.connectors.asynciter import AsyncIterableSource
from eddyflow.connectors.source import SourceReader
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.runtime.operators.io import SourceSpec
from eddyflow.runtime.workers.protocol import SourceEnd, SourceRecords, dump_exception

__all__ = ["IterableRelay", "relays_of"]


class IterableRelay:
    """Reads one async-iterable source in the calling process and sends its
    records to the worker running the source's task, within its credit."""

    def __init__(self, uid: str, source: AsyncIterableSource, worker: int,
                 send: Callable[[int, Any], None]) -> None:
        self.uid = uid
        self.source = source
        self.worker = worker
        self._send = send
        self.credit = source.buffer
        self._more = anyio.Event()

    def add_credit(self, records: int) -> None:
        """The worker's task took ``records``: that many more may go."""
        self.credit += records
        self._more.set()

    async def run(self) -> None:
        """Read the iterator to its end (or error) and send everything."""
        # create_reader refuses a second read (a restarted attempt), as in
        # one process: the iterator cannot be replayed.
        reader = self.source.create_reader(0, 1)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader.fetch, name=f"read {self.uid}")
                await self._pump(reader)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await reader.close()

    async def _pump(self, reader: SourceReader) -> None:
        while True:
            while self.credit <= 0:
                self._more = anyio.Event()
                await self._more.wait()
            ready = reader.available()
            if ready is not None:
                await ready
            try:
                batch = await reader.read_batch(self.credit)
            except Exception as exc:  # the worker's task fails naming the source
                self._send(self.worker, _end_with(self.uid, exc))
                return
            if batch is None:
                self._send(self.worker, SourceEnd(self.uid))
                return
            if batch:
                self.credit -= len(batch)
                # A batch takes all the reader has (within credit): the
                # next read waits for more, or for credit.
                self._send(self.worker, SourceRecords(self.uid, batch))


def _end_with(uid: str, exc: Exception) -> SourceEnd:
    return SourceEnd(uid, *dump_exception(exc))


def relays_of(plan: ExecutionPlan, worker_of: Mapping[tuple[int, int], int],
              send: Callable[[int, Any], None]) -> dict[str, IterableRelay]:
    """A relay for each async-iterable source of ``plan``, to its task's worker."""
    relays: dict[str, IterableRelay] = {}
    nodes = plan.graph.nodes
    for chain in plan.chains:
        head = nodes[chain.node_ids[0]]
        if isinstance(head.payload, SourceSpec) and isinstance(head.payload.source,
                                                               AsyncIterableSource):
            relays[head.uid] = IterableRelay(head.uid, head.payload.source,
                                             worker_of[(chain.index, 0)], send)
    return relays
