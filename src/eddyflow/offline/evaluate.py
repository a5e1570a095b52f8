"""Batch evaluation of a job's logical graph on Spark RDDs.

Each operator becomes RDD transformations over ``(tag, record)`` pairs. The
*tag* is a tuple of ints that orders records the way one streaming channel
does: ``(source node, source subtask, sequence number, output index, …)``.
Where an operator is order-sensitive — every keyed operator: its state is a
fold over the key's records — each key's records are processed in tag order,
which is the order the streaming run saw whenever the key's records came
through a single source subtask. (Records from several source subtasks reach
a key interleaved by timing; the batch run takes them subtask by subtask, so a
keyed function whose state depends on that interleaving cannot be checked
exactly — nor can the streaming run promise one.)

Keyed operators run the runtime's own operator code (the specs' operators,
on a memory backend holding all key groups of a Spark partition), so the
batch semantics cannot drift from the streaming ones. Records are partitioned
by key group — the stable hash the runtime uses — never by Python's ``hash``.

Loops (strongly connected components) are iterated in rounds until no record
comes back round any back-edge; keyed state inside a loop is carried from one
round to the next. Once a loop's records in flight and state are few, its
remaining rounds run on the driver (``localrdd.py``): a Spark round costs
about a second of scheduling however little it does.

A missing input is ``None`` (statically empty), so a run that replays no
source (only a checkpoint's back-edge logs) evaluates only what those reach.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from eddyflow.graph.dfs import EdgeKind
from eddyflow.graph.logical import Edge
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.keygroups import key_group_for
from eddyflow.offline.broadcast_replay import ElementsOnly, element_key, replay_broadcast, side_of
from eddyflow.offline.localrdd import LocalContext, to_local, to_spark
from eddyflow.runtime.operators.async_calls import MapAsyncSpec
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.runtime.operators.broadcast import BroadcastSpec
from eddyflow.runtime.operators.co_process import CoProcessSpec
from eddyflow.runtime.operators.io import SinkSpec
from eddyflow.runtime.operators.keyed import KeyedCountSpec, KeyedSpec
from eddyflow.runtime.operators.side_outputs import MainOutputSpec, SideOutputSpec, SideRecord
from eddyflow.runtime.operators.stateless import FilterSpec, FlatMapSpec, IterationHeadSpec, MapSpec
from eddyflow.runtime.operators.timestamps import AssignTimestampsSpec
from eddyflow.runtime.operators.windows import WindowSpec
from eddyflow.state.memory import MemoryStateBackend

__all__ = ["MAX_ROUNDS", "Evaluation", "evaluate"]

#: Records in flight plus keyed state entries of a loop below which its
#: remaining rounds run on the driver (localrdd.py).
LOCAL_LIMIT = 200_000

#: Rounds a loop may take before the evaluation gives up (a loop that never
#: empties would never terminate in the streaming run either).
MAX_ROUNDS = 10_000

STATELESS_SPECS = (MapSpec, FilterSpec, FlatMapSpec, IterationHeadSpec, AssignTimestampsSpec,
                   MainOutputSpec, SideOutputSpec, CoProcessSpec)

#: A keyed operator's event time at the checkpoint: ``(key groups of an old
#: subtask, its watermark)`` for each old subtask that recorded one.
Watermarks = list[tuple[range, float]]

#: Tags of what event-time operators emit when the replay advances their
#: watermark: after every record's (tags start with a source node id).
_FIRED = 1 << 62

RDD = Any  # pyspark.RDD, untyped


@dataclass
class Evaluation:
    """What one evaluation produced."""

    #: uid -> RDD of ``(key_group, (state, kind, key, value))``
    state: dict[str, RDD] = field(default_factory=dict)
    #: uid -> why the operator (and so its state) could not be evaluated
    unreplayed: dict[str, str] = field(default_factory=dict)
    rounds: dict[int, int] = field(default_factory=dict)  # loop index -> rounds taken


# -- per-partition work (runs on executors) ------------------------------------


def _stateless(spec: Any) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """Items are ``(tag, record)``, or ``(tag, record, timestamp)`` once a
    timestamp assigner has run: the one-to-one operators keep the
    timestamp, as in the streaming run."""
    if isinstance(spec, MapSpec):
        fn = spec.fn

        def run_map(items: Iterable[Any]) -> Iterator[Any]:
            for item in items:
                yield (item[0], fn(item[1]), *item[2:])
        return run_map
    if isinstance(spec, FilterSpec):
        pred = spec.fn

        def run_filter(items: Iterable[Any]) -> Iterator[Any]:
            for item in items:
                if pred(item[1]):
                    yield item
        return run_filter
    if isinstance(spec, FlatMapSpec):
        many = spec.fn

        def run_flat_map(items: Iterable[Any]) -> Iterator[Any]:
            for item in items:
                for i, out in enumerate(many(item[1])):
                    yield ((*item[0], i), out, *item[2:])
        return run_flat_map
    if isinstance(spec, AssignTimestampsSpec):
        extract = spec.strategy.timestamp

        def run_stamp(items: Iterable[Any]) -> Iterator[Any]:
            for item in items:
                yield item[0], item[1], extract(item[1])
        return run_stamp
    if isinstance(spec, MainOutputSpec | SideOutputSpec):
        tag = spec.tag.name if isinstance(spec, SideOutputSpec) else None

        def run_select(items: Iterable[Any]) -> Iterator[Any]:
            for item in items:
                r = item[1]
                side = type(r) is SideRecord
                if tag is None and not side:
                    yield item
                elif tag is not None and side and r.tag == tag:
                    yield (item[0], r.value, *item[2:])
        return run_select
    if isinstance(spec, CoProcessSpec):
        return _co_process(spec)
    assert isinstance(spec, IterationHeadSpec)
    return iter


def _co_process(spec: CoProcessSpec) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """A co-process function without keys (no state): record by record."""
    def run_co(items: Iterable[Any]) -> Iterator[Any]:
        op = spec.instantiate(OperatorContext("co-process", 0, 1, 1, MemoryStateBackend()))
        op.open()
        try:
            for item in items:
                stamped = len(item) > 2
                outs, stamps = op.process_ts([item[1]], [item[2]] if stamped else None)
                for i, out in enumerate(outs):
                    yield ((*item[0], i), out, stamps[i]) if stamps else ((*item[0], i), out)
        finally:
            op.close()
    return run_co


def _key_records(key_fn: Callable[[Any], Any], max_parallelism: int
                 ) -> Callable[[Iterable[Any]], Iterator[Any]]:
    def run(items: Iterable[Any]) -> Iterator[Any]:
        for item in items:
            r = item[1]
            k = key_fn(r)
            yield key_group_for(k, max_parallelism), (
                "r", k, item[0], r, item[2] if len(item) > 2 else None)
    return run


def _watermark_of(watermarks: Watermarks, kg: int) -> float:
    for groups, w in watermarks:
        if kg in groups:
            return w
    return -math.inf


def _keyed(spec: Any, uid: str, max_parallelism: int, want_outputs: bool,
           watermarks: Watermarks | None = None) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """One Spark partition of a keyed operator: restore the partition's
    state, fold each key's records in tag order, emit the outputs (``("o",
    tag, record, timestamp)``) and the final state (``("s", key_group,
    (state, key, value))``).

    Event time: each record is handled under the watermark ``-inf`` (none is
    late), then the watermark advances to what the checkpoint recorded for
    the key's group (``watermarks``), firing the timers and windows it had
    fired. That is the streaming run's state when no record reached the
    operator behind its watermark. A record that did (dropped as late, or
    joining a window again within the allowed lateness) changes only
    windows the watermark has purged since, except a session it would join
    to a purged one (its key then shows as a mismatch); a process function
    whose state depends on whether a timer fired before a later record
    cannot be replayed exactly either."""

    def run(items: Iterable[Any]) -> Iterator[Any]:
        by_group: dict[float, tuple[list[Any], dict[Any, list[Any]]]] = {}
        kinds: dict[str, str] = {}
        # Every key arrives with its key group (records and restored state
        # alike): kept, so that the state written out is not hashed again.
        group_of: dict[Any, int] = {}
        for kg, item in items:
            w = -math.inf if watermarks is None else _watermark_of(watermarks, kg)
            group = by_group.get(w)
            if group is None:
                group = by_group[w] = ([], collections.defaultdict(list))
            restored, by_key = group
            if item[0] == "r":
                by_key[item[1]].append((item[2], item[3], item[4]))
                group_of[item[1]] = kg
            else:
                _, name, kind, key, value = item
                kinds[name] = kind
                restored.append((name, key, value))
                group_of[key] = kg
        fired = 0
        # One operator per watermark: the timers of one group of keys must
        # not fire at another's watermark.
        for w, (restored, by_key) in sorted(by_group.items()):
            ctx = OperatorContext(uid, 0, 1, max_parallelism, MemoryStateBackend())
            op = spec.instantiate(ctx)
            op.open()
            try:
                backend = getattr(op, "backend", None)
                assert backend is not None
                if restored:
                    backend.restore(kinds, restored)
                    timers = getattr(op, "timers", None)
                    if timers is not None:
                        timers.rebuild()
                for recs in by_key.values():
                    recs.sort(key=lambda tr: tr[0])
                    if any(ts is not None for _, _, ts in recs):
                        for tag, r, ts in recs:
                            outs, stamps = op.process_ts([r], [ts])
                            if want_outputs:
                                for i, out in enumerate(outs):
                                    yield ("o", (*tag, i), out,
                                           None if stamps is None else stamps[i])
                    elif op.one_to_one:
                        outs = op.process([r for _, r, _ in recs])
                        if want_outputs:
                            for (tag, _, _), out in zip(recs, outs, strict=True):
                                yield "o", tag, out, None
                    else:
                        for tag, r, _ in recs:
                            for i, out in enumerate(op.process([r])):
                                if want_outputs:
                                    yield "o", (*tag, i), out, None
                if w > op.watermark:
                    op.watermark = w
                    fire = op.on_watermark(w)
                    stamps = getattr(fire, "timestamps", None)
                    if want_outputs:
                        for i, out in enumerate(fire):
                            yield ("o", (_FIRED, fired), out,
                                   None if stamps is None else stamps[i])
                            fired += 1
                kinds_now = backend.kinds
                for name, table in backend.tables().items():
                    kind = kinds_now[name]
                    for key, value in table.items():
                        kg = group_of.get(key)
                        if kg is None:  # a key only the operator's own code made
                            kg = key_group_for(key, max_parallelism)
                        yield "s", kg, (name, kind, key, value)
            finally:
                op.close()
    return run


def _count_partial(key_fn: Callable[[Any], Any], max_parallelism: int
                   ) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """Map-side combine of a count whose running counts nobody downstream
    needs: a word count's 10M words become one record per word and partition."""
    def run(items: Iterable[Any]) -> Iterator[Any]:
        counts: collections.Counter[Any] = collections.Counter()
        for item in items:
            counts[key_fn(item[1])] += 1
        for k, n in counts.items():
            # Tagged like every item of the merge: a bare (key, n) whose key
            # is "s" once passed for restored state.
            yield key_group_for(k, max_parallelism), ("p", k, n)
    return run


