"""Tests of the execution plan (``eddyflow.graph.plan.build_plan`` and
``StreamEnvironment.plan()``): operator chaining, resolution of the DEFAULT
partitioning, back-edges in the plan, and the validation errors a job gets
before it runs (each naming the offending operator where there is one).
"""

from __future__ import annotations

from typing import Any

import pytest

import eddyflow as ef
from eddyflow.connectors.source import Source, SourceReader
from eddyflow.graph.dfs import EdgeKind
from eddyflow.graph.logical import LogicalGraph, Partitioning
from eddyflow.graph.plan import ExecutionPlan, build_plan


def identity(x: Any) -> Any:
    return x


def chain_names(plan: ExecutionPlan) -> list[str]:
    return [c.name for c in plan.chains]


def exchanges_by_uid(plan: ExecutionPlan) -> dict[tuple[str, str], Partitioning]:
    nodes = plan.graph.nodes
    return {
        (nodes[x.source_node].uid, nodes[x.target_node].uid): x.partitioning
        for x in plan.exchanges
    }


def check_plan_invariants(plan: ExecutionPlan) -> None:
    """Structural facts every plan must satisfy."""
    graph = plan.graph
    # Every operator is in exactly one chain.
    all_ids = [i for c in plan.chains for i in c.node_ids]
    assert sorted(all_ids) == [n.id for n in graph.nodes]
    for c in plan.chains:
        for i in c.node_ids:
            assert plan.chain_of[i] == c.index
            assert plan.parallelism[i] == c.parallelism
        assert c.name == " -> ".join(graph.nodes[i].uid for i in c.node_ids)
    # Each logical edge is either inside a chain (consecutive operators) or
    # an exchange, never both.
    exchanged = {x.edge_id for x in plan.exchanges}
    for e in graph.edges:
        c_src, c_dst = plan.chain_of[e.source], plan.chain_of[e.target]
        ids = plan.chains[c_src].node_ids
        inside = (
            c_src == c_dst
            and e.source in ids
            and ids.index(e.target) == ids.index(e.source) + 1
            and e.id not in exchanged
        )
        assert inside != (e.id in exchanged), e
    for x in plan.exchanges:
        assert x.partitioning is not Partitioning.DEFAULT
        if x.partitioning is Partitioning.FORWARD:
            assert plan.parallelism[x.source_node] == plan.parallelism[x.target_node]


def sink() -> ef.ListSink:
    return ef.ListSink()


# -- chaining ------------------------------------------------------------------


def test_forward_edges_with_equal_parallelism_chain() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    src = env.from_collection(range(10)).set_parallelism(2).name("src")
    src.map(identity).name("m").filter(bool).name("f").sink_to(sink()).name("out")
    plan = env.plan()
    check_plan_invariants(plan)
    assert chain_names(plan) == ["src -> m -> f -> out"]
    assert plan.chains[0].parallelism == 2
    assert plan.exchanges == ()


def test_different_parallelism_breaks_the_chain() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    src = env.from_collection(range(10)).name("src")  # parallelism 1
    m = src.map(identity).name("m")  # parallelism 2
    m.map(identity).name("m3").set_parallelism(3).sink_to(sink()).name("out")
    plan = env.plan()
    check_plan_invariants(plan)
    # The sink runs at the default parallelism 2, not m3's 3.
    assert chain_names(plan) == ["src", "m", "m3", "out"]
    assert [c.parallelism for c in plan.chains] == [1, 2, 3, 2]
    assert exchanges_by_uid(plan) == {
        ("src", "m"): Partitioning.REBALANCE,
        ("m", "m3"): Partitioning.REBALANCE,
        ("m3", "out"): Partitioning.REBALANCE,
    }


def test_key_by_at_parallelism_one_chains() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    src = env.from_collection(["a", "b", "a"]).name("src")
    src.key_by(identity).count().name("count").sink_to(sink()).name("out")
    plan = env.plan()
    check_plan_invariants(plan)
    assert chain_names(plan) == ["src -> count -> out"]
    assert plan.exchanges == ()


