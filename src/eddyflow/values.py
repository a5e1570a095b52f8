"""What the runtime knows of Python values, for every package that must
tell whether user code can change a value in place (state snapshots,
replayed collections). Standard library only."""

from __future__ import annotations

__all__ = ["CONTAINERS", "SCALARS"]

#: Values no code can change in place.
SCALARS = frozenset({int, float, str, bytes, bool, complex, type(None)})
#: Immutable containers: immutable when everything in them is.
CONTAINERS = frozenset({tuple, frozenset})
