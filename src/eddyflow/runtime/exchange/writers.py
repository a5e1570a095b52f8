"""Record writers: the output side of an exchange, one per outgoing edge of a
task. Each partitions records over the edge's channels into per-channel
buffers and hands a buffer to its channel when it holds ``batch_size``
records, or when the task flushes (input idle, buffer timeout, or before an
event).

``add`` is synchronous and returns whether a buffer is full, so the task only
pays for an ``await`` when a batch actually leaves.

Timestamps (event time) follow their records into the buffers: ``add`` takes
the batch's parallel timestamp list, or ``None`` when the stream has no event
time, which keeps the partitioning loops of such streams as they were. A
buffer that mixes both (a union of a stream with event time and one without)
holds ``None`` for the records that have no timestamp.

Unaligned checkpoints: :meth:`RecordWriter.overtake` sends a barrier ahead
of everything this writer has produced and not yet had consumed — its
unsent buffers, the batch a waiting put holds, and what its bounded channels
queue — and returns those records, which become the checkpoint's channel
state. Unbounded channels (loop back-edges) never hold a producer up, so the
barrier goes behind their records, as in an aligned checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eddyflow.keygroups import bulk_key_groups, stable_hash, subtask_for_key_group
from eddyflow.runtime.exchange.channel import Channel, Interrupt
from eddyflow.runtime.exchange.events import RecordBatch, Span, merge_span
from eddyflow.values import immutable, independent_copy

__all__ = [
    "BroadcastWriter",
    "ForwardWriter",
    "KeyGroupWriter",
    "KeyRoutingError",
    "RebalanceWriter",
    "RecordWriter",
    "load_bulk_routing",
]


class KeyRoutingError(Exception):
    """The key selector of an exchange failed on a record."""

    def __init__(self, index: int, record: Any) -> None:
        super().__init__(index, record)
        self.index = index
        self.record = record


class RecordWriter:
    """The output side of one outgoing edge of a task: partitions records
    over the edge's channels into buffers (see the module docstring)."""

    def __init__(self, channels: list[Channel], batch_size: int, label: str) -> None:
        self.channels = channels
        self.batch_size = batch_size
        #: The configured batch size; ``batch_size`` is less while a
        #: consumer's debloating asks for smaller batches (``limit_batch``).
        self.max_batch = batch_size
        self._limits = [batch_size] * len(channels)
        self.label = label  # "source -> target" for errors and metrics
        self.buffers = [RecordBatch() for _ in channels]
        self.full = False
        self.dirty_since = 0.0  # monotonic time of the oldest unflushed record, 0 if none
        #: The loop this edge lies in (its records count as in flight), if any.
        self.tracker: Any = None
        #: How many channels each record goes to (broadcast: all of them).
        self.copies = 1
        #: The owning task's: lets a put that waits for space be interrupted.
        self.interrupt: Interrupt | None = None
        # Channels the event being emitted has reached (some perhaps by
        # overtaking, when a checkpoint switched to unaligned meanwhile).
        self._reached: set[int] = set()
        self._emitting: Any = None

    def add(self, records: list[Any], span: Span | None,
            timestamps: list[Any] | None = None) -> bool:
        """Buffer a batch's ``records`` (read from ``span``, with their
        ``timestamps`` or ``None``); whether a buffer is now full."""
        raise NotImplementedError

    async def _send(self, i: int, buf: RecordBatch) -> None:
        # Sent whole, however much a fan-out overfilled it: channels bound
        # records, not batches, and one hand-off is cheaper than ten.
        # Unless a slow consumer asked for smaller batches (debloating).
        size = self.batch_size
        if len(buf) > size and size < self.max_batch:
            await self._send_parts(i, buf, size)
            return
        await self.channels[i].put(buf, self.interrupt)

    async def _send_parts(self, i: int, buf: RecordBatch, size: int) -> None:
        """Send ``buf`` (taken out of buffer ``i``, which is empty) in batches
        of ``size``. What is not sent yet goes back into the buffer while a
        part is being put, so that a barrier overtaking meanwhile takes it
        along (``overtake``), ahead of itself."""
        put = self.channels[i].put
        while len(buf) > size:
            part = RecordBatch(buf[:size], buf.span,
                               None if buf.timestamps is None else buf.timestamps[:size])
            del buf[:size]
            if buf.timestamps is not None:
                del buf.timestamps[:size]
            self.buffers[i] = buf
            await put(part, self.interrupt)
            if self.buffers[i] is not buf:
                return  # overtaken: the rest went into the channel before the barrier
            self.buffers[i] = RecordBatch()
        await put(buf, self.interrupt)

    def limit_batch(self, index: int, size: int) -> None:
        """Debloating: the consumer of channel ``index`` takes batches of
        ``size`` records (at most the configured size). The writer fills
        its buffers up to the smallest such size over its channels."""
        limits = self._limits
        limits[index] = min(size, self.max_batch)
        self.batch_size = min(limits)

    @property
    def emitting(self) -> Any:
        """The event :meth:`emit_event` is sending, if it is under way."""
        return self._emitting

    def _hand_over(self, i: int) -> None:
        """Buffer ``i`` into its channel now, whatever the capacity."""
        buf = self.buffers[i]
        if buf:
            self.buffers[i] = RecordBatch()
            self.channels[i].append(buf)

    def hand_over(self) -> None:
        """Every buffer into its channel now, whatever the capacity: restored
        channel state routed before the job starts."""
        for i in range(len(self.channels)):
            self._hand_over(i)
        self.full = False
        self.dirty_since = 0.0

    async def send_full(self) -> None:
        """Send every buffer that has reached the batch size."""
        size = self.batch_size
        for i, buf in enumerate(self.buffers):
            if len(buf) >= size:
                self.buffers[i] = RecordBatch()
                await self._send(i, buf)
        self.full = False

    async def flush(self) -> None:
        """Send every buffer that holds records."""
        for i, buf in enumerate(self.buffers):
            if buf:
                self.buffers[i] = RecordBatch()
                await self._send(i, buf)
        self.full = False
        self.dirty_since = 0.0

    async def emit_event(self, event: Any) -> None:
        """Flush, then send ``event`` on every channel, behind all records."""
        self._emitting = event
        self._reached = set()
        try:
            await self.flush()
            for i, ch in enumerate(self.channels):
                if i not in self._reached:
                    await ch.put(event, self.interrupt)
                    self._reached.add(i)
        finally:
            self._emitting = None

    def overtake(self, barrier: Any, replacing: Any = None) -> dict[str, list[RecordBatch]]:
        """Send ``barrier`` ahead of this writer's records still in flight
        (no ``await``: capacity does not apply); per channel key, the record
        batches it overtook, oldest first. ``replacing``: the same
        checkpoint's aligned barrier this writer is emitting (held up by
        back-pressure); a channel it already reached is left alone, and it
        is not put where ``barrier`` goes."""
        overtaken: dict[str, list[RecordBatch]] = {}
        emitting = replacing is not None and self._emitting is replacing
        for i, ch in enumerate(self.channels):
            if emitting and i in self._reached:
                continue
            if emitting and ch.is_putting(replacing):
                ch.drop_pending()  # the aligned barrier: this one overtakes instead
            else:
                ch.deliver_pending()
            self._hand_over(i)
            if ch.capacity is None:
                ch.append(barrier)
                overtaken[ch.key] = []
            else:
                overtaken[ch.key] = ch.overtake(barrier)
            if emitting:
                self._reached.add(i)
        self.full = False
        self.dirty_since = 0.0
        return overtaken


