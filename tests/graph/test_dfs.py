"""Tests of ``eddyflow.graph.dfs.classify_edges``: the DFS pass that finds the
back-edges ABS on cyclic graphs must not align on (DESIGN.md §3).

Covers DAGs (tree, forward and cross edges), self-loops, simple, nested and
disjoint cycles, parallel edges, very deep graphs (no recursion limit),
determinism, and property tests over random digraphs, including an exact
comparison with a straightforward recursive reference implementation.
"""

from __future__ import annotations

import sys
from collections import defaultdict, deque
from collections.abc import Hashable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyflow.graph.dfs import EdgeKind, classify_edges

TREE, FORWARD, BACK, CROSS = EdgeKind.TREE, EdgeKind.FORWARD, EdgeKind.BACK, EdgeKind.CROSS


# -- helpers -------------------------------------------------------------------


def is_acyclic(vertices: Sequence[Hashable], edges: Sequence[tuple[Hashable, Hashable]]) -> bool:
    """Kahn's topological sort: True iff every vertex can be ordered."""
    indeg = {v: 0 for v in vertices}
    succ: dict[Hashable, list[Hashable]] = defaultdict(list)
    for u, w in edges:
        succ[u].append(w)
        indeg[w] += 1
    ready = deque(v for v in vertices if indeg[v] == 0)
    ordered = 0
    while ready:
        v = ready.popleft()
        ordered += 1
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return ordered == len(vertices)


def without_back_edges(edges, kinds):
    return [e for e, k in zip(edges, kinds, strict=True) if k is not BACK]


def reachable(edges, start) -> set:
    succ = defaultdict(list)
    for u, w in edges:
        succ[u].append(w)
    seen = {start}
    todo = [start]
    while todo:
        v = todo.pop()
        for w in succ[v]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def reference_classify(vertices, edges, roots):
    """Textbook recursive DFS edge classification (CLRS colours + discovery
    times), visiting roots first, then vertices in order, successors in edge
    order. Only for small graphs."""
    out = defaultdict(list)
    for i, (u, _) in enumerate(edges):
        out[u].append(i)
    colour = dict.fromkeys(vertices, "white")
    disc: dict = {}
    kinds: list = [None] * len(edges)
    clock = [0]

    def visit(v):
        colour[v] = "grey"
        disc[v] = clock[0]
        clock[0] += 1
        for i in out[v]:
            w = edges[i][1]
            if colour[w] == "white":
                kinds[i] = TREE
                visit(w)
            elif colour[w] == "grey":
                kinds[i] = BACK
            elif disc[w] > disc[v]:
                kinds[i] = FORWARD
            else:
                kinds[i] = CROSS
        colour[v] = "black"

    for v in [*roots, *vertices]:
        if colour[v] == "white":
            visit(v)
    return kinds


# -- DAGs ----------------------------------------------------------------------


def test_empty_graph() -> None:
    assert classify_edges([], [], []) == []
    assert classify_edges(["a"], [], ["a"]) == []


def test_chain_is_all_tree_edges() -> None:
    vs = ["a", "b", "c", "d"]
    es = [("a", "b"), ("b", "c"), ("c", "d")]
    assert classify_edges(vs, es, ["a"]) == [TREE, TREE, TREE]


def test_diamond_with_forward_and_cross_edges() -> None:
    #   a -> b -> d,  a -> c -> d,  a -> d
    vs = ["a", "b", "c", "d"]
    es = [("a", "b"), ("b", "d"), ("a", "c"), ("c", "d"), ("a", "d")]
    kinds = classify_edges(vs, es, ["a"])
    # d is first reached through b; when c is explored d is finished and was
    # discovered before c: a cross edge. a -> d reaches a finished descendant
    # of a: a forward edge.
    assert kinds == [TREE, TREE, TREE, CROSS, FORWARD]
    assert BACK not in kinds


def test_forward_edge_to_grandchild() -> None:
    vs = [0, 1, 2]
    es = [(0, 1), (1, 2), (0, 2)]
    assert classify_edges(vs, es, [0]) == [TREE, TREE, FORWARD]


