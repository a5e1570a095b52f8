"""Loop termination by counting (docs/concepts/cycles.md, Termination).

A bounded iterative job ends when its sources are exhausted and no record is
anywhere in any loop. Each loop (a strongly connected component of the plan)
has a :class:`LoopTracker` counting the records in flight on the channels
inside it: a writer adds a batch's records when it buffers them (before any
await, so the count never dips while records are on their way), and a task
subtracts a batch's records only after it has processed the batch and
buffered all its outputs. Everything runs on one event loop, so when the
count is zero no record is buffered, queued or being processed anywhere in
the loop. A loop head whose regular inputs have all ended and whose loop
count is zero, and every channel that *enters* the loop from outside has
ended, knows the loop is empty and ends: no timeout, no idle wait. (Its own
input ending is not enough: another head subtask, or another entry into the
same loop, may still feed records that come back to it.)
"""

from __future__ import annotations

from eddyflow.runtime.exchange.channel import InputGate

__all__ = ["LoopTracker"]


class LoopTracker:
    """The records in flight inside one loop, and the gates of the tasks
    that end when it is empty (see the module docstring)."""

    __slots__ = ("heads", "in_flight", "index", "open_entries")

    def __init__(self, index: int) -> None:
        self.index = index
        self.in_flight = 0
        self.open_entries = 0  # channels into the loop from outside, not ended yet
        self.heads: list[InputGate] = []  # gates of the tasks that end this loop

    @property
    def empty(self) -> bool:
        """No record is in the loop and no channel into it is open."""
        return self.open_entries == 0 and self.in_flight == 0

    def _wake_heads(self) -> None:
        for gate in self.heads:
            gate.wake()  # a head blocked on its gate re-checks for the end

    def consumed(self, n: int) -> None:
        """A task processed ``n`` of the loop's records and buffered their
        outputs."""
        self.in_flight -= n
        if self.in_flight == 0 and self.open_entries == 0:
            self._wake_heads()

    def entry_ended(self) -> None:
        """A channel into the loop from outside it ended."""
        self.open_entries -= 1
        if self.empty:
            self._wake_heads()

    def __repr__(self) -> str:
        return f"LoopTracker(loop {self.index}, {self.in_flight} in flight)"
