"""Typed DataFrame columns for the Python objects a checkpoint holds (keys,
values, records): one Spark type per column, inferred from every object of
the column, or text when there is none.

A column's type is the *join* of its objects' types in a small lattice,
computed by one aggregate over the RDD (a join per partition on the
executors, then a join of those on the driver): the join is commutative and
associative, so the result does not depend on the partitioning or on the
order rows arrive in, and every object is looked at (no sampling: one
float among a million ints must make the column a double, not fail the
conversion). The types:

* ``None``: no type of its own (null in any column); a column of nulls
  only is a string column.
* ``bool`` -> boolean, ``int`` -> long (64-bit; a larger int makes the
  column text), ``float`` -> double, ``str`` -> string, ``bytes`` -> binary.
  ``True`` is an ``int`` in Python, but a column mixing booleans and numbers
  is text; ints and floats mixed are a double column (as Spark's own JSON
  inference: an int beyond 2**53 loses precision there).
* a tuple -> a struct with fields ``_1``, ``_2``, … (a named tuple: its field
  names); tuples of different lengths or names make the column text.
* a list -> an array of its elements' joined type.
* a dict -> a map from its keys' type (boolean, long, double, string or
  binary; not null) to its values' joined type.
* anything else (sets, dataclasses, user classes, …) -> text, and so does
  a column where any object's type does not join with the others' (a
  struct holding a text field is text as a whole: a column is either typed
  all through or text).

Text is what the readers have always shown: a ``str`` as itself, anything
else as its ``repr`` (:func:`text_of`); ``as_text=True`` on a reader gives
it for every object column without looking at the objects.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TEXT", "Column", "converter", "frame", "join", "spark_type", "text_of",
           "type_of"]

# A type is a hashable tuple: ("null",), ("text",), a scalar ("long",) ...,
# ("struct", names, fields), ("array", element), ("map", key, value).
Type = tuple[Any, ...]
NULL: Type = ("null",)
TEXT: Type = ("text",)
BOOLEAN: Type = ("boolean",)
LONG: Type = ("long",)
DOUBLE: Type = ("double",)
STRING: Type = ("string",)
BINARY: Type = ("binary",)
_MAP_KEYS = frozenset({BOOLEAN, LONG, DOUBLE, STRING, BINARY})
_MIN_LONG, _MAX_LONG = -(1 << 63), (1 << 63) - 1
#: Deeper nesting than this is text (and a bound on the recursion).
_MAX_DEPTH = 16


def text_of(x: Any) -> str | None:
    """How an object shows as text: a ``str`` as itself, anything else as
    its ``repr`` (``None`` stays null)."""
    if x is None:
        return None
    return x if isinstance(x, str) else repr(x)


def _struct(names: tuple[str, ...], fields: tuple[Type, ...]) -> Type:
    return TEXT if TEXT in fields else ("struct", names, fields)


def _array(element: Type) -> Type:
    return TEXT if element == TEXT else ("array", element)


def _map(key: Type, value: Type) -> Type:
    if value == TEXT or (key != NULL and key not in _MAP_KEYS):
        return TEXT
    return ("map", key, value)


def join(a: Type, b: Type) -> Type:
    """The least type both ``a`` and ``b`` convert to (text if none)."""
    if a == b:
        return a
    if a == NULL:
        return b
    if b == NULL:
        return a
    if a == TEXT or b == TEXT:
        return TEXT
    if {a, b} == {LONG, DOUBLE}:
        return DOUBLE
    if a[0] != b[0]:
        return TEXT
    if a[0] == "struct":
        if a[1] != b[1]:
            return TEXT
        return _struct(a[1], tuple(map(join, a[2], b[2])))
    if a[0] == "array":
        return _array(join(a[1], b[1]))
    if a[0] == "map":
        return _map(join(a[1], b[1]), join(a[2], b[2]))
    return TEXT  # two different scalars


def _join_all(types: Iterable[Type]) -> Type:
    out = NULL
    for t in types:
        out = join(out, t)
        if out == TEXT:
            break
    return out


def type_of(x: Any, depth: int = 0) -> Type:
    """The type of one object (see the module docstring)."""
    if x is None:
        return NULL
    if isinstance(x, bool):  # before int: True is an int
        return BOOLEAN
    if isinstance(x, int):
        return LONG if _MIN_LONG <= x <= _MAX_LONG else TEXT
    if isinstance(x, float):
        return DOUBLE
    if isinstance(x, str):
        return STRING
    if isinstance(x, bytes):
        return BINARY
    if depth >= _MAX_DEPTH:
        return TEXT
    if isinstance(x, tuple):
        fields = getattr(type(x), "_fields", None)
        if fields is not None and len(fields) == len(x):
            names = tuple(map(str, fields))
        else:
            names = tuple(f"_{i + 1}" for i in range(len(x)))
        if not names:
            return TEXT  # an empty struct is no column type
        return _struct(names, tuple(type_of(item, depth + 1) for item in x))
    if isinstance(x, list):
        return _array(_join_all(type_of(e, depth + 1) for e in x))
    if isinstance(x, dict):
        if None in x:
            return TEXT  # a map key is never null in Spark
        return _map(_join_all(type_of(k, depth + 1) for k in x),
                    _join_all(type_of(v, depth + 1) for v in x.values()))
    return TEXT


def _final(t: Type) -> Type:
    """``t`` with the parts no object gave a type to (nulls only, empty
    lists and dicts) made strings."""
    if t == NULL:
        return STRING
    if t[0] == "struct":
        return ("struct", t[1], tuple(map(_final, t[2])))
    if t[0] == "array":
        return ("array", _final(t[1]))
    if t[0] == "map":
        return ("map", _final(t[1]), _final(t[2]))
    return t


def spark_type(t: Type) -> Any:
    """The Spark SQL type of a (final) type; text is a string column."""
    from pyspark.sql import types as T

    kind = t[0]
    scalars = {"text": T.StringType, "string": T.StringType, "long": T.LongType,
               "double": T.DoubleType, "boolean": T.BooleanType, "binary": T.BinaryType}
    if kind in scalars:
        return scalars[kind]()
    if kind == "struct":
        return T.StructType([T.StructField(name, spark_type(f), True)
                             for name, f in zip(t[1], t[2], strict=True)])
    if kind == "array":
        return T.ArrayType(spark_type(t[1]), True)
    if kind == "map":
        return T.MapType(spark_type(t[1]), spark_type(t[2]), True)
    raise ValueError(f"not a column type: {t!r}")


def _convert(t: Type, x: Any) -> Any:
    """``x`` as a value of a column of (final) type ``t``."""
    if x is None:
        return None
    kind = t[0]
    if kind == "text":
        return x if isinstance(x, str) else repr(x)
    if kind == "string":
        return str.__str__(x)  # a str subclass (StrEnum) as the plain string
    if kind == "long":
        return int(x)
    if kind == "double":
        return float(x)
    if kind == "boolean":
        return bool(x)
    if kind == "binary":
        return bytes(x)
    if kind == "struct":
        return tuple(_convert(f, item) for f, item in zip(t[2], x, strict=True))
    if kind == "array":
        return [_convert(t[1], e) for e in x]
    return {_convert(t[1], k): _convert(t[2], v) for k, v in x.items()}


def converter(t: Type) -> Callable[[Any], Any]:
    """A function converting objects of a column of type ``t`` (final)."""
    if t == TEXT:
        return text_of
    return functools.partial(_convert, t)


@dataclass(frozen=True)
class Column:
    """A column of a reader's DataFrame: ``spark`` its Spark type, or
    ``None`` for a column of Python objects, typed by inference."""

    name: str
    spark: Any = None
    nullable: bool = True


def _partition_types(positions: Sequence[int], rows: Iterable[tuple[Any, ...]]
                     ) -> Iterator[list[Type]]:
    """The joined types of one partition's objects at ``positions``."""
    types = [NULL] * len(positions)
    for row in rows:
        for i, p in enumerate(positions):
            t = types[i]
            if t != TEXT:
                types[i] = join(t, type_of(row[p]))
    yield types


