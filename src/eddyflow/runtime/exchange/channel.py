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
buffering them anywhere else (docs/concepts/checkpoints.md, step 2). These are hand-made on
asyncio futures rather than ``asyncio.Queue``s because an asyncio program has
no way to wait on "whichever of these queues is ready" cheaply.

Unaligned checkpoints (docs/concepts/unaligned.md) need two more things of a
channel. A *priority* item (an unaligned barrier) is put at the head of the
queue, behind earlier priority items only, whatever the capacity: it
overtakes the records queued, which :meth:`Channel.overtake` hands back as
they were at that moment (serialised) to become channel state. And a producer
that waits for space must still be able to take part in a checkpoint: its
wait can be *interrupted* (:class:`Interrupt`), and the item it was putting
can be delivered over capacity (:meth:`Channel.deliver_pending`) so that the
barrier overtakes it too.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from eddyflow.runtime.exchange.events import RecordBatch

__all__ = ["Channel", "InputGate", "Interrupt"]

_NOTHING: Any = object()


class Interrupt:
    """A task's way to be called back while it waits for space in a channel.

    ``request()`` (a priority barrier reached the task's input, a source is
    asked for a barrier, a checkpoint switched to unaligned) wakes a waiting
    ``Channel.put`` of the task, which runs ``handler`` in the task's own
    coroutine and then waits on, unless the handler delivered the item it
    was putting. Requests made while the task is not waiting are left to its
    loop, which looks at the same conditions between batches.
    """

    __slots__ = ("_future", "enabled", "handler", "requested")

    def __init__(self, handler: Callable[[], Awaitable[None]]) -> None:
        self.handler = handler
        self.enabled = True  # off while the task ends its input: no snapshot mid-way
        self.requested = False
        self._future: asyncio.Future[None] | None = None

    def request(self) -> None:
        """Have the handler run: now if the task waits for space, else at
        the task's next look between batches."""
        self.requested = True
        f = self._future
        if f is not None and not f.done():
            f.set_result(None)

    async def wait(self, space: asyncio.Future[None], channel: Channel) -> None:
        """Wait for ``space`` or for the item being put to be delivered,
        running the handler whenever a request comes meanwhile.

        A request completes ``space`` itself rather than a future of its
        own: waiting on two futures (``asyncio.wait``) costs the waiter two
        more turns of the event loop to wake, and behind a stage that blocks
        the loop for a batch at a time each turn is long (the deep pipeline
        of benchmarks/backpressure.py, ``--shape deep``, measures how long a
        priority barrier waits per back-pressured task). The put's loop
        checks the capacity again, so a wake-up without space only waits
        anew."""
        if self.requested and self.enabled:
            await self._handle(channel)
            return
        self._future = space
        try:
            await space
        finally:
            self._future = None
        if self.requested and self.enabled:
            await self._handle(channel)

    async def _handle(self, channel: Channel) -> None:
        """Run the handler while requests keep coming (each may take part in
        another checkpoint), unless the item being put was delivered."""
        while self.requested and self.enabled and not channel.delivered:
            self.requested = False
            await self.handler()


