"""Channels and input gates.

A :class:`Channel` is a bounded FIFO of batches and events from one upstream
subtask to one downstream subtask; its bound is what back-pressures a fast
producer. The bound counts *records* (an event counts as one): a producer
waits while the channel holds ``capacity`` records or more, so a channel holds
at most ``capacity`` records plus one batch. Counting records rather than
batches lets a fan-out (a ``flat_map`` that turns one batch into ten batches'
worth) send its output in one hand-off instead of ten, with the same memory
bound. A channel can be unbounded (``capacity`` ``None``), for the feedback
edges of loops, which must always accept.

An :class:`InputGate` multiplexes a task's input channels: it hands out the
next item of any channel that has one and is not *blocked*. Blocking a
channel stops reading it while its producer fills it up to its bound and then
waits, which is how barrier alignment holds back post-barrier records without
buffering them anywhere else (DESIGN.md §2, step 2). These are hand-made on
asyncio futures rather than ``asyncio.Queue``s because an asyncio program has
no way to wait on "whichever of these queues is ready" cheaply.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from eddyflow.runtime.events import RecordBatch

__all__ = ["Channel", "InputGate"]


class Channel:
    __slots__ = ("_gate", "_items", "_records", "_space_waiters", "capacity", "index", "name")

    def __init__(self, name: str, capacity: int | None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"channel capacity must be >= 1, got {capacity}")
        self.name = name
        self.capacity = capacity  # in records
        self._records = 0
        self._items: collections.deque[Any] = collections.deque()
        self._space_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._gate: InputGate | None = None
        self.index = -1

    def __len__(self) -> int:
        """Batches and events queued."""
        return len(self._items)

    @property
    def records(self) -> int:
        """Records queued (an event counts as one)."""
        return self._records

    async def put(self, item: Any) -> None:
        cap = self.capacity
        if cap is not None:
            while self._records >= cap:
                fut = asyncio.get_running_loop().create_future()
                self._space_waiters.append(fut)
                try:
                    await fut
                except BaseException:
                    if fut in self._space_waiters:
                        self._space_waiters.remove(fut)
                    raise
        self._items.append(item)
        self._records += len(item) if type(item) is RecordBatch else 1
        gate = self._gate
        if gate is not None:
            gate._wake()

    def _pop(self) -> Any:
        item = self._items.popleft()
        self._records -= len(item) if type(item) is RecordBatch else 1
        waiters = self._space_waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)
                break
        return item


class InputGate:
    """The input channels of one task, read in turn."""

    __slots__ = ("_next", "_waiter", "blocked", "channels")

    def __init__(self, channels: list[Channel]) -> None:
        self.channels = channels
        self.blocked = [False] * len(channels)
        self._waiter: asyncio.Future[None] | None = None
        self._next = 0
        for i, ch in enumerate(channels):
            if ch._gate is not None:
                raise ValueError(f"channel {ch.name} already feeds a gate")
            ch._gate = self
            ch.index = i

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def poll(self) -> tuple[int, Any] | None:
        """The next item of an unblocked channel, or ``None`` if none has one."""
        chans = self.channels
        n = len(chans)
        start = self._next
        for k in range(n):
            i = start + k
            if i >= n:
                i -= n
            ch = chans[i]
            if ch._items and not self.blocked[i]:
                # Move on after each item: one busy channel must not starve
                # the others (it would also stall barrier alignment).
                self._next = i + 1 if i + 1 < n else 0
                return i, ch._pop()
        return None

    async def get(self) -> tuple[int, Any]:
        while True:
            got = self.poll()
            if got is not None:
                return got
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def wait(self) -> None:
        """Wait until an item arrives or someone wakes the gate (a loop's
        in-flight count reaching zero); the caller polls again."""
        if self.poll_ready():
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def poll_ready(self) -> bool:
        return any(ch._items and not self.blocked[i] for i, ch in enumerate(self.channels))

    def backlog(self) -> int:
        """Records (an event counts as one) queued on the unblocked channels."""
        blocked = self.blocked
        return sum(ch._records for i, ch in enumerate(self.channels) if not blocked[i])

    def block(self, index: int) -> None:
        self.blocked[index] = True

    def unblock(self, index: int) -> None:
        self.blocked[index] = False
        self._wake()

    def unblock_all(self) -> None:
        self.blocked = [False] * len(self.channels)
        self._wake()

    def queued(self) -> int:
        """Batches and events waiting in all channels (for metrics and tests)."""
        return sum(len(ch) for ch in self.channels)
