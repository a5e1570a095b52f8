"""Restart strategies: how often and how soon a failed job restarts
in-process from its latest complete checkpoint (docs/concepts/checkpoints.md, Recovery)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FixedDelayRestart", "NoRestart", "RestartStrategy"]


class RestartStrategy:
    attempts = 0
    delay = 0.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(attempts={self.attempts}, delay={self.delay})"


class NoRestart(RestartStrategy):
    """The first failure fails the job (the default)."""


@dataclass(frozen=True, repr=False)
class FixedDelayRestart(RestartStrategy):
    """Restart up to ``attempts`` times, waiting ``delay`` seconds each time."""

    attempts: int = 3
    delay: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"attempts must be an int, got {self.attempts!r}")
        if self.attempts < 0:
            raise ValueError(f"attempts must be >= 0, got {self.attempts}")
        if not self.delay >= 0:
            raise ValueError(f"delay must be >= 0 seconds, got {self.delay}")
