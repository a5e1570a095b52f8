"""``map_async``: a coroutine function called per record, up to ``capacity``
calls in flight per subtask, on the job's event loop (after Flink's
``AsyncWaitOperator``; docs/concepts/async.md).

The operator never awaits. ``process_ts`` admits a batch: it starts a call
(an asyncio task) per record while fewer than ``capacity`` are running and
queues the rest, and returns nothing. The task of a call handles its
completion as soon as the call returns: it starts the next queued call (so
the calls in flight stay at ``capacity`` whatever the task is doing) and,
when results can be emitted, calls :attr:`AsyncCallOperator.on_ready`,
which wakes the task
(``Task._wake``). The task then takes the results a segment at a time
(:meth:`AsyncCallOperator.take`) and runs them through the rest of its
chain. It stops reading input while :attr:`AsyncCallOperator.saturated`:
``capacity`` records are admitted and not yet emitted (running, queued, or
complete but waiting for an earlier result), which bounds the memory to
``capacity`` records plus one input batch and back-pressures upstream.

Order. ``ordered=True`` emits results in input order: the head of the queue
goes out once complete, with whatever completed behind it. ``ordered=False``
emits them as they complete within *segments* between watermarks: a
watermark that reaches the operator while records are admitted closes the
current segment and is held; it goes out after every result of its segment
and before any result of the next, whose completed results wait for it
(Flink's unordered mode). A watermark held back never lets a result of an
earlier record arrive late downstream.

Checkpoints. The records admitted and not yet emitted, in input order and
with their timestamps, are this subtask's operator state: they are pickled
at the barrier (a list, written to the checkpoint as one file) and, after a
restore at any parallelism, split among the new subtasks and called again.
Their results emitted after the barrier are thus outside every downstream
snapshot of that checkpoint, and the calls themselves are at-least-once.
With checkpointing on, records that may change in place are copied when
admitted, so the checkpoint holds them as they arrived whatever ``fn`` does
to them. A held watermark is not in the checkpoint: the operator's
watermark is the last one it let through, and upstream sends later ones
again after a restore.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import pickle
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import CoroutineType
from typing import Any

from eddyflow.checkpoint.storage import CheckpointCorrupted
from eddyflow.errors import StateSerializationError
from eddyflow.runtime.operators.base import Operator, OperatorContext, OperatorSnapshot
from eddyflow.state.abc import SnapshotTarget
from eddyflow.values import immutable, independent_copy

__all__ = ["AsyncCallFailed", "AsyncCallOperator", "MapAsyncSpec", "decode_in_flight"]

#: Format of the pickled list of in-flight records in a checkpoint.
_FORMAT = 1


class AsyncCallFailed(Exception):
    """A call of ``map_async`` raised or timed out: ``record`` is its input,
    ``__cause__`` what it raised."""

    def __init__(self, record: Any, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.record = record
        self.cause = cause


class CallTimedOut(Exception):
    """A call took longer than the operator's ``timeout``."""


class _Deadline:
    """When a running call times out (loop time)."""

    __slots__ = ("at", "expired", "task")

    def __init__(self, at: float, task: asyncio.Future[Any]) -> None:
        self.at = at
        self.task: asyncio.Future[Any] | None = task  # None once it completed
        self.expired = False


class _Entry:
    """One admitted record: its input (and the copy the checkpoint keeps),
    timestamp, call and result."""

    __slots__ = ("deadline", "done", "kept", "record", "result", "segment", "task", "timestamp")

    def __init__(self, record: Any, kept: Any, timestamp: Any) -> None:
        self.record = record
        self.kept = kept
        self.timestamp = timestamp
        self.done = False
        self.result: Any = None
        self.task: asyncio.Future[Any] | None = None
        self.deadline: _Deadline | None = None
        self.segment: _Segment | None = None


