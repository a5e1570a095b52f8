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

Over worker processes (``runtime/workers/termination.py``) each worker has a
tracker per loop that counts only its own part: the records its tasks put
into the loop (:attr:`LoopTracker.sent`, which is ``in_flight + done``) and
those they consumed (:attr:`LoopTracker.done`), both only ever growing. A
record sent in one worker and consumed in another makes the first count
positive and the second negative, so no worker can tell on its own; its
tracker then has a :attr:`~LoopTracker.watcher`, told whenever a task of the
loop runs out of input, and the loop is empty only once the job's
coordinator has concluded so from all the workers' counts
(:meth:`LoopTracker.conclude`).
"""

from __future__ import annotations

from collections.abc import Callable

from eddyflow.runtime.exchange.channel import InputGate

__all__ = ["LoopTracker"]


class LoopTracker:
    """The records in flight inside one loop, and the gates of the tasks
    that end when it is empty (see the module docstring)."""

    __slots__ = ("concluded", "done", "heads", "in_flight", "index", "open_entries", "watcher")

    def __init__(self, index: int) -> None:
        self.index = index
        self.in_flight = 0
        #: Records of the loop consumed here, ever (``in_flight + done``: sent here).
        self.done = 0
        self.open_entries = 0  # channels into the loop from outside, not ended yet
        self.heads: list[InputGate] = []  # gates of the tasks that end this loop
        #: Over worker processes: told when a task of the loop here runs out
        #: of input (``runtime/workers/termination.py``); ``None`` in one process.
        self.watcher: Callable[[LoopTracker], None] | None = None
        #: Over worker processes: the coordinator found the loop empty in every worker.
        self.concluded = False

    @property
    def sent(self) -> int:
        """Records put into the loop here, ever."""
        return self.in_flight + self.done

    @property
    def empty(self) -> bool:
        """No record is in the loop and no channel into it is open (over
        worker processes: the coordinator concluded so)."""
        if self.watcher is not None:
            return self.concluded
        return self.open_entries == 0 and self.in_flight == 0

    def _wake_heads(self) -> None:
        for gate in self.heads:
            gate.wake()  # a head blocked on its gate re-checks for the end

    def consumed(self, n: int) -> None:
        """A task processed ``n`` of the loop's records and buffered their
        outputs."""
        self.in_flight -= n
        self.done += n
        if self.in_flight == 0 and self.open_entries == 0 and self.watcher is None:
            self._wake_heads()

    def entry_ended(self) -> None:
        """A channel into the loop from outside it ended."""
        self.open_entries -= 1
        if self.empty:
            self._wake_heads()

    def idle(self) -> None:
        """A task of the loop has nothing to read now (over worker
        processes, a moment to report this worker's counts)."""
        watcher = self.watcher
        if watcher is not None:
            watcher(self)

    def conclude(self) -> None:
        """The coordinator found the loop empty in every worker process: its heads end it."""
        self.concluded = True
        self._wake_heads()

    def __repr__(self) -> str:
        return f"LoopTracker(loop {self.index}, {self.in_flight} in flight)"
