"""Tests of ``eddyflow.keygroups``: the stable ``key -> hash -> key group ->
subtask`` mapping (DESIGN.md §4).

The hash must be the same in every process whatever ``PYTHONHASHSEED`` is,
keys that are equal as dict keys must share a key group, the subtask ranges
must partition the key groups exactly, the groups must be evenly used, and
key types without a stable hash must be refused. End to end, a keyed job
must route each key to exactly one subtask, the same one in every process.

Subprocesses run this very file through ``runpy`` (``__name__`` is not
``"__main__"`` then, and no test runs), so that they use the same keys and the
same job as the test process.
"""

from __future__ import annotations

import enum
import itertools
import json
import os
import runpy
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eddyflow as ef
from eddyflow.keygroups import (
    UnsupportedKeyError,
    bulk_key_groups,
    check_key,
    key_group_for,
    key_group_range,
    key_groups_of,
    stable_hash,
    subtask_for_key_group,
)

MAX_PARALLELISM = 128
PARALLELISMS = (1, 2, 3, 7, 128)

KEYS: list[Any] = [
    "",
    "a",
    "b",
    "hello world",
    "wörd",
    "日本語のキー",
    "emoji \U0001f600",
    "\ud800 lone surrogate",
    "a" * 1000,
    0,
    1,
    -1,
    42,
    -(2**31),
    2**31,
    2**63 - 1,
    -(2**63),
    2**63,
    -(2**63) - 1,
    2**64,
    10**30,
    -(10**30),
    2**200 + 12345,
    b"",
    b"bytes",
    b"\x00\xff\x80",
    0.5,
    -2.25,
    3.141592653589793,
    1e300,
    1e-300,
    float("inf"),
    float("-inf"),
    (),
    ("a", 1),
    (1, ("nested", b"x", None), 2.5),
    (None,),
    None,
    True,
    False,
]


def key_table(keys: list[Any]) -> list[list[int]]:
    """Per key: [stable_hash, key group, subtask at each parallelism]."""
    rows = []
    for k in keys:
        kg = key_group_for(k, MAX_PARALLELISM)
        rows.append(
            [stable_hash(k), kg]
            + [subtask_for_key_group(kg, MAX_PARALLELISM, p) for p in PARALLELISMS]
        )
    return rows


