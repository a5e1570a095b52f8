"""The batch replay of a broadcast function's operator (``BroadcastSpec``,
``runtime/operators/broadcast.py``) for ``evaluate``.

The broadcast input is small by nature (rules, configuration) and every
subtask sees all of it in the same order, so the driver replays it: one
operator holding every key group starts from the restored broadcast state,
handles the broadcast records in tag order (a channel's order), and its
table is the final broadcast state, one row per entry, as the streaming
subtasks together store it. What ``process_broadcast_element`` yields is
emitted once per subtask of the streaming run, as each of them emits it.

The element side is then replayed key by key like any keyed operator, with
every copy of the operator holding that final broadcast state before its
first element: the replay takes the broadcast records first. Which of a
key's elements a streaming run handled before a broadcast record arrived is
timing (Flink says the same of its broadcast state), so keyed state that
depends on it cannot be checked exactly; state that reads the broadcast
state only in event-time timers after the broadcast records' own
timestamps (or not at all) is replayed exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from eddyflow.keygroups import key_group_for
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.runtime.operators.broadcast import BroadcastSpec
from eddyflow.runtime.operators.keyed import KeyedOperator, KeyedSpec
from eddyflow.runtime.operators.two_input import SideKeys
from eddyflow.state.memory import MemoryStateBackend

__all__ = ["ElementsOnly", "element_key", "replay_broadcast", "side_of"]


def element_key(spec: BroadcastSpec) -> Callable[[Any], Any]:
    """The key of an element (``(0, record)``): a keyed function's, or one
    key for all of a non-keyed function's (it has no keyed state)."""
    keys = spec.key_fn
    assert isinstance(keys, SideKeys)
    if keys.left is None:
        return _no_key
    return keys


def _no_key(tagged: Any) -> int:
    return 0


@dataclass(frozen=True)
class ElementsOnly(KeyedSpec):
    """``spec``'s operator for the element side, its broadcast state set to
    ``final`` before its first element."""

    spec: BroadcastSpec
    final: dict[Any, Any]

    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        op = self.spec.instantiate(ctx)
        op.load_broadcast_state(self.final)
        return op


def replay_broadcast(spec: BroadcastSpec, uid: str, max_parallelism: int, parallelism: int,
                     records: Iterable[tuple[Any, ...]], restored: Iterable[tuple[Any, ...]]
                     ) -> tuple[dict[Any, Any], list[tuple[Any, ...]], list[Any]]:
    """The final broadcast state, its state rows (``(key_group, (state,
    kind, key, value))``) and the outputs (``(tag, record, timestamp)``) of
    the broadcast ``records`` (items ``(tag, (1, record)[, timestamp])``)
    from the ``restored`` rows of the broadcast state."""
    op = spec.instantiate(OperatorContext(uid, 0, 1, max_parallelism, MemoryStateBackend()))
    op.open()
    try:
        data = op.data
        for _, (_, _, key, value) in restored:
            data[key] = value
        outputs: list[Any] = []
        for item in sorted(records, key=lambda it: it[0]):
            ts = item[2] if len(item) > 2 else None
            outs, stamps = op.process_ts([item[1]], None if ts is None else [ts])
            for copy in range(parallelism):
                for i, out in enumerate(outs):
                    outputs.append(((*item[0], copy, i), out,
                                    None if stamps is None else stamps[i]))
        final = dict(data)
    finally:
        op.close()
    rows = [(key_group_for(k, max_parallelism), (spec.name, "value", k, v))
            for k, v in final.items()]
    return final, rows, outputs


def side_of(item: tuple[Any, ...]) -> int:
    """The side of an item of a two-input operator's tagged input."""
    return int(item[1][0])
