"""The logical dataflow graph, its depth-first edge classification and the
execution plan (parallel instances, partitioners, operator chains).

Pure data and pure functions: nothing here knows about asyncio or the
runtime, so the plan can be built, inspected and tested on its own, and the
offline (Spark) jobs can read a job's shape without running it.
"""

from eddyflow.graph.dfs import EdgeKind, classify_edges
from eddyflow.graph.logical import Edge, LogicalGraph, Node, Partitioning
from eddyflow.graph.plan import ChainSpec, ExchangeSpec, ExecutionPlan, build_plan

__all__ = [
    "ChainSpec",
    "Edge",
    "EdgeKind",
    "ExchangeSpec",
    "ExecutionPlan",
    "LogicalGraph",
    "Node",
    "Partitioning",
    "build_plan",
    "classify_edges",
]