class _Segment:
    """Unordered mode: the entries admitted between two watermarks."""

    __slots__ = ("done", "open", "watermark")

    def __init__(self, watermark: float | None = None) -> None:
        self.open = 0  # entries whose call has not completed
        self.done: list[_Entry] = []  # completed, not yet emitted
        self.watermark = watermark  # the watermark that closes it, once one came


class _OrderedQueue:
    """Entries and held watermarks in arrival order; emitted from the head."""

    def __init__(self) -> None:
        self.items: collections.deque[_Entry | float] = collections.deque()

    def add(self, entry: _Entry) -> None:
        self.items.append(entry)

    def completed(self, entry: _Entry) -> bool:
        items = self.items
        return bool(items) and items[0] is entry

    def hold(self, watermark: float) -> None:
        self.items.append(watermark)

    def take(self) -> tuple[list[_Entry], float | None] | None:
        items = self.items
        out: list[_Entry] = []
        while items:
            head = items[0]
            if type(head) is float:
                if out:
                    break  # the results before it go first, then it
                items.popleft()
                return out, head
            assert isinstance(head, _Entry)
            if not head.done:
                break
            out.append(head)
            items.popleft()
        return (out, None) if out else None

    def entries(self) -> list[_Entry]:
        return [e for e in self.items if type(e) is _Entry]


class _UnorderedQueue:
    """Segments between watermarks; the head segment's results go out as
    they complete, later segments' wait for it."""

    def __init__(self) -> None:
        self.segments: collections.deque[_Segment] = collections.deque()
        #: Admitted, not emitted, in input order (for snapshots).
        self.pending: dict[int, _Entry] = {}

    def add(self, entry: _Entry) -> None:
        segs = self.segments
        if not segs or segs[-1].watermark is not None:
            segs.append(_Segment())
        seg = segs[-1]
        seg.open += 1
        entry.segment = seg
        self.pending[id(entry)] = entry

    def completed(self, entry: _Entry) -> bool:
        seg = entry.segment
        assert seg is not None
        seg.open -= 1
        seg.done.append(entry)
        return seg is self.segments[0]

    def hold(self, watermark: float) -> None:
        segs = self.segments
        if segs and segs[-1].watermark is None:
            segs[-1].watermark = watermark
        else:
            segs.append(_Segment(watermark))

    def take(self) -> tuple[list[_Entry], float | None] | None:
        segs = self.segments
        while segs:
            seg = segs[0]
            if seg.done:
                out, seg.done = seg.done, []
                pending = self.pending
                for e in out:
                    del pending[id(e)]
                return out, None
            if seg.open:
                return None
            segs.popleft()
            if seg.watermark is not None:
                return [], seg.watermark
        return None

    def entries(self) -> list[_Entry]:
        return list(self.pending.values())