def test_multiple_sources_cross_edge_between_trees() -> None:
    # Two sources; the second reaches a vertex the first already finished.
    vs = ["s1", "s2", "m", "k"]
    es = [("s1", "m"), ("m", "k"), ("s2", "m"), ("s2", "k")]
    kinds = classify_edges(vs, es, ["s1", "s2"])
    assert kinds == [TREE, TREE, CROSS, CROSS]


def test_vertices_not_reached_from_roots_are_still_classified() -> None:
    # 'x' is not reachable from the root: the search restarts from it.
    vs = ["a", "b", "x"]
    es = [("a", "b"), ("x", "b"), ("x", "x")]
    assert classify_edges(vs, es, ["a"]) == [TREE, CROSS, BACK]


def test_roots_default_to_vertex_order() -> None:
    vs = ["a", "b", "c"]
    es = [("a", "b"), ("b", "c"), ("c", "a")]
    assert classify_edges(vs, es) == [TREE, TREE, BACK]
    # Starting from c: c->a and a->b are tree edges, b->c closes the cycle.
    assert classify_edges(["c", "a", "b"], es) == [TREE, BACK, TREE]


# -- cycles --------------------------------------------------------------------


def test_self_loop_is_back_edge() -> None:
    assert classify_edges(["a"], [("a", "a")], ["a"]) == [BACK]
    vs = ["s", "a", "t"]
    es = [("s", "a"), ("a", "a"), ("a", "t")]
    assert classify_edges(vs, es, ["s"]) == [TREE, BACK, TREE]


def test_simple_cycle_back_edge_closes_it() -> None:
    vs = ["src", "head", "body", "sink"]
    es = [("src", "head"), ("head", "body"), ("body", "head"), ("body", "sink")]
    kinds = classify_edges(vs, es, ["src"])
    assert kinds == [TREE, TREE, BACK, TREE]


def test_which_edge_is_back_depends_on_the_root() -> None:
    vs = ["a", "b"]
    es = [("a", "b"), ("b", "a")]
    assert classify_edges(vs, es, ["a"]) == [TREE, BACK]
    assert classify_edges(vs, es, ["b"]) == [BACK, TREE]


def test_nested_cycles() -> None:
    # Outer loop h1 -> h2 -> x -> h1, inner loop h2 -> x -> h2.
    vs = ["s", "h1", "h2", "x", "out"]
    es = [
        ("s", "h1"),
        ("h1", "h2"),
        ("h2", "x"),
        ("x", "h2"),  # inner feedback
        ("x", "h1"),  # outer feedback
        ("x", "out"),
    ]
    kinds = classify_edges(vs, es, ["s"])
    assert kinds == [TREE, TREE, TREE, BACK, BACK, TREE]
    assert is_acyclic(vs, without_back_edges(es, kinds))


def test_multiple_disjoint_cycles() -> None:
    vs = ["s", "a1", "a2", "b1", "b2", "b3", "t"]
    es = [
        ("s", "a1"),
        ("a1", "a2"),
        ("a2", "a1"),
        ("s", "b1"),
        ("b1", "b2"),
        ("b2", "b3"),
        ("b3", "b1"),
        ("a2", "t"),
        ("b3", "t"),
    ]
    kinds = classify_edges(vs, es, ["s"])
    assert [i for i, k in enumerate(kinds) if k is BACK] == [2, 6]
    assert kinds[8] is CROSS  # t finished under a2 before b3 is explored
    assert is_acyclic(vs, without_back_edges(es, kinds))


def test_parallel_edges_are_classified_one_by_one() -> None:
    vs = ["a", "b"]
    es = [("a", "b"), ("a", "b"), ("b", "a"), ("b", "a")]
    kinds = classify_edges(vs, es, ["a"])
    # The first a->b discovers b; the second reaches a finished descendant.
    assert kinds == [TREE, FORWARD, BACK, BACK]