def infer(rows: Any, positions: Sequence[int]) -> list[Type]:
    """The (final) types of the objects at ``positions`` of an RDD's rows:
    one job, a join per partition, then on the driver."""
    types = [NULL] * len(positions)
    for part in rows.mapPartitions(functools.partial(_partition_types, tuple(positions))
                                   ).collect():
        types = [join(a, b) for a, b in zip(types, part, strict=True)]
    return [_final(t) for t in types]


def _convert_row(positions: tuple[int, ...], convert: tuple[Callable[[Any], Any], ...],
                 row: tuple[Any, ...]) -> tuple[Any, ...]:
    out = list(row)
    for p, f in zip(positions, convert, strict=True):
        out[p] = f(out[p])
    return tuple(out)


def frame(spark: Any, rows: Any, columns: Sequence[Column], *, as_text: bool = False) -> Any:
    """A DataFrame of an RDD of row tuples: the object columns typed by
    inference (or text, ``as_text``)."""
    from pyspark import StorageLevel
    from pyspark.sql import types as T

    positions = tuple(i for i, c in enumerate(columns) if c.spark is None)
    if as_text or not positions:
        types = [TEXT] * len(positions)
    else:
        # The rows are read twice (once for their types, once for the
        # DataFrame): kept, so that the files are read and verified once.
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        types = infer(rows, positions)
    typed = dict(zip(positions, types, strict=True))
    schema = T.StructType([
        T.StructField(c.name, spark_type(typed[i]) if i in typed else c.spark, c.nullable)
        for i, c in enumerate(columns)])
    convert = tuple(converter(t) for t in types)
    return spark.createDataFrame(
        rows.map(functools.partial(_convert_row, positions, convert)), schema,
        # The conversion gives each column its type: no need to check every row.
        verifySchema=False)
