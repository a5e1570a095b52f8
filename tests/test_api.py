"""The DataStream API surface (API.md).

Bad input is rejected when the job is declared, with a TypeError or
ValueError that names the operator; the keyed operators (count, sum, reduce,
map_with_state, process) produce exactly the documented outputs; key_by
accepts a function, a tuple position or a dict field; and JobResult counts
records in and out per operator.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import eddyflow as ef


def _run(build: Any, parallelism: int = 1) -> list[Any]:
    env = ef.StreamEnvironment(parallelism=parallelism)
    sink = ef.ListSink()
    build(env).sink_to(sink)
    env.execute()
    return sink.results


# -- bad input at build time --------------------------------------------------------


@pytest.mark.parametrize("method", ["map", "flat_map", "filter"])
@pytest.mark.parametrize("bad", [None, 3, "len"])
def test_non_callable_to_stateless_operator(method: str, bad: Any) -> None:
    env = ef.StreamEnvironment()
    ds = env.from_collection([1]).map(str)
    with pytest.raises(TypeError, match=rf"operator '{method}-[0-9a-f]{{8}}'.*must be callable"):
        getattr(ds, method)(bad)
    assert len(env._graph.nodes) == 2  # nothing half-added


@pytest.mark.parametrize("method", ["reduce", "map_with_state", "sum"])
def test_non_callable_to_keyed_operator(method: str) -> None:
    env = ef.StreamEnvironment()
    keyed = env.from_collection([("a", 1)]).key_by(0)
    with pytest.raises(TypeError, match=rf"operator '{method}-[0-9a-f]{{8}}'.*must be callable"):
        getattr(keyed, method)(42)


@pytest.mark.parametrize("key", [1.5, None, b"x", [0]])
def test_key_by_rejects_non_key_types(key: Any) -> None:
    env = ef.StreamEnvironment()
    ds = env.from_collection([(1, 2)]).name("src")
    with pytest.raises(TypeError, match="key_by after 'src'"):
        ds.key_by(key)


def test_key_by_rejects_bool() -> None:
    env = ef.StreamEnvironment()
    with pytest.raises(TypeError, match="key_by"):
        env.from_collection([(1, 2)]).key_by(True)


def test_key_by_rejects_negative_position() -> None:
    env = ef.StreamEnvironment()
    ds = env.from_collection([(1, 2)]).map(tuple).name("pairs")
    with pytest.raises(ValueError, match=r"key_by after 'pairs'.*>= 0"):
        ds.key_by(-1)


@pytest.mark.parametrize("method", ["count", "reduce", "process", "sum", "map_with_state"])
def test_keyed_operation_on_non_keyed_stream(method: str) -> None:
    class P(ef.KeyedProcessFunction):
        def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
            yield value

    env = ef.StreamEnvironment()
    ds = env.from_collection([1]).map(str).name("strs")
    args = {"count": (), "reduce": (max,), "process": (P(),), "sum": (),
            "map_with_state": (lambda r, s: (r, s),)}[method]
    with pytest.raises(TypeError, match=r"after 'strs'.*key_by") as info:
        getattr(ds, method)(*args)
    assert f"{method}()" in str(info.value)


def test_process_with_class_instead_of_instance() -> None:
    class Dedup(ef.KeyedProcessFunction):
        def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
            yield value

    env = ef.StreamEnvironment()
    keyed = env.from_collection([1]).key_by(lambda x: x)
    with pytest.raises(TypeError, match=r"operator 'process-[0-9a-f]{8}'.*Dedup\(\)"):
        keyed.process(Dedup)  # type: ignore[arg-type]


def test_process_with_plain_function() -> None:
    env = ef.StreamEnvironment()
    keyed = env.from_collection([1]).key_by(lambda x: x)
    with pytest.raises(TypeError, match=r"operator 'process-[0-9a-f]{8}'.*KeyedProcessFunction"):
        keyed.process(lambda v, ctx: [v])  # type: ignore[arg-type]


@pytest.mark.parametrize(("n", "exc"), [(0, ValueError), (-3, ValueError), ("2", TypeError),
                                        (2.0, TypeError), (True, TypeError)])
def test_set_parallelism_bad_values(n: Any, exc: type[Exception]) -> None:
    env = ef.StreamEnvironment()
    ds = env.from_collection([1]).map(str).name("fmt")
    with pytest.raises(exc, match="operator 'fmt'"):
        ds.set_parallelism(n)


def test_name_twice_with_same_label() -> None:
    env = ef.StreamEnvironment()
    ds = env.from_collection([1]).map(str).name("step")
    with pytest.raises(ValueError, match="'step' is already used"):
        ds.map(str).name("step")


@pytest.mark.parametrize("label", ["", "a/b", ".hidden", 7])
def test_name_invalid_label(label: Any) -> None:
    env = ef.StreamEnvironment()
    ds = env.from_collection([1]).map(str)
    with pytest.raises(ValueError, match=r"operator 'map-[0-9a-f]{8}': invalid name"):
        ds.name(label)


def test_renaming_same_operator_is_allowed() -> None:
    env = ef.StreamEnvironment()
    ds = env.from_collection([1]).map(str).name("a").name("a")
    assert ds.operator_name == "a"


@pytest.mark.parametrize("partitioning", ["key_by", "rebalance", "broadcast", "union"])
def test_set_parallelism_and_name_need_an_operator(partitioning: str) -> None:
    env = ef.StreamEnvironment()
    ds = env.from_collection([(1, 2)]).name("src")
    other = env.from_collection([(3, 4)])
    s = {"key_by": lambda: ds.key_by(0), "rebalance": ds.rebalance,
         "broadcast": ds.broadcast, "union": lambda: ds.union(other)}[partitioning]()
    with pytest.raises(TypeError, match="set_parallelism applies to the operator just added"):
        s.set_parallelism(2)
    with pytest.raises(TypeError, match="name applies to the operator just added"):
        s.name("x")


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"parallelism": 0}, ValueError),
    ({"parallelism": -1}, ValueError),
    ({"parallelism": "1"}, TypeError),
    ({"max_parallelism": 0}, ValueError),
    ({"parallelism": 5, "max_parallelism": 4}, ValueError),
    ({"batch_size": 0}, ValueError),
    ({"channel_capacity": 0}, ValueError),
    ({"buffer_timeout": -0.1}, ValueError),
    ({"buffer_debloat_target": 0}, ValueError),
    ({"buffer_debloat_target": float("inf")}, ValueError),
])
def test_environment_bad_config(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        ef.StreamEnvironment(**kwargs)


def test_parallelism_above_max_parallelism_message() -> None:
    with pytest.raises(ValueError, match="parallelism 200 exceeds max_parallelism 128"):
        ef.StreamEnvironment(parallelism=200)


def test_keyed_operator_parallelism_above_max_parallelism() -> None:
    env = ef.StreamEnvironment(max_parallelism=8)
    (env.from_collection([1]).key_by(lambda x: x).count().name("cnt").set_parallelism(9)
        .sink_to(ef.ListSink()))
    with pytest.raises(ValueError, match=r"operator 'cnt'.*exceeds max_parallelism 8"):
        env.plan()
    with pytest.raises(ValueError, match="operator 'cnt'"):
        env.execute()


def test_read_text_file_missing_path(tmp_path: Path) -> None:
    env = ef.StreamEnvironment()
    path = tmp_path / "sub" / "missing.txt"
    with pytest.raises(FileNotFoundError) as info:
        env.read_text_file(path)
    assert str(path) in str(info.value)


def test_sink_to_needs_a_sink() -> None:
    env = ef.StreamEnvironment()
    with pytest.raises(TypeError, match=r"needs an ef\.Sink"):
        env.from_collection([1]).map(str).name("fmt").sink_to([])  # type: ignore[arg-type]


def test_from_source_needs_a_source() -> None:
    env = ef.StreamEnvironment()
    with pytest.raises(TypeError, match=r"needs an ef\.Source"):
        env.from_source([1, 2])  # type: ignore[arg-type]


def test_job_without_sink_or_source_is_rejected() -> None:
    env = ef.StreamEnvironment()
    with pytest.raises(ValueError, match="no operators"):
        env.execute()
    env.from_collection([1]).map(str)
    with pytest.raises(ValueError, match="no sink"):
        env.execute()


def test_second_execute_of_one_environment_is_refused() -> None:
    # Its sinks hold the first run's output: a second run into them would
    # duplicate it (a ListSink would hold every record twice).
    env = ef.StreamEnvironment()
    sink = ef.ListSink()
    env.from_collection([1, 2, 3]).sink_to(sink)
    env.execute("first")
    with pytest.raises(RuntimeError, match=r"already executed job 'first'; build a new "
                                           r"environment .*sinks hold the first run's output"):
        env.execute("second")
    assert sink.results == [1, 2, 3]


async def test_second_execute_async_is_refused_even_while_the_first_runs(
        tmp_path: Path) -> None:
    import asyncio

    env = ef.StreamEnvironment()
    env.enable_checkpointing(interval=0.01, directory=tmp_path / "chk")
    sink = ef.ListSink()
    env.from_collection(range(10)).sink_to(sink)
    first = asyncio.ensure_future(env.execute_async("first"))
    await asyncio.sleep(0)  # the first run has started
    with pytest.raises(RuntimeError, match="already executed job 'first'"):
        await env.execute_async("again")
    result = await first
    assert sink.results == list(range(10))
    # (Its checkpoints, the final one last, are all there.)
    assert ef.list_checkpoints(tmp_path / "chk")[-1].id == result.completed_checkpoints[-1]


def test_refused_execute_ran_nothing_and_may_be_retried(tmp_path: Path) -> None:
    # An execute() refused for its arguments (a restore that is no
    # checkpoint) ran nothing: the environment still runs once.
    env = ef.StreamEnvironment()
    sink = ef.ListSink()
    env.from_collection([1]).sink_to(sink)
    with pytest.raises(ValueError, match="chk-<n>"):
        env.execute(restore=str(tmp_path))
    env.execute()
    assert sink.results == [1]


def test_union_across_environments_rejected() -> None:
    a = ef.StreamEnvironment().from_collection([1])
    b = ef.StreamEnvironment().from_collection([2])
    with pytest.raises(ValueError, match="different environments"):
        a.union(b)
    with pytest.raises(TypeError, match="union takes DataStreams"):
        a.union([3])  # type: ignore[arg-type]


# -- keyed operators: exact outputs ---------------------------------------------------------


WORDS = ["a", "b", "a", "c", "b", "a"]
PAIRS = [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("b", 5), ("a", 6)]


def test_count_output() -> None:
    got = _run(lambda env: env.from_collection(WORDS).key_by(lambda w: w).count())
    assert got == [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 2), ("a", 3)]


def test_sum_default_value_fn_is_second_field() -> None:
    got = _run(lambda env: env.from_collection(PAIRS).key_by(0).sum())
    assert got == [("a", 1), ("b", 2), ("a", 4), ("c", 4), ("b", 7), ("a", 10)]


def test_sum_with_value_fn() -> None:
    got = _run(lambda env: env.from_collection(PAIRS).key_by(0).sum(lambda r: r[1] * 0.5))
    assert got == [("a", 0.5), ("b", 1.0), ("a", 2.0), ("c", 2.0), ("b", 3.5), ("a", 5.0)]


def test_reduce_output() -> None:
    def add(acc: tuple[str, int], r: tuple[str, int]) -> tuple[str, int]:
        return (acc[0], acc[1] + r[1])

    got = _run(lambda env: env.from_collection(PAIRS).key_by(0).reduce(add))
    assert got == [
        ("a", ("a", 1)), ("b", ("b", 2)), ("a", ("a", 4)),
        ("c", ("c", 4)), ("b", ("b", 7)), ("a", ("a", 10)),
    ]


def test_map_with_state_output_and_clearing() -> None:
    # Running total per key, reset (state cleared) whenever it reaches >= 4.
    def step(r: tuple[str, int], total: int | None) -> tuple[Any, int | None]:
        new = (total or 0) + r[1]
        return (r[0], new, total), (None if new >= 4 else new)

    env = ef.StreamEnvironment()
    sink = ef.ListSink()
    env.from_collection(PAIRS).key_by(0).map_with_state(step).name("mws").sink_to(sink)
    result = env.execute()
    assert sink.results == [
        ("a", 1, None), ("b", 2, None), ("a", 4, 1),
        ("c", 4, None), ("b", 7, 2), ("a", 6, None),
    ]
    assert result.state("mws") == {}  # every key ended cleared


def test_map_with_state_must_return_pair() -> None:
    env = ef.StreamEnvironment()
    env.from_collection([1]).key_by(lambda x: x).map_with_state(lambda r, s: r).sink_to(
        ef.ListSink())
    with pytest.raises(ef.JobFailed, match=r"must return \(output, new_state\)"):
        env.execute()


def test_process_function_with_state() -> None:
    class Dedup(ef.KeyedProcessFunction):
        def open(self, ctx: ef.RuntimeContext) -> None:
            self.seen = ctx.value_state("seen", default=False)

        def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
            if not self.seen.value:
                self.seen.value = True
                yield (ctx.current_key, value)

    got = _run(lambda env: env.from_collection(PAIRS).key_by(0).process(Dedup()))
    assert got == [("a", ("a", 1)), ("b", ("b", 2)), ("c", ("c", 4))]


def test_keyed_outputs_at_parallelism_three_match_per_key() -> None:
    expected = [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 2), ("a", 3)]
    got = _run(lambda env: env.from_collection(WORDS * 1).key_by(lambda w: w).count(), 3)
    assert sorted(got) == sorted(expected)
    for k in "abc":
        assert [c for w, c in got if w == k] == [c for w, c in expected if w == k]


def test_key_by_position_on_tuples() -> None:
    got = _run(lambda env: env.from_collection([(1, "x"), (2, "y"), (1, "z")]).key_by(0).count())
    assert got == [(1, 1), (2, 1), (1, 2)]
    got = _run(lambda env: env.from_collection([(1, "x"), (2, "x"), (1, "z")]).key_by(1).count())
    assert got == [("x", 1), ("x", 2), ("z", 1)]


def test_key_by_field_on_dicts() -> None:
    rows = [{"user": "u1", "n": 5}, {"user": "u2", "n": 1}, {"user": "u1", "n": 2}]
    got = _run(lambda env: env.from_collection(rows).key_by("user").sum(lambda r: r["n"]))
    assert got == [("u1", 5), ("u2", 1), ("u1", 7)]


def test_key_by_tuple_keys() -> None:
    rows = [("a", 1, 10), ("a", 2, 10), ("a", 1, 5)]
    got = _run(lambda env: env.from_collection(rows).key_by(lambda r: (r[0], r[1])).count(), 2)
    assert sorted(got) == [(("a", 1), 1), (("a", 1), 2), (("a", 2), 1)]


def test_job_result_counts_per_operator() -> None:
    env = ef.StreamEnvironment()
    sink = ef.ListSink()
    (env.from_collection(range(100)).name("nums")
        .filter(lambda x: x % 4 == 0).name("quarter")
        .flat_map(lambda x: [x, x]).name("twice")
        .key_by(lambda x: x % 3).count().name("cnt")
        .sink_to(sink).name("out"))
    result = env.execute("counted")
    assert result.job_name == "counted"
    assert result.records_out["nums"] == 100
    assert result.records_in["quarter"] == 100
    assert result.records_out["quarter"] == 25
    assert result.records_in["twice"] == 25
    assert result.records_out["twice"] == 50
    assert result.records_in["cnt"] == 50
    assert result.records_out["cnt"] == 50
    assert result.records_in["out"] == 50
    assert result.records_out["out"] == 0
    assert set(result.records_in) == {"nums", "quarter", "twice", "cnt", "out"}
    assert result.duration >= 0
    assert result.restarts == 0
    assert result.completed_checkpoints == []
    assert sum(result.state("cnt").values()) == 50


def test_job_result_counts_sum_over_parallel_subtasks() -> None:
    env = ef.StreamEnvironment(parallelism=3)
    (env.from_collection(range(999)).set_parallelism(3).name("src")
        .map(lambda x: x).name("m")
        .rebalance().filter(lambda x: x % 2).name("odd").set_parallelism(2)
        .sink_to(ef.ListSink()).name("out"))
    result = env.execute()
    assert result.records_out["src"] == 999
    assert result.records_in["m"] == result.records_out["m"] == 999
    assert result.records_in["odd"] == 999
    assert result.records_out["odd"] == 499
    assert result.records_in["out"] == 499


class _Numbers(ef.Source):
    """A source of another kind than a collection (only declared, never run)."""

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        raise NotImplementedError


def _default_uids(*, before: bool = False, branch: bool = False, sink: bool = False,
                  pipeline: bool = False, loop: bool = False, parallelism: int = 1
                  ) -> list[str]:
    """The uids of an unnamed job's operators, in the order they were added,
    with unrelated operators added (they are left out of the list):
    ``before``, an independent pipeline declared ahead of the job (of
    another source: equal sources are told apart by the order they are
    declared in); ``branch``, a side branch off its source; ``sink``, a
    second sink of its counts; ``pipeline``, an independent source and
    pipeline after it. ``loop`` adds a loop closed by a feedback edge (its
    uids are listed)."""
    env = ef.StreamEnvironment(parallelism=parallelism)
    if before:
        env.from_source(_Numbers()).map(abs).key_by(abs).count().sink_to(ef.ListSink())
    first = len(env._graph.nodes)
    src = env.from_collection([1])
    counts = src.map(str).filter(bool).key_by(lambda s: s).count()
    counts.sink_to(ef.ListSink())
    if loop:
        head = counts.map(lambda r: r[1]).iterate()
        step = head.map(lambda n: n - 1)
        head.close_with(step.filter(lambda n: n > 0))
        step.filter(lambda n: n == 0).sink_to(ef.ListSink())
    ours = [n.uid for n in env._graph.nodes[first:]]
    if branch:
        src.map(repr).sink_to(ef.ListSink())
    if sink:
        counts.print()
    if pipeline:
        env.from_collection([2]).map(str).key_by(lambda s: s).count().sink_to(ef.ListSink())
    return ours


def test_default_operator_names_are_deterministic_unique_and_stable() -> None:
    """Unnamed operators get uids derived from their place in the graph
    (kind, inputs, source or sink, ordinal among equals): the same on every
    build and at any parallelism, unique, readable, and unchanged when an
    unrelated operator is added anywhere, so that the job still restores
    its checkpoints."""
    uids = _default_uids()
    assert uids == _default_uids() == _default_uids(parallelism=4)
    assert len(set(uids)) == len(uids)
    assert [u.rsplit("-", 1)[0] for u in uids] == ["source", "map", "filter", "count", "sink"]
    assert all(re.fullmatch(r"[a-z_]+-[0-9a-f]{8}", u) for u in uids), uids
    for added in ("before", "branch", "sink", "pipeline"):
        assert _default_uids(**{added: True}) == uids, added
    with_loop = _default_uids(loop=True)
    assert with_loop[:len(uids)] == uids
    assert with_loop == _default_uids(loop=True, branch=True, pipeline=True)
    assert len(set(with_loop)) == len(with_loop)


def test_default_operator_name_follows_its_upstream_chain() -> None:
    """Another upstream chain or partitioning gives an operator another uid
    (a restore then refuses its state rather than read it wrongly); naming
    an operator changes the uids of those added after it downstream only."""
    def count_uid(ds: ef.DataStream) -> str:
        return ds.key_by(lambda r: r).count().operator_name

    env = ef.StreamEnvironment()
    src = env.from_collection([1])
    direct, mapped = count_uid(src), count_uid(src.map(str))
    assert direct != mapped
    assert len({direct, mapped, src.map(str).operator_name,
                src.rebalance().map(str).operator_name}) == 4
    env = ef.StreamEnvironment()
    named = env.from_collection([1]).name("numbers")
    assert count_uid(named) != direct



def test_empty_checkpoint_directory_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        ef.StreamEnvironment().enable_checkpointing(1.0, "")


def test_a_failed_execute_is_not_chained_to_no_running_event_loop() -> None:
    env = ef.StreamEnvironment()

    def boom(x: int) -> int:
        raise ValueError("bad record")

    env.from_collection([1]).map(boom).sink_to(ef.ListSink())
    with pytest.raises(ef.JobFailed) as info:
        env.execute()
    chain = []
    exc: BaseException | None = info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    assert not any("no running event loop" in str(e) for e in chain), chain
