"""How keyed state is laid out in RocksDB: row keys as bytes.

A row key is ``<key group: 2 bytes big-endian><state name length: 1
byte><state name><key>``, and for map and list state one more component (the
map key, or an 8-byte sequence number). The key group comes first so that one
key group is one contiguous range of the database: a restore at another
parallelism copies exactly the ranges a subtask now owns, without decoding a
row. Two bytes cap ``max_parallelism`` at :data:`MAX_PARALLELISM` (as Flink
caps it at 32768).

The key encoding is *canonical*: keys equal as Python dict keys (``1``,
``1.0``, ``True``; a ``StrEnum`` and its string) encode to the same bytes, as
they are one entry in the memory backend; and *self-delimiting* (a length
before every variable part), so no key's encoding is a prefix of another's
and a key can be followed by a map key. The supported types are those with a
stable hash (:mod:`eddyflow.keygroups`): ``None``, ``bool``, ``int``,
``float``, ``str``, ``bytes`` and tuples of them.
"""

from __future__ import annotations

import math
import operator
import struct
import zlib
from collections.abc import Sequence
from typing import Any

from eddyflow.keygroups import (
    MAX_PARALLELISM,
    UnsupportedKeyError,
    crc_key_groups,
    key_group_for,
    key_groups_of,
)

__all__ = [
    "MAX_PARALLELISM",
    "StatePrefix",
    "decode_key",
    "encode_key",
    "key_group_bounds",
    "key_group_of_row",
    "key_group_prefix",
    "sort_order",
    "str_key_groups",
]


_NONE, _INT, _BIGINT, _FLOAT, _STR, _BYTES, _TUPLE = range(7)
_Q = struct.Struct(">q")
_D = struct.Struct(">d")
_KG = struct.Struct(">H")


def _length(n: int) -> bytes:
    return bytes((n,)) if n < 0xFF else b"\xff" + n.to_bytes(4, "big")