def test_key_by_at_parallelism_two_does_not_chain() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    src = env.from_collection(["a", "b", "a"]).set_parallelism(2).name("src")
    key_fn = str.upper
    src.key_by(key_fn).count().name("count").sink_to(sink()).name("out")
    plan = env.plan()
    check_plan_invariants(plan)
    assert chain_names(plan) == ["src", "count -> out"]
    (x,) = plan.exchanges
    assert x.partitioning is Partitioning.KEY_GROUP
    assert x.key_fn is key_fn
    assert not x.back_edge


def test_explicit_rebalance_and_broadcast_at_parallelism_two_do_not_chain() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    src = env.from_collection(range(4)).set_parallelism(2).name("src")
    a = src.rebalance().map(identity).name("a")
    a.broadcast().map(identity).name("b").sink_to(sink()).name("out")
    plan = env.plan()
    check_plan_invariants(plan)
    assert chain_names(plan) == ["src", "a", "b -> out"]
    assert exchanges_by_uid(plan) == {
        ("src", "a"): Partitioning.REBALANCE,
        ("a", "b"): Partitioning.BROADCAST,
    }


def test_any_partitioning_at_parallelism_one_chains() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    src = env.from_collection(range(4)).name("src")
    a = src.rebalance().map(identity).name("a")
    a.broadcast().map(identity).name("b").sink_to(sink()).name("out")
    plan = env.plan()
    assert chain_names(plan) == ["src -> a -> b -> out"]


def test_node_with_two_consumers_ends_its_chain() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    src = env.from_collection(range(4)).set_parallelism(2).name("src")
    m = src.map(identity).name("m")
    m.filter(bool).name("f").sink_to(sink()).name("out1")
    m.map(identity).name("g").sink_to(sink()).name("out2")
    plan = env.plan()
    check_plan_invariants(plan)
    assert chain_names(plan) == ["src -> m", "f -> out1", "g -> out2"]
    assert exchanges_by_uid(plan) == {
        ("m", "f"): Partitioning.FORWARD,
        ("m", "g"): Partitioning.FORWARD,
    }


def test_union_target_is_a_chain_head() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    a = env.from_collection([1, 2]).name("a")
    b = env.from_collection([3, 4]).name("b")
    a.union(b).map(identity).name("u").sink_to(sink()).name("out")
    plan = env.plan()
    check_plan_invariants(plan)
    assert chain_names(plan) == ["a", "b", "u -> out"]
    assert exchanges_by_uid(plan) == {
        ("a", "u"): Partitioning.FORWARD,
        ("b", "u"): Partitioning.FORWARD,
    }


def test_union_of_a_stream_with_itself_is_not_chained() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    a = env.from_collection([1, 2]).name("a")
    a.union(a).map(identity).name("u").sink_to(sink()).name("out")
    plan = env.plan()
    check_plan_invariants(plan)
    assert chain_names(plan) == ["a", "u -> out"]
    assert len(plan.exchanges) == 2


def _linear_job(env: ef.StreamEnvironment) -> None:
    src = env.from_collection(range(20)).name("src")
    src.map(identity).name("m").key_by(lambda x: x % 3).count().name("count").sink_to(
        sink()
    ).name("out")


@pytest.mark.parametrize("how", ["constructor", "method"])
def test_chaining_disabled_gives_one_task_per_operator(how: str) -> None:
    if how == "constructor":
        env = ef.StreamEnvironment(parallelism=1, chaining=False)
    else:
        env = ef.StreamEnvironment(parallelism=1)
        assert env.disable_operator_chaining() is env
    _linear_job(env)
    plan = env.plan()
    check_plan_invariants(plan)
    assert chain_names(plan) == ["src", "m", "count", "out"]
    assert exchanges_by_uid(plan) == {
        ("src", "m"): Partitioning.FORWARD,
        ("m", "count"): Partitioning.KEY_GROUP,
        ("count", "out"): Partitioning.FORWARD,
    }


def test_chaining_enabled_by_default_for_the_same_job() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    _linear_job(env)
    assert chain_names(env.plan()) == ["src -> m -> count -> out"]