def _merge_counts(items: Iterable[Any]) -> Iterator[Any]:
    """Partial counts and restored counts of one partition, summed per key:
    ``(key_group, ("count", "value", key, total))``."""
    totals: dict[Any, list[int]] = {}
    for kg, item in items:
        if item[0] == "s":  # restored state: ("s", name, kind, key, value)
            key, n = item[3], item[4]
        else:  # a partial count: ("p", key, n)
            _, key, n = item
        total = totals.get(key)
        if total is None:
            totals[key] = [kg, n]
        else:
            total[1] += n
    for key, (kg, n) in totals.items():
        yield kg, ("count", "value", key, n)


# -- the graph -----------------------------------------------------------------


class _Evaluator:
    def __init__(self, sc: Any, plan: ExecutionPlan, partitions: int,
                 watermarks: dict[str, Watermarks]) -> None:
        self.sc = sc
        self.watermarks = watermarks
        self.plan = plan
        self.graph = plan.graph
        self.mp = plan.max_parallelism
        self.partitions = partitions
        self.result = Evaluation()
        self.back = {e.id for e in plan.graph.edges if plan.edge_kinds[e.id] is EdgeKind.BACK}
        # Persisted RDDs of this evaluation, released by the caller.
        self.persisted: list[RDD] = []

    def union(self, rdds: Iterable[RDD | None]) -> RDD | None:
        parts = [r for r in rdds if r is not None]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else self.sc.union(parts)

    def wants_outputs(self, node_id: int) -> bool:
        return any(not isinstance(self.graph.nodes[e.target].payload, SinkSpec)
                   for e in self.graph.outputs(node_id))

    def blocked(self, node_id: int, why: str) -> None:
        """``node_id`` cannot be evaluated; nor can anything downstream of it."""
        todo = [node_id]
        seen = set()
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            node = self.graph.nodes[n]
            reason = why if n == node_id else f"downstream of '{self.graph.nodes[node_id].uid}'"
            if not isinstance(node.payload, SinkSpec):
                self.result.unreplayed.setdefault(node.uid, reason)
            todo.extend(e.target for e in self.graph.outputs(n))

    def node(self, node_id: int, inputs: RDD | None, state: RDD | None
             ) -> tuple[RDD | None, RDD | None]:
        """Evaluate one node: its outputs and, for a keyed one, its state
        (``(key_group, (state, kind, key, value))``)."""
        node = self.graph.nodes[node_id]
        spec = node.payload
        if node.uid in self.result.unreplayed:
            return None, None
        if isinstance(spec, SinkSpec):
            return None, None
        if isinstance(spec, STATELESS_SPECS):
            return (None if inputs is None
                    else inputs.mapPartitions(_stateless(spec), preservesPartitioning=True)), None
        if isinstance(spec, MapAsyncSpec):
            # Its results come from an external system at the time of the
            # call, and the records it had in flight at the checkpoint are
            # in no downstream state yet: a replay would be a guess.
            self.blocked(node_id, f"map_async '{node.uid}' is not replayed offline: its results "
                         "come from calls to an external system when the job ran")
            return None, None
        if not isinstance(spec, KeyedSpec):
            self.blocked(node_id, f"cannot replay a {type(spec).__name__} in batch")
            return None, None
        if isinstance(spec, WindowSpec) and not spec.assigner.is_event_time:
            self.blocked(node_id, "processing-time windows depend on the wall clock")
            return None, None
        if isinstance(spec, BroadcastSpec):
            return self.broadcast(node_id, spec, inputs, state)
        return self.keyed(node_id, spec, inputs, state)

    def broadcast(self, node_id: int, spec: BroadcastSpec, inputs: RDD | None,
                  state: RDD | None) -> tuple[RDD | None, RDD | None]:
        """A broadcast function: its broadcast side on the driver, then its
        elements like any keyed operator's (``broadcast_replay.py``)."""
        node, name = self.graph.nodes[node_id], spec.name
        records = [] if inputs is None else inputs.filter(lambda it: side_of(it) == 1).collect()
        given = [] if state is None else state.filter(lambda kv: kv[1][0] == name).collect()
        final, rows, fired = replay_broadcast(spec, node.uid, self.mp,
                                              self.plan.parallelism[node_id], records, given)
        others = None if state is None else state.filter(lambda kv: kv[1][0] != name)
        elements = None if inputs is None else inputs.filter(lambda it: side_of(it) == 0)
        outputs, states = self.keyed(node_id, ElementsOnly(element_key(spec), spec, final),
                                     elements, others)
        fired_rdd = self.sc.parallelize([_output(("o", *f)) for f in fired]) if fired else None
        return (self.union([outputs, fired_rdd]),
                self.union([states, self.sc.parallelize(rows, 1)]))

    def keyed(self, node_id: int, spec: KeyedSpec, inputs: RDD | None, state: RDD | None
              ) -> tuple[RDD | None, RDD | None]:
        """A keyed operator: each key's records in tag order, from its state."""
        node = self.graph.nodes[node_id]
        restored = None
        if state is not None:
            restored = state.map(lambda kv: (kv[0], ("s", *kv[1])))
        if inputs is None:
            # No records reach it: its state is what it started with.
            return None, state
        want = self.wants_outputs(node_id)
        if isinstance(spec, KeyedCountSpec) and not want:
            partial = inputs.mapPartitions(_count_partial(spec.key_fn, self.mp))
            return None, _union_of(self.union([partial, restored])).partitionBy(
                self.partitions, _identity).mapPartitions(_merge_counts, True)
        keyed_in = inputs.mapPartitions(_key_records(spec.key_fn, self.mp))
        both = _union_of(self.union([keyed_in, restored])).partitionBy(self.partitions, _identity)
        run = both.mapPartitions(
            _keyed(spec, node.uid, self.mp, want, self.watermarks.get(node.uid)), True)
        if want:
            run = run.persist()
            self.persisted.append(run)
        outputs = run.filter(lambda t: t[0] == "o").map(_output) if want else None
        states = run.filter(lambda t: t[0] == "s").map(lambda t: (t[1], t[2]))
        return outputs, states