def encode_key(key: Any) -> bytes:
    """The canonical, self-delimiting encoding of ``key``."""
    t = type(key)
    if t is str:
        b: bytes = key.encode("utf-8", "surrogatepass")
        return b"\x04" + _length(len(b)) + b
    if t is int or t is bool:
        k = int(key)
        if -(1 << 63) <= k < (1 << 63):
            return b"\x01" + _Q.pack(k)
        raw = k.to_bytes((k.bit_length() + 8) // 8, "big", signed=True)
        return b"\x02" + _length(len(raw)) + raw
    if t is float:
        if math.isfinite(key) and key.is_integer():
            return encode_key(int(key))  # 1.0 == 1: one key
        return b"\x03" + _D.pack(key)
    if t is bytes:
        raw_key: bytes = key
        return b"\x05" + _length(len(raw_key)) + raw_key
    if t is tuple:
        return b"\x06" + _length(len(key)) + b"".join(map(encode_key, key))
    if key is None:
        return b"\x00"
    # Subclasses equal their base value as dict keys (see keygroups.stable_hash).
    bases: tuple[Any, ...] = (bool, int, str, bytes, float, tuple)
    for base in bases:
        if isinstance(key, base):
            return encode_key(str.__str__(key) if base is str else base(key))
    raise UnsupportedKeyError(
        f"key {key!r} of type {t.__name__} cannot be stored in RocksDB; key_by must return "
        "str, bytes, int, float, bool, None or a tuple of these"
    )


def _read_length(b: bytes, i: int) -> tuple[int, int]:
    n = b[i]
    if n < 0xFF:
        return n, i + 1
    return int.from_bytes(b[i + 1:i + 5], "big"), i + 5


def decode_key(b: bytes, i: int = 0) -> tuple[Any, int]:
    """The key encoded at ``b[i:]`` and the offset just after it."""
    tag = b[i]
    i += 1
    if tag == _STR:
        n, i = _read_length(b, i)
        return b[i:i + n].decode("utf-8", "surrogatepass"), i + n
    if tag == _INT:
        return _Q.unpack_from(b, i)[0], i + 8
    if tag == _NONE:
        return None, i
    if tag == _FLOAT:
        return _D.unpack_from(b, i)[0], i + 8
    if tag == _BYTES:
        n, i = _read_length(b, i)
        return bytes(b[i:i + n]), i + n
    if tag == _BIGINT:
        n, i = _read_length(b, i)
        return int.from_bytes(b[i:i + n], "big", signed=True), i + n
    if tag == _TUPLE:
        n, i = _read_length(b, i)
        items = []
        for _ in range(n):
            item, i = decode_key(b, i)
            items.append(item)
        return tuple(items), i
    raise ValueError(f"not an eddyflow key encoding: tag {tag} at offset {i - 1}")


_UTF8 = operator.methodcaller("encode", "utf-8", "surrogatepass")
#: The encoding header of a string of n < 255 bytes.
_STR_HEADERS = [b"\x04" + bytes((n,)) for n in range(0xFF)]


def _str_header(utf8: bytes) -> bytes:
    n = len(utf8)
    return _STR_HEADERS[n] if n < 0xFF else b"\x04\xff" + n.to_bytes(4, "big")


def key_group_prefix(key_group: int) -> bytes:
    """The first bytes of every row of ``key_group``."""
    return _KG.pack(key_group)


def key_group_bounds(key_groups: range | None) -> tuple[bytes, bytes]:
    """``[lower, upper)`` of the rows of ``key_groups`` (every row: ``None``).
    A key group is below ``MAX_PARALLELISM``, so its two bytes never reach
    ``0xffff``: one byte past the last is above every row."""
    if key_groups is None:
        return b"", b"\xff"
    return _KG.pack(key_groups.start), _KG.pack(key_groups.stop)


def key_group_of_row(row: bytes) -> int:
    return int(_KG.unpack_from(row)[0])


def str_key_groups(utf8: Sequence[bytes], max_parallelism: int) -> list[int]:
    """The key group of each string key, given its UTF-8 encoding:
    ``stable_hash(s) % max_parallelism`` (``fmix32(crc32(utf8))``), the
    finaliser run on all of them at once by numpy rather than a Python call
    a key (profiled: the per-key finaliser was a third of building a
    checkpoint's row keys, 0.25 of 0.8 s for 1M keys)."""
    groups: list[int] = _str_key_groups(utf8, max_parallelism).tolist()
    return groups


def _str_key_groups(utf8: Sequence[bytes], max_parallelism: int) -> Any:
    """:func:`str_key_groups` as a numpy array."""
    return crc_key_groups(map(zlib.crc32, utf8), len(utf8), max_parallelism)


def sort_order(rows: list[bytes]) -> list[int]:
    """The indices of ``rows`` in ascending byte order (``rows`` distinct and
    self-delimiting, as row keys are). numpy sorts them as fixed-width byte
    strings, NUL-padded: since no row is a prefix of another, two rows
    differ before the shorter one ends, so the padding never decides and
    the order is ``sorted``'s (measured: 0.34 s against 0.53 s for
    ``sorted(range(n), key=rows.__getitem__)`` over 1M rows, and 1.2 s for
    sorting ``(row, value)`` tuples). Long rows would make the fixed-width
    copy huge: those are sorted by Python."""
    if not rows:
        return []
    if max(map(len, rows)) > _NUMPY_SORT_WIDTH:
        return sorted(range(len(rows)), key=rows.__getitem__)
    import numpy as np

    order: list[int] = np.argsort(np.array(rows, dtype=np.bytes_)).tolist()
    return order


#: Up to this ``max_parallelism``, string row keys are joined from a table of
#: every (key group, length) pair's first bytes (255 entries a key group).
_PAIRED = 256
#: Rows longer than this are sorted without numpy (see :func:`sort_order`).
_NUMPY_SORT_WIDTH = 256
#: Below this many keys, rows are made a key at a time: numpy's cost a call
#: is more than theirs (a batch's few keys that a filter cannot rule out).
_FEW = 16


class StatePrefix:
    """Row keys of one state: ``prefix(key)`` for one key, ``prefixes(keys)``
    for a batch (key groups hashed at close to C speed for string keys)."""

    __slots__ = ("_by_group", "_by_group_list", "_groups", "max_parallelism", "name", "tag")

    def __init__(self, name: str, max_parallelism: int) -> None:
        raw = name.encode("utf-8")
        if len(raw) > 0xFF:
            raise ValueError(f"state name {name!r} is longer than 255 bytes")
        self.name = name
        self.tag = bytes((len(raw),)) + raw
        self.max_parallelism = max_parallelism
        self._by_group: dict[int, bytes] = {}
        #: The first bytes of the rows of every key group and string length
        #: (see ``_str_prefixes``; built for the first batch).
        self._groups: list[bytes] | None = None
        #: Every key group's prefix, by key group (for a batch, when
        #: ``_groups`` would be too big).
        self._by_group_list: list[bytes] | None = None

    def _group(self, kg: int) -> bytes:
        p = self._by_group.get(kg)
        if p is None:
            p = self._by_group[kg] = _KG.pack(kg) + self.tag
        return p

    def prefix(self, key: Any) -> bytes:
        return self._group(key_group_for(key, self.max_parallelism)) + encode_key(key)

    def prefixes(self, keys: Sequence[Any]) -> list[bytes]:
        if len(keys) < _FEW:
            return list(map(self.prefix, keys))
        try:
            # Strict UTF-8 by the unbound method: half the cost of passing an
            # error handler (measured: 0.07 against 0.14 s for 500k keys),
            # the same bytes for every string but one with a lone surrogate.
            # It refuses anything but a string (a str subclass is encoded as
            # its string, as encode_key does): no pass over the keys' types.
            utf8 = list(map(str.encode, keys))
        except TypeError:
            groups = map(self._group, key_groups_of(keys, self.max_parallelism))
            return [g + e for g, e in zip(groups, map(encode_key, keys), strict=True)]
        except UnicodeEncodeError:
            if not all(isinstance(k, str) for k in keys):
                return list(map(self.prefix, keys))
            utf8 = list(map(_UTF8, keys))
        return self._str_prefixes(utf8)

    def _str_prefixes(self, utf8: list[bytes]) -> list[bytes]:
        """:meth:`prefixes` of string keys (the common case), the same bytes
        at a fifth of the cost: each key encoded once, key groups hashed by
        :func:`str_key_groups`, and the rows joined by ``map`` from tables
        of every key group's prefix and every short length's header, with
        no Python bytecode a key (profiled: 1.8 of 3.8 s of a 464k-key
        flush went to the generic path; then 0.8 s for 1M keys with a Python
        loop, 0.55 s without); ``utf8``: the keys' UTF-8 encodings."""
        import numpy as np

        mp = self.max_parallelism
        lengths = np.fromiter(map(len, utf8), dtype=np.int64, count=len(utf8))
        if mp <= _PAIRED and (not len(utf8) or int(lengths.max()) < 0xFF):
            # One table of every (key group, length) pair's first bytes: one
            # concatenation a key instead of two (0.19 against 0.23 s for
            # 500k keys).
            pairs = self._groups
            if pairs is None:
                pairs = self._groups = [self._group(kg) + head for kg in range(mp)
                                        for head in _STR_HEADERS]
            index = (_str_key_groups(utf8, mp).astype(np.int64) * len(_STR_HEADERS)
                     + lengths).tolist()
            return list(map(bytes.__add__, map(pairs.__getitem__, index), utf8))
        by_group = self._by_group_list
        if by_group is None:
            by_group = self._by_group_list = list(map(self._group, range(mp)))
        groups = map(by_group.__getitem__, str_key_groups(utf8, mp))
        return list(map(bytes.__add__, groups, map(bytes.__add__, map(_str_header, utf8), utf8)))

    def split(self, row: bytes) -> tuple[Any, bytes]:
        """A row of this state: its key and what follows the key."""
        key, end = decode_key(row, 2 + len(self.tag))
        return key, row[end:]


def split_row(row: bytes) -> tuple[int, str, Any, bytes]:
    """``(key group, state name, key, rest)`` of any row."""
    kg = key_group_of_row(row)
    n = row[2]
    name = row[3:3 + n].decode("utf-8")
    key, end = decode_key(row, 3 + n)
    return kg, name, key, row[end:]