def test_unchained_job_runs_and_gives_the_same_result() -> None:
    results = []
    for chaining in (True, False):
        env = ef.StreamEnvironment(parallelism=2, chaining=chaining)
        out = ef.ListSink()
        src = env.from_collection([f"k{i % 5}" for i in range(50)]).name("src")
        src.map(str.upper).name("m").key_by(identity).count().name("count").sink_to(out)
        result = env.execute()
        results.append((sorted(out.results), result.state("count")))
    assert results[0] == results[1]
    assert results[0][1] == {f"K{i}": 10 for i in range(5)}


def test_build_plan_chaining_flag_directly() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    _linear_job(env)
    plan = build_plan(env._graph, 1, 128, chaining=False)
    assert len(plan.chains) == 4
    plan = build_plan(env._graph, 1, 128)
    assert len(plan.chains) == 1


# -- partitioning resolution -----------------------------------------------------


def test_default_partitioning_is_forward_when_parallelism_matches() -> None:
    env = ef.StreamEnvironment(parallelism=3, chaining=False)
    src = env.from_collection(range(9)).set_parallelism(3).name("src")
    src.map(identity).name("m").sink_to(sink()).name("out")
    plan = env.plan()
    assert exchanges_by_uid(plan) == {
        ("src", "m"): Partitioning.FORWARD,
        ("m", "out"): Partitioning.FORWARD,
    }


def test_default_partitioning_is_rebalance_when_parallelism_differs() -> None:
    env = ef.StreamEnvironment(parallelism=3)
    src = env.from_collection(range(9)).name("src")  # 1
    m = src.map(identity).name("m")  # 3
    m.sink_to(sink()).name("out").set_parallelism(2)
    plan = env.plan()
    assert exchanges_by_uid(plan) == {
        ("src", "m"): Partitioning.REBALANCE,
        ("m", "out"): Partitioning.REBALANCE,
    }
    assert plan.parallelism == {0: 1, 1: 3, 2: 2}


def test_explicit_forward_with_unequal_parallelism_names_both_operators() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    src = env.from_collection(range(4)).name("the-source")  # parallelism 1
    src.forward().map(identity).name("the-map").sink_to(sink())
    with pytest.raises(ValueError, match=r"forward edge 'the-source' -> 'the-map'.*1 and 2"):
        env.plan()


def test_explicit_forward_with_equal_parallelism_chains() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    src = env.from_collection(range(4)).set_parallelism(2).name("src")
    src.forward().map(identity).name("m").sink_to(sink()).name("out")
    assert chain_names(env.plan()) == ["src -> m -> out"]


def test_source_parallelism_is_capped_by_the_source() -> None:
    class OneSplit(Source):
        max_parallelism = 1

        def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
            raise NotImplementedError

    env = ef.StreamEnvironment(parallelism=4)
    env.from_source(OneSplit()).name("src").map(identity).name("m").sink_to(sink())
    plan = env.plan()
    assert plan.parallelism[0] == 1
    assert plan.parallelism[1] == 4
    assert exchanges_by_uid(plan)[("src", "m")] is Partitioning.REBALANCE


# -- back-edges ------------------------------------------------------------------


def _loop_graph() -> LogicalGraph:
    g = LogicalGraph()
    src = g.add_node("source", None, uid="src", is_source=True, parallelism=1)
    head = g.add_node("map", None, uid="head", parallelism=1)
    body = g.add_node("map", None, uid="body", parallelism=1)
    out = g.add_node("sink", None, uid="out", is_sink=True, parallelism=1)
    g.add_edge(src.id, head.id)
    g.add_edge(head.id, body.id)
    g.add_edge(body.id, head.id, feedback=True)
    g.add_edge(body.id, out.id)
    return g


def test_back_edge_is_found_and_never_chained() -> None:
    plan = build_plan(_loop_graph(), 1, 128)
    check_plan_invariants(plan)
    assert [(e.source, e.target) for e in plan.back_edges] == [(2, 1)]
    assert plan.edge_kinds[2] is EdgeKind.BACK
    back = [x for x in plan.exchanges if x.back_edge]
    assert [(x.source_node, x.target_node) for x in back] == [(2, 1)]
    assert "back-edge exchange" in plan.describe()


def test_back_edge_found_by_dfs_even_without_feedback_marker() -> None:
    g = _loop_graph()
    g.edges[2].feedback = False
    plan = build_plan(g, 1, 128)
    assert [e.id for e in plan.back_edges] == [2]


