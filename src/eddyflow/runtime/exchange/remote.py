"""Channels between worker processes (``runtime/workers/``).

A channel whose producer and consumer run in two worker processes keeps the
semantics of :class:`~eddyflow.runtime.exchange.channel.Channel`: FIFO,
batches and in-band events (barriers, watermarks, end of input), bounded in
records. It is two objects over one :class:`Link` (a connected socket that
carries pickled frames, protocol 5, between the two processes; one link per
pair of workers carries all their channels):

* at the producer, a :class:`RemoteOutChannel`: a put sends the item at once
  and counts its records as held (:meth:`Channel.reserve`); a put waits, as
  on a local channel, while the channel holds its capacity;
* at the consumer, a :class:`CreditedChannel`: the channel its task's gate
  reads, fed by the link's reader; each item the gate takes sends its
  records back as *credit* (:meth:`Channel.release` at the producer).

Credit-based flow control (as Flink's network stack): the producer never
has more than the capacity (plus one batch) unconsumed, so the consumer's
queue never has to refuse an item, and a blocked input (barrier alignment)
holds its records without stopping the link's other channels.

Priority events (unaligned checkpoints), as Flink's: an unaligned barrier
is sent out of band of credit, at once (a ``PRIORITY`` frame; it is counted
as held like any event, but never waits for credit). Everything the
producer sent before it (its handed-over buffers too) is ahead of it on the
link, and the link's reader never waits: so when the barrier reaches the
consumer, every record it must overtake is in the consumer's queue, and
:meth:`CreditedChannel.overtake` puts it at the head there. The records it
overtook are kept with the channel for the consuming task, which takes
them with the barrier (:meth:`CreditedChannel.take_overtaken`) into its
channel state: the producer has none of them any more.

The frame format of a link: a 4-byte big-endian length, then that many
bytes: one pickle (protocol 5) of the list of messages sent during one turn
of the event loop, oldest first. On a data link a message is a tuple
``(DATA, channel id, item)`` (an item of the channel: a record batch or an
event), ``(CREDIT, channel id, records)`` or ``(PRIORITY, channel id,
barrier)`` (above). A record batch whose records are all ``str`` (a word
count's words, lines of text) crosses packed
(:class:`PackedStrs`): its records joined into one UTF-8 string, which the
reader splits again; unpickling (``loads``) is what rebuilds it, so the
reader needs no other step. Measured by benchmarks/transport.py: a third
less CPU than pickling the records one by one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import operator
import pickle
import socket
import struct
from typing import Any

from eddyflow.runtime.exchange.channel import Channel
from eddyflow.runtime.exchange.events import Barrier, RecordBatch, Span

__all__ = [
    "CREDIT",
    "DATA",
    "PRIORITY",
    "CreditedChannel",
    "Link",
    "PackedStrs",
    "RemoteOutChannel",
    "pack_batch",
    "unpack_strs",
]

_HEADER = struct.Struct("!I")
#: Frame kinds on a data link: an item of a channel, credit for one, and a
#: priority item (an unaligned barrier) that overtakes the channel's queue.
DATA = 0
CREDIT = 1
PRIORITY = 2


#: Batches of fewer records cross as pickled lists (a few records pack for
#: no gain).
PACK_MIN = 16
#: Joins the records of a packed batch: a record that holds it (rare)
#: leaves its batch pickled.
_SEPARATOR = "\0"


class PackedStrs:
    """A record batch of ``str`` records, packed for a link: pickles as a
    call of :func:`unpack_strs`, which rebuilds the batch in the reader."""

    __slots__ = ("count", "data", "span", "timestamps")

    def __init__(self, data: bytes, count: int, span: Span | None,
                 timestamps: list[Any] | None) -> None:
        self.data = data
        self.count = count
        self.span = span
        self.timestamps = timestamps

    def __reduce__(self) -> tuple[Any, ...]:
        return unpack_strs, (self.data, self.count, self.span, self.timestamps)


def unpack_strs(data: bytes, count: int, span: Span | None,
                timestamps: list[Any] | None) -> RecordBatch:
    """The record batch a :class:`PackedStrs` holds."""
    records = data.decode("utf-8", "surrogatepass").split(_SEPARATOR)
    if len(records) != count:
        raise ValueError(f"a packed batch of {count} records holds {len(records)}")
    return RecordBatch(records, span, timestamps)


def pack_batch(item: Any) -> Any:
    """``item`` as it crosses a link: a record batch of ``str`` records
    packed (:class:`PackedStrs`), anything else as it is."""
    if (type(item) is not RecordBatch or len(item) < PACK_MIN or type(item[0]) is not str
            or operator.countOf(map(type, item), str) != len(item)):
        return item
    text = _SEPARATOR.join(item)
    if text.count(_SEPARATOR) != len(item) - 1:
        return item  # a record holds the separator
    return PackedStrs(text.encode("utf-8", "surrogatepass"), len(item), item.span,
                      item.timestamps)


class Link:
    """One end of a stream of pickled messages over a connected socket.

    What is sent during one turn of the event loop leaves in one frame, at
    the end of the turn (one pickle, one write, one wake-up of the reader),
    however many batches and credits it holds."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self.sock = sock
        self.name = name
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._outbox: list[Any] = []
        self._inbox: collections.deque[Any] = collections.deque()

    async def open(self) -> None:
        """Attach the socket to the running event loop."""
        self._reader, self._writer = await asyncio.open_connection(
            sock=self.sock, limit=1 << 20)

    def send(self, message: Any) -> None:
        """Send ``message`` without waiting, at the end of this turn of the
        event loop (what a channel sends is bounded by its credit)."""
        outbox = self._outbox
        if not outbox:
            asyncio.get_running_loop().call_soon(self.flush)
        outbox.append(message)

    def flush(self) -> None:
        """Send what :meth:`send` collected, as one frame."""
        messages, self._outbox = self._outbox, []
        w = self._writer
        if not messages or w is None:
            return
        if w.transport.is_closing():
            return  # the other end is gone: its reader reports that, not every send
        data = pickle.dumps(messages, protocol=5)
        w.writelines((_HEADER.pack(len(data)), data))

    async def drain(self) -> None:
        """Wait until the sent messages are handed to the socket."""
        self.flush()
        if self._writer is not None:
            await self._writer.drain()

    async def recv(self) -> Any:
        """The next message; :class:`EOFError` when the other end closed."""
        inbox = self._inbox
        if inbox:
            return inbox.popleft()
        r = self._reader
        assert r is not None, f"link {self.name} is not open"
        try:
            (n,) = _HEADER.unpack(await r.readexactly(_HEADER.size))
            inbox.extend(pickle.loads(await r.readexactly(n)))
            return inbox.popleft()
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            # (A write that found the other end gone fails the reads too.)
            raise EOFError(f"link {self.name} closed") from exc

    async def aclose(self) -> None:
        """Close once everything sent has left (``drain`` only waits for
        the buffer to fall below its high-water mark)."""
        self.flush()
        w = self._writer
        if w is None:
            self.sock.close()
            return
        w.close()
        with contextlib.suppress(OSError):  # the other end is gone already
            await w.wait_closed()

    def close(self) -> None:
        """Close the connection (the other end reads its end)."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
        else:
            self.sock.close()


class RemoteOutChannel(Channel):
    """The producer's end of a channel whose consumer is in another worker."""

    __slots__ = ("channel_id", "link")

    def __init__(self, name: str, capacity: int | None, link: Link, channel_id: int) -> None:
        super().__init__(name, capacity)
        self.link = link
        self.channel_id = channel_id

    def append(self, item: Any) -> None:
        """Send ``item``; its records count against the capacity until the
        consumer's credit for them comes back."""
        self.reserve(len(item) if type(item) is RecordBatch else 1)
        self.link.send((DATA, self.channel_id, pack_batch(item)))

    def overtake(self, item: Any) -> list[RecordBatch]:
        """Send priority ``item`` now, out of band of credit; it overtakes
        at the consumer (see the module docstring), so nothing overtaken is
        left here: the consumer's task records it. Counted as held, as an
        overtaking item is in a local channel: its credit comes back when
        the consumer takes it."""
        self.reserve(1)
        self.link.send((PRIORITY, self.channel_id, item))
        return []


