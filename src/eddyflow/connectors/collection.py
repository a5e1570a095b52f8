"""``env.from_collection``: records from an in-memory sequence.

The position is the index of the next record in the whole collection. With
parallelism > 1 each subtask reads one contiguous slice, so per-subtask order
is the collection's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from eddyflow.connectors.source import Source, SourceReader

__all__ = ["CollectionSource"]


class CollectionSource(Source):
    def __init__(self, items: Iterable[Any]) -> None:
        seq = isinstance(items, list | tuple | range)
        self.items: Sequence[Any] = items if seq else list(items)  # type: ignore[assignment]

    @property
    def name(self) -> str:
        return "collection"

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        n = len(self.items)
        return _CollectionReader(
            self.items, n * subtask // parallelism, n * (subtask + 1) // parallelism
        )


class _CollectionReader(SourceReader):
    def __init__(self, items: Sequence[Any], start: int, end: int) -> None:
        self._items = items
        self._start = start
        self._end = end
        self._pos = start
        self._batch_start = start

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self._pos >= self._end:
            return None
        self._batch_start = self._pos
        stop = min(self._pos + max_records, self._end)
        batch = list(self._items[self._pos : stop])
        self._pos = stop
        return batch

    def position(self) -> int:
        return self._pos

    def seek(self, position: Any) -> None:
        if not isinstance(position, int) or not self._start <= position <= self._end:
            raise ValueError(
                f"collection position {position!r} outside this split "
                f"[{self._start}, {self._end}]"
            )
        self._pos = position

    def position_of(self, index: int) -> int:
        return self._batch_start + index

    def describe_position(self, position: Any) -> str:
        return f"index {position}"