class Channel:
    """A bounded FIFO of batches and events from one producer subtask to one
    consumer subtask (see the module docstring)."""

    __slots__ = ("_delivered", "_gate", "_items", "_pending", "_priority", "_records",
                 "_space_waiters", "capacity", "index", "key", "name")

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
        #: Names the channel in channel state (``channel_state.channel_key``).
        self.key = name
        self._priority = 0  # priority items at the head of the queue
        self._pending: Any = _NOTHING  # the item a waiting put is putting
        self._delivered = False

    def __len__(self) -> int:
        """Batches and events queued."""
        return len(self._items)

    @property
    def records(self) -> int:
        """Records queued (an event counts as one)."""
        return self._records

    @property
    def has_items(self) -> bool:
        """Whether a batch or an event is queued."""
        return bool(self._items)

    @property
    def has_priority(self) -> bool:
        """Whether a priority item (an unaligned barrier) heads the queue."""
        return self._priority > 0

    @property
    def delivered(self) -> bool:
        """Whether the item a waiting put holds went in over capacity, or was
        dropped, meanwhile (:meth:`deliver_pending`, :meth:`drop_pending`):
        that put is done."""
        return self._delivered

    def is_putting(self, item: Any) -> bool:
        """Whether a put waiting for space is putting ``item``."""
        return self._pending is item

    def attach(self, gate: InputGate, index: int) -> None:
        """Feed ``gate`` as its input ``index``: the gate is woken when an
        item arrives. A channel feeds one gate only."""
        if self._gate is not None:
            raise ValueError(f"channel {self.name} already feeds a gate")
        self._gate = gate
        self.index = index

    async def put(self, item: Any, interrupt: Interrupt | None = None) -> None:
        """Queue ``item``, waiting while the channel holds its capacity's worth
        of records. ``interrupt``: the producing task's, which may run a
        checkpoint's hand-off while the put waits (see :class:`Interrupt`)."""
        cap = self.capacity
        if cap is not None:
            while self._records >= cap:
                fut = asyncio.get_running_loop().create_future()
                self._space_waiters.append(fut)
                try:
                    if interrupt is None:
                        await fut
                    else:
                        self._pending = item
                        try:
                            await interrupt.wait(fut, self)
                        finally:
                            self._pending = _NOTHING
                        if self._delivered:
                            self._delivered = False
                            if not fut.done():
                                self._space_waiters.remove(fut)
                            else:
                                self._release_space()  # pass the wake-up on
                            return
                        if not fut.done():
                            # The handler ran before any wait: the next
                            # round waits on a new future, and a wake-up
                            # given to this one would be lost.
                            self._space_waiters.remove(fut)
                except BaseException:
                    if fut in self._space_waiters:
                        self._space_waiters.remove(fut)
                    raise
        self.append(item)

    def append(self, item: Any) -> None:
        """Queue ``item`` whatever the capacity: the part of an unaligned
        checkpoint's hand-off that may overdraw a channel (by at most a
        writer's buffer), and restored channel state before a job starts."""
        self._items.append(item)
        self._records += len(item) if type(item) is RecordBatch else 1
        gate = self._gate
        if gate is not None:
            gate.wake()

    def reserve(self, records: int) -> None:
        """Count ``records`` as held without queueing them here: a channel
        whose consumer runs in another process (``exchange/remote.py``)
        holds what it sent until the consumer takes it."""
        self._records += records

    def release(self, records: int) -> None:
        """``records`` counted by :meth:`reserve` were taken by the remote
        consumer (its credit): a waiting put may go on."""
        self._records -= records
        self._release_space()

    def deliver_pending(self) -> None:
        """The item a put is waiting to queue goes in now, over capacity;
        that put returns as done."""
        if self._pending is not _NOTHING:
            item, self._pending = self._pending, _NOTHING
            self._delivered = True
            self.append(item)

    def drop_pending(self) -> None:
        """The waiting put's item is not queued after all (the same barrier
        is about to overtake instead); that put returns as done."""
        if self._pending is not _NOTHING:
            self._pending = _NOTHING
            self._delivered = True

    def overtake(self, item: Any) -> list[RecordBatch]:
        """Put priority ``item`` at the head of the queue (behind earlier
        priority items) and return the record batches it overtook, oldest
        first. The caller serialises them at once: they stay queued, and
        the consumer's code may change them once it has them."""
        items = self._items
        prio = self._priority
        overtaken = [it for it in itertools.islice(items, prio, None) if type(it) is RecordBatch]
        items.insert(prio, item)
        self._priority = prio + 1
        self._records += 1
        gate = self._gate
        if gate is not None:
            gate.priority_arrived()
        return overtaken

    def take_overtaken(self, checkpoint_id: int) -> list[RecordBatch]:
        """The record batches priority barrier ``checkpoint_id`` overtook in
        this queue that its consumer records as channel state: none here (a
        local producer captured them when it overtook); a channel fed from
        another process has them (``exchange/remote.py``)."""
        return []

    def find(self, match: Callable[[Any], bool]) -> Any:
        """The first queued event that ``match``es, or ``None``."""
        for item in self._items:
            if type(item) is not RecordBatch and match(item):
                return item
        return None

    def queued_before(self, match: Callable[[Any], bool]) -> tuple[Any, list[RecordBatch]] | None:
        """The first queued event that ``match``es (not a priority item)
        and the record batches queued before it, all left queued; ``None``
        if no event matches."""
        items = self._items
        prio = self._priority
        for idx, it in enumerate(itertools.islice(items, prio, None), prio):
            if type(it) is not RecordBatch and match(it):
                return it, [b for b in itertools.islice(items, prio, idx)
                            if type(b) is RecordBatch]
        return None

    def take_before(self, match: Callable[[Any], bool]) -> list[RecordBatch] | None:
        """If an item that ``match``es is queued: remove it and return the
        record batches queued before it (they stay queued), else ``None``.
        How a task that switches a checkpoint to unaligned takes a barrier
        still stuck behind records on one of its inputs."""
        items = self._items
        prio = self._priority
        for idx, it in enumerate(itertools.islice(items, prio, None), prio):
            if type(it) is not RecordBatch and match(it):
                before = [b for b in itertools.islice(items, prio, idx) if type(b) is RecordBatch]
                del items[idx]
                self._records -= 1
                self._release_space()
                return before
        return None

    def _release_space(self) -> None:
        waiters = self._space_waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)
                break

    def pop(self) -> Any:
        """Take the item at the head of the queue (the gate's read)."""
        item = self._items.popleft()
        if self._priority:
            self._priority -= 1
        self._records -= len(item) if type(item) is RecordBatch else 1
        self._release_space()
        return item


