"""Building a checkpoint's metadata from what the subtasks of a job recorded:
one builder for the checkpoint coordinator (a job's checkpoints) and for
``offline/bootstrap.py`` (a checkpoint written from a DataFrame), so that
both describe the job, its files and their sizes the same way."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from eddyflow.checkpoint.metadata import (
    BootstrapInput,
    CheckpointGraph,
    CheckpointMetadata,
    OperatorState,
    SubtaskState,
    TaskStats,
)
from eddyflow.checkpoint.storage import FileHandle
from eddyflow.graph.plan import ExecutionPlan

__all__ = ["MetadataBuilder"]


class MetadataBuilder:
    """The metadata of one checkpoint of the job ``plan`` describes: add
    what each operator subtask recorded (:meth:`add`) and the files they
    wrote (:meth:`add_files`), then :meth:`build` it. Every operator of the
    plan is in the metadata, with the subtasks added for it."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self._subtasks: dict[str, dict[int, SubtaskState]] = {
            n.uid: {} for n in plan.graph.nodes}
        self._files: dict[str, FileHandle] = {}

    def add(self, uid: str, subtask: int, state: SubtaskState) -> None:
        """What subtask ``subtask`` of operator ``uid`` recorded."""
        self._subtasks[uid][subtask] = state

    def add_files(self, handles: Iterable[FileHandle]) -> None:
        """Files the checkpoint references (one entry per path)."""
        for h in handles:
            self._files[h.path] = h

    def build(self, *, job: str, mode: str, final: bool, trigger_time: float,
              duration: float, alignment_duration: float = 0.0,
              tasks: Mapping[str, TaskStats] | None = None, lineage: str | None = None,
              base: tuple[str, int] | None = None, unaligned: bool = False,
              channel_state_records: int = 0, channel_state_size: int = 0,
              bootstrap: tuple[BootstrapInput, ...] = (),
              written: Callable[[str], bool] | None = None) -> CheckpointMetadata:
        """The metadata, completed now. ``written``: whether this checkpoint
        wrote the file at a path (not so for a file an earlier checkpoint
        already references, with incremental state); all of them if not
        given. The other arguments are :class:`CheckpointMetadata`'s."""
        plan = self.plan
        files = self._files
        full_size = sum(h.size for h in files.values())
        new_size = (full_size if written is None
                    else sum(h.size for path, h in files.items() if written(path)))
        return CheckpointMetadata(
            job=job,
            mode=mode,
            final=final,
            trigger_time=trigger_time,
            completed_at=time.time(),
            duration=duration,
            alignment_duration=alignment_duration,
            max_parallelism=plan.max_parallelism,
            operators={n.uid: OperatorState(n.kind, plan.parallelism[n.id], self._subtasks[n.uid])
                       for n in plan.graph.nodes},
            graph=CheckpointGraph.of_plan(plan),
            files=tuple(files.values()),
            checkpointed_size=new_size,
            full_size=full_size,
            tasks=dict(tasks or {}),
            lineage=lineage,
            base=base,
            unaligned=unaligned,
            channel_state_records=channel_state_records,
            channel_state_size=channel_state_size,
            bootstrap=bootstrap,
        )
