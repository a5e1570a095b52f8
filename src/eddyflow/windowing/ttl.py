"""State time-to-live (``ef.StateTtl``): the parameter of a keyed state
whose entries expire, and the one expiry rule the backends share.

An entry written (or last updated) at ``written_at`` expires at
``written_at + seconds`` and is expired from then on, inclusive, as in
Flink (``lastAccess + ttl <= now``). Which clock ``now`` reads is the
runtime's choice (processing time, Flink's only TTL time); the rule does not
depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from eddyflow.windowing._checks import positive

__all__ = ["StateTtl"]


@dataclass(frozen=True)
class StateTtl:
    """``ctx.value_state("seen", ttl=ef.StateTtl(3600.0))``: entries expire
    ``seconds`` after they were last written; expired entries are never
    returned and are dropped from snapshots."""

    seconds: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", positive("StateTtl", "seconds", self.seconds))

    def expires_at(self, written_at: float) -> float:
        """The time from which an entry written at ``written_at`` is expired."""
        return written_at + self.seconds

    def expired(self, written_at: float, now: float) -> bool:
        """Whether an entry written at ``written_at`` is expired at ``now``."""
        return written_at + self.seconds <= now
