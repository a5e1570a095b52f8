"""Strongly connected components (Tarjan's algorithm, iterative).

A loop of a cyclic job is a strongly connected component with more than one
vertex, or a vertex with a self-loop. Termination of a bounded iterative job
is decided per component: it is empty when no record is in flight on any
edge inside it (docs/concepts/cycles.md, Termination). Nested loops fall into one
component, which is what termination needs: the inner loop cannot end before
the outer one stops feeding it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

__all__ = ["strongly_connected_components"]

V = TypeVar("V", bound=Hashable)


def strongly_connected_components(
    vertices: Sequence[V], edges: Sequence[tuple[V, V]]
) -> list[list[V]]:
    """The components, each a list of vertices in input order; components in
    reverse topological order (Tarjan's), singletons included."""
    index_of = {v: i for i, v in enumerate(vertices)}
    succ: list[list[int]] = [[] for _ in vertices]
    for a, b in edges:
        succ[index_of[a]].append(index_of[b])
    n = len(vertices)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    out: list[list[V]] = []
    counter = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work: list[tuple[int, int]] = [(root, 0)]
        while work:
            v, pos = work[-1]
            if pos == 0 and index[v] < 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            if pos < len(succ[v]):
                work[-1] = (v, pos + 1)
                w = succ[v][pos]
                if index[w] < 0:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp.append(w)
                    if w == v:
                        break
                out.append([vertices[i] for i in sorted(comp)])
    return out