class Tagger(ef.KeyedProcessFunction):
    """Counts records per key; emits ``(key, subtask index)`` per record."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.count = ctx.value_state("count", default=0)

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        self.count.value = self.count.value + 1
        yield (ctx.current_key, ctx.subtask_index)


JOB_KEYS = [f"user-{i}" for i in range(150)] + ["ärger", "ключ", "鍵", ""]


def job_records() -> list[str]:
    return [k for i, k in enumerate(JOB_KEYS) for _ in range(1 + i % 4)]


def run_routing_job() -> dict[str, Any]:
    """Runs a parallelism-3 keyed job; returns what it saw, JSON-friendly."""
    env = ef.StreamEnvironment(parallelism=3, max_parallelism=MAX_PARALLELISM)
    out = ef.ListSink()
    src = env.from_collection(job_records()).name("src")
    src.key_by(lambda r: r).process(Tagger()).name("tag").sink_to(out)
    result = env.execute("routing")
    return {
        "pairs": sorted([k, s] for k, s in out.results),
        "counts": result.state("tag", "count"),
    }


def run_python(code: str, hash_seed: str) -> str:
    src_dir = str(Path(ef.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src_dir, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


THIS_FILE = str(Path(__file__).resolve())


# -- stable across processes ------------------------------------------------------


@pytest.mark.parametrize("seed", ["0", "12345", "random"])
def test_stable_hash_identical_across_processes(seed: str) -> None:
    code = (
        "import json, runpy\n"
        f"ns = runpy.run_path({THIS_FILE!r})\n"
        "print(json.dumps(ns['key_table'](ns['KEYS'])))\n"
    )
    other = json.loads(run_python(code, seed))
    assert other == key_table(KEYS)


def test_subprocess_really_has_another_hash_seed() -> None:
    # Guards the test above: str hash() does differ between these processes.
    code = "print(hash('eddyflow'))"
    assert run_python(code, "0") != run_python(code, "12345")


def test_golden_values() -> None:
    # Key groups are written into checkpoints: a change of the hash would
    # silently misplace restored state. Pin a few values.
    assert [stable_hash(k) for k in ("a", 1, b"a", None, ("a", 1), 0.5)] == GOLDEN
    assert [key_group_for(k, 128) for k in ("a", 1, b"a", None, ("a", 1), 0.5)] == [
        g % 128 for g in GOLDEN
    ]


GOLDEN = [3320656311, 3338211737, 2283663378, 2654435769, 654105059, 1870105627]


def test_hash_is_32_bit_unsigned() -> None:
    for k in KEYS:
        h = stable_hash(k)
        assert isinstance(h, int)
        assert 0 <= h < 2**32


def test_distinct_keys_mostly_get_distinct_hashes() -> None:
    hashes = [stable_hash(k) for k in KEYS if k is not True and k is not False]
    # True/False collide with 1/0 on purpose; everything else should not.
    assert len(set(hashes)) == len(hashes)


# -- equal keys share a key group --------------------------------------------------


@pytest.mark.parametrize(
    "equal",
    [
        (1, 1.0, True),
        (0, 0.0, -0.0, False),
        (-7, -7.0),
        (2**70, float(2**70)),
        (10**20, 1e20) if 10**20 == 1e20 else (2**66, 2.0**66),
        ((1, "a"), (1.0, "a"), (True, "a")),
        ((0, (1,)), (False, (1.0,))),
    ],
)
def test_keys_equal_as_dict_keys_share_a_key_group(equal: tuple[Any, ...]) -> None:
    assert len({*equal}) == 1  # they really are one dict key
    assert len({stable_hash(k) for k in equal}) == 1
    for mp in (1, 7, 128, 32768):
        assert len({key_group_for(k, mp) for k in equal}) == 1


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-(2**53), max_value=2**53) | st.integers().map(lambda i: i << 80))
def test_integral_floats_hash_like_ints(i: int) -> None:
    f = float(i)
    if f == i:
        assert stable_hash(f) == stable_hash(i)


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False))
def test_float_hash_consistent_with_equality(f: float) -> None:
    if f.is_integer():
        assert stable_hash(f) == stable_hash(int(f))
    assert stable_hash(f) == stable_hash(float(repr(f)))


# -- key group ranges ---------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=4096).flatmap(
    lambda mp: st.tuples(st.just(mp), st.integers(min_value=1, max_value=mp))
))
def test_key_group_ranges_partition_and_invert(mp_p: tuple[int, int]) -> None:
    mp, p = mp_p
    ranges = [key_group_range(s, mp, p) for s in range(p)]
    # Contiguous, in order, covering range(mp) exactly once.
    assert ranges[0].start == 0
    assert ranges[-1].stop == mp
    for a, b in itertools.pairwise(ranges):
        assert a.stop == b.start
    assert [g for r in ranges for g in r] == list(range(mp))
    # Balanced: sizes differ by at most one; none empty when p <= mp.
    sizes = {len(r) for r in ranges}
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= 1
    # Exact inverse of subtask_for_key_group.
    for s, r in enumerate(ranges):
        for g in r:
            assert subtask_for_key_group(g, mp, p) == s


@pytest.mark.parametrize("mp,p", [(1, 1), (128, 1), (128, 3), (128, 128), (7, 5), (32768, 10)])
def test_key_group_range_examples(mp: int, p: int) -> None:
    owner = [subtask_for_key_group(g, mp, p) for g in range(mp)]
    for s in range(p):
        assert list(key_group_range(s, mp, p)) == [g for g in range(mp) if owner[g] == s]


def test_key_group_range_small_example() -> None:
    assert [key_group_range(s, 10, 3) for s in range(3)] == [range(0, 4), range(4, 7),
                                                            range(7, 10)]
    assert [subtask_for_key_group(g, 10, 3) for g in range(10)] == [0] * 4 + [1] * 3 + [2] * 3


# -- distribution ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make_key",
    [
        lambda i: f"key-{i}",
        lambda i: f"{i}",
        lambda i: i,
        lambda i: (i, "x"),
        lambda i: f"user{i}@example.com".encode(),
    ],
    ids=["prefixed-str", "digit-str", "int", "tuple", "bytes"],
)
def test_distribution_over_128_groups_is_uniform(make_key: Any) -> None:
    n = 100_000
    counts = Counter(key_group_for(make_key(i), 128) for i in range(n))
    mean = n / 128
    assert len(counts) == 128
    assert min(counts.values()) >= 0.75 * mean, min(counts.values())
    assert max(counts.values()) <= 1.25 * mean, max(counts.values())


def test_distribution_over_subtasks_is_even() -> None:
    n = 30_000
    for p in (2, 3, 5):
        counts = Counter(
            subtask_for_key_group(key_group_for(f"k{i}", 128), 128, p) for i in range(n)
        )
        for s in range(p):
            share = len(key_group_range(s, 128, p)) / 128
            assert abs(counts[s] - share * n) <= 0.1 * share * n


# -- unsupported keys ------------------------------------------------------------------


class Custom:
    def __hash__(self) -> int:
        return 1


@pytest.mark.parametrize(
    "key,type_name",
    [
        ([1, 2], "list"),
        ({"a": 1}, "dict"),
        (object(), "object"),
        ({1, 2}, "set"),
        (frozenset({1}), "frozenset"),
        (Custom(), "Custom"),
        (bytearray(b"x"), "bytearray"),
        (("ok", [1]), "list"),  # inside a tuple
        (1 + 2j, "complex"),
    ],
)
def test_unsupported_key_types_raise_naming_the_type(key: Any, type_name: str) -> None:
    with pytest.raises(UnsupportedKeyError, match=rf"of type {type_name} has no stable hash"):
        stable_hash(key)
    with pytest.raises(UnsupportedKeyError, match=rf"type {type_name}\b"):
        key_group_for(key, 128)
    with pytest.raises(UnsupportedKeyError, match=rf"type {type_name}\b"):
        check_key(key)


def test_unsupported_key_error_is_a_type_error_and_exported() -> None:
    assert issubclass(UnsupportedKeyError, TypeError)
    assert ef.UnsupportedKeyError is UnsupportedKeyError


@pytest.mark.parametrize("key", KEYS)
def test_check_key_accepts_supported_keys(key: Any) -> None:
    check_key(key)


def _unsupported_key_job() -> ef.StreamEnvironment:
    env = ef.StreamEnvironment(parallelism=1)
    src = env.from_collection([{"a": 1}])
    src.key_by(lambda r: Custom()).count().name("cnt").sink_to(ef.ListSink())
    return env


def test_keyed_job_with_unsupported_key_fails_naming_the_type() -> None:
    with pytest.raises(ef.JobFailed, match=r"'cnt'.*UnsupportedKeyError.*type Custom") as info:
        _unsupported_key_job().execute()
    assert info.value.operator == "cnt"


def test_keyed_job_failure_carries_the_unsupported_key_error_as_cause() -> None:
    # API.md: "A job that ... raises ef.JobFailed carrying the root cause";
    # errors.JobFailed: "``__cause__`` is the root cause".
    with pytest.raises(ef.JobFailed) as info:
        _unsupported_key_job().execute()
    assert isinstance(info.value.__cause__, UnsupportedKeyError), info.value.__cause__
    assert "Custom" in str(info.value.__cause__)


# -- end to end: routing -----------------------------------------------------------------


def test_keyed_job_routes_each_key_to_exactly_one_subtask() -> None:
    seen = run_routing_job()
    by_key: dict[str, set[int]] = {}
    for k, s in seen["pairs"]:
        by_key.setdefault(k, set()).add(s)
    assert set(by_key) == set(JOB_KEYS)
    for k, subtasks in by_key.items():
        expected = subtask_for_key_group(key_group_for(k, MAX_PARALLELISM), MAX_PARALLELISM, 3)
        assert subtasks == {expected}, k
    # All three subtasks get work, and every record was seen once.
    assert {s for subtasks in by_key.values() for s in subtasks} == {0, 1, 2}
    assert len(seen["pairs"]) == len(job_records())
    assert seen["counts"] == Counter(job_records())


def test_keyed_job_routing_is_identical_in_another_process() -> None:
    here = run_routing_job()
    code = (
        "import json, runpy\n"
        f"ns = runpy.run_path({THIS_FILE!r})\n"
        "print(json.dumps(ns['run_routing_job']()))\n"
    )
    there = json.loads(run_python(code, "98765"))
    assert there["pairs"] == [list(p) for p in here["pairs"]]
    assert there["counts"] == here["counts"]


def test_runpy_entry_does_not_collide_with_module_import() -> None:
    # Sanity check of the helper the subprocess tests rely on.
    ns = runpy.run_path(THIS_FILE)
    assert ns["key_table"](["a"]) == key_table(["a"])


@given(st.lists(st.one_of(st.text(), st.integers(), st.tuples(st.text(), st.integers()),
                          st.none(), st.floats(allow_nan=False))),
       st.integers(1, 4096))
def test_key_groups_of_equals_key_group_for_each_key(keys: list[Any], mp: int) -> None:
    assert key_groups_of(keys, mp) == [key_group_for(k, mp) for k in keys]


@given(st.lists(st.text(), min_size=1), st.integers(1, 4096))
def test_key_groups_of_string_keys_takes_the_fast_path_exactly(keys: list[str], mp: int) -> None:
    keys.append("\udcff lone surrogate")
    assert key_groups_of(keys, mp) == [key_group_for(k, mp) for k in keys]


@given(st.one_of(st.lists(st.text()), st.lists(st.integers(-(2**63), 2**63 - 1)),
                 st.lists(st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1)))),
       st.integers(1, 4096))
def test_bulk_key_groups_equal_key_group_for_each_key(keys: list[Any], mp: int) -> None:
    groups = bulk_key_groups(keys, mp)
    if not keys:
        assert groups is None  # nothing to go fast on
    else:
        assert groups is not None
        assert groups.tolist() == [key_group_for(k, mp) for k in keys]


def test_bulk_key_groups_leave_other_keys_to_the_caller() -> None:
    # Ints beyond 64 bits hash their own bytes; mixes, floats and tuples
    # have rules of their own (1.0 hashes as 1): all are hashed a key at a time.
    for keys in ([1, 2**64], [-(2**63) - 1], ["a", 1], [1.0, 2.0], [("a", 1)], [None],
                 ["\ud800", 1], [b"a", "a"], []):
        assert bulk_key_groups(keys, 128) is None
    assert bulk_key_groups(KEYS[:9], 128).tolist() == [key_group_for(k, 128) for k in KEYS[:9]]


def test_bulk_key_groups_hash_a_subclass_of_str_as_its_value() -> None:
    class Color(enum.StrEnum):
        RED = "red"
        BLUE = "bl\udcffue"

    keys = [Color.RED, "red", Color.BLUE, "x"]
    groups = bulk_key_groups(keys, 4096)
    assert groups is not None
    assert groups.tolist() == [key_group_for(k, 4096) for k in keys]
    assert groups[0] == groups[1]


def test_max_parallelism_is_capped_with_a_clear_error() -> None:
    import eddyflow as ef

    ef.StreamEnvironment(max_parallelism=32768)
    with pytest.raises(ValueError, match="max_parallelism 1000000000 exceeds the limit of 32768"):
        ef.StreamEnvironment(max_parallelism=10**9)
