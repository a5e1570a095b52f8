"""Tests of the keyed state handles (``ValueState``, ``ListState``,
``MapState``, ``ReducingState``): first directly on a
``MemoryKeyedStateBackend`` (per-key scoping, defaults, clear, one kind per
name), then end to end through ``keyed.process(...)`` at parallelism 2,
checking both the output and the final state of the job.
"""

from __future__ import annotations

import operator
from collections import Counter, defaultdict
from typing import Any

import pytest

import eddyflow as ef
from eddyflow.state.handles import ListState, MapState, ReducingState, ValueState
from eddyflow.state.memory import MemoryKeyedStateBackend, MemoryStateBackend


@pytest.fixture
def backend() -> MemoryKeyedStateBackend:
    return MemoryKeyedStateBackend("my-op", range(0, 128), 128)


def entries(backend: MemoryKeyedStateBackend, name: str) -> dict[Any, Any]:
    return {k: v for n, _, k, v in backend.entries() if n == name}


# -- ValueState --------------------------------------------------------------------


def test_value_state_default_and_per_key_isolation(backend: MemoryKeyedStateBackend) -> None:
    v = ValueState(backend, "v", default=0)
    backend.current_key = "a"
    assert v.value == 0
    v.value = 5
    backend.current_key = "b"
    assert v.value == 0
    v.update(7)
    assert v.value == 7
    backend.current_key = "a"
    assert v.value == 5
    assert entries(backend, "v") == {"a": 5, "b": 7}


def test_value_state_default_none(backend: MemoryKeyedStateBackend) -> None:
    v = ValueState(backend, "v")
    backend.current_key = 1
    assert v.value is None
    assert entries(backend, "v") == {}  # reading does not store the default


def test_value_state_clear_only_current_key(backend: MemoryKeyedStateBackend) -> None:
    v = ValueState(backend, "v", default=-1)
    for k in ("a", "b"):
        backend.current_key = k
        v.value = k * 2
    backend.current_key = "a"
    v.clear()
    assert v.value == -1
    v.clear()  # clearing an absent key is a no-op
    backend.current_key = "b"
    assert v.value == "bb"
    assert entries(backend, "v") == {"b": "bb"}


def test_value_state_none_key_and_tuple_keys(backend: MemoryKeyedStateBackend) -> None:
    v = ValueState(backend, "v", default=0)
    for k, val in ((None, 1), (("x", 1), 2), (("x", 2), 3)):
        backend.current_key = k
        v.value = val
    backend.current_key = ("x", 1)
    assert v.value == 2
    backend.current_key = None
    assert v.value == 1


def test_equal_keys_share_state(backend: MemoryKeyedStateBackend) -> None:
    v = ValueState(backend, "v", default=0)
    backend.current_key = 1
    v.value = 10
    backend.current_key = 1.0
    assert v.value == 10
    backend.current_key = True
    assert v.value == 10


def test_two_handles_same_name_same_kind_share_the_table(
    backend: MemoryKeyedStateBackend,
) -> None:
    v1 = ValueState(backend, "shared", default=0)
    v2 = ValueState(backend, "shared", default=0)
    backend.current_key = "k"
    v1.value = 3
    assert v2.value == 3


def test_different_names_are_independent(backend: MemoryKeyedStateBackend) -> None:
    a = ValueState(backend, "a", default=0)
    b = ValueState(backend, "b", default=0)
    backend.current_key = "k"
    a.value = 1
    assert b.value == 0
    assert sorted(backend.tables()) == ["a", "b"]


@pytest.mark.parametrize(
    "first,second,kinds",
    [
        (lambda b: ValueState(b, "x"), lambda b: ListState(b, "x"), ("value", "list")),
        (lambda b: ListState(b, "x"), lambda b: MapState(b, "x"), ("list", "map")),
        (lambda b: MapState(b, "x"), lambda b: ReducingState(b, "x", max), ("map", "reducing")),
        (lambda b: ReducingState(b, "x", max), lambda b: ValueState(b, "x"), ("reducing", "value")),
    ],
)
def test_one_name_two_kinds_raises_naming_operator(
    backend: MemoryKeyedStateBackend, first: Any, second: Any, kinds: tuple[str, str]
) -> None:
    first(backend)
    with pytest.raises(
        ValueError,
        match=rf"operator 'my-op': state 'x' is already declared as {kinds[0]} state, "
        rf"not {kinds[1]} state",
    ):
        second(backend)


