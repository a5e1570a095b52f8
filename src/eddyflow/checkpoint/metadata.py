"""The typed model of a checkpoint's ``chk-<n>/_metadata`` (docs/concepts/checkpoints.md).

The coordinator builds a :class:`CheckpointMetadata` once every task has
acknowledged a checkpoint and writes its :meth:`~CheckpointMetadata.to_json`;
:class:`~eddyflow.checkpoint.storage.CheckpointStorage` adds its envelope
(``format_version``, ``checkpoint_id``, ``checksum``) and verifies it on read.
Whatever reads a checkpoint — restore, ``list_checkpoints``, the command line,
the offline jobs — reads it through :func:`read_checkpoint` or
:meth:`CheckpointMetadata.from_json`, not by indexing the JSON.

``to_json`` writes exactly the JSON the runtime has always written, and
``from_json`` reads every checkpoint written so far: keys it does not know
are ignored (a subtask's are kept, see :class:`SubtaskState`), and keyed
state of metadata format 1 (one full file per subtask) is read by
:meth:`KeyedStateHandle.from_json` (and written back in the current form).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle, StateFile
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage, FileHandle

__all__ = [
    "BackEdgeLog",
    "BootstrapInput",
    "ChannelState",
    "CheckpointGraph",
    "CheckpointMetadata",
    "GraphEdge",
    "GraphNode",
    "OperatorList",
    "OperatorState",
    "SplitInfo",
    "SubtaskState",
    "TaskStats",
    "read_checkpoint",
]


@dataclass(frozen=True)
class BackEdgeLog:
    """The records in flight on a loop head's back-edges at the barrier."""

    file: FileHandle
    records: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file.to_json(), "records": self.records}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> BackEdgeLog:
        return BackEdgeLog(FileHandle.from_json(dict(d["file"])), int(d["records"]))


@dataclass(frozen=True)
class ChannelState:
    """An unaligned checkpoint's channel state at one subtask: the records in
    flight on its channels at the barrier, in one file. ``inputs``: per
    input channel key (``exchange:upstream:downstream``), how many records
    this subtask logged on it between its snapshot and the barrier's
    arrival, and (a producer in another worker process) the records the
    barrier overtook in this subtask's queue; ``outputs``: per output
    channel key, how many records the barrier overtook there. On restore a
    channel gets its input part first, then its output part (the order they
    travelled in)."""

    file: FileHandle
    inputs: Mapping[str, int]
    outputs: Mapping[str, int]

    @property
    def records(self) -> int:
        return sum(self.inputs.values()) + sum(self.outputs.values())

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file.to_json(), "inputs": dict(self.inputs),
                "outputs": dict(self.outputs)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ChannelState:
        return ChannelState(FileHandle.from_json(dict(d["file"])),
                            {str(k): int(v) for k, v in d["inputs"].items()},
                            {str(k): int(v) for k, v in d["outputs"].items()})


@dataclass(frozen=True)
class OperatorList:
    """A subtask's operator list state in one file (``map_async``'s records
    in flight at the barrier): on restore the lists of all old subtasks are
    split among the new ones, whatever the parallelism."""

    file: FileHandle
    records: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file.to_json(), "records": self.records}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> OperatorList:
        return OperatorList(FileHandle.from_json(dict(d["file"])), int(d["records"]))


_PART_KEYS = frozenset({"source", "splits", "keyed", "committables", "backedge",
                        "channel_state", "watermark", "operator_list"})


@dataclass(frozen=True)
class SplitInfo:
    """A split of a split source as a checkpoint records it beside its
    position (JSON key ``splits``, by split id): what the source needs to
    read it again after a restore at any parallelism (``data``: a file and
    byte range, a log partition), the ``index`` that picks its subtask
    (``None``: a hash of the id), and whether it was read to its end."""

    data: Any = None
    index: int | None = None
    finished: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"data": self.data, "index": self.index}
        if self.finished:
            out["finished"] = True
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SplitInfo:
        index = d.get("index")
        return SplitInfo(d.get("data"), None if index is None else int(index),
                         bool(d.get("finished", False)))


