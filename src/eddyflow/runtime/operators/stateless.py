"""Stateless operators: ``map``, ``filter``, ``flat_map`` and the loop head.
Each is one list operation per batch (a C-level loop); being pure, they
find a failing record by re-running the batch record by record."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from eddyflow.runtime.operators.base import Operator, OperatorContext

__all__ = ["FilterSpec", "FlatMapSpec", "IterationHeadSpec", "MapSpec"]


class _PureOperator(Operator):
    pure = True

    def __init__(self, ctx: OperatorContext, fn: Callable[[Any], Any]) -> None:
        super().__init__(ctx)
        self.fn = fn

    def locate_failure(self, batch: list[Any]) -> int | None:
        for i, r in enumerate(batch):
            try:
                self.process([r])
            except Exception:
                return i
        return None  # not reproducible: the function is not deterministic

    def output_counts(self, batch: list[Any]) -> list[int] | None:
        return [len(self.process([r])) for r in batch]


class _Map(_PureOperator):
    one_to_one = True

    def process(self, batch: list[Any]) -> list[Any]:
        return list(map(self.fn, batch))


class _Filter(_PureOperator):
    def process(self, batch: list[Any]) -> list[Any]:
        return list(filter(self.fn, batch))

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        # The predicate once per record; both lists kept by its answers.
        keep = list(map(self.fn, batch))
        kept = list(itertools.compress(batch, keep))
        if timestamps is None:
            return kept, None
        return kept, list(itertools.compress(timestamps, keep))


class _FlatMap(_PureOperator):
    def process(self, batch: list[Any]) -> list[Any]:
        return list(itertools.chain.from_iterable(map(self.fn, batch)))

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        parts = [list(p) for p in map(self.fn, batch)]
        out = list(itertools.chain.from_iterable(parts))
        if timestamps is None:
            return out, None
        # Each output takes its input's timestamp (the output_counts idea).
        return out, [t for t, p in zip(timestamps, parts, strict=True) for _ in p]


class _Identity(Operator):
    one_to_one = True
    pure = True

    def process(self, batch: list[Any]) -> list[Any]:
        return batch


@dataclass(frozen=True)
class IterationHeadSpec:
    """The head of a loop (``ds.iterate()``): passes on both the records that
    enter the loop and those fed back by ``close_with``."""

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _Identity(ctx)


@dataclass(frozen=True)
class MapSpec:
    """``map(fn)``: one output per record."""

    fn: Callable[[Any], Any]

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _Map(ctx, self.fn)


@dataclass(frozen=True)
class FilterSpec:
    """``filter(fn)``: the records ``fn`` accepts."""

    fn: Callable[[Any], Any]

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _Filter(ctx, self.fn)


@dataclass(frozen=True)
class FlatMapSpec:
    """``flat_map(fn)``: every output of ``fn`` for each record."""

    fn: Callable[[Any], Iterable[Any]]

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _FlatMap(ctx, self.fn)
