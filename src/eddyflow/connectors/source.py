"""The source protocol.

A :class:`Source` describes where records come from; each parallel source
subtask gets its own :class:`SourceReader`, which reads batches from a
*position*, reports the position of its next record (the source's state in a
checkpoint: docs/concepts/checkpoints.md, step 1) and seeks back to a restored one. Positions
must be JSON-serialisable, because they are written into checkpoint metadata.
"""

from __future__ import annotations

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

        May return fewer records (even none) when no more are available right
        now; the runtime flushes its output buffers after a short batch, so a
        slow trickle of input still flows downstream promptly.
        """

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