def _encode_watermark(w: float) -> float | str:
    # JSON has no infinities: they are written as "inf" and "-inf".
    return w if math.isfinite(w) else ("inf" if w > 0 else "-inf")


def _decode_watermark(v: Any) -> float:
    # A number is kept as written (an int stays an int), so that the model
    # writes back the JSON it read.
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    return float(v)


@dataclass(frozen=True)
class SubtaskState:
    """What one subtask of one operator recorded: a source's position (JSON
    key ``source``), keyed state, a sink's pending transactions, a loop
    head's back-edge log, an unaligned checkpoint's channel state, operator
    list state (``map_async``'s records in flight), and the operator's
    watermark at the barrier (``None``: it had none yet).

    A split source's subtask records its splits (``splits``, by id) and
    their positions: ``position`` is then a mapping of split id to position.
    A position may itself be ``None``, hence ``is_source``. A task
    acknowledges these (``runtime/checkpointing/messages.py``); keys of the
    JSON this model does not know are kept in ``extra`` and written back, so
    that rewriting a checkpoint's metadata never drops them."""

    is_source: bool = False
    position: Any = None
    #: A split source's splits, by id (``None``: a source of the
    #: ``create_reader`` protocol, whose split is the subtask).
    splits: Mapping[str, SplitInfo] | None = None
    keyed: KeyedStateHandle | None = None
    committables: tuple[Any, ...] = ()
    backedge: BackEdgeLog | None = None
    channel_state: ChannelState | None = None
    watermark: float | None = None
    operator_list: OperatorList | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.extra)
        if self.watermark is not None:
            out["watermark"] = _encode_watermark(self.watermark)
        if self.is_source:
            out["source"] = self.position
        if self.splits is not None:
            out["splits"] = {k: v.to_json() for k, v in self.splits.items()}
        if self.keyed is not None:
            out["keyed"] = self.keyed.to_json()
        if self.committables:
            out["committables"] = list(self.committables)
        if self.backedge is not None:
            out["backedge"] = self.backedge.to_json()
        if self.channel_state is not None:
            out["channel_state"] = self.channel_state.to_json()
        if self.operator_list is not None:
            out["operator_list"] = self.operator_list.to_json()
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SubtaskState:
        keyed, backedge, watermark = d.get("keyed"), d.get("backedge"), d.get("watermark")
        return SubtaskState(
            is_source="source" in d,
            position=d.get("source"),
            splits=(None if d.get("splits") is None
                    else {str(k): SplitInfo.from_json(v) for k, v in d["splits"].items()}),
            keyed=None if keyed is None else KeyedStateHandle.from_json(keyed),
            committables=tuple(d.get("committables") or ()),
            backedge=None if backedge is None else BackEdgeLog.from_json(backedge),
            channel_state=(None if d.get("channel_state") is None
                           else ChannelState.from_json(d["channel_state"])),
            watermark=None if watermark is None else _decode_watermark(watermark),
            operator_list=(None if d.get("operator_list") is None
                           else OperatorList.from_json(d["operator_list"])),
            extra={k: v for k, v in d.items() if k not in _PART_KEYS},
        )


@dataclass(frozen=True)
class OperatorState:
    """One operator of the job: its kind, parallelism and subtasks' state
    (keyed by subtask index; the JSON keys them by its string)."""

    kind: str
    parallelism: int
    subtasks: Mapping[int, SubtaskState]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "parallelism": self.parallelism,
                "subtasks": {str(s): part.to_json() for s, part in self.subtasks.items()}}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> OperatorState:
        subtasks = {int(s): SubtaskState.from_json(part) for s, part in d["subtasks"].items()}
        return OperatorState(str(d["kind"]), int(d["parallelism"]), dict(sorted(subtasks.items())))


@dataclass(frozen=True)
class GraphNode:
    id: int
    uid: str
    kind: str
    parallelism: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "uid": self.uid, "kind": self.kind,
                "parallelism": self.parallelism}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> GraphNode:
        return GraphNode(int(d["id"]), str(d["uid"]), str(d["kind"]), int(d["parallelism"]))


