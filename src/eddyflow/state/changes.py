"""Change tracking: the keys of each table written since the last snapshot
(:class:`Changes`), so that a snapshot can cost what changed rather than
what the state holds. Every write to a table is recorded here, by the state
handles one key at a time and by the keyed operators a batch at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

__all__ = ["Changes", "Written", "written_keys"]


#: What a table's :class:`Changes` held at a snapshot: keys written one by
#: one, and collections of keys written batch by batch (lists as recorded,
#: and sets of the ones already de-duplicated).
Written = tuple[dict[Any, Any], list[Collection[Any]]]


def written_keys(written: Written) -> set[Any]:
    """Every key of ``written``, once each (in no particular order: a set is
    built much faster than an ordered dict of the same keys, and no reader
    needs the order; ``benchmarks/state.py``)."""
    one_by_one, batches = written
    keys: set[Any] = set(one_by_one)
    for batch in batches:
        keys.update(batch)
    return keys


class Changes:
    """The keys of one table written since the last snapshot.

    Two records, both replaced (never cleared) at each snapshot: ``keys``, a
    dict (its values mean nothing) for writes one at a time (the state
    handles), ``None`` when nothing needs to know (no checkpointing, or
    :attr:`saturated`); and whole lists of keys (:meth:`add_batch`) for the
    keyed operators, which record a batch's keys with one list built at C
    speed instead of a hash insert per record (at a million keys every
    insert is a cache miss: see the keyed ``sum`` rows of
    ``benchmarks/state.py``). The snapshot unions them, off the event loop.

    What the snapshot decides from is how many *distinct* keys were written
    (:meth:`count`): a few hot keys written a million times are a small
    delta. So the lists are de-duplicated into a set (``set.update`` per
    list, at C speed) every ``dedup_every`` keys recorded, as long as that
    pays: a key written again is a hash look-up of a key in the cache, a
    small fraction of what the keyed operator spent on it. When a fold finds
    mostly new keys (uniform keys over a large state, each insert a cache
    miss) de-duplicating stops until the next snapshot, and the lists are
    counted as they are (an upper bound; a Zipf law of exponent 1 over 300k
    keys is still counted exactly, one of 0.8 is not): one fold of
    ``dedup_every`` keys per interval is the price of finding out (see
    ``benchmarks/state.py --scenarios hot-keys`` and the uniform ``sum``
    rows). Past ``fold`` keys in lists (a long interval), the lists are
    folded into the set to bound their memory, a slice per batch recorded.

    A backend whose next snapshot will not use the keys once there are too
    many of them (the memory backend writes every entry once a fifth of
    them changed) passes ``budget``: once more distinct keys than
    ``budget()`` says were recorded (as far as :meth:`__len__` knows),
    recording stops (:attr:`saturated`, ``keys`` is ``None``) until
    :meth:`take_written`. Recording a key costs a cache miss for each key of
    a batch and another to free it, for keys nobody would read (the keyed
    ``sum`` rows of ``benchmarks/state.py`` measure it)."""

    __slots__ = ("_batched", "_batches", "_budget", "_cap", "_dedup", "_seen", "keys",
                 "saturated")

    fold = 1 << 22
    #: Keys folded per batch recorded once past ``fold`` (~20 ms of work).
    fold_step = 1 << 16
    #: Keys recorded between two de-duplications (~1 ms of work at worst).
    dedup_every = 1 << 13

    def __init__(self, track: bool, budget: Callable[[], float] | None = None,
                 *, saturated: bool = False) -> None:
        self.keys: dict[Any, Any] | None = {} if track else None
        self._batches: list[Collection[Any]] = []
        self._batched = 0
        #: Keys of the lists folded so far, each once.
        self._seen: set[Any] = set()
        #: De-duplicating pays in this interval (written keys repeat).
        self._dedup = True
        self._budget = budget
        #: Recording stopped: the keys written since the last snapshot are not known.
        self.saturated = False
        self._cap: float = self.fold
        self._reset_cap()
        if track and saturated:
            self.saturate()

    def add_batch(self, keys: Collection[Any]) -> None:
        """Record the keys of a batch as written (call only while tracking)."""
        self._batches.append(keys)
        self._batched += len(keys)
        if self._batched > self._cap:
            self._overflow()

    def _overflow(self) -> None:
        if self._dedup:
            self._dedup_all()
        budget = self._budget
        limit = budget() if budget is not None else None
        if limit is not None and len(self) > limit:
            self.saturate()
            return
        cap: float = self.dedup_every if self._dedup else self.fold
        if limit is not None:
            # The budget grew with the table: look again when the lists
            # would reach it.
            cap = min(cap, max(0.0, limit - (len(self) - self._batched)))
        self._cap = cap
        if self._dedup:
            return
        if self._batched <= self.fold:
            return
        # Fold the oldest batches, up to ``fold_step`` keys: called again at
        # each batch recorded while past ``fold``, so that a long interval's
        # keys are folded a slice at a time between batches, never in one
        # stop of the loop (millions of keys folded at once were the longest
        # gap in a RocksDB running sum's output: benchmarks/state.py).
        seen = self._seen
        batches = self._batches
        folded = taken = 0
        while taken < len(batches) and folded < self.fold_step:
            batch = batches[taken]
            seen.update(batch)
            folded += len(batch)
            taken += 1
        del batches[:taken]
        self._batched -= folded

    def _dedup_all(self) -> None:
        """Fold every list into the set; stop de-duplicating until the next
        snapshot if most of their keys were new (it would not pay)."""
        seen = self._seen
        before, folded = len(seen), self._batched
        for batch in self._batches:
            seen.update(batch)
        self._batches = []
        self._batched = 0
        # (Judged on enough keys: a few new keys say nothing of the interval.)
        if folded >= self.dedup_every // 2 and (len(seen) - before) * 4 > folded * 3:
            self._dedup = False

    def count(self) -> int:
        """How many distinct keys were recorded: exact while de-duplicating
        pays (the lists not folded yet, fewer than ``dedup_every`` keys, are
        folded now), else an upper bound (a key in two lists counts twice).
        What a snapshot decides on, before :meth:`take_written`."""
        if self._dedup and self._batched:
            self._dedup_all()
        return len(self)

    def saturate(self) -> None:
        """Stop recording (while tracking): the next snapshot will not read
        the keys."""
        if self.keys is None and not self.saturated:
            return  # not tracking
        self.keys = None
        self._batches = []
        self._batched = 0
        self._seen = set()
        self.saturated = True

    def put_back(self, written: Written) -> None:
        """Record the keys of ``written`` (taken earlier) as written again,
        by reference: a snapshot that was to write them was abandoned
        (de-duplicating them here would cost a stop of the loop at the end
        of a large running sum, and the next snapshot de-duplicates
        anyway)."""
        keys = self.keys
        assert keys is not None
        one_by_one, batches = written
        keys.update(one_by_one)
        for batch in batches:
            self.add_batch(batch)

    def __len__(self) -> int:
        """How many keys were recorded (a key in two lists, or written one by
        one and in a list, may count twice; see :meth:`count`)."""
        return ((len(self.keys) if self.keys is not None else 0) + len(self._seen)
                + self._batched)

    def take(self) -> Written:
        """The keys written so far; recording starts over. Not for a
        record with a ``budget`` (see :meth:`take_written`)."""
        if self.saturated:
            raise RuntimeError("the written keys are not known (saturated): use take_written")
        keys, batches, seen = self.keys, self._batches, self._seen
        if keys is None:
            return {}, []
        self.keys = {}
        self._batches = []
        self._batched = 0
        self._seen = set()
        self._dedup = True
        self._reset_cap()
        return keys, ([seen, *batches] if seen else batches)

    def take_written(self) -> Written | None:
        """The keys written so far, or ``None`` if recording had stopped
        (:attr:`saturated`); recording starts over either way."""
        if self.saturated:
            self.saturated = False
            self.keys = {}
            self._dedup = True
            self._reset_cap()
            return None
        return self.take()

    def _reset_cap(self) -> None:
        # How many batched keys to hold before de-duplicating them, or
        # asking the budget again.
        cap = min(self.fold, self.dedup_every)
        self._cap = cap if self._budget is None else min(cap, self._budget())

