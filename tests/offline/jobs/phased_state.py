"""Keyed value state written in phases, a checkpoint between phases: for
``read_changes`` between checkpoints whose differences are known.

The source (one subtask) reads ``(key, value)`` records phase by phase and,
at the end of each phase but the last, waits until a checkpoint of
``PHASED_CHECKPOINTS`` has recorded it there twice (every record of the
phase in that checkpoint's state, and the backend told the first one is
complete before the next phase's changes are snapshotted). A value of
``None`` clears the key's state. The phases (``PHASED_KEYS`` = n,
``PHASED_CHANGED`` = m):

1. keys ``k0`` .. ``k<n-1>``, each a dict value ``{"v": i, "tags": ["new"]}``;
2. the first m keys updated (``"v"`` + n), the next m cleared, m new keys
   ``t<i>`` created, and the m keys after those updated (``"v"`` + 1);
3. the ``t<i>`` keys cleared again, and the last of those updated keys set
   back to their phase-1 value.

So between the end of phase 1 and the end: m keys changed, m deleted, m
written but unchanged, m created and deleted again. ``PHASED_BACKEND``:
``memory`` (chains of deltas that are never cut here) or ``rocksdb``
(local databases under ``PHASED_ROCKSDB``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import eddyflow as ef

KEYS = int(os.environ.get("PHASED_KEYS", "1000"))
CHANGED = int(os.environ.get("PHASED_CHANGED", "10"))
CHECKPOINTS = os.environ.get("PHASED_CHECKPOINTS", "checkpoints/phased")


def value(i: int) -> dict[str, Any]:
    return {"v": i, "tags": ["new"]}


def phases(n: int = KEYS, m: int = CHANGED) -> list[list[tuple[str, Any]]]:
    one = [(f"k{i}", value(i)) for i in range(n)]
    two = ([(f"k{i}", value(i + n)) for i in range(m)]
           + [(f"k{i}", None) for i in range(m, 2 * m)]
           + [(f"t{i}", value(-i)) for i in range(m)]
           + [(f"k{i}", value(i + 1)) for i in range(2 * m, 3 * m)])
    three = ([(f"t{i}", None) for i in range(m)]
             + [(f"k{i}", value(i)) for i in range(2 * m, 3 * m)])
    return [one, two, three]


def recorded(directory: str, position: int) -> int:
    """How many completed checkpoints recorded the source at ``position``."""
    if not os.path.isdir(directory):
        return 0
    return sum(1 for info in ef.list_checkpoints(directory)
               for op in info.meta.operators.values() for part in op.subtasks.values()
               if part.is_source and part.position == position)


class PhasedReader(ef.SourceReader):
    def __init__(self, records: list[tuple[str, Any]], gates: list[int]) -> None:
        self.records = records
        self.gates = gates
        self.next = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.next >= len(self.records):
            return None
        gate = next((g for g in self.gates if g >= self.next), len(self.records))
        if gate == self.next:
            if recorded(CHECKPOINTS, gate) < 2:
                await asyncio.sleep(0.02)
                return []
            self.gates = [g for g in self.gates if g > gate]
            gate = next(iter(self.gates), len(self.records))
        stop = min(gate, self.next + max_records)
        batch = [(k, None if v is None else dict(v, tags=list(v["tags"])))
                 for k, v in self.records[self.next:stop]]
        self.next = stop
        return batch

    def position(self) -> Any:
        return self.next

    def seek(self, position: Any) -> None:
        self.next = int(position)


class PhasedSource(ef.Source):
    max_parallelism = 1

    def __init__(self) -> None:
        parts = phases()
        self.records = [r for part in parts for r in part]
        self.gates = []
        at = 0
        for part in parts[:-1]:
            at += len(part)
            self.gates.append(at)

    @property
    def name(self) -> str:
        return "phased"

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return PhasedReader(self.records, list(self.gates))


class Keep(ef.KeyedProcessFunction):
    """The key's last value; ``None`` clears it."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.last = ctx.value_state("last")

    def process(self, record: tuple[str, Any], ctx: ef.RuntimeContext) -> Any:
        if record[1] is None:
            self.last.clear()
        else:
            self.last.update(record[1])
        return ()


def build(env: ef.StreamEnvironment) -> None:
    if os.environ.get("PHASED_BACKEND", "memory") == "rocksdb":
        env.set_state_backend(ef.RocksDBStateBackend(os.environ["PHASED_ROCKSDB"]))
    else:
        env.set_state_backend(ef.MemoryStateBackend(max_chain=1000, max_delta_ratio=1000.0))
    (env.from_source(PhasedSource(), parallelism=1).name("records")
        .key_by(lambda r: r[0]).process(Keep()).name("keep")
        .sink_to(ef.ListSink()).name("out"))