@dataclass(frozen=True)
class GraphEdge:
    source: int
    target: int
    partitioning: str
    back_edge: bool

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target,
                "partitioning": self.partitioning, "back_edge": self.back_edge}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> GraphEdge:
        return GraphEdge(int(d["source"]), int(d["target"]), str(d["partitioning"]),
                         bool(d["back_edge"]))


@dataclass(frozen=True)
class CheckpointGraph:
    """The job graph the checkpoint was taken of, for offline tools."""

    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]

    def to_json(self) -> dict[str, Any]:
        return {"nodes": [n.to_json() for n in self.nodes],
                "edges": [e.to_json() for e in self.edges]}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> CheckpointGraph:
        return CheckpointGraph(tuple(GraphNode.from_json(n) for n in d["nodes"]),
                               tuple(GraphEdge.from_json(e) for e in d["edges"]))

    @staticmethod
    def of_plan(plan: Any) -> CheckpointGraph:
        """The graph of an execution plan (``graph.plan.ExecutionPlan``,
        taken by its attributes: ``state`` does not import ``graph``), as the
        coordinator and ``offline.bootstrap`` record it."""
        return CheckpointGraph(
            nodes=tuple(GraphNode(n.id, n.uid, n.kind, plan.parallelism[n.id])
                        for n in plan.graph.nodes),
            edges=tuple(GraphEdge(e.source, e.target, e.partitioning.value,
                                  plan.edge_kinds[e.id].value == "back")
                        for e in plan.graph.edges))


@dataclass(frozen=True)
class TaskStats:
    """How long one task aligned and took the two halves of its snapshot (s)."""

    alignment_duration: float
    sync_duration: float
    async_duration: float

    def to_json(self) -> dict[str, Any]:
        return {"alignment_duration": self.alignment_duration,
                "sync_duration": self.sync_duration, "async_duration": self.async_duration}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TaskStats:
        return TaskStats(float(d["alignment_duration"]), float(d["sync_duration"]),
                         float(d["async_duration"]))


@dataclass(frozen=True)
class BootstrapInput:
    """State a checkpoint was *bootstrapped* with, not computed from its
    sources (``eddyflow.offline.bootstrap``): the rows of one state of one
    keyed operator, kept as they were given, in keyed-state files (ungrouped,
    full: ``state/format.py``) beside the operator's own state files. They
    are the checkpoint's input as much as its sources are: ``validate``
    starts the replay from them, and a restore never reads them."""

    operator: str
    state: str
    kind: str
    #: Rows given (one per key).
    rows: int
    files: tuple[StateFile, ...]
    #: What they were written from, for people (the DataFrame's columns).
    origin: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"operator": self.operator, "state": self.state, "kind": self.kind,
                "rows": self.rows, "files": [f.to_json() for f in self.files],
                "origin": self.origin}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> BootstrapInput:
        return BootstrapInput(str(d["operator"]), str(d["state"]), str(d["kind"]),
                              int(d["rows"]), tuple(StateFile.from_json(f) for f in d["files"]),
                              str(d.get("origin", "")))