def test_memory_state_backend_factory() -> None:
    kb = MemoryStateBackend().create_keyed_backend("op", 1, range(64, 128), 128)
    assert isinstance(kb, MemoryKeyedStateBackend)
    assert kb.operator == "op"
    assert kb.key_groups == range(64, 128)
    assert kb.max_parallelism == 128


def test_entries_report_key_groups(backend: MemoryKeyedStateBackend) -> None:
    from eddyflow.keygroups import key_group_for

    v = ValueState(backend, "v")
    for k in ("a", "b", 3):
        backend.current_key = k
        v.value = 1
    assert sorted(backend.entries(), key=repr) == sorted(
        [("v", key_group_for(k, 128), k, 1) for k in ("a", "b", 3)], key=repr
    )


# -- ListState ---------------------------------------------------------------------


def test_list_state_add_get_and_isolation(backend: MemoryKeyedStateBackend) -> None:
    ls = ListState(backend, "l")
    backend.current_key = "a"
    assert ls.get() == []
    assert list(ls) == []
    ls.add(1)
    ls.add(2)
    backend.current_key = "b"
    ls.add(9)
    backend.current_key = "a"
    assert ls.get() == [1, 2]
    assert list(ls) == [1, 2]
    assert entries(backend, "l") == {"a": [1, 2], "b": [9]}


def test_list_state_get_returns_a_copy(backend: MemoryKeyedStateBackend) -> None:
    ls = ListState(backend, "l")
    backend.current_key = "a"
    ls.add(1)
    got = ls.get()
    got.append(99)
    assert ls.get() == [1]


def test_list_state_add_all(backend: MemoryKeyedStateBackend) -> None:
    ls = ListState(backend, "l")
    backend.current_key = "a"
    ls.add_all([])
    assert entries(backend, "l") == {}  # nothing added: no empty list stored
    ls.add_all(iter([1, 2]))
    ls.add_all((3,))
    assert ls.get() == [1, 2, 3]


def test_list_state_update_replaces_and_empty_update_clears(
    backend: MemoryKeyedStateBackend,
) -> None:
    ls = ListState(backend, "l")
    backend.current_key = "a"
    ls.add_all([1, 2, 3])
    backend.current_key = "b"
    ls.add(4)
    backend.current_key = "a"
    ls.update(x for x in [7, 8])
    assert ls.get() == [7, 8]
    ls.update([])
    assert ls.get() == []
    assert "a" not in entries(backend, "l")
    assert entries(backend, "l") == {"b": [4]}


def test_list_state_clear(backend: MemoryKeyedStateBackend) -> None:
    ls = ListState(backend, "l")
    backend.current_key = "a"
    ls.add(1)
    ls.clear()
    assert ls.get() == []
    assert entries(backend, "l") == {}
    ls.add(2)
    assert ls.get() == [2]


# -- MapState ----------------------------------------------------------------------


def test_map_state_put_get_contains(backend: MemoryKeyedStateBackend) -> None:
    ms = MapState(backend, "m")
    backend.current_key = "a"
    assert ms.get("x") is None
    assert ms.get("x", 0) == 0
    assert "x" not in ms
    assert len(ms) == 0
    assert ms.is_empty()
    ms.put("x", 1)
    ms.put("y", 2)
    ms.put("x", 3)
    assert ms.get("x") == 3
    assert "x" in ms
    assert len(ms) == 2
    assert not ms.is_empty()
    assert sorted(ms.items()) == [("x", 3), ("y", 2)]
    assert sorted(ms.keys()) == ["x", "y"]
    assert sorted(ms.values()) == [2, 3]
    backend.current_key = "b"
    assert ms.is_empty()
    assert "x" not in ms
    assert entries(backend, "m") == {"a": {"x": 3, "y": 2}}


def test_map_state_views_are_copies(backend: MemoryKeyedStateBackend) -> None:
    ms = MapState(backend, "m")
    backend.current_key = "a"
    ms.put("x", 1)
    ms.items().append(("y", 2))
    ms.keys().append("z")
    assert ms.items() == [("x", 1)]


def test_map_state_remove_last_entry_deletes_the_key(backend: MemoryKeyedStateBackend) -> None:
    ms = MapState(backend, "m")
    backend.current_key = "a"
    ms.put("x", 1)
    ms.put("y", 2)
    ms.remove("x")
    assert entries(backend, "m") == {"a": {"y": 2}}
    ms.remove("absent")  # no-op
    assert entries(backend, "m") == {"a": {"y": 2}}
    ms.remove("y")
    assert entries(backend, "m") == {}
    assert ms.is_empty()
    ms.remove("y")  # removing from an absent key is a no-op
    backend.current_key = "nobody"
    ms.remove("y")
    assert entries(backend, "m") == {}


