"""Tests of ``eddyflow.graph.scc.strongly_connected_components`` and of the
loops the execution plan derives from it (``ExecutionPlan.loops``,
``ExchangeSpec.loop``), which loop termination counts records by
(DESIGN.md §3, last paragraph).

Covers DAGs (every vertex its own component), self-loops, simple, nested and
disjoint cycles, deep graphs (no recursion limit), the documented output
order (vertices in input order, components in reverse topological order),
a property test against a brute-force reachability reference, and the plans
of ``iterate()`` jobs: one loop, nested loops (one component), two loops in
one job, keyed feedback at parallelism > 1.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import eddyflow as ef
from eddyflow.graph.logical import Partitioning
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.graph.scc import strongly_connected_components

# -- a brute-force reference -----------------------------------------------------


def reach(vertices: Sequence[Hashable], edges: Sequence[tuple[Hashable, Hashable]]
          ) -> dict[Hashable, set[Hashable]]:
    """For each vertex, every vertex reachable from it (itself included)."""
    succ: dict[Hashable, list[Hashable]] = defaultdict(list)
    for u, w in edges:
        succ[u].append(w)
    out = {}
    for v in vertices:
        seen = {v}
        todo = [v]
        while todo:
            x = todo.pop()
            for w in succ[x]:
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        out[v] = seen
    return out


def reference_components(vertices: Sequence[Hashable],
                         edges: Sequence[tuple[Hashable, Hashable]]) -> set[frozenset[Hashable]]:
    r = reach(vertices, edges)
    return {frozenset(w for w in vertices if w in r[v] and v in r[w]) for v in vertices}


def check_output_shape(vertices: Sequence[Hashable], edges: Sequence[tuple[Hashable, Hashable]],
                       comps: list[list[Hashable]]) -> None:
    """Partition of the vertices, each component in input order, components in
    reverse topological order of the condensation."""
    flat = [v for c in comps for v in c]
    assert sorted(map(repr, flat)) == sorted(map(repr, vertices))
    assert len(flat) == len(set(flat))
    pos = {v: i for i, v in enumerate(vertices)}
    for c in comps:
        assert c, "no empty component"
        assert [pos[v] for v in c] == sorted(pos[v] for v in c)
    comp_of = {v: i for i, c in enumerate(comps) for v in c}
    for u, w in edges:
        if comp_of[u] != comp_of[w]:
            # Tarjan's order: a component comes after every component it reaches.
            assert comp_of[w] < comp_of[u], (u, w, comps)


def sccs(vertices: Sequence[Hashable], edges: Sequence[tuple[Hashable, Hashable]]
         ) -> set[frozenset[Hashable]]:
    comps = strongly_connected_components(vertices, edges)
    check_output_shape(vertices, edges, comps)
    return {frozenset(c) for c in comps}


# -- examples --------------------------------------------------------------------


def test_empty_graph() -> None:
    assert strongly_connected_components([], []) == []


def test_dag_every_vertex_alone() -> None:
    v = ["a", "b", "c", "d", "e"]
    e = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"), ("a", "e")]
    comps = strongly_connected_components(v, e)
    check_output_shape(v, e, comps)
    assert sorted(comps) == [[x] for x in v]
    # Reverse topological: the sink "e" first, the source "a" last.
    assert comps[0] == ["e"] and comps[-1] == ["a"]


def test_isolated_vertices_and_parallel_edges() -> None:
    v = [0, 1, 2]
    e = [(0, 1), (0, 1), (1, 0), (1, 0)]
    assert sccs(v, e) == {frozenset({0, 1}), frozenset({2})}


def test_self_loop_is_a_singleton_component() -> None:
    v = [0, 1, 2]
    e = [(0, 1), (1, 1), (1, 2)]
    assert sccs(v, e) == {frozenset({0}), frozenset({1}), frozenset({2})}


def test_simple_cycle() -> None:
    v = ["src", "head", "body", "out"]
    e = [("src", "head"), ("head", "body"), ("body", "head"), ("body", "out")]
    comps = strongly_connected_components(v, e)
    check_output_shape(v, e, comps)
    assert comps == [["out"], ["head", "body"], ["src"]]


def test_nested_cycles_form_one_component() -> None:
    # src -> H1 -> A -> H2 -> B -> H2 (inner) ; B -> X -> H1 (outer) ; X -> out
    v = ["src", "H1", "A", "H2", "B", "X", "out"]
    e = [("src", "H1"), ("H1", "A"), ("A", "H2"), ("H2", "B"), ("B", "H2"),
         ("B", "X"), ("X", "H1"), ("X", "out")]
    assert sccs(v, e) == {frozenset({"src"}), frozenset({"out"}),
                          frozenset({"H1", "A", "H2", "B", "X"})}


def test_disjoint_cycles_are_separate_components() -> None:
    # Two loops one after the other, and a third on a separate branch.
    v = list(range(10))
    e = [(0, 1), (1, 2), (2, 1), (2, 3), (3, 4), (4, 5), (5, 3), (5, 6),
         (0, 7), (7, 8), (8, 7), (8, 9)]
    assert sccs(v, e) == {frozenset({1, 2}), frozenset({3, 4, 5}), frozenset({7, 8}),
                          frozenset({0}), frozenset({6}), frozenset({9})}


def test_two_cycles_sharing_a_vertex_merge() -> None:
    v = ["a", "b", "c", "d"]
    e = [("a", "b"), ("b", "a"), ("b", "c"), ("c", "b"), ("c", "d")]
    assert sccs(v, e) == {frozenset({"a", "b", "c"}), frozenset({"d"})}


def test_vertex_order_in_components_follows_input_order() -> None:
    v = ["z", "y", "x", "w"]
    e = [("w", "x"), ("x", "y"), ("y", "z"), ("z", "w")]
    assert strongly_connected_components(v, e) == [["z", "y", "x", "w"]]


def test_deep_cycle_does_not_hit_the_recursion_limit() -> None:
    n = sys.getrecursionlimit() * 3
    v = list(range(n))
    e = [(i, i + 1) for i in range(n - 1)] + [(n - 1, 0)]
    assert strongly_connected_components(v, e) == [v]


def test_deep_chain_does_not_hit_the_recursion_limit() -> None:
    n = sys.getrecursionlimit() * 3
    v = list(range(n))
    e = [(i, i + 1) for i in range(n - 1)]
    comps = strongly_connected_components(v, e)
    assert comps == [[i] for i in reversed(v)]


def test_deterministic() -> None:
    v = list(range(8))
    e = [(0, 1), (1, 2), (2, 0), (3, 4), (4, 3), (2, 3), (5, 6), (6, 7), (7, 5), (1, 6)]
    first = strongly_connected_components(v, e)
    for _ in range(5):
        assert strongly_connected_components(v, e) == first


# -- property: agrees with brute force -------------------------------------------


@st.composite
def digraphs(draw: st.DrawFn) -> tuple[list[int], list[tuple[int, int]]]:
    n = draw(st.integers(0, 14))
    if n == 0:
        return [], []
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                          max_size=3 * n))
    vertices = draw(st.permutations(list(range(n))))
    return list(vertices), edges


@settings(max_examples=300, deadline=None)
@given(digraphs())
def test_matches_brute_force_reachability(graph: tuple[list[int], list[tuple[int, int]]]
                                          ) -> None:
    vertices, edges = graph
    assert sccs(vertices, edges) == reference_components(vertices, edges)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.data())
def test_cycles_joined_by_a_dag_edge_stay_apart(a: int, b: int, data: st.DataObject) -> None:
    """Two cycles with an edge from one to the other (never back) are two
    components; adding one edge back merges them."""
    first = [("p", i) for i in range(a)]
    second = [("q", i) for i in range(b)]
    edges = [(first[i], first[(i + 1) % a]) for i in range(a)]
    edges += [(second[i], second[(i + 1) % b]) for i in range(b)]
    x = data.draw(st.sampled_from(first))
    y = data.draw(st.sampled_from(second))
    edges.append((x, y))
    vertices = first + second
    assert sccs(vertices, edges) == {frozenset(first), frozenset(second)}
    edges.append((data.draw(st.sampled_from(second)), data.draw(st.sampled_from(first))))
    assert sccs(vertices, edges) == {frozenset(vertices)}


# -- loops in execution plans ----------------------------------------------------


def identity(x: Any) -> Any:
    return x


def uids(plan: ExecutionPlan, ids: frozenset[int]) -> set[str]:
    return {plan.graph.nodes[i].uid for i in ids}


def loop_of_exchanges(plan: ExecutionPlan) -> dict[tuple[str, str], tuple[bool, int | None]]:
    nodes = plan.graph.nodes
    return {(nodes[x.source_node].uid, nodes[x.target_node].uid): (x.back_edge, x.loop)
            for x in plan.exchanges}


def check_loop_invariants(plan: ExecutionPlan) -> None:
    """Every loop is a real SCC with a cycle; back-edges lie inside loops;
    ``ExchangeSpec.loop`` is set exactly when both ends are in one loop."""
    ids = [n.id for n in plan.graph.nodes]
    edges = [(e.source, e.target) for e in plan.graph.edges]
    comps = reference_components(ids, edges)
    self_loops = {u for u, w in edges if u == w}
    want = {c for c in comps if len(c) > 1 or next(iter(c)) in self_loops}
    assert set(plan.loops) == want
    assert len(plan.loops) == len(want)
    for i, loop in enumerate(plan.loops):
        for n in loop:
            assert plan.loop_of(n) == i
    for e in plan.back_edges:
        li = plan.loop_of(e.source)
        assert li is not None and plan.loop_of(e.target) == li
    for x in plan.exchanges:
        a, b = plan.loop_of(x.source_node), plan.loop_of(x.target_node)
        assert x.loop == (a if a is not None and a == b else None)
        if x.back_edge:
            assert x.loop is not None


def test_plan_without_loops() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    env.from_collection(range(3)).map(identity).key_by(identity).count().sink_to(ef.ListSink())
    plan = env.plan()
    check_loop_invariants(plan)
    assert plan.loops == ()
    assert all(x.loop is None and not x.back_edge for x in plan.exchanges)


def test_plan_single_loop() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    src = env.from_collection(range(3)).name("src")
    loop = src.iterate().name("head")
    body = loop.map(identity).name("body")
    loop.close_with(body.filter(identity).name("feedback"))
    body.filter(identity).name("exit").sink_to(ef.ListSink()).name("sink")
    plan = env.plan()
    check_loop_invariants(plan)
    assert [uids(plan, lp) for lp in plan.loops] == [{"head", "body", "feedback"}]
    assert plan.loop_of(plan.graph.node_by_uid("src").id) is None
    assert plan.loop_of(plan.graph.node_by_uid("exit").id) is None
    xs = loop_of_exchanges(plan)
    assert xs[("src", "head")] == (False, None)
    assert xs[("feedback", "head")] == (True, 0)
    assert xs[("body", "feedback")] == (False, 0)
    assert xs[("body", "exit")] == (False, None)
    # head -> body chains (one output, one input, parallelism 1): no exchange.
    assert ("head", "body") not in xs
    assert [(plan.graph.nodes[e.source].uid, plan.graph.nodes[e.target].uid)
            for e in plan.back_edges] == [("feedback", "head")]


def test_plan_nested_loops_are_one_loop() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    src = env.from_collection(range(3)).name("src")
    outer = src.iterate().name("outer")
    a = outer.map(identity).name("a")
    inner = a.iterate().name("inner")
    b = inner.map(identity).name("b")
    inner.close_with(b.filter(identity).name("fi"))
    ex = b.filter(identity).name("ex")
    outer.close_with(ex.filter(identity).name("fo"))
    ex.filter(identity).name("out").sink_to(ef.ListSink()).name("sink")
    plan = env.plan()
    check_loop_invariants(plan)
    assert [uids(plan, lp) for lp in plan.loops] == [
        {"outer", "a", "inner", "b", "fi", "ex", "fo"}]
    xs = loop_of_exchanges(plan)
    assert xs[("fi", "inner")] == (True, 0)
    assert xs[("fo", "outer")] == (True, 0)
    assert xs[("a", "inner")] == (False, 0)  # the inner head's regular input is in the loop
    assert xs[("src", "outer")] == (False, None)
    assert xs[("ex", "out")] == (False, None)
    assert len(plan.back_edges) == 2


def test_plan_two_loops_in_sequence_and_in_parallel() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    src = env.from_collection(range(3)).name("src")
    l1 = src.iterate().name("h1")
    b1 = l1.map(identity).name("b1")
    l1.close_with(b1.filter(identity).name("f1"))
    after1 = b1.filter(identity).name("x1")
    l2 = after1.iterate().name("h2")
    b2 = l2.map(identity).name("b2")
    l2.close_with(b2.filter(identity).name("f2"))
    b2.filter(identity).name("x2").sink_to(ef.ListSink()).name("sink2")
    # A third loop on its own branch from the same source.
    l3 = src.map(identity).name("m3").iterate().name("h3")
    b3 = l3.map(identity).name("b3")
    l3.close_with(b3)
    b3.filter(identity).name("x3").sink_to(ef.ListSink()).name("sink3")
    plan = env.plan()
    check_loop_invariants(plan)
    loops = [uids(plan, lp) for lp in plan.loops]
    assert sorted(map(sorted, loops)) == sorted(map(sorted, [
        {"h1", "b1", "f1"}, {"h2", "b2", "f2"}, {"h3", "b3"}]))
    xs = loop_of_exchanges(plan)
    i1 = plan.loop_of(plan.graph.node_by_uid("h1").id)
    i2 = plan.loop_of(plan.graph.node_by_uid("h2").id)
    i3 = plan.loop_of(plan.graph.node_by_uid("h3").id)
    assert len({i1, i2, i3}) == 3
    assert xs[("f1", "h1")] == (True, i1)
    assert xs[("f2", "h2")] == (True, i2)
    assert xs[("b3", "h3")] == (True, i3)
    assert xs[("x1", "h2")] == (False, None)  # between two loops: in neither


def test_plan_keyed_feedback_at_parallelism_3() -> None:
    env = ef.StreamEnvironment(parallelism=3)
    src = env.from_collection(range(3)).name("src")
    loop = src.iterate().name("head")
    body = loop.map(identity).name("body")
    loop.close_with(body.filter(identity).name("fb").key_by(identity))
    body.filter(identity).name("exit").sink_to(ef.ListSink()).name("sink")
    plan = env.plan()
    check_loop_invariants(plan)
    (back,) = [x for x in plan.exchanges if x.back_edge]
    assert back.partitioning is Partitioning.KEY_GROUP
    assert back.loop == 0
    assert plan.chains[back.target_chain].parallelism == 3


def test_plan_self_loop_via_close_with_itself() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    src = env.from_collection(range(3)).name("src")
    loop = src.iterate().name("head")
    loop.close_with(loop.filter(identity).name("fb"))
    loop.map(identity).name("exit").sink_to(ef.ListSink())
    plan = env.plan()
    check_loop_invariants(plan)
    assert [uids(plan, lp) for lp in plan.loops] == [{"head", "fb"}]