@dataclass(frozen=True)
class CheckpointMetadata:
    """A completed checkpoint: what every operator subtask recorded, every
    file it references (with size and SHA-256), and its statistics. Times are
    Unix times, durations seconds, sizes bytes."""

    job: str
    mode: str
    #: Taken at the end of a bounded input.
    final: bool
    trigger_time: float
    completed_at: float
    duration: float
    #: The longest alignment of any task.
    alignment_duration: float
    max_parallelism: int
    #: By operator uid.
    operators: Mapping[str, OperatorState]
    graph: CheckpointGraph
    files: tuple[FileHandle, ...]
    #: What this checkpoint wrote (with incremental state: its new files only).
    checkpointed_size: int
    #: All the state it references.
    full_size: int
    #: By task name and subtask, ``"<name>[<subtask>]"``.
    tasks: Mapping[str, TaskStats]
    #: The history this checkpoint belongs to: drawn by a fresh start,
    #: inherited by every restore (see :mod:`eddyflow.checkpoint.commits`).
    #: ``None`` in checkpoints written before lineages existed.
    lineage: str | None = None
    #: The checkpoint of another folder this history was last restored
    #: from, ``(folder, id)``; ``None`` if it started in this folder
    #: (checkpoint/commits.py decides by it what a restore takes back elsewhere).
    base: tuple[str, int] | None = None
    #: Taken unaligned at one task at least (``unaligned`` mode, or an
    #: aligned checkpoint that switched after ``aligned_timeout``).
    unaligned: bool = False
    #: The records in flight it holds as channel state, and their bytes.
    channel_state_records: int = 0
    channel_state_size: int = 0
    #: Written by ``eddyflow.offline.bootstrap``, not by a job: the state it
    #: was given (empty for a checkpoint a job took).
    bootstrap: tuple[BootstrapInput, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "mode": self.mode,
            "final": self.final,
            "trigger_time": self.trigger_time,
            "completed_at": self.completed_at,
            "duration": self.duration,
            "alignment_duration": self.alignment_duration,
            "max_parallelism": self.max_parallelism,
            "operators": {uid: op.to_json() for uid, op in self.operators.items()},
            "graph": self.graph.to_json(),
            "files": [f.to_json() for f in self.files],
            "checkpointed_size": self.checkpointed_size,
            "full_size": self.full_size,
            "tasks": {name: t.to_json() for name, t in self.tasks.items()},
            **({} if self.lineage is None else {"lineage": self.lineage}),
            **({} if self.base is None else {"base": list(self.base)}),
            **({} if not self.unaligned else {
                "unaligned": True, "channel_state_records": self.channel_state_records,
                "channel_state_size": self.channel_state_size}),
            **({} if not self.bootstrap else {
                "bootstrap": [b.to_json() for b in self.bootstrap]}),
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> CheckpointMetadata:
        """Raises ``ValueError`` if ``d`` is not checkpoint metadata."""
        try:
            return CheckpointMetadata(
                job=str(d["job"]),
                mode=str(d["mode"]),
                final=bool(d["final"]),
                trigger_time=float(d["trigger_time"]),
                completed_at=float(d["completed_at"]),
                duration=float(d["duration"]),
                alignment_duration=float(d["alignment_duration"]),
                max_parallelism=int(d["max_parallelism"]),
                operators={uid: OperatorState.from_json(op)
                           for uid, op in d["operators"].items()},
                graph=CheckpointGraph.from_json(d["graph"]),
                files=tuple(FileHandle.from_json(dict(f)) for f in d["files"]),
                checkpointed_size=int(d["checkpointed_size"]),
                full_size=int(d["full_size"]),
                tasks={name: TaskStats.from_json(t) for name, t in d["tasks"].items()},
                lineage=None if d.get("lineage") is None else str(d["lineage"]),
                base=None if d.get("base") is None else (str(d["base"][0]), int(d["base"][1])),
                unaligned=bool(d.get("unaligned", False)),
                channel_state_records=int(d.get("channel_state_records", 0)),
                channel_state_size=int(d.get("channel_state_size", 0)),
                bootstrap=tuple(BootstrapInput.from_json(b) for b in d.get("bootstrap", ())),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # One kind of error, whatever is missing or mistyped, deep down or not.
            raise ValueError(
                f"not checkpoint metadata: {type(exc).__name__}: {exc}") from exc


def read_checkpoint(storage: CheckpointStorage, checkpoint_id: int, *,
                    verify_files: bool = False) -> CheckpointMetadata:
    """The verified metadata of checkpoint ``checkpoint_id`` (and, with
    ``verify_files``, every file it references checked against it); raises
    :class:`CheckpointCorrupted`, naming the file, if anything fails."""
    raw = storage.verify(checkpoint_id) if verify_files else storage.read_metadata(checkpoint_id)
    try:
        return CheckpointMetadata.from_json(raw)
    except ValueError as exc:
        path = storage.layout.metadata(checkpoint_id)
        raise CheckpointCorrupted(f"{path}: {exc}") from exc