def _extend_timestamps(buf: RecordBatch, timestamps: list[Any] | None, n: int) -> None:
    """Append ``n`` records' timestamps to ``buf`` (before the records):
    ``None`` for each if they have none, after padding ``buf``'s own records
    with ``None`` if it had none so far."""
    held = buf.timestamps
    if held is None:
        held = buf.timestamps = [None] * len(buf)
    if timestamps is None:
        held.extend([None] * n)
    else:
        held.extend(timestamps)


class ForwardWriter(RecordWriter):
    """One channel (forward edge, or a single downstream subtask)."""

    def add(self, records: list[Any], span: Span | None,
            timestamps: list[Any] | None = None) -> bool:
        buf = self.buffers[0]
        if timestamps is not None or buf.timestamps is not None:
            _extend_timestamps(buf, timestamps, len(records))
        buf.extend(records)
        buf.span = merge_span(buf.span, span)
        self.full = full = len(buf) >= self.batch_size
        return full


class RebalanceWriter(RecordWriter):
    """Round-robin, a whole output batch at a time: per-record round-robin
    would cost a Python-level append per record for no better balance."""

    def __init__(self, channels: list[Channel], batch_size: int, label: str, start: int) -> None:
        super().__init__(channels, batch_size, label)
        self._next = start % len(channels)

    def add(self, records: list[Any], span: Span | None,
            timestamps: list[Any] | None = None) -> bool:
        i = self._next
        self._next = (i + 1) % len(self.channels)
        buf = self.buffers[i]
        if timestamps is not None or buf.timestamps is not None:
            _extend_timestamps(buf, timestamps, len(records))
        buf.extend(records)
        buf.span = merge_span(buf.span, span)
        full = len(buf) >= self.batch_size
        self.full = self.full or full
        return self.full