class CreditedChannel(Channel):
    """The consumer's end of a channel whose producer is in another worker:
    what the gate takes is credited back to the producer."""

    __slots__ = ("_overtaken", "channel_id", "link")

    def __init__(self, name: str, capacity: int | None, link: Link, channel_id: int) -> None:
        super().__init__(name, capacity)
        self.link = link
        self.channel_id = channel_id
        # Per checkpoint id, the record batches its priority barrier
        # overtook here, until the consuming task takes the barrier.
        self._overtaken: dict[int, list[RecordBatch]] = {}

    def overtake(self, item: Any) -> list[RecordBatch]:
        """A priority barrier from the producer (the link's reader): at the
        head of the queue, the batches it overtook kept for the consuming
        task (:meth:`take_overtaken`). They stay queued, behind the barrier,
        and unchanged until the task has taken it: it is read first."""
        overtaken = super().overtake(item)
        if type(item) is Barrier:
            self._overtaken[item.checkpoint_id] = overtaken
        return overtaken

    def take_overtaken(self, checkpoint_id: int) -> list[RecordBatch]:
        """The record batches barrier ``checkpoint_id`` overtook here."""
        return self._overtaken.pop(checkpoint_id, [])

    def pop(self) -> Any:
        """Take the head item and credit its records back."""
        item = super().pop()
        self.link.send((CREDIT, self.channel_id,
                        len(item) if type(item) is RecordBatch else 1))
        return item

    def take_before(self, match: Any) -> list[RecordBatch] | None:
        """As :meth:`Channel.take_before`, crediting the event taken."""
        before = super().take_before(match)
        if before is not None:
            self.link.send((CREDIT, self.channel_id, 1))
        return before
