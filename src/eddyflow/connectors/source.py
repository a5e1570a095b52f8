"""The source protocol.

A :class:`Source` describes where records come from; each parallel source
subtask gets its own :class:`SourceReader`, which reads batches from a
*position*, reports the position of its next record (the source's state in a
checkpoint: docs/concepts/checkpoints.md, step 1) and seeks back to a restored one. Positions
must be JSON-serialisable, because they are written into checkpoint metadata.

Reads do not wait for input (docs/extending/connector.md): the source task emits
checkpoint barriers, watermarks and idleness between two reads, so a read
that waited for an external system's next record would hold all of them
back. A reader with nothing to return right now returns an empty batch and
says with :meth:`SourceReader.available` when to read again; the task waits
for that, a checkpoint trigger or a processing-time timer, whichever comes
first (after Flink's FLIP-27 ``SourceReader.isAvailable``). Work that does
wait (an async client's receive loop) runs in :meth:`SourceReader.fetch`,
which the task runs beside its reads and which hands records to
``read_batch`` through a buffer of the reader's own.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from typing import Any

__all__ = ["NotReplayableError", "Source", "SourceReader", "same_position"]


def same_position(a: Any, b: Any) -> bool:
    """Positions compare as the JSON they are stored as in checkpoint metadata."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class NotReplayableError(RuntimeError):
    """A source was asked to seek to a position it cannot go back to."""


class SourceReader(ABC):
    """Reads one split of a source; used by exactly one source subtask."""

    @abstractmethod
    async def read_batch(self, max_records: int) -> list[Any] | None:
        """Up to ``max_records`` records, or ``None`` when the input is exhausted.

        Returns what is available now: fewer records, or none (``[]``), when
        no more are. It should not await input that has not arrived yet
        (see the module docstring): return ``[]`` and let :meth:`available`
        say when to read again. The runtime flushes its output buffers after
        a short batch, so a slow trickle of input still flows downstream
        promptly.
        """

    def available(self) -> asyncio.Future[None] | None:
        """After a read returned ``[]``: a future that is done once
        :meth:`read_batch` has something to return (records, the end of the
        input or an error), or ``None`` to be read again at once.

        The source task awaits it together with checkpoint triggers and
        processing-time timers, so a quiet input holds back neither
        checkpoints nor (with ``with_idleness``) watermarks; it never
        cancels the future, and may ask again, so a reader can hand out the
        same future until it is done. The default, ``None``, suits a reader
        that is never without input for long (a file, a collection): the task
        lets the rest of the job run, then reads again.
        """
        return None

    async def fetch(self) -> None:  # noqa: B027 - optional hook
        """Background work of the reader: run by the source task in its task
        group from before the first read until the task ends, then
        cancelled. A reader of an input that arrives by awaiting (an async
        iterator, a socket) receives here into a buffer that
        :meth:`read_batch` takes from, and resolves :meth:`available`'s
        future when records arrive. A failure of the input is best handed
        to ``read_batch`` to raise, so the job's error names the source and
        its position; an exception raised here fails the job as it is. The
        default has nothing to do and returns at once."""

    @abstractmethod
    def position(self) -> Any:
        """The position of the next record to be read (JSON-serialisable)."""

    @abstractmethod
    def seek(self, position: Any) -> None:
        """Continue reading at ``position``, a value :meth:`position` returned."""

    def position_of(self, index: int) -> Any:
        """The position of record ``index`` of the last batch, for error messages.

        ``None`` when the reader cannot tell.
        """
        return None

    def split_at(self, batch: list[Any], position: Any) -> tuple[list[Any], bool] | None:
        """For an offline replay up to ``position`` (a checkpoint's): the
        records of the last batch, ``batch``, that come before it, and
        whether the reader has now reached it. ``None`` when the reader
        cannot tell (the replay then reads one record at a time).

        The default serves readers whose ``position_of(i)`` is the full
        position before record ``i``: the cut is a prefix of the batch."""
        if same_position(self.position(), position):
            return batch, True
        for i in range(1, len(batch)):
            p = self.position_of(i)
            if p is None:
                return None
            if same_position(p, position):
                return batch[:i], True
        return batch, False

    def describe_position(self, position: Any) -> str:
        """How a position reads in an error message."""
        return f"position {position!r}"

    def snapshot_position(self, checkpoint_id: int) -> Any:
        """The position checkpoint ``checkpoint_id`` records for this reader
        (Flink's ``SourceReader.snapshotState(checkpointId)``): the source
        task calls it when it emits that checkpoint's barrier, between two
        batches. The default is :meth:`position`; a reader that
        acknowledges positions in :meth:`notify_checkpoint_complete`
        overrides it to remember which position went into which checkpoint
        (:meth:`position` itself is also called between batches, for error
        messages, and says nothing about checkpoints)."""
        return self.position()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:  # noqa: B027 - optional hook
        """Checkpoint ``checkpoint_id``, which recorded this reader's
        position, is complete (Flink's ``SourceReader.notifyCheckpointComplete``).

        The source task calls it on the job's event loop once the
        checkpoint's metadata is durable, as the sink operator's commit is
        called: a reader of a system that keeps a consumer's progress on its
        side (a replication slot, a consumer group's committed offset) may
        now acknowledge the position it reported for that checkpoint (in
        :meth:`snapshot_position`), and no
        earlier, since a restore goes back to the last completed checkpoint.
        Completions arrive in checkpoint order, but a reader may miss some
        (a checkpoint completes while the job fails): acknowledge everything
        up to the newest one notified. A reader whose input ended is told
        of the checkpoints that complete after (they hold its final
        position), even once :meth:`close` has run. It must not block: a reader that
        acknowledges over the network records the id here and lets its
        :meth:`fetch` do the round trip. The default does nothing.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release files, connections or background tasks."""


class Source(ABC):
    """A (replayable) source of records; ``env.from_source`` takes any subclass."""

    #: The most subtasks this source can be split over; ``None`` for no limit.
    max_parallelism: int | None = None
    #: Whether :meth:`SourceReader.seek` can go back to any reported position.
    replayable: bool = True

    @property
    def name(self) -> str:
        """A description of the source (its type, and file or log name): an
        unnamed source's uid in checkpoints is derived from it, so it must
        be the same in every run of the job."""
        return type(self).__name__

    @abstractmethod
    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        """The reader of split ``subtask`` out of ``parallelism``."""
