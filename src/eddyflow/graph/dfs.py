"""Depth-first classification of the edges of a directed graph.

ABS on cyclic graphs (docs/concepts/cycles.md) aligns barriers on the graph without its
back-edges; this pass finds them. It is the textbook DFS edge classification
(tree, forward, cross, back), run iteratively so that deep graphs do not hit
Python's recursion limit, and deterministic: roots and successors are visited
in the order given, so the same job always yields the same back-edges.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from typing import TypeVar

__all__ = ["EdgeKind", "classify_edges"]

V = TypeVar("V", bound=Hashable)


class EdgeKind(enum.Enum):
    TREE = "tree"  # discovered a new vertex
    FORWARD = "forward"  # to a descendant already discovered
    BACK = "back"  # to a vertex on the DFS stack: closes a cycle
    CROSS = "cross"  # to a finished vertex in another subtree


def classify_edges(
    vertices: Sequence[V],
    edges: Sequence[tuple[V, V]],
    roots: Sequence[V] = (),
) -> list[EdgeKind]:
    """Classify every edge of the graph; returns one kind per edge, in order.

    The search starts from ``roots`` (the sources) in order, then from any
    vertex still unvisited, in the order of ``vertices``. Parallel edges are
    classified one by one; a self-loop is a back-edge. Removing the edges
    classified ``BACK`` leaves a DAG.
    """
    index = {v: i for i, v in enumerate(vertices)}
    if len(index) != len(vertices):
        raise ValueError("duplicate vertex")
    out: list[list[int]] = [[] for _ in vertices]
    for e, (src, dst) in enumerate(edges):
        if src not in index or dst not in index:
            raise ValueError(f"edge {e} ({src!r} -> {dst!r}) names an unknown vertex")
        out[index[src]].append(e)

    kinds: list[EdgeKind | None] = [None] * len(edges)
    discovered = [-1] * len(vertices)
    on_stack = [False] * len(vertices)
    clock = 0

    starts: list[int] = [index[r] for r in roots] + list(range(len(vertices)))
    for start in starts:
        if discovered[start] >= 0:
            continue
        discovered[start] = clock
        clock += 1
        on_stack[start] = True
        # Each frame: (vertex, position in its out-edge list).
        stack: list[tuple[int, int]] = [(start, 0)]
        while stack:
            v, pos = stack[-1]
            if pos == len(out[v]):
                stack.pop()
                on_stack[v] = False
                continue
            stack[-1] = (v, pos + 1)
            e = out[v][pos]
            w = index[edges[e][1]]
            if discovered[w] < 0:
                kinds[e] = EdgeKind.TREE
                discovered[w] = clock
                clock += 1
                on_stack[w] = True
                stack.append((w, 0))
            elif on_stack[w]:
                kinds[e] = EdgeKind.BACK
            elif discovered[w] > discovered[v]:
                kinds[e] = EdgeKind.FORWARD
            else:
                kinds[e] = EdgeKind.CROSS
    result = [k for k in kinds if k is not None]
    assert len(result) == len(edges)
    return result