def test_map_state_clear(backend: MemoryKeyedStateBackend) -> None:
    ms = MapState(backend, "m")
    for k in ("a", "b"):
        backend.current_key = k
        ms.put(k, k)
    backend.current_key = "a"
    ms.clear()
    assert ms.is_empty()
    assert entries(backend, "m") == {"b": {"b": "b"}}


def test_map_state_none_values(backend: MemoryKeyedStateBackend) -> None:
    ms = MapState(backend, "m")
    backend.current_key = "a"
    ms.put("x", None)
    assert "x" in ms
    assert ms.get("x", "dflt") is None
    assert len(ms) == 1


# -- ReducingState -----------------------------------------------------------------


def test_reducing_state_folds_per_key(backend: MemoryKeyedStateBackend) -> None:
    rs = ReducingState(backend, "r", operator.add)
    backend.current_key = "a"
    assert rs.get() is None
    rs.add(1)
    assert rs.get() == 1
    rs.add(2)
    rs.add(3)
    backend.current_key = "b"
    rs.add(10)
    backend.current_key = "a"
    assert rs.get() == 6
    assert entries(backend, "r") == {"a": 6, "b": 10}


def test_reducing_state_first_value_is_not_reduced(backend: MemoryKeyedStateBackend) -> None:
    calls: list[tuple[Any, Any]] = []

    def fn(x: Any, y: Any) -> Any:
        calls.append((x, y))
        return x + y

    rs = ReducingState(backend, "r", fn)
    backend.current_key = "a"
    rs.add([1])
    assert calls == []
    rs.add([2])
    assert calls == [([1], [2])]
    assert rs.get() == [1, 2]


def test_reducing_state_order_of_arguments(backend: MemoryKeyedStateBackend) -> None:
    rs = ReducingState(backend, "r", lambda acc, v: f"{acc}{v}")
    backend.current_key = 0
    for ch in "abc":
        rs.add(ch)
    assert rs.get() == "abc"


def test_reducing_state_clear_restarts_the_fold(backend: MemoryKeyedStateBackend) -> None:
    rs = ReducingState(backend, "r", max)
    backend.current_key = "a"
    rs.add(5)
    rs.clear()
    assert rs.get() is None
    rs.add(2)
    assert rs.get() == 2


def test_reducing_state_with_falsy_accumulator(backend: MemoryKeyedStateBackend) -> None:
    # 0 and None-like accumulators must still be folded, not restarted.
    rs = ReducingState(backend, "r", operator.add)
    backend.current_key = "a"
    rs.add(0)
    rs.add(0)
    rs.add(4)
    assert rs.get() == 4
    rs2 = ReducingState(backend, "r2", lambda a, b: None if b == 0 else (a or 0) + b)
    rs2.add(1)
    rs2.add(0)  # accumulator becomes None
    rs2.add(5)
    assert rs2.get() == 5


def test_reducing_state_needs_a_callable(backend: MemoryKeyedStateBackend) -> None:
    with pytest.raises(TypeError, match="reducing state 'r': fn must be callable"):
        ReducingState(backend, "r", 3)  # type: ignore[arg-type]


# -- end to end: keyed.process at parallelism 2 ---------------------------------------


WORDS = ["apple", "pear", "fig", "kiwi", "plum", "lime", "date", "yuzu", "ёлка", "梨"]
RECORDS = [(WORDS[(i * 7) % len(WORDS)], i) for i in range(300)]


def by_key() -> dict[str, list[int]]:
    d: dict[str, list[int]] = defaultdict(list)
    for k, v in RECORDS:
        d[k].append(v)
    return d


def run(fn: ef.KeyedProcessFunction) -> tuple[list[Any], ef.JobResult]:
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    out = ef.ListSink()
    src = env.from_collection(RECORDS).name("src")
    src.key_by(0).process(fn).name("proc").sink_to(out)
    plan = env.plan()
    assert plan.parallelism[plan.graph.node_by_uid("proc").id] == 2
    result = env.execute("state-e2e")
    return out.results, result


