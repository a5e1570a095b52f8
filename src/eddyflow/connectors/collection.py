"""``env.from_collection``: records from an in-memory sequence.

A split source (connectors/splits.py): the collection is cut in as many
contiguous slices as the source has subtasks when the job first starts, and
a slice's position is the index of its next record in the whole collection.
A restore at another parallelism deals the same slices out anew; each
slice is read in the collection's order.

A replay after a failure must read the records as they were, even though the
job (a ``map`` that changes a dict in place, say) changed the objects it was
given: unless every item is an immutable value (numbers, strings, tuples of
them), the collection is pickled in chunks when the source is declared, and
each read unpickles fresh objects (as Flink's ``fromCollection`` serialises
its elements). Items that cannot be pickled are deep-copied instead, and
items that cannot be copied either (modules, say) are shared, with a warning.
"""

from __future__ import annotations

import copy
import logging
import pickle
from collections.abc import Iterable, Sequence
from typing import Any

from eddyflow.connectors.source import SourceReader
from eddyflow.connectors.splits import RestoredSplit, SourceSplit, SplitSource
from eddyflow.values import immutable

__all__ = ["CollectionSource"]

log = logging.getLogger("eddyflow")

#: Records per pickled chunk: a reader that seeks unpickles from one chunk on.
_CHUNK = 4096


class CollectionSource(SplitSource):
    """The source of ``env.from_collection`` (see the module docstring)."""

    def __init__(self, items: Iterable[Any]) -> None:
        if isinstance(items, range):
            self._shared: Sequence[Any] | None = items
            self._chunks: list[bytes] | None = None
            self._n = len(items)
            self._copies: list[Any] | None = None
            return
        seq: Sequence[Any] = items if isinstance(items, list | tuple) else list(items)
        self._n = len(seq)
        self._shared = self._chunks = self._copies = None
        if immutable(seq):
            self._shared = seq
            return
        try:
            self._chunks = [pickle.dumps(list(seq[i:i + _CHUNK]), pickle.HIGHEST_PROTOCOL)
                            for i in range(0, self._n, _CHUNK)]
        except Exception as exc:
            log.debug("from_collection: items not picklable (%s), deep-copying them", exc)
            try:
                self._copies = copy.deepcopy(list(seq))
            except Exception as exc2:
                log.warning("from_collection: the records can be neither pickled nor copied "
                            "(%s); a replay after a failure reads them as they are then", exc2)
                self._shared = seq

    @property
    def name(self) -> str:
        return "collection"

    def _slice(self, k: int, pieces: int) -> SourceSplit:
        n = self._n
        return SourceSplit(f"slice-{k}", [n * k // pieces, n * (k + 1) // pieces], k)

    def discover_splits(self, known: Sequence[SourceSplit], parallelism: int
                        ) -> list[SourceSplit]:
        if known:
            return []  # cut once, when the job first started
        return [self._slice(k, parallelism) for k in range(parallelism)]

    def create_split_reader(self, split: SourceSplit) -> SourceReader:
        bounds = split.data
        if (not isinstance(bounds, list) or len(bounds) != 2
                or not all(isinstance(b, int) for b in bounds)
                or not 0 <= bounds[0] <= bounds[1] <= self._n):
            raise ValueError(f"collection split {split.split_id!r}: {bounds!r} is no slice of "
                             f"the {self._n} records (was the collection changed?)")
        return _CollectionReader(self, bounds[0], bounds[1])

    def splits_of_subtask(self, subtask: int, parallelism: int, position: Any
                          ) -> list[RestoredSplit]:
        # Before it was a split source, subtask s of p read slice s of p.
        return [RestoredSplit(self._slice(subtask, parallelism), position)]

    def read(self, start: int, stop: int, cache: dict[int, list[Any]]) -> list[Any]:
        """Records ``start`` to ``stop``, as they were when the source was
        declared. ``cache``: the reader's unpickled chunks (each record is
        handed out once: a reader reads forward)."""
        if self._shared is not None:
            return list(self._shared[start:stop])
        if self._chunks is not None:
            out: list[Any] = []
            for c in range(start // _CHUNK, (stop - 1) // _CHUNK + 1):
                chunk = cache.get(c)
                if chunk is None:
                    cache.clear()
                    chunk = cache[c] = pickle.loads(self._chunks[c])
                base = c * _CHUNK
                out.extend(chunk[max(start - base, 0):stop - base])
            return out
        assert self._copies is not None
        return copy.deepcopy(self._copies[start:stop])


class _CollectionReader(SourceReader):
    def __init__(self, source: CollectionSource, start: int, end: int) -> None:
        self._source = source
        self._start = start
        self._end = end
        self._pos = start
        self._batch_start = start
        self._cache: dict[int, list[Any]] = {}

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self._pos >= self._end:
            return None
        self._batch_start = self._pos
        stop = min(self._pos + max_records, self._end)
        batch = self._source.read(self._pos, stop, self._cache)
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
        self._cache.clear()  # records already handed out are not handed out again

    def position_of(self, index: int) -> int:
        return self._batch_start + index

    def describe_position(self, position: Any) -> str:
        return f"index {position}"
