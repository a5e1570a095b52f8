"""User function types: ``KeyedProcessFunction`` and the ``RuntimeContext``
it is opened with and called with."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from eddyflow.state.abc import KeyedStateBackend
from eddyflow.state.handles import ListState, MapState, ReducingState, ValueState

__all__ = ["KeyedProcessFunction", "RuntimeContext"]


class RuntimeContext:
    """What a keyed function knows about where it runs, and its state."""

    def __init__(
        self,
        operator: str,
        subtask: int,
        parallelism: int,
        max_parallelism: int,
        backend: KeyedStateBackend,
    ) -> None:
        self.operator_name = operator
        self.subtask_index = subtask
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self._backend = backend

    @property
    def current_key(self) -> Any:
        """The key of the record being processed."""
        return self._backend.current_key

    def value_state(self, name: str, default: Any = None) -> ValueState[Any]:
        return ValueState(self._backend, name, default)

    def list_state(self, name: str) -> ListState[Any]:
        return ListState(self._backend, name)

    def map_state(self, name: str) -> MapState[Any, Any]:
        return MapState(self._backend, name)

    def reducing_state(self, name: str, fn: Callable[[Any, Any], Any]) -> ReducingState[Any]:
        return ReducingState(self._backend, name, fn)


class KeyedProcessFunction(ABC):
    """A function of a keyed stream with keyed state.

    Every parallel subtask gets its own copy of the object (as Flink
    serialises one per subtask), so state handles kept on ``self`` in
    :meth:`open` are per subtask.
    """

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Declare state handles here."""

    @abstractmethod
    def process(self, value: Any, ctx: RuntimeContext) -> Iterable[Any] | None:
        """Handle one record; yield (or return an iterable of) output records."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called once when the subtask ends."""
