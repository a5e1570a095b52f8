"""``env.from_async_iterable``: records from an async iterator of the
embedding program (a queue consumer, a websocket, an async generator).

Not replayable: the position is the number of records emitted, and a seek
to anything but the start fails, so a job fed this way is at-most-once for
these records unless the iterator is wrapped in a real :class:`Source`.

The reader never waits in ``read_batch``: its :meth:`~SourceReader.fetch`
(run by the source task in its task group) drains the iterator into a
bounded buffer, ``read_batch`` takes whatever is there, and
:meth:`~SourceReader.available` tells the task when more has come. So a
quiet iterator holds back neither checkpoints (the task emits a barrier at
once, at the number of records emitted so far) nor, with ``with_idleness``,
watermarks; and records that arrive one by one are not held back to fill a
batch.

What the buffer holds at a checkpoint is not in it: the records were taken
from the iterator but not emitted, so they come after the checkpoint's
position. Nothing can replay them (the iterator is not replayable, and a
restore refuses to seek past the start), so the at-most-once guarantee
covers them like the records emitted after the last checkpoint: if the job
stops before it reads them, they are lost, and the reader logs how many.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterable, Callable
from typing import Any

import anyio

from eddyflow.connectors.source import NotReplayableError, Source, SourceReader

__all__ = ["AsyncIterableSource", "BufferedReader", "RelayedReader"]

_log = logging.getLogger("eddyflow")


class AsyncIterableSource(Source):
    """The source of ``env.from_async_iterable``: one split, read once.

    ``buffer``: the most records taken from the iterator ahead of the job
    (while it is back-pressured, the iterator is not read further).
    """

    max_parallelism = 1
    replayable = False

    def __init__(self, aiterable: AsyncIterable[Any], buffer: int = 4096) -> None:
        if not hasattr(aiterable, "__aiter__"):
            raise TypeError(f"from_async_iterable needs an async iterable, got {aiterable!r}")
        if buffer < 1:
            raise ValueError(f"from_async_iterable: buffer must be at least 1, got {buffer!r}")
        self._aiterable = aiterable
        self._buffer = buffer
        self._used = False

    @property
    def name(self) -> str:
        return "async-iterable"

    def __getstate__(self) -> dict[str, Any]:
        # A copy in another process (a spawned worker) never reads the
        # iterator: the calling process reads it and relays its records
        # (runtime/workers/relay.py). An async generator does not pickle.
        state = dict(self.__dict__)
        state["_aiterable"] = None
        state["_used"] = True
        return state

    @property
    def buffer(self) -> int:
        """The most records read from the iterator ahead of the job."""
        return self._buffer

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        if self._used:
            raise NotReplayableError(
                "from_async_iterable: the iterator was already consumed by an earlier run; "
                "it cannot be read again"
            )
        self._used = True
        return _AsyncIterableReader(self._aiterable, self._buffer)


class BufferedReader(SourceReader):
    """The reader side of ``from_async_iterable``: records pushed into a
    bounded buffer (by :meth:`push`, then :meth:`finish`), taken by the
    task in batches; its position is the number of records emitted.

    :class:`_AsyncIterableReader` pushes from the iterator in this process;
    with worker processes the calling process reads the iterator and a
    :class:`RelayedReader` in the worker is pushed what it sends
    (``runtime/workers/``)."""

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._consumed = 0
        self._done = False
        self._error: BaseException | None = None
        #: Resolved when records (or the end) arrive: handed to the task.
        self._ready: asyncio.Future[None] | None = None

    def push(self, items: list[Any]) -> None:
        """Records for the task, in order."""
        self._items.extend(items)
        ready = self._ready
        if ready is not None and not ready.done():
            ready.set_result(None)

    def finish(self, error: BaseException | None = None) -> None:
        """No more records come (``error``: why, raised once the buffer is drained)."""
        self._error = error
        self._done = True
        ready = self._ready
        if ready is not None and not ready.done():
            ready.set_result(None)

    def taken(self, n: int) -> None:
        """The task took ``n`` records from the buffer (room for more)."""

    async def read_batch(self, max_records: int) -> list[Any] | None:
        items = self._items
        if not items:
            if self._error is not None:
                raise self._error
            return None if self._done else []
        if max_records >= len(items):
            batch = list(items)
            items.clear()
        else:
            batch = [items.popleft() for _ in range(max_records)]
        self._consumed += len(batch)
        self.taken(len(batch))
        return batch

    def available(self) -> asyncio.Future[None] | None:
        if self._items or self._done:
            return None
        ready = self._ready
        if ready is None or ready.done():
            ready = self._ready = asyncio.get_running_loop().create_future()
        return ready

    def position(self) -> int:
        return self._consumed

    def seek(self, position: Any) -> None:
        if position != self._consumed:
            raise NotReplayableError(
                f"from_async_iterable cannot seek to record {position!r}: an async iterator "
                "is not replayable (implement ef.Source for exactly-once input)"
            )

    def describe_position(self, position: Any) -> str:
        return f"record #{position} of the async iterable"

    async def close(self) -> None:
        if self._items:
            # At-most-once (see the module docstring), but not silently.
            _log.warning(
                "from_async_iterable: %d record(s) taken from the iterator after record #%d "
                "were never emitted: the job stopped first (the source is at-most-once)",
                len(self._items), self._consumed)
            self._items.clear()


class _AsyncIterableReader(BufferedReader):
    """Pushes the iterator's records, at most ``buffer`` ahead of the task."""

    def __init__(self, aiterable: AsyncIterable[Any], buffer: int) -> None:
        super().__init__()
        self._aiterable = aiterable
        self._capacity = buffer
        #: Resolved when the task takes records from a full buffer.
        self._space: asyncio.Future[None] | None = None

    def taken(self, n: int) -> None:
        space = self._space
        if space is not None and not space.done():
            space.set_result(None)

    async def fetch(self) -> None:
        iterator = aiter(self._aiterable)
        items = self._items
        error: BaseException | None = None
        try:
            async for item in iterator:
                self.push([item])
                if len(items) >= self._capacity:
                    # Back-pressure reaches the iterator: read no further
                    # until the task has taken some.
                    self._space = asyncio.get_running_loop().create_future()
                    await self._space
        except Exception as exc:  # handed to read_batch: the job fails naming the source
            error = exc
        finally:
            self.finish(error)
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                # An async generator left at a yield (the buffer full, the job
                # cancelled) is finalised now, not whenever it is collected.
                with anyio.CancelScope(shield=True):
                    try:
                        await aclose()
                    except Exception as exc:  # its cleanup failed: nothing left to fail
                        _log.warning("from_async_iterable: closing the iterator raised "
                                     "%s: %s", type(exc).__name__, exc)


class RelayedReader(BufferedReader):
    """The reader of an async-iterable source in a worker process: the
    calling process reads the iterator and sends its records; each batch
    the task takes is handed to ``on_taken`` (the caller's credit: it
    sends no more than the buffer holds)."""

    def __init__(self, on_taken: Callable[[int], None]) -> None:
        super().__init__()
        self._on_taken = on_taken

    def taken(self, n: int) -> None:
        self._on_taken(n)
