"""Window functions: the user-facing ABCs (``AggregateFunction``,
``ProcessWindowFunction``) and the adapters the window operator runs.

An adapter turns ``reduce(fn)``, ``aggregate(agg)``, ``sum(value_fn)``,
``count()`` or ``process(fn)`` into one shape:

* ``first(value) -> acc``: the accumulator of a window's first record;
* ``add(acc, value) -> acc``: fold in one more record;
* ``merge(a, b) -> acc``: the accumulator of two merging session windows
  (``a`` the earlier window's);
* ``result(key, window, acc) -> list``: what the window emits when it fires
  (``result_for(key, start, end, acc)`` the same from the bounds).

Accumulators are plain values (the running reduce value, the sum, an
``int`` count, the user's accumulator, a tuple of elements for ``process``)
and adapters never keep one: the operator stores them as keyed state per
(key, window) in either backend, so they must pickle, which is why nothing
callable ever goes into one. ``reduce``/``aggregate``/``sum``/``count`` keep
one accumulator per window, never the elements (``incremental``).

The built-in adapters do not change an accumulator in place (``process``
builds a new tuple per record: quadratic for a huge window, so the operator
should rather append to list state and hand ``result`` the list). A user's
``AggregateFunction.add`` may mutate its accumulator and return it, as in
Flink; the operator writes the returned value back either way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from eddyflow.windowing.windows import TimeWindow, WindowAssigner, WindowResult

__all__ = [
    "AggregateAdapter",
    "AggregateFunction",
    "CountAdapter",
    "ProcessAdapter",
    "ProcessWindowFunction",
    "ReduceAdapter",
    "SumAdapter",
    "WindowAdapter",
    "check_window_function",
]


class AggregateFunction(ABC):
    """An incremental aggregation (Flink's ``AggregateFunction``, with the
    accumulator passed last as Python code reads best):
    ``create_accumulator() -> acc``, ``add(value, acc) -> acc``,
    ``get_result(acc) -> result``, ``merge(a, b) -> acc``.

    ``merge`` is needed only for session windows; a subclass that does not
    override it is refused with session windows when the job is declared.
    """

    @abstractmethod
    def create_accumulator(self) -> Any:
        """A new, empty accumulator."""

    @abstractmethod
    def add(self, value: Any, accumulator: Any) -> Any:
        """``accumulator`` with ``value`` folded in (may change it in place
        and return it)."""

    @abstractmethod
    def get_result(self, accumulator: Any) -> Any:
        """The window's value from its accumulator."""

    def merge(self, a: Any, b: Any) -> Any:
        """One accumulator holding both (``a`` is the earlier window's)."""
        raise NotImplementedError(
            f"{type(self).__name__}.merge is not implemented: session windows need it")


class ProcessWindowFunction(ABC):
    """Sees a whole window at once: ``process(key, window, elements)`` is a
    generator whose outputs are emitted as they are (not wrapped in a
    ``WindowResult``). The window keeps every element until it is dropped."""

    @abstractmethod
    def process(self, key: Any, window: TimeWindow, elements: list[Any]) -> Iterable[Any]:
        """Yield the outputs for ``window`` of ``key``; ``elements`` in arrival
        order (merged sessions: the earlier session's first)."""


def _callable(owner: str, name: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"{owner}: {name} must be callable, got {fn!r}")


class WindowAdapter(ABC):
    """The one shape the window operator runs (see the module docstring)."""

    #: One accumulator per window rather than the elements.
    incremental: bool = True
    #: ``merge`` works, so the function can run over session windows.
    mergeable: bool = True
    #: For error messages: the API method this adapter stands for.
    method: str = ""

    @abstractmethod
    def first(self, value: Any) -> Any:
        """The accumulator of a window whose first record is ``value``."""

    @abstractmethod
    def add(self, accumulator: Any, value: Any) -> Any:
        """``accumulator`` with ``value`` folded in."""

    @abstractmethod
    def merge(self, a: Any, b: Any) -> Any:
        """The accumulator of a merged window (``a``: the earlier window)."""

    def result(self, key: Any, window: TimeWindow, accumulator: Any) -> list[Any]:
        """What the window emits when it fires: one ``WindowResult``."""
        return self.result_for(key, window.start, window.end, accumulator)

    def result_for(self, key: Any, start: float, end: float, accumulator: Any) -> list[Any]:
        """``result`` for the window ``[start, end)``, without building a
        ``TimeWindow`` unless the function needs one (the operator's hot path)."""
        return [WindowResult(key, start, end, self.value(accumulator))]

    def value(self, accumulator: Any) -> Any:
        """The value of ``WindowResult`` (incremental adapters)."""
        return accumulator


