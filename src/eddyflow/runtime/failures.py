"""Failure reports: an operator's exception as a :class:`TaskFailure` that
names the operator, the subtask, the record and the source position it came
from, traced back through the chain (see ``Operator.output_counts``).
"""

from __future__ import annotations

from typing import Any

from eddyflow.connectors.source import SourceReader
from eddyflow.errors import StateSerializationError
from eddyflow.runtime.exchange.events import Span
from eddyflow.runtime.exchange.writers import KeyRoutingError, RecordWriter
from eddyflow.runtime.operators.async_calls import AsyncCallFailed
from eddyflow.runtime.operators.base import Operator

__all__ = ["FailureReports", "TaskFailure", "exception_leaves"]


def exception_leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    """The exceptions inside ``group`` and its nested groups, in order: a task
    group's failure is told by its leaves, not by the group."""
    leaves: list[BaseException] = []
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            leaves.extend(exception_leaves(e))
        else:
            leaves.append(e)
    return leaves


class TaskFailure(Exception):
    """An operator failed; the message says where, ``__cause__`` says why."""

    def __init__(self, message: str, operator: str, subtask: int | None,
                 position: str | None) -> None:
        super().__init__(message)
        self.operator = operator
        self.subtask = subtask
        self.position = position


class FailureReports:
    """Mixed into ``Task``: its failures, described."""

    name: str
    subtask: int
    parallelism: int
    operators: list[Operator]
    reader: SourceReader | None
    source_uid: str | None
    source_label: str
    #: The positions the batch being processed was read from, if known.
    _current_span: Span | None = None

    def _trace_back(self, start: int, stages: list[list[Any]], index: int | None) -> int | None:
        """Map an index into ``stages[-1]`` back to an index into ``stages[0]``."""
        if index is None:
            return None
        for k in range(len(stages) - 2, -1, -1):
            counts = self.operators[start + k].output_counts(stages[k])
            if counts is None:
                return None
            acc = 0
            for i, c in enumerate(counts):
                acc += c
                if index < acc:
                    index = i
                    break
            else:
                return None
        return index

    def _where(self, input_index: int | None, span: Span | None) -> str | None:
        if self.reader is not None and input_index is not None:
            pos = self.reader.position_of(input_index)
            if pos is not None:
                return f"{self.source_label} at {self.reader.describe_position(pos)}"
        if span:
            return "; ".join(
                f"{label} positions {first!r} to {end!r}" for label, first, end in span
            )
        return None

    def _describe(self, what: str, exc: BaseException, record: Any, where: str | None) -> str:
        msg = (f"{what} (subtask {self.subtask + 1} of {self.parallelism}) raised "
               f"{type(exc).__name__}: {exc}")
        if record is not _NO_RECORD:
            msg += f"; on record {record!r:.200}"
        if where:
            msg += f"; read from {where}"
        return msg

    def _failure(self, exc: BaseException, op: Operator, start: int,
                 stages: list[list[Any]], index: int | None) -> TaskFailure:
        record = stages[-1][index] if index is not None and index < len(stages[-1]) else _NO_RECORD
        # Only a trace that reaches the task's own input names a source position.
        input_index = self._trace_back(start, stages, index) if start == 0 else None
        where = self._where(input_index, self._current_span)
        what = f"key selector of '{op.uid}'" if op.key_failed else f"operator '{op.uid}'"
        return TaskFailure(self._describe(what, exc, record, where), op.uid, self.subtask, where)

    def _operator_failure(self, op: Operator, exc: BaseException) -> TaskFailure:
        """``op`` failed outside a record (its snapshot, say)."""
        return TaskFailure(self._describe(f"operator '{op.uid}'", exc, _NO_RECORD, None),
                           op.uid, self.subtask, None)

    def _serialization_failure(self, exc: StateSerializationError) -> TaskFailure:
        """A value of ``exc.operator`` that cannot be pickled, as a failure of
        that operator in this subtask."""
        uid = exc.operator or (self.operators[0].uid if self.operators else self.name)
        return TaskFailure(self._describe(f"operator '{uid}'", exc, _NO_RECORD, None),
                           uid, self.subtask, None)

    def _routing_failure(self, exc: KeyRoutingError, w: RecordWriter,
                         stages_in: list[Any]) -> TaskFailure:
        cause = exc.__cause__ or exc
        # The writer saw the chain's output: trace from it back to the input.
        stages = self._last_stages(stages_in) if stages_in else []
        index = self._trace_back(0, stages, exc.index) if stages else None
        where = self._where(index, self._current_span)
        source, target = w.label.split(" -> ")
        what = f"key selector of '{target}', evaluated after '{source}'"
        return TaskFailure(self._describe(what, cause, exc.record, where),
                           target, self.subtask, where)

    def _last_stages(self, task_input: list[Any]) -> list[list[Any]]:
        # Recompute the intermediate batches of the pure prefix; stop at the
        # first operator that cannot be re-run without side effects.
        stages = [task_input]
        for op in self.operators:
            if not (op.pure or op.one_to_one):
                return []
            if op.pure:
                stages.append(op.process(stages[-1]))
            else:
                stages.append(stages[-1])  # same length: indexes are unchanged
        return stages

    def _source_failure(self, exc: BaseException, reader: SourceReader) -> TaskFailure:
        where = f"{self.source_label} at {reader.describe_position(reader.position())}"
        return TaskFailure(self._describe(f"source '{self.source_uid}'", exc, _NO_RECORD, where),
                           str(self.source_uid), self.subtask, where)

    def _call_failure(self, op: Operator, exc: AsyncCallFailed) -> TaskFailure:
        """A call of the ``map_async`` ``op`` raised or timed out on ``exc.record``."""
        return TaskFailure(self._describe(f"map_async '{op.uid}'", exc.cause, exc.record, None),
                           op.uid, self.subtask, None)

    def _end_input_failure(self, op: Operator, exc: BaseException) -> TaskFailure:
        """``op`` failed at the end of its input."""
        return TaskFailure(self._describe(f"operator '{op.uid}'", exc, _NO_RECORD,
                                          "the end of input"), op.uid, self.subtask, None)


_NO_RECORD: Any = object()
