"""What the runtime knows of Python values, for every package that must
tell whether user code can change a value in place (state snapshots,
replayed collections, records handed to several consumers), and how it
gives each its own copy. Standard library only."""

from __future__ import annotations

import copy
import itertools
import pickle
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["CONTAINERS", "SCALARS", "immutable", "independent_copy"]

#: Values no code can change in place.
SCALARS = frozenset({int, float, str, bytes, bool, complex, type(None)})
#: Immutable containers: immutable when everything in them is.
CONTAINERS = frozenset({tuple, frozenset})


def immutable(items: Sequence[Any]) -> bool:
    """Whether every item is an immutable value (checked level by level of
    nested tuples, at C speed where a level holds only tuples)."""
    level: Iterable[Any] = items
    while True:
        types = set(map(type, level))
        if types <= SCALARS:
            return True
        if not types <= SCALARS | CONTAINERS:
            return False
        containers = (level if types <= CONTAINERS
                      else [x for x in level if type(x) in CONTAINERS])
        level = list(itertools.chain.from_iterable(containers))


def independent_copy(items: list[Any]) -> list[Any] | None:
    """A copy of ``items`` that shares no mutable object with them: a pickle
    round trip (one C-level pass for the whole list), or a deep copy of
    what does not pickle; ``None`` if neither works."""
    try:
        copied: list[Any] = pickle.loads(pickle.dumps(items, pickle.HIGHEST_PROTOCOL))
        return copied
    except Exception:
        try:
            return copy.deepcopy(items)
        except Exception:
            return None