def test_self_loop_is_a_back_edge_exchange() -> None:
    g = LogicalGraph()
    g.add_node("source", None, uid="src", is_source=True)
    g.add_node("map", None, uid="loop")
    g.add_node("sink", None, uid="out", is_sink=True)
    g.add_edge(0, 1)
    g.add_edge(1, 1, feedback=True)
    g.add_edge(1, 2)
    plan = build_plan(g, 2, 128)
    check_plan_invariants(plan)
    assert [e.id for e in plan.back_edges] == [1]
    (x,) = [x for x in plan.exchanges if x.edge_id == 1]
    assert x.back_edge and x.source_chain == x.target_chain


def test_describe_lists_tasks_and_exchanges() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    src = env.from_collection(range(4)).name("src")
    src.map(identity).name("m").sink_to(sink()).name("out")
    assert env.plan().describe().splitlines() == [
        "task 0 x1: src",
        "task 1 x2: m -> out",
        "exchange 0 -> 1 (rebalance)",
    ]


def test_unnamed_operators_get_deterministic_uids() -> None:
    def build() -> list[str]:
        env = ef.StreamEnvironment(parallelism=2)
        s = env.from_collection(range(3))
        s.map(identity).key_by(identity).count().sink_to(sink())
        s.filter(bool).print()
        return [n.uid for n in env.plan().graph.nodes]

    first = build()
    assert first == build()
    assert len(set(first)) == len(first)


# -- validation ------------------------------------------------------------------


def test_no_operators() -> None:
    with pytest.raises(ValueError, match="no operators"):
        build_plan(LogicalGraph(), 1, 128)


def test_no_sink() -> None:
    env = ef.StreamEnvironment()
    env.from_collection([1]).map(identity).name("dangling")
    with pytest.raises(ValueError, match=r"no sink.*sink_to"):
        env.plan()


def test_no_source() -> None:
    g = LogicalGraph()
    g.add_node("map", None, uid="m")
    g.add_node("sink", None, uid="out", is_sink=True)
    g.add_edge(0, 1)
    with pytest.raises(ValueError, match="no source"):
        build_plan(g, 1, 128)


def test_operator_without_input_is_named() -> None:
    g = LogicalGraph()
    g.add_node("source", None, uid="src", is_source=True)
    g.add_node("map", None, uid="orphan")
    g.add_node("sink", None, uid="out", is_sink=True)
    g.add_edge(0, 2)
    g.add_edge(1, 2)
    with pytest.raises(ValueError, match="operator 'orphan' has no input"):
        build_plan(g, 1, 128)


def test_duplicate_names_in_graph_are_named() -> None:
    g = LogicalGraph()
    g.add_node("source", None, uid="src", is_source=True)
    g.add_node("map", None, uid="twice")
    g.add_node("map", None, uid="twice")
    g.add_node("sink", None, uid="out", is_sink=True)
    g.add_edge(0, 1)
    g.add_edge(1, 2)
    g.add_edge(2, 3)
    with pytest.raises(ValueError, match=r"unique.*'twice'"):
        build_plan(g, 1, 128)


def test_duplicate_name_rejected_when_declared() -> None:
    env = ef.StreamEnvironment()
    s = env.from_collection([1]).name("same")
    with pytest.raises(ValueError, match="'same' is already used"):
        s.map(identity).name("same")


def test_generated_uid_steps_around_an_explicit_name() -> None:
    # An explicit name equal to the uid a later unnamed operator would get:
    # that operator takes a longer digest of the same description, not the
    # name (nor an error at planning).
    env = ef.StreamEnvironment()
    s = env.from_collection([1]).name("src")
    would_be = s.map(identity).operator_name
    env = ef.StreamEnvironment()
    src = env.from_collection([1]).name("src")
    env.from_collection([2]).name(would_be).sink_to(sink())
    s = src.map(identity)
    s.sink_to(sink())
    assert s.operator_name.startswith(would_be) and s.operator_name != would_be
    uids = [n.uid for n in env.plan().graph.nodes]
    assert len(set(uids)) == len(uids)


