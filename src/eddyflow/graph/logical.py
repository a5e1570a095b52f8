"""The logical graph a job's DataStream calls build: operators and edges.

A node is one operator at its chosen parallelism; its ``payload`` is whatever
the runtime needs to instantiate it (user functions, sinks, sources). The
graph never looks inside a payload, which keeps it free of runtime imports.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Edge", "LogicalGraph", "Node", "Partitioning"]


class Partitioning(enum.Enum):
    DEFAULT = "default"  # forward when parallelisms match, else rebalance
    FORWARD = "forward"  # subtask i -> subtask i
    REBALANCE = "rebalance"  # round-robin over all downstream subtasks
    KEY_GROUP = "key_group"  # stable hash of the key -> key group -> subtask
    BROADCAST = "broadcast"  # every record to every downstream subtask


@dataclass
class Node:
    id: int
    uid: str
    kind: str
    payload: Any
    parallelism: int | None = None
    is_source: bool = False
    is_sink: bool = False
    keyed: bool = False  # owns keyed state: parallelism must not exceed max_parallelism
    max_source_parallelism: int | None = None  # e.g. 1 for a non-parallel source
    named: bool = False  # uid chosen by the user through .name()


@dataclass
class Edge:
    id: int
    source: int
    target: int
    partitioning: Partitioning = Partitioning.DEFAULT
    key_fn: Callable[[Any], Any] | None = None
    feedback: bool = False  # declared by close_with(); the DFS still decides


@dataclass
class LogicalGraph:
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)

    def add_node(
        self, kind: str, payload: Any, *, uid: str | None = None, **attrs: Any
    ) -> Node:
        node_id = len(self.nodes)
        node = Node(id=node_id, uid=uid or f"{kind}-{node_id}", kind=kind, payload=payload, **attrs)
        self.nodes.append(node)
        return node

    def add_edge(
        self,
        source: int,
        target: int,
        partitioning: Partitioning = Partitioning.DEFAULT,
        key_fn: Callable[[Any], Any] | None = None,
        *,
        feedback: bool = False,
    ) -> Edge:
        edge = Edge(len(self.edges), source, target, partitioning, key_fn, feedback)
        self.edges.append(edge)
        return edge

    def inputs(self, node_id: int) -> list[Edge]:
        return [e for e in self.edges if e.target == node_id]

    def outputs(self, node_id: int) -> list[Edge]:
        return [e for e in self.edges if e.source == node_id]

    def node_by_uid(self, uid: str) -> Node:
        for n in self.nodes:
            if n.uid == uid:
                return n
        raise KeyError(uid)
