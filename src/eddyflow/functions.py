"""User function types: ``KeyedProcessFunction`` and the ``RuntimeContext``
it is opened with and called with."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from eddyflow.state.abc import KeyedStateBackend
from eddyflow.state.handles import ListState, MapState, ReducingState, ValueState

if TYPE_CHECKING:
    from eddyflow.runtime.timers import TimerService

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
        #: The event timestamp of the record being processed (``None`` if it
        #: has none), or of the timer firing in ``on_timer``.
        self.timestamp: float | None = None
        #: Timers of the current key (set by the operator before ``open``).
        self.timer_service: TimerService = None  # type: ignore[assignment]

    @property
    def current_key(self) -> Any:
        """The key of the record being processed (of the timer, in ``on_timer``)."""
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

    def on_timer(self, timestamp: float, ctx: RuntimeContext) -> Iterable[Any] | None:
        """A timer registered for ``timestamp`` fires (``ctx.current_key`` is
        its key, ``ctx.timestamp`` its time); yield outputs. Event-time
        timers fire once the watermark reaches them, in timestamp order;
        processing-time timers once the job's clock does."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called once when the subtask ends."""
