"""Argument checks of the public types (windows, watermark strategies, state
time-to-live): every constructor rejects bad parameters at once, naming the
class and the parameter, so a mistake shows up where the job is declared and
not as a wrong result later."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["finite", "non_negative", "positive"]


def finite(owner: str, name: str, value: Any) -> float:
    """``value`` as a float; a TypeError unless it is a real number (bools are
    not: ``size=True`` is a mistake), a ValueError when it is NaN or infinite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner}: {name} must be a number of seconds, got {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{owner}: {name} must be finite, got {value!r}")
    return result


def positive(owner: str, name: str, value: Any) -> float:
    """A finite float > 0."""
    result = finite(owner, name, value)
    if result <= 0.0:
        raise ValueError(f"{owner}: {name} must be > 0, got {value!r}")
    return result


def non_negative(owner: str, name: str, value: Any) -> float:
    """A finite float >= 0."""
    result = finite(owner, name, value)
    if result < 0.0:
        raise ValueError(f"{owner}: {name} must be >= 0, got {value!r}")
    return result