class BroadcastWriter(RecordWriter):
    """Every record to every channel."""

    def __init__(self, channels: list[Channel], batch_size: int, label: str) -> None:
        super().__init__(channels, batch_size, label)
        self.copies = len(channels)

    def add(self, records: list[Any], span: Span | None,
            timestamps: list[Any] | None = None) -> bool:
        size = self.batch_size
        # Each downstream subtask gets records of its own (a change one
        # makes in place must not show in another's), unless they cannot
        # change: the first gets the originals.
        own = immutable(records)
        for j, buf in enumerate(self.buffers):
            recs = records
            if j and not own:
                copied = independent_copy(records)
                recs = records if copied is None else copied
            if timestamps is not None or buf.timestamps is not None:
                _extend_timestamps(buf, timestamps, len(recs))
            buf.extend(recs)
            buf.span = merge_span(buf.span, span)
            if len(buf) >= size:
                self.full = True
        return self.full


class KeyGroupWriter(RecordWriter):
    """Hash partitioning: key -> stable hash -> key group -> subtask.

    A batch is routed whole (benchmarks/workers.py, word count at
    parallelism 2, profiled): the keys by one ``map`` of the key selector,
    their key groups, for ``str`` and ``int`` keys, by
    :func:`~eddyflow.keygroups.bulk_key_groups` (the stable hash at C speed,
    no per-record lookup), and the subtasks by one index of the key-group
    table. A lookup of each key in a dictionary of the keys seen (what
    routing did a record at a time before) cost more than the hash: a
    dictionary of every distinct key per writer falls out of the CPU's
    caches, and the state table downstream looks the key up again anyway.
    Other keys (tuples, floats), and batches too small for numpy to pay,
    still go through that dictionary."""

    _CACHE_LIMIT = 1 << 16
    #: Batches of fewer records are routed a record at a time.
    BULK = 64

    def __init__(
        self,
        channels: list[Channel],
        batch_size: int,
        label: str,
        key_fn: Callable[[Any], Any],
        max_parallelism: int,
    ) -> None:
        super().__init__(channels, batch_size, label)
        self.key_fn = key_fn
        self.max_parallelism = max_parallelism
        p = len(channels)
        self._route = [subtask_for_key_group(g, max_parallelism, p) for g in range(max_parallelism)]
        self._route_array: Any = None  # _route as a numpy array, made on first use
        # key -> channel. Python's hash() only serves as the cache's own
        # lookup; the routing decision itself is the stable hash.
        self._cache: dict[Any, int] = {}
        # Once records with timestamps went through, every buffer keeps a
        # timestamp list (the loop without them is the fast one).
        self._timestamped = False

    def _channel_of(self, k: Any) -> int:
        c = self._cache.get(k)
        if c is None:
            c = self._route[stable_hash(k) % self.max_parallelism]
            if len(self._cache) >= self._CACHE_LIMIT:
                self._cache.clear()
            self._cache[k] = c
        return c

    def _channels(self, records: list[Any]) -> list[int] | None:
        """The channel of each record, a batch at a time; ``None`` if the
        key selector failed (the record-at-a-time path then names the
        record)."""
        try:
            keys = list(map(self.key_fn, records))
        except Exception:
            return None
        groups = bulk_key_groups(keys, self.max_parallelism)
        if groups is not None:
            route = self._route_array
            if route is None:
                import numpy as np  # (importing eddyflow does not import numpy)

                route = self._route_array = np.array(self._route, dtype=np.intp)
            chans: list[int] = route[groups].tolist()
            return chans
        # Other keys: through the dictionary of the keys seen.
        try:
            found: list[Any] = list(map(self._cache.get, keys))
        except TypeError:
            i, cause = _first_unhashable(keys)
            raise KeyRoutingError(i, records[i]) from cause
        if None in found:
            channel_of = self._channel_of
            for i, c in enumerate(found):
                if c is None:
                    try:
                        found[i] = channel_of(keys[i])
                    except Exception as exc:
                        raise KeyRoutingError(i, records[i]) from exc
        return found

    def _routed(self, span: Span | None) -> bool:
        """After records were routed: widen the spans of the buffers that
        hold some, and say whether one is full."""
        size = self.batch_size
        for buf in self.buffers:
            if buf:
                buf.span = merge_span(buf.span, span)
                if len(buf) >= size:
                    self.full = True
        return self.full

    def _add_timestamped(self, records: list[Any], span: Span | None,
                         timestamps: list[Any] | None) -> bool:
        """``add`` for records with timestamps: each goes with its record."""
        self._timestamped = True
        for buf in self.buffers:
            if buf.timestamps is None:
                buf.timestamps = [None] * len(buf)
        ts = timestamps if timestamps is not None else [None] * len(records)
        appends = [b.append for b in self.buffers]
        stamps = [b.timestamps.append for b in self.buffers]  # type: ignore[union-attr]
        chans = self._channels(records) if len(records) >= self.BULK else None
        if chans is not None:
            for r, t, c in zip(records, ts, chans, strict=True):
                appends[c](r)
                stamps[c](t)
            return self._routed(span)
        kf = self.key_fn
        i = 0
        try:
            for i, r in enumerate(records):
                k = kf(r)
                try:
                    c = self._channel_of(k)
                except TypeError:
                    stable_hash(k)  # UnsupportedKeyError names the key's type
                    raise
                appends[c](r)
                stamps[c](ts[i])
        except Exception as exc:
            raise KeyRoutingError(i, records[i] if i < len(records) else None) from exc
        return self._routed(span)

    def add(self, records: list[Any], span: Span | None,
            timestamps: list[Any] | None = None) -> bool:
        if timestamps is not None or self._timestamped:
            return self._add_timestamped(records, span, timestamps)
        if len(records) >= self.BULK:
            chans = self._channels(records)
            if chans is not None:
                appends = [b.append for b in self.buffers]
                for r, ch in zip(records, chans, strict=True):
                    appends[ch](r)
                return self._routed(span)
        kf = self.key_fn
        cache = self._cache
        get = cache.get
        route = self._route
        mp = self.max_parallelism
        appends = [b.append for b in self.buffers]
        i = 0
        try:
            for i, r in enumerate(records):  # noqa: B007 - i names the failing record
                k = kf(r)
                try:
                    c = get(k)
                except TypeError:
                    stable_hash(k)  # UnsupportedKeyError names the key's type
                    raise
                if c is None:
                    c = route[stable_hash(k) % mp]
                    if len(cache) >= self._CACHE_LIMIT:
                        cache.clear()
                    cache[k] = c
                appends[c](r)
        except Exception as exc:
            raise KeyRoutingError(i, records[i] if i < len(records) else None) from exc
        return self._routed(span)


def load_bulk_routing() -> None:
    """Import numpy, which :class:`KeyGroupWriter` routes batches with, now:
    a worker process forked after this inherits it instead of importing it
    at its first batch (tens of milliseconds of CPU per worker and attempt;
    importing eddyflow does not import numpy)."""
    import numpy  # noqa: F401


def _first_unhashable(keys: list[Any]) -> tuple[int, Exception]:
    """The index of the first key that has no hash at all, and the error
    that says so (``UnsupportedKeyError`` naming its type)."""
    for i, k in enumerate(keys):
        try:
            hash(k)
        except TypeError as exc:
            try:
                stable_hash(k)
            except Exception as unsupported:
                return i, unsupported
            return i, exc
    raise AssertionError("a key had no hash, then had one")
