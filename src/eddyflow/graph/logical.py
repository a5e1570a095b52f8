"""The logical graph a job's DataStream calls build: operators and edges.

A node is one operator at its chosen parallelism; its ``payload`` is whatever
the runtime needs to instantiate it (user functions, sinks, sources). The
graph never looks inside a payload, which keeps it free of runtime imports.

A node's ``uid`` is its identity in checkpoints: the name ``.name()`` gives
it, or else one generated from a stable description of its place in the
graph (:meth:`LogicalGraph.generated_uid`, as Flink hashes its operator
ids): its kind, what it reads (the uids of its inputs when it was added,
with their partitioning), a description of a source or sink, and its
ordinal among the operators with all of these equal. So adding an
operator that is not upstream of another (a side branch, a sink, a whole
new pipeline) leaves that other's uid as it was, and a job restores its
own checkpoints at any parallelism; a changed upstream chain changes the
uid, and the restore's strict state matching then refuses what would
otherwise be restored into the wrong operator.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Iterable
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
    #: Owns keyed state, so its parallelism must not exceed max_parallelism:
    #: ``DataStream`` sets it from the payload (whether it is a ``KeyedSpec``).
    keyed: bool = False
    max_source_parallelism: int | None = None  # e.g. 1 for a non-parallel source
    named: bool = False  # uid chosen by the user through .name()
    #: Runs at the parallelism of that node (a two-input operator's ``tag``
    #: operators follow their producers, so that they chain to them), unless
    #: its own is set.
    parallelism_of: int | None = None
    #: What a generated uid is derived from (``LogicalGraph.generated_uid``);
    #: kept, whatever the uid is now, to number later operators that share it.
    signature: str = ""
    #: Starts a task of its own: nothing chains into it (``map_async``,
    #: whose task must read a gate to wait on its calls' completions).
    chain_head: bool = False


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

    def generated_uid(self, kind: str, inputs: Iterable[tuple[int, Partitioning]] = (),
                      detail: str = "") -> tuple[str, str]:
        """The uid an unnamed operator of ``kind`` reading ``inputs`` (node
        id, partitioning) would get if added now, and the signature it is
        derived from. ``detail`` describes a source or sink (its ``name``,
        e.g. ``file:words.txt``), which has no inputs to tell it apart.

        Nothing here depends on the order in which unrelated operators were
        added, or on parallelism: only on the operator's own description
        and on how many operators with the same one were added before it.
        Feedback edges (``close_with``) are added after their head, so they
        never take part: no uid depends on itself.
        """
        reads = sorted([self.nodes[s].uid, p.value] for s, p in inputs)  # union order is moot
        signature = json.dumps([kind, detail, reads], separators=(",", ":"))
        ordinal = sum(1 for n in self.nodes if n.signature == signature)
        digest = hashlib.sha256(f"{signature}#{ordinal}".encode()).hexdigest()
        taken = {n.uid for n in self.nodes}
        # 32 bits keep it readable; on the (unlikely) clash with an earlier
        # operator, the newcomer takes a longer digest, so that the earlier
        # one keeps its uid.
        for width in range(8, len(digest) + 1, 4):
            uid = f"{kind}-{digest[:width]}"
            if uid not in taken:
                return uid, signature
        raise AssertionError("no free uid")  # pragma: no cover - 256 bits are distinct

    def add_node(
        self, kind: str, payload: Any, *, uid: str | None = None,
        inputs: Iterable[tuple[int, Partitioning]] = (), detail: str = "", **attrs: Any
    ) -> Node:
        """Add an operator; ``uid`` if given, else one generated from
        ``kind``, ``inputs`` and ``detail`` (:meth:`generated_uid`). The
        caller adds the edges of ``inputs``."""
        generated, signature = self.generated_uid(kind, inputs, detail)
        node = Node(id=len(self.nodes), uid=uid or generated, kind=kind, payload=payload,
                    signature=signature, **attrs)
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
