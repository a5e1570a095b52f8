"""Broadcast state: ``events.key_by(k).connect(rules.broadcast("rules"))
.process(KeyedBroadcastProcessFunction)`` and its non-keyed form
(``events.connect(...)`` with a ``BroadcastProcessFunction``).

Every subtask receives every broadcast record (the broadcast input's
partitioning) and keeps the whole broadcast state in memory: a dict that
``process_broadcast_element`` may change and ``process_element`` and
``on_timer`` read through a read-only view. The state lives in checkpoints
as the operator's keyed state of the broadcast's name, each entry kept by
the subtask whose key groups hold the entry's key: every subtask holds the
same copy, so storing one entry once stores every subtask's copy, and the
union of the subtasks' snapshots is the whole state. A restore, at any
parallelism, gives every new subtask that union (it reads the snapshots
of all old subtasks, ``restore_broadcast``), where Flink has every copy
written and each new subtask read one of them; the entries also read
offline (``read_state``) as any keyed state, once each.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.functions import (
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
    RuntimeContext,
)
from eddyflow.keygroups import check_key, key_group_for
from eddyflow.runtime.operators.base import OperatorContext
from eddyflow.runtime.operators.co_process import copy_function
from eddyflow.runtime.operators.keyed import KeyedOperator, KeyedSpec
from eddyflow.runtime.operators.two_input import SideKeys, TwoInputKeyedOperator, side_record
from eddyflow.state.format import DELETED
from eddyflow.state.handles import ValueState
from eddyflow.state.registry import kind_of

__all__ = ["BroadcastSpec", "BroadcastState"]


class BroadcastState(MutableMapping[Any, Any]):
    """The broadcast state as ``process_broadcast_element`` sees it: a dict
    whose changes also go to the subtask's keyed state (for the keys of its
    key groups), so that they are checkpointed."""

    def __init__(self, data: dict[Any, Any], write: Any) -> None:
        self._data = data
        self._write = write

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        check_key(key)
        self._data[key] = value
        self._write(key, value)

    def __delitem__(self, key: Any) -> None:
        del self._data[key]
        self._write(key, DELETED)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"BroadcastState({self._data!r:.200})"


class _Broadcast(TwoInputKeyedOperator):
    reads_every_key_group = True

    def __init__(self, ctx: OperatorContext, key_fn: SideKeys, name: str,
                 fn: BroadcastProcessFunction) -> None:
        super().__init__(ctx, key_fn)
        self.keyed_sides = (key_fn.left is not None, False)
        self.fn = fn
        self.name = name
        self.data: dict[Any, Any] = {}
        self.read_only = MappingProxyType(self.data)
        self.writable = BroadcastState(self.data, self._persist)
        self.stored: ValueState[Any] | None = None

    def open(self) -> None:
        super().open()
        if not self.keyed_sides[0]:
            # A non-keyed function has no keyed state of its own: its
            # context says so rather than hand it a key-less one.
            c, old = self.ctx, self.rctx
            assert old is not None
            self.rctx = RuntimeContext(c.uid, c.subtask, c.parallelism, c.max_parallelism,
                                       None, c.clock.now)
            pending = self._side_out
            self.rctx.set_side_output(lambda tag, value: pending.append(side_record(tag, value)))
        self.fn.open(self.rctx)  # type: ignore[arg-type]

    def open_function(self, rctx: RuntimeContext) -> None:
        assert self.backend is not None
        self.stored = ValueState(self.backend, self.name)

    def _persist(self, key: Any, value: Any) -> None:
        backend, stored = self.backend, self.stored
        assert backend is not None and stored is not None
        if key_group_for(key, self.ctx.max_parallelism) not in backend.key_groups:
            return  # another subtask stores this entry (its copy is the same)
        saved = backend.current_key
        backend.current_key = key
        try:
            if value is DELETED:
                stored.clear()
            else:
                stored.value = value
        finally:
            backend.current_key = saved

    def handle(self, side: int, record: Any, ctx: RuntimeContext) -> Any:
        if side:
            ctx.broadcast_state = self.writable
            try:
                return self.fn.process_broadcast_element(record, ctx)
            finally:
                ctx.broadcast_state = self.read_only
        ctx.broadcast_state = self.read_only
        return self.fn.process_element(record, ctx)

    def timer(self, timestamp: float, ctx: RuntimeContext) -> Any:
        ctx.broadcast_state = self.read_only
        if isinstance(self.fn, KeyedBroadcastProcessFunction):
            return self.fn.on_timer(timestamp, ctx)
        return None

    def restore_broadcast(self, root: str, handles: list[KeyedStateHandle]) -> None:
        """Load the whole broadcast state from the snapshots of every old
        subtask (``handles``), each of which holds the entries of its key
        groups."""
        name, data = self.name, self.data
        mp = self.ctx.max_parallelism
        for h in handles:
            for _, state, key, value in kind_of(h).read(root, h, key_groups=None,
                                                        max_parallelism=mp):
                if state != name:
                    continue
                if value is DELETED:
                    data.pop(key, None)
                else:
                    data[key] = value

    def close(self) -> None:
        try:
            self.fn.close()
        finally:
            super().close()


@dataclass(frozen=True)
class BroadcastSpec(KeyedSpec):
    """``connect(stream.broadcast(name)).process(fn)``: ``key_fn`` keys the
    first input (``SideKeys(None, None)`` when it is not keyed); ``name`` is
    the broadcast state's."""

    name: str
    fn: BroadcastProcessFunction

    def instantiate(self, ctx: OperatorContext) -> KeyedOperator:
        assert isinstance(self.key_fn, SideKeys)
        return _Broadcast(ctx, self.key_fn, self.name, copy_function(self.fn, ctx.uid))