class RunningCount(ef.KeyedProcessFunction):
    """ValueState: a running count; clears the key's state every 10th record."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.count = ctx.value_state("count", default=0)

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        n = self.count.value + 1
        if n == 10:
            self.count.clear()
        else:
            self.count.value = n
        yield (ctx.current_key, n, ctx.subtask_index)


def test_e2e_value_state() -> None:
    results, result = run(RunningCount())
    counts = Counter(k for k, _ in RECORDS)
    expected_outputs = sorted(
        (k, i % 10 if i % 10 else 10) for k, n in counts.items() for i in range(1, n + 1)
    )
    assert sorted((k, n) for k, n, _ in results) == expected_outputs
    # Both subtasks did work, and each key stayed on one subtask.
    assert {s for _, _, s in results} == {0, 1}
    subtask_of: dict[str, set[int]] = defaultdict(set)
    for k, _, s in results:
        subtask_of[k].add(s)
    assert all(len(s) == 1 for s in subtask_of.values())
    final = {k: n % 10 for k, n in counts.items() if n % 10}
    assert result.state("proc", "count") == final
    assert result.state("proc") == final  # its only state


class CollectList(ef.KeyedProcessFunction):
    """ListState: keeps the values; on a value divisible by 50 replaces the
    list with just that value; emits the list length."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.items = ctx.list_state("items")

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        _, v = value
        if v % 50 == 0:
            self.items.update([v])
        else:
            self.items.add(v)
        yield (ctx.current_key, len(self.items.get()))


def test_e2e_list_state() -> None:
    results, result = run(CollectList())
    expected_final: dict[str, list[int]] = {}
    expected_out = []
    for k, vs in by_key().items():
        acc: list[int] = []
        for v in vs:
            acc = [v] if v % 50 == 0 else [*acc, v]
            expected_out.append((k, len(acc)))
        expected_final[k] = acc
    assert sorted(results) == sorted(expected_out)
    # Per key, the order of the values is the input order.
    assert result.state("proc", "items") == expected_final


class Histogram(ef.KeyedProcessFunction):
    """MapState: counts values mod 3 per key; removes bucket 0 whenever it
    reaches 4; emits the number of buckets."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.buckets = ctx.map_state("buckets")

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        b = value[1] % 3
        n = self.buckets.get(b, 0) + 1
        if b == 0 and n == 4:
            self.buckets.remove(b)
        else:
            self.buckets.put(b, n)
        yield (ctx.current_key, len(self.buckets))


def test_e2e_map_state() -> None:
    results, result = run(Histogram())
    expected_final: dict[str, dict[int, int]] = {}
    expected_out = []
    for k, vs in by_key().items():
        m: dict[int, int] = {}
        for v in vs:
            b = v % 3
            n = m.get(b, 0) + 1
            if b == 0 and n == 4:
                del m[b]
            else:
                m[b] = n
            expected_out.append((k, len(m)))
        expected_final[k] = m
    assert sorted(results) == sorted(expected_out)
    assert result.state("proc", "buckets") == expected_final


class RunningMax(ef.KeyedProcessFunction):
    """ReducingState: a running max and a running sum per key."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.max = ctx.reducing_state("max", max)
        self.sum = ctx.reducing_state("sum", operator.add)

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        self.max.add(-abs(value[1] - 150))
        self.sum.add(value[1])
        yield (ctx.current_key, self.max.get(), self.sum.get())


def test_e2e_reducing_state() -> None:
    results, result = run(RunningMax())
    expected_out = []
    for k, vs in by_key().items():
        for i in range(1, len(vs) + 1):
            expected_out.append((k, max(-abs(v - 150) for v in vs[:i]), sum(vs[:i])))
    assert sorted(results) == sorted(expected_out)
    assert result.state("proc", "max") == {
        k: max(-abs(v - 150) for v in vs) for k, vs in by_key().items()
    }
    assert result.state("proc", "sum") == {k: sum(vs) for k, vs in by_key().items()}
    with pytest.raises(KeyError, match="name one"):
        result.state("proc")


class Conflicting(ef.KeyedProcessFunction):
    def open(self, ctx: ef.RuntimeContext) -> None:
        self.a = ctx.value_state("s")
        self.b = ctx.list_state("s")

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        yield value


def test_e2e_conflicting_declaration_fails_naming_operator() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    env.from_collection(RECORDS).key_by(0).process(Conflicting()).name("clash").sink_to(
        ef.ListSink()
    )
    with pytest.raises(ef.JobFailed, match=r"operator 'clash': state 's' is already declared"):
        env.execute()


def test_e2e_state_of_unknown_operator() -> None:
    _, result = run(RunningMax())
    with pytest.raises(KeyError, match="no keyed state"):
        result.state("src")
