"""Side outputs: ``SideRecord``, how an operator (the window operator, for
its late records) puts a record in a side output among its outputs, and
the two stateless selections ``WindowedStream`` adds after it: its main
output (``MainOutputSpec``) and a side output (``SideOutputSpec``,
``get_side_output(tag)``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from eddyflow.runtime.operators.base import Operator, OperatorContext
from eddyflow.windowing.windows import OutputTag

__all__ = ["MainOutputSpec", "SideOutputSpec", "SideRecord"]


class SideRecord(NamedTuple):
    """A record for the side output ``tag`` (a tag's name), among the
    window operator's outputs until a side or main selection unwraps or
    drops it."""

    tag: str
    value: Any


class _SelectSide(Operator):
    """The records of one side output, unwrapped (with their timestamps)."""

    pure = True

    def __init__(self, ctx: OperatorContext, tag: str | None) -> None:
        super().__init__(ctx)
        self.tag = tag

    def process(self, batch: list[Any]) -> list[Any]:
        return self.process_ts(batch, None)[0]

    def process_ts(self, batch: list[Any], timestamps: list[Any] | None
                   ) -> tuple[list[Any], list[Any] | None]:
        tag = self.tag
        picked = [i for i, r in enumerate(batch)
                  if (type(r) is SideRecord) == (tag is not None)
                  and (tag is None or r.tag == tag)]
        out = ([batch[i] for i in picked] if tag is None
               else [batch[i].value for i in picked])
        if timestamps is None:
            return out, None
        return out, [timestamps[i] for i in picked]

    def output_counts(self, batch: list[Any]) -> list[int] | None:
        tag = self.tag
        return [int((type(r) is SideRecord) == (tag is not None)
                    and (tag is None or r.tag == tag)) for r in batch]


@dataclass(frozen=True)
class SideOutputSpec:
    """``get_side_output(tag)``: the records the operator before put in ``tag``."""

    tag: OutputTag

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _SelectSide(ctx, self.tag.name)


@dataclass(frozen=True)
class MainOutputSpec:
    """The main output of an operator with side outputs: its records that
    are not side records."""

    def instantiate(self, ctx: OperatorContext) -> Operator:
        return _SelectSide(ctx, None)
