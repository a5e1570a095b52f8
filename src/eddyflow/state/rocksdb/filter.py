"""Which keys a value table's database may hold: an in-process Bloom filter,
so that a key seen for the first time is known absent without a read.

A keyed operator over keys that rarely repeat (a count of event ids, a
dedup) meets a new key at nearly every record. Once the table's cache has
been evicted, each key it lacks is asked of RocksDB (a multi-get a batch);
for a new key that read finds nothing, and it was the largest cost of a
count over 3M distinct keys (py-spy: a third of the run in ``get_many``, as
much again writing and encoding rows; ``benchmarks/state.py``, scenario
``distinct-keys``). RocksDB's own Bloom filters do not make it cheap: the
read still crosses into RocksDB a key at a time, and searches the memtables,
which hold the newest keys.

:class:`KeyFilter` answers "maybe present" or "absent" for a whole batch in a
few numpy operations over the keys' Python hashes (cached in every ``str``),
with no false "absent": a key the table may have written is never reported
absent. It is a *blocked* Bloom filter (the bits of a key all in one 64-bit
word: one memory access a key) that grows by adding filters of twice the
capacity of the last (a scalable Bloom filter): the keys a database holds
are not known in advance, and a filter cannot be rebuilt without them.

Python salts ``str`` hashes per process: a filter is meaningful only in the
process that built it, which is the only one that reads it (a snapshot's
forked child writes rows, it never loads keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["KeyFilter"]

_MASK64 = (1 << 64) - 1
#: A 64-bit word per 2 keys of capacity (4 bytes a key; the filters of a
#: growing table take up to twice that), 5 bits a key: 0.03% false "maybe"
#: for a full filter, 0.35% over the 4 filters that 2M keys filled a batch at
#: a time (1.5% at 4 keys a word, measured the same way). A false "maybe"
#: costs its key a read.
_KEYS_PER_WORD = 2
#: The capacity of a first filter.
_MIN_CAPACITY = 1 << 14


def _mix(h: Any) -> Any:
    """splitmix64's finaliser of 64-bit hashes (a numpy ``uint64`` array):
    an ``int``'s hash is the int itself, whose low bits alone would pick a
    word and whose high bits are zero."""
    import numpy as np

    h = h ^ (h >> np.uint64(30))
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


def _mix_one(h: int) -> int:
    """:func:`_mix` of one hash, in Python integers (the same bits)."""
    h &= _MASK64
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _MASK64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _MASK64
    return h ^ (h >> 31)


def _masks(z: Any) -> Any:
    """The bits each mixed hash sets in its word: five 6-bit fields of its
    high 30 bits (the word is picked by the low bits)."""
    import numpy as np

    one = np.uint64(1)
    m = np.left_shift(one, (z >> np.uint64(34)) & np.uint64(63))
    m |= np.left_shift(one, (z >> np.uint64(40)) & np.uint64(63))
    m |= np.left_shift(one, (z >> np.uint64(46)) & np.uint64(63))
    m |= np.left_shift(one, (z >> np.uint64(52)) & np.uint64(63))
    m |= np.left_shift(one, z >> np.uint64(58))
    return m


def _mask_one(z: int) -> int:
    return ((1 << ((z >> 34) & 63)) | (1 << ((z >> 40) & 63)) | (1 << ((z >> 46) & 63))
            | (1 << ((z >> 52) & 63)) | (1 << (z >> 58)))


class KeyFilter:
    """A set of keys that answers membership with false positives but no
    false negatives (see the module docstring). ``capacity``: the keys the
    first filter is sized for; more are taken in larger filters."""

    __slots__ = ("_added", "_capacity", "_words")

    def __init__(self, capacity: int = _MIN_CAPACITY) -> None:
        #: One array of 64-bit words per filter, oldest first; a key may be
        #: in any of them, new keys go into the last.
        self._words: list[Any] = []
        #: Keys added to the last filter (repeats counted: an upper bound).
        self._added = 0
        self._capacity = 0
        self._grow(max(int(capacity), _MIN_CAPACITY))

    def _grow(self, capacity: int) -> None:
        import numpy as np

        words = 1 << max(0, (-(-capacity // _KEYS_PER_WORD) - 1).bit_length())
        self._words.append(np.zeros(words, dtype=np.uint64))
        self._capacity = words * _KEYS_PER_WORD
        self._added = 0

    @property
    def nbytes(self) -> int:
        """The memory the filter's bits take."""
        return sum(int(w.nbytes) for w in self._words)

    @staticmethod
    def _hashes(keys: Sequence[Any]) -> Any:
        import numpy as np

        h = np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys))
        return _mix(h.view(np.uint64))

    def add_many(self, keys: Sequence[Any]) -> None:
        """Add ``keys`` (hashable)."""
        if keys:
            z = self._hashes(keys)
            self._insert(z, _masks(z))

    def _insert(self, z: Any, m: Any) -> None:
        import numpy as np

        if self._added + len(z) > self._capacity:
            self._grow(max(2 * self._capacity, len(z)))
        words = self._words[-1]
        # ``or.at``, not ``words[i] |= m``: two keys of one batch may share a word.
        np.bitwise_or.at(words, z & np.uint64(len(words) - 1), m)
        self._added += len(z)

    def test_and_add(self, keys: Sequence[Any]) -> list[bool]:
        """For each of ``keys``, whether it may have been added before
        (``False``: certainly not); adds those that were not (their hashes
        computed once for both)."""
        if not keys:
            return []
        import numpy as np

        z = self._hashes(keys)
        m = _masks(z)
        found = np.zeros(len(keys), dtype=np.bool_)
        for words in self._words:
            found |= (words[z & np.uint64(len(words) - 1)] & m) == m
        new = ~found
        if new.any():
            self._insert(z[new], m[new])
        hits: list[bool] = found.tolist()
        return hits

    def test_and_add_one(self, key: Any) -> bool:
        """:meth:`test_and_add` of one key, in Python integers (numpy's cost
        a call is more than a single key's work)."""
        z = _mix_one(hash(key))
        m = _mask_one(z)
        if any(int(w[z & (len(w) - 1)]) & m == m for w in self._words):
            return True
        if self._added >= self._capacity:
            self._grow(2 * self._capacity)
        words = self._words[-1]
        i = z & (len(words) - 1)
        words[i] = int(words[i]) | m
        self._added += 1
        return False
