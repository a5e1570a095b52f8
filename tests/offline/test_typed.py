"""Typed columns (``offline/typed.py``): the type of a column is the join of
its objects' types, the same whatever the order or partitioning, every
object converts to it, and what does not type is text; the readers give
typed key and value columns, and ``as_text=True`` today's text."""

from __future__ import annotations

import functools
import math
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eddyflow as ef
from eddyflow.offline.typed import (
    BOOLEAN,
    DOUBLE,
    LONG,
    NULL,
    STRING,
    TEXT,
    _convert,
    _final,
    join,
    text_of,
    type_of,
)

Point = namedtuple("Point", ["x", "y"])


def column_type(objects: list[Any]) -> Any:
    return _final(functools.reduce(join, map(type_of, objects), NULL))


def test_scalars_and_their_mixes() -> None:
    assert column_type([1, 2, None]) == LONG
    assert column_type([1, 2.5]) == DOUBLE
    assert column_type([True, False]) == BOOLEAN
    assert column_type([True, 1]) == TEXT  # a bool is an int in Python, not here
    assert column_type(["a", None]) == STRING
    assert column_type([None, None]) == STRING
    assert column_type([1, 1 << 63]) == TEXT  # beyond 64 bits
    assert column_type([-(1 << 63)]) == LONG
    assert column_type([1, "a"]) == TEXT
    assert column_type([{1, 2}]) == TEXT  # a set is not a simple value


def test_tuples_lists_and_dicts() -> None:
    assert column_type([("a", 1), ("b", 2.0)]) == (
        "struct", ("_1", "_2"), (STRING, DOUBLE))
    assert column_type([("a", 1), ("b", 1, 2)]) == TEXT
    assert column_type([Point(1, 2)]) == ("struct", ("x", "y"), (LONG, LONG))
    assert column_type([Point(1, 2), (1, 2)]) == TEXT  # other field names
    assert column_type([[1, 2], [], [3.5]]) == ("array", DOUBLE)
    assert column_type([[]]) == ("array", STRING)
    assert column_type([{"t": 1.0}, {"u": 2}]) == ("map", STRING, DOUBLE)
    assert column_type([{"at": [1.0]}, {}]) == ("map", STRING, ("array", DOUBLE))
    assert column_type([{(1, 2): 3}]) == TEXT  # a struct is no map key here
    assert column_type([{None: 3}]) == TEXT
    assert column_type([("a", {1, 2})]) == TEXT  # text anywhere: text all through
    assert column_type([()]) == TEXT


simple = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=True) | st.text(max_size=4) | st.binary(max_size=4)
    | st.frozensets(st.integers(), max_size=2),
    lambda inner: st.tuples(inner, inner) | st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.lists(simple, max_size=8), st.randoms())
def test_the_join_is_order_free_and_every_object_converts(objects: list[Any],
                                                          rnd: Any) -> None:
    t = column_type(objects)
    shuffled = list(objects)
    rnd.shuffle(shuffled)
    assert column_type(shuffled) == t
    # Any split into partitions joins to the same type.
    cut = len(objects) // 2
    left = functools.reduce(join, map(type_of, objects[:cut]), NULL)
    right = functools.reduce(join, map(type_of, objects[cut:]), NULL)
    assert _final(join(right, left)) == t
    for x in objects:
        converted = _convert(t, x)
        if t == TEXT:
            assert converted == text_of(x)
        elif t == DOUBLE and x is not None:
            assert converted == float(x) or (math.isnan(converted) and math.isnan(x))


def test_converted_values_are_the_objects() -> None:
    t = column_type([("a", 1), ("b", 2.5)])
    assert _convert(t, ("a", 1)) == ("a", 1.0)
    assert isinstance(_convert(t, ("a", 1))[1], float)
    assert _convert(column_type([{"k": [1, 2]}]), {"k": [1, 2]}) == {"k": [1, 2]}


def test_read_state_types_keys_and_values(spark: Any, tmp_path: Path) -> None:
    """Tuple keys are structs, dict values maps, counts longs; ``as_text``
    gives the text columns, str as itself and the rest as repr."""
    from pyspark.sql import types as T

    from eddyflow.offline import read_state

    env = ef.StreamEnvironment(parallelism=2)
    env.enable_checkpointing(10.0, tmp_path / "chk")
    records = [(("u", i % 7), {"n": float(i)}) for i in range(200)]
    keyed = env.from_collection(records).name("records").key_by(lambda r: r[0])
    keyed.count().name("count").sink_to(ef.ListSink())
    keyed.reduce(lambda a, b: (a[0], {"n": a[1]["n"] + b[1]["n"]})).name("last").sink_to(
        ef.ListSink())
    result = env.execute("typed")
    final = ef.list_checkpoints(tmp_path / "chk")[-1]

    counts = read_state(spark, final.path, operator="count")
    assert counts.schema["key"].dataType == T.StructType([
        T.StructField("_1", T.StringType()), T.StructField("_2", T.LongType())])
    assert counts.schema["value"].dataType == T.LongType()
    got = {tuple(r["key"]): r["value"] for r in counts.collect()}
    assert got == dict(result.state("count"))

    last = read_state(spark, final.path, operator="last")
    assert last.schema["value"].dataType == T.StructType([
        T.StructField("_1", T.StructType([T.StructField("_1", T.StringType()),
                                          T.StructField("_2", T.LongType())])),
        T.StructField("_2", T.MapType(T.StringType(), T.DoubleType()))])
    want = dict(result.state("last"))
    assert {tuple(r["key"]): (tuple(r["value"][0]), r["value"][1])
            for r in last.collect()} == want

    text = read_state(spark, final.path, operator="count", as_text=True)
    assert [f.dataType for f in text.schema.fields] == [
        T.StringType(), T.IntegerType(), T.IntegerType(), T.StringType(), T.StringType(),
        T.StringType()]
    assert {r["key"]: r["value"] for r in text.collect()} == {
        repr(k): repr(v) for k, v in result.state("count").items()}

    # Both operators together: the values do not join (long, struct): text.
    both = read_state(spark, final.path)
    assert both.schema["value"].dataType == T.StringType()
    assert both.schema["key"].dataType == counts.schema["key"].dataType


@pytest.mark.parametrize("values", [[1, True], [1, 1 << 64]])
def test_columns_that_do_not_type_are_text(spark: Any, values: list[Any]) -> None:
    from pyspark.sql import types as T

    from eddyflow.offline.typed import Column, frame

    rows = spark.sparkContext.parallelize([(i, v) for i, v in enumerate(values)], 2)
    df = frame(spark, rows, [Column("i", T.LongType(), False), Column("v")])
    assert df.schema["v"].dataType == T.StringType()
    assert sorted(r["v"] for r in df.collect()) == sorted(map(repr, values))