def test_parallel_self_loops() -> None:
    assert classify_edges(["a"], [("a", "a")] * 3, ["a"]) == [BACK] * 3


def test_vertices_may_be_any_hashable() -> None:
    vs = [("op", 1), ("op", 2), None]
    es = [(("op", 1), ("op", 2)), (("op", 2), None), (None, ("op", 1))]
    assert classify_edges(vs, es, [("op", 1)]) == [TREE, TREE, BACK]


# -- input validation ----------------------------------------------------------


def test_unknown_vertex_in_edge_raises() -> None:
    with pytest.raises(ValueError, match=r"edge 1 \('b' -> 'zz'\) names an unknown vertex"):
        classify_edges(["a", "b"], [("a", "b"), ("b", "zz")], ["a"])


def test_duplicate_vertex_raises() -> None:
    with pytest.raises(ValueError, match="duplicate vertex"):
        classify_edges(["a", "a"], [], [])


# -- deep graphs ---------------------------------------------------------------


N_DEEP = 10_000


def test_deep_chain_does_not_recurse() -> None:
    assert sys.getrecursionlimit() < N_DEEP * 2  # the test means something
    vs = list(range(N_DEEP))
    es = [(i, i + 1) for i in range(N_DEEP - 1)]
    assert classify_edges(vs, es, [0]) == [TREE] * (N_DEEP - 1)


def test_deep_cycle_has_exactly_one_back_edge() -> None:
    vs = list(range(N_DEEP))
    es = [(i, i + 1) for i in range(N_DEEP - 1)] + [(N_DEEP - 1, 0)]
    kinds = classify_edges(vs, es, [0])
    assert kinds[-1] is BACK
    assert kinds.count(BACK) == 1
    assert kinds.count(TREE) == N_DEEP - 1


def test_deep_chain_with_shortcuts_and_feedback() -> None:
    vs = list(range(N_DEEP))
    es = [(i, i + 1) for i in range(N_DEEP - 1)]
    es += [(i, i + 2) for i in range(0, N_DEEP - 2, 7)]  # forward shortcuts
    es += [(i, i - 3) for i in range(3, N_DEEP, 11)]  # feedback edges
    kinds = classify_edges(vs, es, [0])
    n_chain = N_DEEP - 1
    n_short = len(range(0, N_DEEP - 2, 7))
    assert kinds[:n_chain] == [TREE] * n_chain
    assert kinds[n_chain : n_chain + n_short] == [FORWARD] * n_short
    assert set(kinds[n_chain + n_short :]) == {BACK}
    assert is_acyclic(vs, without_back_edges(es, kinds))


def test_deep_chain_given_in_reverse_vertex_order() -> None:
    # The search starts from the last vertex of the chain first (no roots):
    # every edge then points to an already finished vertex.
    vs = list(range(N_DEEP))[::-1]
    es = [(i, i + 1) for i in range(N_DEEP - 1)]
    kinds = classify_edges(vs, es)
    assert kinds == [CROSS] * (N_DEEP - 1)


# -- determinism ---------------------------------------------------------------


def test_deterministic_across_calls() -> None:
    vs = [f"v{i}" for i in range(50)]
    es = [(f"v{i}", f"v{(i * 7 + 3) % 50}") for i in range(50)]
    es += [(f"v{i}", f"v{(i * 13 + 1) % 50}") for i in range(50)]
    first = classify_edges(vs, es, ["v0", "v17"])
    for _ in range(5):
        assert classify_edges(list(vs), list(es), ["v0", "v17"]) == first


