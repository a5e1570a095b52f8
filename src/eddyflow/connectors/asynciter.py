"""``env.from_async_iterable``: records from an async iterator of the
embedding program (a queue consumer, a websocket, an async generator).

Not replayable: the position is the number of records consumed, and a seek
to anything but the start fails, so a job fed this way is at-most-once for
these records unless the iterator is wrapped in a real :class:`Source`.

A pump coroutine drains the iterator into a bounded buffer; ``read_batch``
takes whatever is there without waiting for more, so records that arrive one
by one are not held back to fill a batch.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterable
from typing import Any

from eddyflow.connectors.source import NotReplayableError, Source, SourceReader

__all__ = ["AsyncIterableSource"]


class AsyncIterableSource(Source):
    max_parallelism = 1
    replayable = False

    def __init__(self, aiterable: AsyncIterable[Any], buffer: int = 4096) -> None:
        if not hasattr(aiterable, "__aiter__"):
            raise TypeError(f"from_async_iterable needs an async iterable, got {aiterable!r}")
        self._aiterable = aiterable
        self._buffer = buffer
        self._used = False

    @property
    def name(self) -> str:
        return "async-iterable"

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        if self._used:
            raise NotReplayableError(
                "from_async_iterable: the iterator was already consumed by an earlier run; "
                "it cannot be read again"
            )
        self._used = True
        return _AsyncIterableReader(self._aiterable, self._buffer)


class _AsyncIterableReader(SourceReader):
    def __init__(self, aiterable: AsyncIterable[Any], buffer: int) -> None:
        self._aiterable = aiterable
        self._capacity = buffer
        self._items: collections.deque[Any] = collections.deque()
        self._consumed = 0
        self._done = False
        self._error: BaseException | None = None
        self._pump: asyncio.Task[None] | None = None
        self._have_items = asyncio.Event()
        self._have_space = asyncio.Event()
        self._have_space.set()

    async def _run_pump(self) -> None:
        try:
            async for item in self._aiterable:
                self._items.append(item)
                self._have_items.set()
                if len(self._items) >= self._capacity:
                    self._have_space.clear()
                    await self._have_space.wait()
        except Exception as exc:  # handed to the reading task, which fails the job
            self._error = exc
        finally:
            self._done = True
            self._have_items.set()

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._run_pump())
        while not self._items:
            if self._error is not None:
                raise self._error
            if self._done:
                return None
            self._have_items.clear()
            await self._have_items.wait()
        n = min(max_records, len(self._items))
        batch = [self._items.popleft() for _ in range(n)]
        self._consumed += n
        if not self._items and not self._done:
            self._have_items.clear()
        self._have_space.set()
        return batch

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
        pump, self._pump = self._pump, None
        if pump is not None and not pump.done():
            pump.cancel()
            # Wait for it so no coroutine of the job outlives the job.
            await asyncio.gather(pump, return_exceptions=True)