class AsyncCallOperator(Operator):
    """The ``map_async`` operator of one subtask (see the module docstring).
    It heads its chain (``Node.chain_head``), so the task that runs it reads
    a gate, never a source."""

    def __init__(self, ctx: OperatorContext, fn: Callable[[Any], Awaitable[Any]],
                 capacity: int, timeout: float, ordered: bool) -> None:
        super().__init__(ctx)
        self.fn = fn
        self.capacity = capacity
        self.timeout = timeout
        self.ordered = ordered
        self._queue: _OrderedQueue | _UnorderedQueue = (
            _OrderedQueue() if ordered else _UnorderedQueue())
        self._waiting: collections.deque[_Entry] = collections.deque()
        #: The running calls: each task, with the awaitable it awaits.
        self._tasks: dict[asyncio.Future[Any], Awaitable[Any]] = {}
        self._deadlines: collections.deque[_Deadline] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Admitted and not yet emitted.
        self.count = 0
        #: Results (or a failure) are ready for :meth:`take`.
        self.ready = False
        self._failure: AsyncCallFailed | None = None
        #: Called (on the loop) when :attr:`ready` becomes true: the task
        #: sets it to its wake-up. (Only :meth:`take` frees room below
        #: ``capacity``, so a task waiting at capacity waits for this too.)
        self.on_ready: Callable[[], None] = _nothing
        self._closed = False

    @property
    def saturated(self) -> bool:
        """``capacity`` records are admitted and not emitted: read no more."""
        return self.count >= self.capacity

    # -- records in -----------------------------------------------------------

    def process(self, batch: list[Any]) -> list[Any]:
        self.process_ts(batch, None)
        return []

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        kept = batch
        if self.ctx.checkpointing and not immutable(batch):
            # The checkpoint must hold the inputs as they arrived, whatever
            # the calls do to them (a dict enriched in place, say).
            kept = independent_copy(batch) or batch
        if timestamps is None:
            for r, k in zip(batch, kept, strict=True):
                self._admit(_Entry(r, k, None))
        else:
            for r, k, t in zip(batch, kept, timestamps, strict=True):
                self._admit(_Entry(r, k, t))
        return [], None

    def _admit(self, entry: _Entry) -> None:
        self._queue.add(entry)
        self.count += 1
        if len(self._tasks) < self.capacity:
            self._start(entry)
        else:
            self._waiting.append(entry)

    def _start(self, entry: _Entry) -> None:
        try:
            call = self.fn(entry.record)
        except Exception as exc:  # raised before it awaited anything
            self._fail(entry, exc)
            return
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if type(call) is not CoroutineType and not inspect.isawaitable(call):
            self._fail(entry, TypeError(
                f"map_async needs a coroutine function; {self.fn!r:.80} returned "
                f"{type(call).__name__}, not an awaitable"))
            return
        # The wrapper handles the completion itself, at once: a done-callback
        # would wait for another turn of the loop before the next call starts.
        task = loop.create_task(self._call(entry, call))
        entry.task = task
        self._tasks[task] = call
        # Timeouts: one timer for all calls, not one per call (an asyncio
        # timeout per call was a third of the operator's cost per record in
        # benchmarks/map_async.py). Calls start in order with the same
        # timeout, so their deadlines are in order too.
        deadline = _Deadline(loop.time() + self.timeout, task)
        entry.deadline = deadline
        self._deadlines.append(deadline)
        if self._timer is None:
            self._timer = loop.call_at(deadline.at, self._expire)

    def _expire(self) -> None:
        """The earliest deadline passed: cancel the calls past theirs (they
        fail the job as timed out) and wait for the next deadline."""
        self._timer = None
        loop = self._loop
        if self._closed or loop is None:
            return
        now = loop.time()
        deadlines = self._deadlines
        while deadlines:
            head = deadlines[0]
            if head.task is None:
                deadlines.popleft()  # completed
                continue
            if head.at > now:
                break
            deadlines.popleft()
            head.expired = True
            head.task.cancel()
        if deadlines:
            self._timer = loop.call_at(deadlines[0].at, self._expire)

    def _fail(self, entry: _Entry, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = AsyncCallFailed(entry.record, exc)
            self._signal()

    async def _call(self, entry: _Entry, call: Awaitable[Any]) -> None:
        try:
            result = await call
        except asyncio.CancelledError as exc:  # a timeout, the job's end, or the call's own
            self._completed(entry, None, exc)
            raise
        except Exception as exc:
            self._completed(entry, None, exc)
        else:
            self._completed(entry, result, None)

    def _completed(self, entry: _Entry, result: Any, exc: BaseException | None) -> None:
        task = entry.task
        if task is not None:
            self._tasks.pop(task, None)
        entry.task = None
        deadline = entry.deadline
        if deadline is not None:
            deadline.task = None
            entry.deadline = None
        deadlines = self._deadlines
        while deadlines and deadlines[0].task is None:
            deadlines.popleft()  # keeps the deque to the calls running, in practice
        if self._closed:
            return
        if deadline is not None and deadline.expired:
            self._fail(entry, CallTimedOut(
                f"the call did not complete within its timeout of {self.timeout:g} s"))
            return
        if exc is not None:
            self._fail(entry, exc)
            return
        entry.result = result
        entry.done = True
        if self._waiting:
            self._start(self._waiting.popleft())
        if self._queue.completed(entry):
            self._signal()

    def _signal(self) -> None:
        if not self.ready:
            self.ready = True
            self.on_ready()

    # -- results out ------------------------------------------------------------

    def take(self) -> tuple[list[Any], list[Any] | None, float | None] | None:
        """The next results to emit, with their timestamps (``None`` if the
        records had none), or a watermark now released (with no results),
        or ``None`` when nothing more is ready. One segment per call, so
        that nothing taken is outside both the operator's state and the
        task's output buffers when a snapshot is taken. Raises
        :class:`AsyncCallFailed` for a call that raised or timed out."""
        if self._failure is not None:
            raise self._failure
        got = self._queue.take()
        if got is None:
            self.ready = False
            return None
        entries, watermark = got
        if watermark is not None:
            self.watermark = watermark
            return [], None, watermark
        self.count -= len(entries)
        self.records_out += len(entries)
        results = [e.result for e in entries]
        stamps = [e.timestamp for e in entries] if entries[0].timestamp is not None else None
        return results, stamps, None

    def hold_watermark(self, watermark: float) -> bool:
        if not self.count:
            return False
        self._queue.hold(watermark)
        return True

    # -- checkpoints and restore --------------------------------------------------

    def snapshot(self, checkpoint_id: int, target: SnapshotTarget | None = None
                 ) -> OperatorSnapshot | None:
        entries = self._queue.entries()
        if not entries:
            return None
        items = [(e.kept, e.timestamp) for e in entries]
        try:
            blob = pickle.dumps((_FORMAT, items), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise StateSerializationError(
                f"{type(exc).__name__}: {exc}", subject="a record in flight",
                operator=self.uid, checkpoint=checkpoint_id) from exc
        return OperatorSnapshot(operator_list=blob, operator_list_records=len(items))

    def restore_operator_list(self, items: list[tuple[Any, Any]]) -> None:
        """Admit the records a checkpoint had in flight (this subtask's
        share of them): their calls are made again."""
        for record, timestamp in items:
            copy = record
            if self.ctx.checkpointing and not immutable([record]):
                copied = independent_copy([record])
                copy = copied[0] if copied else record
            self._admit(_Entry(record, copy, timestamp))

    # -- the end ---------------------------------------------------------------

    def _cancel(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._deadlines.clear()
        for task, call in self._tasks.items():
            task.cancel()
            if type(call) is CoroutineType and (inspect.getcoroutinestate(call)
                                                == inspect.CORO_CREATED):
                call.close()  # its task never ran: it was not awaited, and need not be
        self._tasks.clear()
        self._waiting.clear()

    def close(self) -> None:
        self._cancel()

    def abort(self) -> None:
        self._cancel()


def decode_in_flight(data: bytes, path: str) -> list[tuple[Any, Any]]:
    """The ``(record, timestamp)`` pairs of a checkpoint's file of records in
    flight at a ``map_async`` subtask (``path`` for errors)."""
    try:
        fmt, items = pickle.loads(data)
        if fmt != _FORMAT:
            raise ValueError(f"unknown format {fmt!r}")
        return [(r, t) for r, t in items]
    except Exception as exc:
        raise CheckpointCorrupted(f"{path}: unreadable records in flight: {exc}") from exc


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class MapAsyncSpec:
    """``map_async(fn, capacity, timeout, ordered)``: ``await fn(record)`` per
    record, up to ``capacity`` at a time per subtask."""

    fn: Callable[[Any], Awaitable[Any]]
    capacity: int = 100
    timeout: float = 10.0
    ordered: bool = True

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return AsyncCallOperator(ctx, self.fn, self.capacity, self.timeout, self.ordered)