class ReduceAdapter(WindowAdapter):
    """``reduce(fn)``: ``fn(a, b)`` folds two values of the window into one;
    the accumulator is the reduced value. ``fn`` also merges sessions."""

    method = "reduce"

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        _callable("reduce", "fn", fn)
        self.fn = fn

    def first(self, value: Any) -> Any:
        return value

    def add(self, accumulator: Any, value: Any) -> Any:
        return self.fn(accumulator, value)

    def merge(self, a: Any, b: Any) -> Any:
        return self.fn(a, b)


class SumAdapter(WindowAdapter):
    """``sum(value_fn)``: the sum of ``value_fn(record)``, started from the
    first value (not from 0, as the keyed ``sum``: floats, Decimals and
    anything with ``+`` add up in their own type)."""

    method = "sum"

    def __init__(self, value_fn: Callable[[Any], Any]) -> None:
        _callable("sum", "value_fn", value_fn)
        self.value_fn = value_fn

    def first(self, value: Any) -> Any:
        return self.value_fn(value)

    def add(self, accumulator: Any, value: Any) -> Any:
        return accumulator + self.value_fn(value)

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


class CountAdapter(WindowAdapter):
    """``count()``: the number of records in the window (an ``int``)."""

    method = "count"

    def first(self, value: Any) -> Any:
        return 1

    def add(self, accumulator: Any, value: Any) -> Any:
        return accumulator + 1

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


class AggregateAdapter(WindowAdapter):
    """``aggregate(agg)``: the user's accumulator; ``WindowResult.value`` is
    ``agg.get_result(acc)``."""

    method = "aggregate"

    def __init__(self, agg: AggregateFunction) -> None:
        if not isinstance(agg, AggregateFunction):
            raise TypeError(f"aggregate: expected an ef.AggregateFunction, got {agg!r}")
        self.agg = agg
        # Whether the subclass overrides merge (the base one raises).
        self.mergeable = type(agg).merge is not AggregateFunction.merge

    def first(self, value: Any) -> Any:
        return self.agg.add(value, self.agg.create_accumulator())

    def add(self, accumulator: Any, value: Any) -> Any:
        return self.agg.add(value, accumulator)

    def merge(self, a: Any, b: Any) -> Any:
        return self.agg.merge(a, b)

    def value(self, accumulator: Any) -> Any:
        return self.agg.get_result(accumulator)


class ProcessAdapter(WindowAdapter):
    """``process(fn)``: the accumulator is the tuple of the window's elements
    (a tuple: immutable, so the pure ``add`` cannot corrupt a snapshot);
    ``result`` runs ``fn.process`` and emits what it yields."""

    method = "process"
    incremental = False

    def __init__(self, fn: ProcessWindowFunction) -> None:
        if not isinstance(fn, ProcessWindowFunction):
            raise TypeError(f"process: expected an ef.ProcessWindowFunction, got {fn!r}")
        self.fn = fn

    def first(self, value: Any) -> Any:
        return (value,)

    def add(self, accumulator: Any, value: Any) -> Any:
        return (*accumulator, value)

    def merge(self, a: Any, b: Any) -> Any:
        return (*a, *b)

    def result(self, key: Any, window: TimeWindow, accumulator: Sequence[Any]) -> list[Any]:
        return list(self.fn.process(key, window, list(accumulator)))

    def result_for(self, key: Any, start: float, end: float, accumulator: Any) -> list[Any]:
        return self.result(key, TimeWindow(start, end), accumulator)


def check_window_function(adapter: WindowAdapter, assigner: WindowAssigner) -> None:
    """Refuses, when the job is declared, a function the windows cannot run:
    an ``AggregateFunction`` without ``merge`` over session windows."""
    if assigner.is_merging and not adapter.mergeable:
        name = type(getattr(adapter, "agg", adapter)).__name__
        raise TypeError(
            f"{adapter.method}: {name} must implement merge(a, b) to run over "
            f"{type(assigner).__name__} (merging windows merge their accumulators)")
