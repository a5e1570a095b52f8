"""Proving a checkpoint consistent: replay the job in Spark and compare.

``validate`` loads the job file's ``build(env)``, replays every source from
its beginning up to the position the checkpoint recorded for it, evaluates
the job's operators in batch (``evaluate.py``) and compares the keyed state
it arrives at — what exactly-once processing of that input prefix must give
— with the checkpoint's, key by key: nothing lost, nothing counted twice.

A history that started from a *bootstrapped* checkpoint (``bootstrap.py``)
did not start from empty state: the rows it was bootstrapped with are part
of its input. They are recorded in that checkpoint as they were given
(``CheckpointMetadata.bootstrap``), and the replay starts from them: its
operators' state before the first record is those rows, partitioned here by
key group, not read from the state files under test. So a bootstrapped
checkpoint validates when its state files hold exactly the rows given (in
the right key groups), and a later checkpoint of a job restored from it
when its state is those rows run forward with the input up to its
positions. The bootstrapped checkpoint is found by following the
checkpoint's ``base`` (the checkpoint of another folder its history was
restored from) through checkpoints of its lineage.

For a loop the checkpoint is more than its operators' state: records that
were round the loop when it was taken are in its head's back-edge log, and a
restore feeds them back in. So the snapshot's side of the comparison is the
snapshot state *run forward* with the back-edge logs until the loops are
empty (with no new input), and the replay's side runs the input prefix until
the loops are empty. A consistent snapshot makes both the same.

User functions travel to the executors with Spark's cloudpickle, by value
for the job file and the modules beside it (the executors need not have the
job file on their path); eddyflow and the modules the job imports from its
folder are shipped to them (``shipping.py``): they need not have eddyflow
installed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from eddyflow.checkpoint.handles import StateFile
from eddyflow.checkpoint.layout import CheckpointLayout
from eddyflow.checkpoint.metadata import BootstrapInput
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage
from eddyflow.connectors.splits import RestoredSplit, SplitSource, checkpointed_splits
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.jobfile import build_environment
from eddyflow.keygroups import key_group_range
from eddyflow.offline.checkpoint import CheckpointRef, open_checkpoint
from eddyflow.offline.errors import spark_errors
from eddyflow.offline.evaluate import Watermarks, evaluate
from eddyflow.offline.readers import (
    as_text,
    backedge_rdd,
    channel_state_exchanges,
    channel_state_rdd,
    state_rdd,
)
from eddyflow.offline.replay import replay_split, replay_splits
from eddyflow.offline.shipping import ship_to_executors
from eddyflow.runtime.operators.io import SourceSpec
from eddyflow.runtime.operators.keyed import KeyedSpec
from eddyflow.state.format import read_state_file
from eddyflow.state.ttl import base_kind, has_ttl, unwrap

__all__ = ["ValidationReport", "validate"]

MISMATCH_COLUMNS = ("operator", "state", "key", "expected", "actual")

log = logging.getLogger("eddyflow.offline")


@dataclass
class ValidationReport:
    """The outcome of :func:`validate`."""

    checkpoint: str
    checkpoint_id: int
    #: Every replayable operator's state matches and none was left out.
    ok: bool
    #: ``operator, state, key, expected, actual`` (text) of every entry that
    #: differs; ``expected`` or ``actual`` is null for a missing entry.
    mismatches: Any
    mismatch_count: int
    #: State entries compared (the union of both sides' keys).
    compared: int
    #: Keyed operators whose state was compared.
    operators: list[str]
    #: Operators that could not be replayed, with the reason; their state is
    #: not vouched for.
    unreplayed: dict[str, str] = field(default_factory=dict)
    #: Source records replayed, per source operator.
    records_replayed: dict[str, int] = field(default_factory=dict)
    #: Rounds each loop took, replay side.
    loop_rounds: list[int] = field(default_factory=list)
    #: The rows the replay started from, per bootstrapped operator and
    #: state (``"<operator>/<state>"``), and the checkpoint that recorded
    #: them: the history's bootstrap (see the module docstring).
    bootstrapped: dict[str, tuple[int, str]] = field(default_factory=dict)

    def first_mismatches(self, n: int = 20) -> list[tuple[Any, ...]]:
        rows = self.mismatches.orderBy("operator", "state", "key").limit(n).collect()
        return [tuple(r) for r in rows]


def _replay(source: Any, uid: str, node_id: int, parallelism: int,
            positions: dict[int, Any], counter: Any) -> Any:
    def run(subtask: int) -> Iterator[tuple[tuple[int, ...], Any]]:
        seq = 0
        for batch in replay_split(source, uid, subtask, parallelism, positions[subtask]):
            for r in batch:
                yield (node_id, subtask, seq), r
                seq += 1
        counter.add(seq)
    return run


def _replay_splits(source: SplitSource, uid: str, node_id: int, splits: list[RestoredSplit],
                   counter: Any) -> Any:
    """As :func:`_replay`, for a split source: one Spark partition per split
    the checkpoint recorded (over all subtasks, whatever the parallelism)."""
    def run(i: int) -> Iterator[tuple[tuple[int, ...], Any]]:
        seq = 0
        for batch in replay_splits(source, uid, [splits[i]]):
            for r in batch:
                yield (node_id, i, seq), r
                seq += 1
        counter.add(seq)
    return run


def _watermarks(ref: CheckpointRef) -> dict[str, Watermarks]:
    """Each operator's event time at the checkpoint, by the key groups of
    the subtask that recorded it: the replay advances to it."""
    mp = ref.meta.max_parallelism
    out: dict[str, Watermarks] = {}
    for uid, op in ref.meta.operators.items():
        for s, part in sorted(op.subtasks.items()):
            if part.watermark is not None:
                out.setdefault(uid, []).append(
                    (key_group_range(s, mp, op.parallelism), part.watermark))
    return out


def _compare(items: Iterable[Any]) -> Iterator[tuple[str | None, ...] | int]:
    """One partition of key groups: pair expected and actual entries; yield
    the mismatches as text rows, then the number of entries compared."""
    sides: dict[tuple[str, str, Any], list[Any]] = {}
    missing = object()
    for _, (side, uid, name, key, value) in items:
        pair = sides.setdefault((uid, name, key), [missing, missing])
        pair[0 if side == "e" else 1] = value
    for (uid, name, key), (expected, actual) in sides.items():
        if expected is missing or actual is missing or expected != actual:
            yield (uid, name, as_text(key),
                   None if expected is missing else as_text(expected),
                   None if actual is missing else as_text(actual))
    yield len(sides)


def _comparable(kind: str, value: Any) -> Any:
    """List state compares as a multiset: a key's list is in arrival order,
    and records from several channels arrive interleaved by timing, so no
    replay can promise the streaming run's order (each channel's own order
    is kept, but not how channels interleave). A state with a TTL compares
    its values without their write times: those are processing time, which
    no replay reproduces (nor which entries expired: see docs/architecture/state.md)."""
    if has_ttl(kind):
        value = unwrap(kind, value)
        kind = base_kind(kind)
    if kind == "list" and isinstance(value, list):
        return sorted(value, key=repr)
    return value


def _sided(side: str, uid: str) -> Any:
    return lambda kv: (kv[0], (side, uid, kv[1][0], kv[1][2], _comparable(kv[1][1], kv[1][3])))


def validate(spark: Any, chk: str | os.PathLike[str] | CheckpointRef, *,
             job: str | os.PathLike[str], checkpoint: int | None = None,
             partitions: int | None = None) -> ValidationReport:
    """Validate checkpoint ``chk`` (a ``chk-<n>`` folder, or a checkpoint
    directory with ``checkpoint`` or the latest) against the job file
    ``job``. See the module docstring for what is compared.

    A Spark task that fails raises the error it raised on its executor
    (``CheckpointCorrupted`` for a state file that does not verify,
    ``ReplayError``; another as ``SparkTaskFailed``), not Spark's wrapper of
    it (see ``offline/errors.py``)."""
    with spark_errors():
        return _validate(spark, chk, job=job, checkpoint=checkpoint, partitions=partitions)


def _validate(spark: Any, chk: str | os.PathLike[str] | CheckpointRef, *,
              job: str | os.PathLike[str], checkpoint: int | None,
              partitions: int | None) -> ValidationReport:
    from pyspark.sql import types as T

    ref = chk if isinstance(chk, CheckpointRef) else open_checkpoint(chk, checkpoint)
    sc = spark.sparkContext
    env, module = build_environment(job)
    ship_to_executors(spark, job=module, checkpoint=ref)
    meta_ops = ref.meta.operators
    plan: ExecutionPlan = env.plan()
    mp = ref.meta.max_parallelism
    plan = dataclasses.replace(plan, max_parallelism=mp)
    parts = partitions or max(2, min(mp, 4 * sc.defaultParallelism))

    sources: dict[int, Any] = {}
    unreplayed: dict[str, str] = {}
    counters: dict[str, Any] = {}
    for node in plan.graph.nodes:
        if not node.is_source:
            continue
        assert isinstance(node.payload, SourceSpec)
        src = node.payload.source
        op = meta_ops.get(node.uid)
        if op is None:
            unreplayed[node.uid] = (f"source '{node.uid}' is not in checkpoint {ref.id} "
                                    f"(it has {sorted(meta_ops)})")
            continue
        if not src.replayable:
            unreplayed[node.uid] = f"source '{node.uid}' ({type(src).__name__}) is not replayable"
            continue
        counters[node.uid] = sc.accumulator(0)
        if isinstance(src, SplitSource):
            try:
                splits = checkpointed_splits(src, node.uid, op)
            except ValueError as exc:
                unreplayed[node.uid] = str(exc)
                continue
            n = max(1, len(splits))
            sources[node.id] = sc.parallelize(range(len(splits)), n).flatMap(
                _replay_splits(src, node.uid, node.id, splits, counters[node.uid]))
            continue
        p = op.parallelism
        positions = {s: part.position for s, part in op.subtasks.items()}
        sources[node.id] = sc.parallelize(range(p), p).flatMap(
            _replay(src, node.uid, node.id, p, positions, counters[node.uid]))

    persisted: list[Any] = []
    inputs = bootstrap_inputs(ref)
    try:
        given = _bootstrapped_state(sc, ref, plan, inputs)
        expected, kept = evaluate(sc, plan, sources, initial_state=given, unreplayed=unreplayed,
                                  watermarks=_watermarks(ref), partitions=parts)
        persisted += kept
        keyed_uids = sorted(u for u, op in meta_ops.items()
                            if any(p.keyed is not None for p in op.subtasks.values()))
        # One RDD per operator over its own files: filtering one RDD of every
        # file would read all of them again for each operator.
        # Stored form: a state with a TTL is restored with its write times.
        initial = {uid: state_rdd(sc, ref, uid, raw=True).map(lambda t: (t[0], t[1][2:]))
                   for uid in keyed_uids}
        logged = [p.backedge.records for op in meta_ops.values()
                  for p in op.subtasks.values() if p.backedge is not None]
        in_channels = sum(p.channel_state.records for op in meta_ops.values()
                          for p in op.subtasks.values() if p.channel_state is not None)
        if sum(logged) or in_channels:
            # Run the snapshot forward with its in-flight records.
            node_ids = {n.uid: n.id for n in plan.graph.nodes}
            in_flight = _in_flight(sc, ref, node_ids, unreplayed) if in_channels else {}
            feedback: dict[int, Any] = {}
            for uid in {u for u, op in meta_ops.items()
                        if any(p.backedge is not None for p in op.subtasks.values())}:
                if uid not in node_ids:
                    unreplayed[uid] = f"loop head '{uid}' of the checkpoint is not in the job"
                    continue
                nid = node_ids[uid]
                feedback[nid] = backedge_rdd(sc, ref, uid).map(
                    lambda t, n=nid: ((n, t[1], t[2], t[3]), t[4]))
            actual, kept = evaluate(sc, plan, {}, initial_state=initial, feedback=feedback,
                                    channel_state=in_flight, unreplayed=unreplayed,
                                    partitions=parts)
            persisted += kept
            actual_state = actual.state
        else:
            actual_state = initial

        skip = set(expected.unreplayed)
        graph_keyed = {n.uid for n in plan.graph.nodes if isinstance(n.payload, KeyedSpec)}
        compared_uids = sorted((graph_keyed | set(keyed_uids)) - skip)
        sided = [expected.state[u].map(_sided("e", u)) for u in compared_uids
                 if u in expected.state]
        sided += [actual_state[u].map(_sided("a", u)) for u in compared_uids
                  if u in actual_state]
        if sided:
            rows = sc.union(sided).partitionBy(parts, lambda kg: kg).mapPartitions(_compare)
            rows = rows.persist()
            persisted.append(rows)
            compared = rows.filter(lambda r: isinstance(r, int)).sum()
            mismatch_rows = rows.filter(lambda r: not isinstance(r, int))
        else:
            compared = 0
            mismatch_rows = sc.emptyRDD()
        schema = T.StructType([T.StructField(c, T.StringType(), c in ("expected", "actual"))
                               for c in MISMATCH_COLUMNS])
        mismatches = spark.createDataFrame(mismatch_rows, schema).cache()
        count = mismatches.count()
    finally:
        for rdd in persisted:
            rdd.unpersist()
    unreplayed_all = dict(expected.unreplayed)
    unreplayed_all.update(unreplayed)
    vouched = [u for u in unreplayed_all if u in graph_keyed or u in keyed_uids]
    return ValidationReport(
        checkpoint=ref.path,
        checkpoint_id=ref.id,
        ok=count == 0 and not vouched,
        mismatches=mismatches,
        mismatch_count=count,
        compared=int(compared),
        operators=compared_uids,
        unreplayed=unreplayed_all,
        records_replayed={u: int(c.value) for u, c in counters.items()},
        loop_rounds=[expected.rounds[i] for i in sorted(expected.rounds)],
        bootstrapped={f"{b.operator}/{b.state}": (b.rows, path) for path, b in inputs},
    )



def bootstrap_inputs(ref: CheckpointRef) -> list[tuple[str, BootstrapInput]]:
    """The state the history of ``ref`` was bootstrapped with, with the
    checkpoint folder that recorded it (its files are under that folder's
    storage root): ``ref``'s own, or that of the
    checkpoint its history was restored from (``base``), and so on back,
    through checkpoints of its lineage. None for a history that started
    from empty state. A base that is gone or does not verify cannot tell:
    logged, and taken as not bootstrapped (its state then shows as
    mismatches, not as a silent pass)."""
    seen: set[tuple[str, int]] = set()
    meta, path = ref.meta, ref.path
    while True:
        if meta.bootstrap:
            return [(path, b) for b in meta.bootstrap]
        if meta.base is None or meta.lineage is None:
            return []
        folder, n = meta.base
        if (folder, n) in seen:
            return []
        seen.add((folder, n))
        try:
            base = open_checkpoint(CheckpointLayout(folder).checkpoint_dir(n))
        except (CheckpointCorrupted, FileNotFoundError) as exc:
            log.warning("checkpoint %d was restored from %s/chk-%d, which cannot be read (%s): "
                        "validated as if its history had started from empty state",
                        ref.id, folder, n, exc)
            return []
        if base.meta.lineage != meta.lineage:
            return []  # another history in that folder now
        meta, path = base.meta, base.path


def _read_given(item: tuple[str, StateFile, str, str, int]) -> Iterator[tuple[int, Any]]:
    """One bootstrap input file, verified: ``(key_group, (state, kind, key,
    value))``, the form ``evaluate`` takes initial state in."""
    root, f, name, kind, mp = item
    CheckpointStorage(root).verify_file(f.handle)
    for kg, state, key, value in read_state_file(root, f, max_parallelism=mp,
                                                 with_groups=True):
        if state == name:
            yield kg, (state, kind, key, value)


def _bootstrapped_state(sc: Any, ref: CheckpointRef, plan: ExecutionPlan,
                        inputs: list[tuple[str, BootstrapInput]]) -> dict[str, Any]:
    """The replay's initial state: the rows the history was bootstrapped
    with (``inputs``), by operator uid (see the module docstring)."""
    mp = ref.meta.max_parallelism
    files: dict[str, list[tuple[str, StateFile, str, str, int]]] = {}
    uids = {n.uid for n in plan.graph.nodes}
    for path, b in inputs:
        root = os.path.dirname(path)
        if b.operator not in uids:
            # Its state shows as entries the replay does not have.
            log.warning("operator '%s' was bootstrapped but is not in the job", b.operator)
            continue
        files.setdefault(b.operator, []).extend((root, f, b.state, b.kind, mp) for f in b.files)
    return {uid: (sc.parallelize(fs, len(fs)).flatMap(_read_given) if fs else sc.emptyRDD())
            for uid, fs in files.items()}


def _in_flight(sc: Any, ref: CheckpointRef, node_ids: dict[str, int],
               unreplayed: dict[str, str]) -> dict[int, Any]:
    """An unaligned checkpoint's channel state as tagged records entering
    each exchange's target node. Tags order a channel's records as they
    travelled (upstream subtask, then sequence), and put the records in
    flight nearer the end of the job first (``-node id``: ids follow the
    graph's order), for they were ahead of what the records further up
    become on their way down."""
    by_target: dict[int, list[str]] = {}
    for exchange in sorted(channel_state_exchanges(ref)):
        target = exchange.split("->", 1)[1]
        if target not in node_ids:
            unreplayed[target] = (f"operator '{target}', which the checkpoint's channel "
                                  "state feeds, is not in the job")
            continue
        by_target.setdefault(node_ids[target], []).append(exchange)
    out: dict[int, Any] = {}
    output_after = 1 << 40  # a channel's output records after its input records
    for nid, exchanges in by_target.items():
        # All the exchanges into the node: a union of two streams has two.
        out[nid] = channel_state_rdd(sc, ref, exchanges).map(
            lambda t, n=nid: ((-n, t[1], t[2], t[4] + (output_after if t[3] == "output" else 0)),
                              t[5]))
    return out