class InputGate:
    """The input channels of one task, read in turn."""

    __slots__ = ("_next", "_priorities", "_waiter", "blocked", "channels", "interrupt")

    def __init__(self, channels: list[Channel]) -> None:
        self.channels = channels
        self.blocked = [False] * len(channels)
        self._waiter: asyncio.Future[None] | None = None
        self._next = 0
        self._priorities = 0  # priority items queued over all channels
        #: The reading task's, told when a priority item arrives.
        self.interrupt: Interrupt | None = None
        for i, ch in enumerate(channels):
            ch.attach(self, i)

    def wake(self) -> None:
        """Wake the task waiting on this gate, if one is: an item arrived, an
        input was unblocked, or a loop it ends may be empty now."""
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def priority_arrived(self) -> None:
        """A channel of the gate queued a priority item: it is read first,
        and the reading task is interrupted if it waits for output space."""
        self._priorities += 1
        self.wake()
        if self.interrupt is not None:
            self.interrupt.request()

    def poll_priority(self) -> tuple[int, Any] | None:
        """The next priority item, blocked channel or not, if one is queued."""
        if not self._priorities:
            return None
        for i, ch in enumerate(self.channels):
            if ch.has_priority:
                self._priorities -= 1
                return i, ch.pop()
        raise AssertionError("a priority item was counted but none is queued")

    def poll(self) -> tuple[int, Any] | None:
        """The next item of an unblocked channel, or ``None`` if none has one.
        Priority items come first, from any channel."""
        if self._priorities:
            return self.poll_priority()
        chans = self.channels
        n = len(chans)
        start = self._next
        for k in range(n):
            i = start + k
            if i >= n:
                i -= n
            ch = chans[i]
            if ch.has_items and not self.blocked[i]:
                # Move on after each item: one busy channel must not starve
                # the others (it would also stall barrier alignment).
                self._next = i + 1 if i + 1 < n else 0
                return i, ch.pop()
        return None

    async def get(self) -> tuple[int, Any]:
        """The next item as :meth:`poll` gives it, waiting for one."""
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

    async def wait_wake(self) -> None:
        """Wait until someone wakes the gate, items queued or not: how a
        task that reads no records for now (a ``map_async`` at capacity)
        still hears of priority items and of its own wake-ups."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def poll_ready(self) -> bool:
        """Whether :meth:`poll` would return an item."""
        if self._priorities:
            return True
        return any(ch.has_items and not self.blocked[i] for i, ch in enumerate(self.channels))

    def backlog(self) -> int:
        """Records (an event counts as one) queued on the unblocked channels."""
        blocked = self.blocked
        return sum(ch.records for i, ch in enumerate(self.channels) if not blocked[i])

    def block(self, index: int) -> None:
        """Stop reading channel ``index`` (barrier alignment) but for its
        priority items."""
        self.blocked[index] = True

    def unblock(self, index: int) -> None:
        """Read channel ``index`` again."""
        self.blocked[index] = False
        self.wake()

    def unblock_all(self) -> None:
        """Read every channel again."""
        self.blocked = [False] * len(self.channels)
        self.wake()

    def queued(self) -> int:
        """Batches and events waiting in all channels (for metrics and tests)."""
        return sum(len(ch) for ch in self.channels)