def _output(t: tuple[Any, ...]) -> tuple[Any, ...]:
    """``("o", tag, record, timestamp)`` as an item (the timestamp only if any)."""
    return (t[1], t[2]) if t[3] is None else (t[1], t[2], t[3])


def _union_of(rdd: RDD | None) -> RDD:
    assert rdd is not None  # one of its parts always is
    return rdd


def _identity(kg: int) -> int:
    return kg


def _topological(items: Iterable[Any], edges: Iterable[tuple[Any, Any]]) -> list[Any]:
    """``items`` in a topological order of ``edges`` (Kahn's algorithm; the
    smallest ready item first, so the order is deterministic)."""
    succ: dict[Any, set[Any]] = collections.defaultdict(set)
    indeg: dict[Any, int] = dict.fromkeys(items, 0)
    for a, b in edges:
        if a != b and b not in succ[a]:
            succ[a].add(b)
            indeg[b] += 1
    order = []
    ready = sorted(c for c, d in indeg.items() if d == 0)
    while ready:
        c = ready.pop(0)
        order.append(c)
        for d in succ[c]:
            indeg[d] -= 1
            if indeg[d] == 0:
                ready.append(d)
        ready.sort()
    return order


def _components(plan: ExecutionPlan) -> list[tuple[str, int]]:
    """Nodes and loops in a topological order of the graph's condensation."""
    comp: dict[int, tuple[str, int]] = {}
    for i, loop in enumerate(plan.loops):
        for n in loop:
            comp[n] = ("loop", i)
    for node in plan.graph.nodes:
        comp.setdefault(node.id, ("node", node.id))
    return _topological(set(comp.values()),
                        ((comp[e.source], comp[e.target]) for e in plan.graph.edges))


