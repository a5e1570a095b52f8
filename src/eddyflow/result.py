"""``JobResult``: what ``execute`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["JobResult"]


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
    final_state: dict[str, dict[str, dict[Any, Any]]] = field(default_factory=dict, repr=False)

    def state(self, operator: str, name: str | None = None) -> dict[Any, Any]:
        """The final keyed state of ``operator`` (its only state if ``name`` is
        omitted)."""
        tables = self.final_state.get(operator)
        if tables is None:
            raise KeyError(f"operator {operator!r} has no keyed state; known: "
                           f"{sorted(self.final_state)}")
        if name is None:
            if len(tables) != 1:
                raise KeyError(f"operator {operator!r} has states {sorted(tables)}; name one")
            return next(iter(tables.values()))
        return tables[name]
