"""What travels through channels: record batches and in-band control events.

Records always travel in a :class:`RecordBatch` (a list, so operators use
list operations at C speed); control events (end of input, checkpoint
barriers, watermarks and watermark status) travel in the same FIFO between
batches, which is what makes them "in band": everything before an event was
sent before it.

Event time: a batch of a stream with event time carries its records'
timestamps in a parallel list (``timestamps[i]`` is ``batch[i]``'s, a float
in seconds, or ``None`` for a record without one); a stream without event
time carries ``None`` there, so jobs that never use event time pay one
attribute per batch and nothing per record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "Barrier",
    "EndOfInput",
    "RecordBatch",
    "Span",
    "Watermark",
    "WatermarkStatus",
    "merge_span",
    "timestamped",
]

#: Where a batch's records were read: ``((source label, first position,
#: position after the last), ...)``. Kept per batch, not per record, so that
#: an error downstream of an exchange can still say which input it came from.
#: Immutable tuples, not a dict of lists: a batch can share its input's span,
#: and a tuple of plain positions is untracked by the garbage collector, so
#: batches that wait in channels while collections run add less to the next
#: full collection.
Span = tuple[tuple[str, Any, Any], ...]


class RecordBatch(list[Any]):
    """Records that travel together, with their span (where they were
    read) and their timestamps (``None``: the stream has no event time)."""

    __slots__ = ("span", "timestamps")

    def __init__(self, records: Any = (), span: Span | None = None,
                 timestamps: list[Any] | None = None) -> None:
        super().__init__(records)
        self.span = span
        #: The records' event timestamps, parallel to the list; ``None``: the
        #: stream has no event time.
        self.timestamps = timestamps


def timestamped(records: list[Any], timestamps: list[Any] | None) -> RecordBatch:
    """``records`` with their timestamps: what an operator returns from
    ``on_watermark`` (or ``process``) to give its outputs timestamps of its
    own choosing (a window result: the window's end)."""
    return RecordBatch(records, None, timestamps)


def merge_span(into: Span | None, other: Span | None) -> Span | None:
    """Widen ``into`` by ``other``. Batches of one source subtask arrive in
    order, so the earliest first and the latest end are the widest range."""
    if other is None or into is other:
        return into
    if into is None:
        return other
    if len(into) == 1 and len(other) == 1 and into[0][0] == other[0][0]:
        return ((into[0][0], into[0][1], other[0][2]),)  # the common case: one source
    merged = list(into)
    for label, first, end in other:
        for i, (known, known_first, _) in enumerate(merged):
            if known == label:
                merged[i] = (label, known_first, end)
                break
        else:
            merged.append((label, first, end))
    return tuple(merged)


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The sender will send nothing more on this channel."""


END_OF_INPUT = EndOfInput()


@dataclass(frozen=True, slots=True)
class Barrier:
    """Checkpoint barrier ``checkpoint_id``: records before it belong to the
    checkpoint's stage, records after it to the next (docs/concepts/checkpoints.md)."""

    checkpoint_id: int
    timestamp: float
    #: Overtakes records (an unaligned checkpoint): it travels as a priority
    #: item, and the task that gets it snapshots at once.
    unaligned: bool = False


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event time ``timestamp`` has been reached on this channel: no record
    with a timestamp ``<= timestamp`` is expected after it (one that comes
    is *late*). ``float('inf')`` ends event time: a bounded input is done."""

    timestamp: float


@dataclass(frozen=True, slots=True)
class WatermarkStatus:
    """The sender's watermark is ``idle`` (its split saw no record for its
    idleness timeout: downstream minimums leave it out) or active again (it
    has records again: it counts from its next watermark on)."""

    idle: bool