def _loop_order(plan: ExecutionPlan, loop: frozenset[int], back: set[int]) -> list[int]:
    """The loop's nodes in topological order of its forward edges."""
    return _topological(loop, ((e.source, e.target) for e in plan.graph.edges
                               if e.source in loop and e.target in loop and e.id not in back))


def evaluate(sc: Any, plan: ExecutionPlan, sources: dict[int, RDD], *,
             initial_state: dict[str, RDD] | None = None,
             feedback: dict[int, RDD] | None = None,
             channel_state: dict[int, RDD] | None = None,
             unreplayed: dict[str, str] | None = None,
             watermarks: dict[str, Watermarks] | None = None,
             partitions: int = 8) -> tuple[Evaluation, list[RDD]]:
    """Evaluate ``plan`` with the records of ``sources`` (node id -> tagged
    RDD), starting from ``initial_state`` (uid -> state RDD) and with
    ``feedback`` (loop head node id -> tagged RDD) entering the loops' heads
    in their first round and ``channel_state`` (node id -> tagged RDD, an
    unaligned checkpoint's channel state) entering nodes before anything
    else reaches them; event-time operators end at ``watermarks`` (uid
    -> key groups and watermark, what the checkpoint recorded). Returns the
    evaluation and the RDDs it persisted (unpersist them when done)."""
    ev = _Evaluator(sc, plan, partitions, dict(watermarks or {}))
    for uid, why in (unreplayed or {}).items():
        ev.blocked(plan.graph.node_by_uid(uid).id, why)
    initial = dict(initial_state or {})
    feedback = dict(feedback or {})
    entering = dict(channel_state or {})
    out: dict[int, RDD | None] = {}
    graph = plan.graph

    def inputs_of(n: int, edges: Iterable[Edge]) -> RDD | None:
        # A node's in-flight records (channel state) join its first input.
        return ev.union([entering.pop(n, None), *(out.get(e.source) for e in edges)])

    for kind, c in _components(plan):
        if kind == "node":
            node = graph.nodes[c]
            if node.is_source:
                out[c] = None if node.uid in ev.result.unreplayed else sources.get(c)
                continue
            outputs, state = ev.node(c, inputs_of(c, graph.inputs(c)),
                                     initial.get(node.uid))
            out[c] = outputs
            if state is not None:
                ev.result.state[node.uid] = state
            elif isinstance(node.payload, KeyedSpec) and node.uid in initial:
                ev.result.state[node.uid] = initial[node.uid]
            continue
        loop = plan.loops[c]
        order = _loop_order(plan, loop, ev.back)
        external = {n: inputs_of(n, [e for e in graph.inputs(n) if e.source not in loop])
                    for n in loop}
        state = {graph.nodes[n].uid: initial.get(graph.nodes[n].uid) for n in loop}
        carry: dict[int, RDD | None] = {n: feedback.get(n) for n in loop}
        leaving: dict[int, list[RDD]] = collections.defaultdict(list)
        rounds = 0
        local = False
        while True:
            this: dict[int, RDD | None] = {}
            for n in order:
                inner = [e for e in graph.inputs(n)
                         if e.source in loop and e.id not in ev.back]
                records = ev.union([external[n] if rounds == 0 else None, carry.get(n),
                                    *(this.get(e.source) for e in inner)])
                uid = graph.nodes[n].uid
                outputs, new_state = ev.node(n, records, state.get(uid))
                this[n] = outputs
                if new_state is not None:
                    new_state = new_state.persist()
                    ev.persisted.append(new_state)
                    state[uid] = new_state
                if outputs is not None and any(e.target not in loop
                                               for e in graph.outputs(n)):
                    outputs = outputs.persist()
                    ev.persisted.append(outputs)
                    this[n] = outputs
                    leaving[n].append(outputs)
            carry = {}
            for e in graph.edges:
                if e.id in ev.back and e.source in loop and this.get(e.source) is not None:
                    carry[e.target] = ev.union([carry.get(e.target), this[e.source]])
            in_flight = 0
            for n, rdd in list(carry.items()):
                if rdd is None:
                    continue
                rdd = rdd.persist()
                ev.persisted.append(rdd)
                carry[n] = rdd
                in_flight += rdd.count()
            alive = in_flight > 0
            if alive and not local and in_flight < LOCAL_LIMIT:
                held = sum(r.count() for r in state.values() if r is not None)
                if in_flight + held < LOCAL_LIMIT:
                    # Few records left round a small loop: finish it on the driver.
                    local = True
                    ev.sc = LocalContext()
                    carry = {n: None if r is None else to_local(r) for n, r in carry.items()}
                    state = {u: None if r is None else to_local(r) for u, r in state.items()}
            rounds += 1
            if not alive:
                break
            if rounds >= MAX_ROUNDS:
                raise RuntimeError(f"loop {sorted(graph.nodes[n].uid for n in loop)} still "
                                   f"has records in flight after {MAX_ROUNDS} rounds")
        ev.result.rounds[c] = rounds
        ev.sc = sc
        for n in loop:
            out[n] = ev.union([to_spark(sc, r) for r in leaving.get(n, [])])
            uid = graph.nodes[n].uid
            if state.get(uid) is not None:
                ev.result.state[uid] = to_spark(sc, state[uid])
    return ev.result, ev.persisted
