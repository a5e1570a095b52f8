"""The execution plan: which operators chain into one task, how many parallel
instances each task has, and which exchanges (partitioned channels) connect
the tasks.

Chaining (docs/architecture/index.md): consecutive operators joined by a forward edge with
equal parallelism run in one task and pass batches by plain function calls,
never through a channel. With parallelism 1 on both sides every partitioning
degenerates to forward (there is only one subtask to send to), so such edges
chain too. Back-edges never chain: they are where barriers are logged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eddyflow.graph.dfs import EdgeKind, classify_edges
from eddyflow.graph.logical import Edge, LogicalGraph, Node, Partitioning
from eddyflow.graph.scc import strongly_connected_components

__all__ = ["ChainSpec", "ExchangeSpec", "ExecutionPlan", "build_plan"]


@dataclass(frozen=True)
class ChainSpec:
    """One task: operators that run in a single coroutine per subtask."""

    index: int
    node_ids: tuple[int, ...]
    parallelism: int
    name: str  # the uids of its operators, joined by " -> "


@dataclass(frozen=True)
class ExchangeSpec:
    """The channels of one logical edge between two chains."""

    edge_id: int
    source_chain: int
    target_chain: int
    source_node: int
    target_node: int
    partitioning: Partitioning  # never DEFAULT: resolved here
    key_fn: Callable[[Any], Any] | None
    back_edge: bool
    #: Index into ``ExecutionPlan.loops`` when both ends are in the same loop:
    #: its records count as in flight round that loop (termination).
    loop: int | None = None


@dataclass(frozen=True)
class ExecutionPlan:
    graph: LogicalGraph
    parallelism: dict[int, int]  # node id -> resolved parallelism
    max_parallelism: int
    edge_kinds: tuple[EdgeKind, ...]  # by edge id
    chains: tuple[ChainSpec, ...]
    exchanges: tuple[ExchangeSpec, ...]
    chain_of: dict[int, int]  # node id -> chain index
    #: The loops: strongly connected components that contain a cycle (node ids).
    loops: tuple[frozenset[int], ...] = ()

    def loop_of(self, node_id: int) -> int | None:
        for i, loop in enumerate(self.loops):
            if node_id in loop:
                return i
        return None

    @property
    def back_edges(self) -> tuple[Edge, ...]:
        return tuple(e for e in self.graph.edges if self.edge_kinds[e.id] is EdgeKind.BACK)

    def describe(self) -> str:
        """A readable summary: one line per task, one per exchange."""
        lines = [f"task {c.index} x{c.parallelism}: {c.name}" for c in self.chains]
        for x in self.exchanges:
            kind = "back-edge " if x.back_edge else ""
            lines.append(
                f"{kind}exchange {x.source_chain} -> {x.target_chain} ({x.partitioning.value})"
            )
        return "\n".join(lines)


def _resolve_parallelism(
    node: Node, default_parallelism: int, max_parallelism: int
) -> int:
    p = node.parallelism if node.parallelism is not None else default_parallelism
    if node.max_source_parallelism is not None:
        p = min(p, node.max_source_parallelism)
    if p < 1:
        raise ValueError(f"operator '{node.uid}': parallelism must be >= 1, got {p}")
    if node.keyed and p > max_parallelism:
        raise ValueError(
            f"operator '{node.uid}': parallelism {p} exceeds max_parallelism {max_parallelism}"
        )
    return p


def _refuse_indistinguishable(graph: LogicalGraph) -> None:
    """Unnamed operators that hold state in checkpoints (sources, keyed
    operators, sinks) and have the same description (kind, inputs, source or
    sink name) are told apart only by the order they were declared in:
    declaring another one ahead of them would hand one's checkpointed state
    to the other without a word. Such operators must be named."""
    groups: dict[str, list[str]] = {}
    for n in graph.nodes:
        if not n.named and n.signature and (n.is_source or n.keyed or n.is_sink):
            groups.setdefault(n.signature, []).append(n.uid)
    clashes = [uids for uids in groups.values() if len(uids) > 1]
    if clashes:
        listed = "; ".join(" and ".join(f"'{u}'" for u in uids) for uids in clashes)
        raise ValueError(
            f"operators {listed} hold checkpointed state and are described alike (same "
            "kind, inputs and source or sink): give each a name with .name(...), so that "
            "a restore maps their state by name, not by the order they were declared in")


def build_plan(
    graph: LogicalGraph,
    default_parallelism: int,
    max_parallelism: int,
    *,
    chaining: bool = True,
) -> ExecutionPlan:
    """Resolve parallelism and partitioning, find back-edges, form chains."""
    if not graph.nodes:
        raise ValueError("the job has no operators")
    uids = [n.uid for n in graph.nodes]
    dupes = sorted({u for u in uids if uids.count(u) > 1})
    if dupes:
        raise ValueError(f"operator names must be unique; used more than once: {dupes}")
    _refuse_indistinguishable(graph)
    if not any(n.is_source for n in graph.nodes):
        raise ValueError("the job has no source")
    if not any(n.is_sink for n in graph.nodes):
        raise ValueError("the job has no sink: add sink_to(...) or print()")

    par: dict[int, int] = {}
    for n in graph.nodes:  # a node follows only earlier ones (``parallelism_of``)
        follows = n.parallelism_of
        par[n.id] = (par[follows] if follows is not None and n.parallelism is None
                     else _resolve_parallelism(n, default_parallelism, max_parallelism))
    for n in graph.nodes:
        if not n.is_source and not graph.inputs(n.id):
            raise ValueError(f"operator '{n.uid}' has no input")

    kinds = classify_edges(
        [n.id for n in graph.nodes],
        [(e.source, e.target) for e in graph.edges],
        [n.id for n in graph.nodes if n.is_source],
    )

    def resolved(e: Edge) -> Partitioning:
        p_up, p_down = par[e.source], par[e.target]
        part = e.partitioning
        if part is Partitioning.DEFAULT:
            part = Partitioning.FORWARD if p_up == p_down else Partitioning.REBALANCE
        if part is Partitioning.FORWARD and p_up != p_down:
            src, dst = graph.nodes[e.source].uid, graph.nodes[e.target].uid
            raise ValueError(
                f"forward edge '{src}' -> '{dst}' needs equal parallelism, got {p_up} and {p_down}"
            )
        return part

    parts = {e.id: resolved(e) for e in graph.edges}

    def chainable(e: Edge) -> bool:
        if not chaining or kinds[e.id] is EdgeKind.BACK or e.source == e.target:
            return False
        if graph.nodes[e.target].chain_head:
            return False
        if len(graph.outputs(e.source)) != 1 or len(graph.inputs(e.target)) != 1:
            return False
        if par[e.source] != par[e.target]:
            return False
        return parts[e.id] is Partitioning.FORWARD or par[e.source] == 1

    chained_in = {e.target: e for e in graph.edges if chainable(e)}
    chained_out = {e.source: e for e in chained_in.values()}
    chains: list[ChainSpec] = []
    chain_of: dict[int, int] = {}
    for n in graph.nodes:
        if n.id in chained_in:
            continue  # not a chain head
        ids = [n.id]
        while ids[-1] in chained_out:
            ids.append(chained_out[ids[-1]].target)
        idx = len(chains)
        for i in ids:
            chain_of[i] = idx
        chains.append(
            ChainSpec(idx, tuple(ids), par[n.id], " -> ".join(graph.nodes[i].uid for i in ids))
        )
    # A cycle made only of chainable edges has no head; chainable() excludes
    # back-edges, so every cycle has a head, but check rather than assume.
    missing = [graph.nodes[i].uid for i in range(len(graph.nodes)) if i not in chain_of]
    if missing:
        raise AssertionError(f"operators left out of every chain: {missing}")

    components = strongly_connected_components(
        [n.id for n in graph.nodes], [(e.source, e.target) for e in graph.edges]
    )
    self_loops = {e.source for e in graph.edges if e.source == e.target}
    loops = tuple(
        frozenset(c) for c in sorted(components, key=min) if len(c) > 1 or c[0] in self_loops
    )
    loop_index = {n: i for i, loop in enumerate(loops) for n in loop}

    def loop_of_edge(e: Edge) -> int | None:
        i = loop_index.get(e.source)
        return i if i is not None and loop_index.get(e.target) == i else None

    exchanges = tuple(
        ExchangeSpec(
            edge_id=e.id,
            source_chain=chain_of[e.source],
            target_chain=chain_of[e.target],
            source_node=e.source,
            target_node=e.target,
            partitioning=parts[e.id],
            key_fn=e.key_fn,
            back_edge=kinds[e.id] is EdgeKind.BACK,
            loop=loop_of_edge(e),
        )
        for e in graph.edges
        if e.target not in chained_in or chained_in[e.target] is not e
    )
    return ExecutionPlan(
        graph=graph,
        parallelism=par,
        max_parallelism=max_parallelism,
        edge_kinds=tuple(kinds),
        chains=tuple(chains),
        exchanges=exchanges,
        chain_of=chain_of,
        loops=loops,
    )