def test_deterministic_across_hash_seeds() -> None:
    # Vertices are strings, whose hash() differs per process: the answer
    # must not depend on set or dict iteration order tied to hash().
    import json
    import os
    import subprocess

    code = (
        "import json;from eddyflow.graph.dfs import classify_edges as c;"
        "vs=[f'v{i}' for i in range(40)];"
        "es=[(f'v{i}',f'v{(i*7+3)%40}') for i in range(40)]"
        "+[(f'v{i}',f'v{(i*11+5)%40}') for i in range(40)];"
        "print(json.dumps([k.value for k in c(vs,es,['v3'])]))"
    )
    outs = set()
    for seed in ("0", "1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.add(proc.stdout.strip())
    assert len(outs) == 1
    vs = [f"v{i}" for i in range(40)]
    es = [(f"v{i}", f"v{(i * 7 + 3) % 40}") for i in range(40)]
    es += [(f"v{i}", f"v{(i * 11 + 5) % 40}") for i in range(40)]
    assert json.loads(outs.pop()) == [k.value for k in classify_edges(vs, es, ["v3"])]


# -- properties over random digraphs --------------------------------------------


@st.composite
def digraphs(draw):
    n = draw(st.integers(min_value=1, max_value=12))
    vertices = list(range(n))
    edges = draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
            max_size=3 * n,
        )
    )
    roots = draw(st.lists(st.integers(0, n - 1), max_size=3))
    order = draw(st.permutations(vertices))
    return list(order), edges, roots


@st.composite
def dags(draw):
    # Edges only go from a lower to a higher rank: acyclic by construction;
    # the vertex order given to the DFS is shuffled.
    n = draw(st.integers(min_value=1, max_value=12))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), max_size=3 * n)) if pairs else []
    order = draw(st.permutations(list(range(n))))
    roots = draw(st.lists(st.integers(0, n - 1), max_size=3))
    return list(order), edges, roots


PROPS = settings(max_examples=200, deadline=None)


@PROPS
@given(digraphs())
def test_property_removing_back_edges_leaves_a_dag(g) -> None:
    vs, es, roots = g
    kinds = classify_edges(vs, es, roots)
    assert len(kinds) == len(es)
    # (a) and (b): every cycle contains a BACK edge <=> G \ L is acyclic.
    assert is_acyclic(vs, without_back_edges(es, kinds))
    # Every self-loop is a back edge.
    for (u, w), k in zip(es, kinds, strict=True):
        if u == w:
            assert k is BACK


@PROPS
@given(digraphs())
def test_property_back_edges_close_cycles(g) -> None:
    # Conversely, a BACK edge u -> w lies on a cycle: w reaches u.
    vs, es, roots = g
    kinds = classify_edges(vs, es, roots)
    for (u, w), k in zip(es, kinds, strict=True):
        if k is BACK:
            assert u in reachable(es, w)


@PROPS
@given(dags())
def test_property_dag_has_no_back_edge(g) -> None:
    vs, es, roots = g
    assert is_acyclic(vs, es)
    # (c)
    assert BACK not in classify_edges(vs, es, roots)


@PROPS
@given(digraphs())
def test_property_tree_edges_form_a_forest(g) -> None:
    vs, es, roots = g
    kinds = classify_edges(vs, es, roots)
    tree = [e for e, k in zip(es, kinds, strict=True) if k is TREE]
    # (d) at most one incoming TREE edge per vertex, no cycle among them.
    incoming = defaultdict(int)
    for _, w in tree:
        incoming[w] += 1
    assert all(c == 1 for c in incoming.values())
    assert is_acyclic(vs, tree)
    # Every vertex is discovered: one tree per DFS start.
    n_trees = len(vs) - len(tree)
    assert n_trees >= 1
    # A root no earlier root reaches starts a tree of its own.
    for i, r in enumerate(roots):
        if not any(r in reachable(es, q) for q in roots[:i]):
            assert incoming[r] == 0, (r, roots)
    # The first start has no incoming TREE edge, whatever its in-edges.
    first = roots[0] if roots else vs[0]
    assert incoming[first] == 0


@PROPS
@given(digraphs())
def test_property_matches_recursive_reference(g) -> None:
    vs, es, roots = g
    assert classify_edges(vs, es, roots) == reference_classify(vs, es, roots)


@PROPS
@given(digraphs())
def test_property_deterministic(g) -> None:
    vs, es, roots = g
    assert classify_edges(vs, es, roots) == classify_edges(list(vs), list(es), list(roots))
