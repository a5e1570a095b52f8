"""``JobResult``: what ``execute`` returns."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eddyflow.runtime.metrics import JobMetrics

__all__ = ["JobResult", "merge_state"]


class _Union(Mapping[Any, Any]):
    """Subtasks' states (disjoint key groups, so disjoint keys) as one
    mapping, read on demand: a RocksDB backend's state is not loaded into
    memory unless asked for (``dict(result.state(...))`` loads it)."""

    def __init__(self, parts: list[Mapping[Any, Any]]) -> None:
        self.parts = parts

    def __getitem__(self, key: Any) -> Any:
        for p in self.parts:
            try:
                return p[key]
            except KeyError:
                continue
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        for p in self.parts:
            yield from p

    def __len__(self) -> int:
        return sum(map(len, self.parts))

    def __repr__(self) -> str:
        return f"<state of {len(self.parts)} subtasks>"


def merge_state(merged: Mapping[Any, Any] | None, part: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """``part`` (one subtask's state) added to ``merged``: dicts (the memory
    backend) are merged into a dict, anything else into a lazy union."""
    if merged is None:
        return part if not isinstance(part, dict) else dict(part)
    if isinstance(merged, dict) and isinstance(part, dict):
        merged.update(part)
        return merged
    parts = merged.parts if isinstance(merged, _Union) else [merged]
    return _Union([*parts, part])


@dataclass
class JobResult:
    job_name: str
    duration: float
    records_in: dict[str, int] = field(default_factory=dict)
    records_out: dict[str, int] = field(default_factory=dict)
    completed_checkpoints: list[int] = field(default_factory=list)
    restarts: int = 0
    #: operator uid -> state name -> {key: value}, merged over subtasks, as
    #: the job left it (for inspection and for comparing runs in tests).
    # Not in the repr: it can hold millions of keys, and asyncio formats the
    # repr of a finished main task's result during teardown.
    final_state: dict[str, dict[str, Mapping[Any, Any]]] = field(default_factory=dict, repr=False)
    #: The last metrics sample, taken as the job ended (runtime/metrics.py).
    metrics: JobMetrics | None = field(default=None, repr=False)

    def state(self, operator: str, name: str | None = None) -> Mapping[Any, Any]:
        """The final keyed state of ``operator`` (its only state if ``name`` is
        omitted): a dict with the memory backend; with RocksDB, a read-only
        mapping that reads the database when it is used, not before.

        A state with a time-to-live shows what user code would have read
        at the job's end: its values without the write times they are
        stored with, and without the entries (keys, map entries, list
        elements) expired by then on the job's clock, dropped or not."""
        tables = self.final_state.get(operator)
        if tables is None:
            raise KeyError(f"operator {operator!r} has no keyed state; known: "
                           f"{sorted(self.final_state)}")
        if name is None:
            if len(tables) != 1:
                raise KeyError(f"operator {operator!r} has states {sorted(tables)}; name one")
            return next(iter(tables.values()))
        return tables[name]