def test_parallelism_below_one_in_graph_is_named() -> None:
    g = LogicalGraph()
    g.add_node("source", None, uid="src", is_source=True)
    g.add_node("map", None, uid="zero", parallelism=0)
    g.add_node("sink", None, uid="out", is_sink=True)
    g.add_edge(0, 1)
    g.add_edge(1, 2)
    with pytest.raises(ValueError, match=r"operator 'zero': parallelism must be >= 1, got 0"):
        build_plan(g, 1, 128)


def test_default_parallelism_below_one_names_first_operator_using_it() -> None:
    g = LogicalGraph()
    g.add_node("source", None, uid="src", is_source=True, parallelism=1)
    g.add_node("sink", None, uid="out", is_sink=True)
    g.add_edge(0, 1)
    with pytest.raises(ValueError, match=r"operator 'out': parallelism must be >= 1"):
        build_plan(g, 0, 128)


@pytest.mark.parametrize("bad", [0, -1])
def test_set_parallelism_below_one_is_named(bad: int) -> None:
    env = ef.StreamEnvironment()
    m = env.from_collection([1]).map(identity).name("mine")
    with pytest.raises(ValueError, match=rf"operator 'mine': parallelism must be >= 1, got {bad}"):
        m.set_parallelism(bad)


def test_keyed_parallelism_above_max_parallelism_is_named() -> None:
    env = ef.StreamEnvironment(parallelism=2, max_parallelism=4)
    src = env.from_collection(["a"]).name("src")
    src.key_by(identity).count().name("counter").set_parallelism(5).sink_to(sink())
    with pytest.raises(
        ValueError, match=r"operator 'counter': parallelism 5 exceeds max_parallelism 4"
    ):
        env.plan()


def test_keyed_parallelism_equal_to_max_parallelism_is_fine() -> None:
    env = ef.StreamEnvironment(parallelism=2, max_parallelism=4)
    src = env.from_collection(["a"]).name("src")
    src.key_by(identity).count().name("counter").set_parallelism(4).sink_to(sink())
    assert env.plan().parallelism[1] == 4


def test_non_keyed_parallelism_may_exceed_max_parallelism() -> None:
    env = ef.StreamEnvironment(parallelism=2, max_parallelism=4)
    env.from_collection(["a"]).map(identity).name("wide").set_parallelism(6).sink_to(sink())
    assert env.plan().parallelism[1] == 6


def test_build_plan_keyed_node_over_max_parallelism() -> None:
    g = LogicalGraph()
    g.add_node("source", None, uid="src", is_source=True, parallelism=1)
    g.add_node("count", None, uid="cnt", keyed=True)
    g.add_node("sink", None, uid="out", is_sink=True)
    g.add_edge(0, 1, Partitioning.KEY_GROUP, identity)
    g.add_edge(1, 2)
    with pytest.raises(ValueError, match=r"operator 'cnt': parallelism 8 exceeds max_paral"):
        build_plan(g, 8, 4)


def test_stateful_operators_described_alike_must_be_named() -> None:
    # Told apart only by declaration order, one would take the other's
    # checkpointed state if another were declared ahead of them.
    env = ef.StreamEnvironment()
    env.from_collection([1]).sink_to(ef.ListSink())
    env.from_collection([2]).sink_to(ef.ListSink())
    with pytest.raises(ValueError, match=r"described alike.*\.name\("):
        env.plan()
    env = ef.StreamEnvironment()
    s = env.from_collection([(1, 2)]).name("src")
    s.key_by(lambda r: r[0]).count().name("by-first").sink_to(ef.ListSink()).name("a")
    s.key_by(lambda r: r[1]).count().sink_to(ef.ListSink()).name("b")
    s.key_by(lambda r: r[1]).count().sink_to(ef.ListSink()).name("c")
    with pytest.raises(ValueError, match="count-"):
        env.plan()
    env = ef.StreamEnvironment()  # named, they are fine; stateless ones need nothing
    s = env.from_collection([1]).name("one")
    s.map(str).sink_to(ef.ListSink()).name("x")
    s.map(str).sink_to(ef.ListSink()).name("y")
    env.from_collection([2]).name("two").sink_to(ef.ListSink()).name("z")
    env.plan()
