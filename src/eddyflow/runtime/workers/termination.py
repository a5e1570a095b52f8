"""The end of a loop whose tasks run in several worker processes
(docs/concepts/cycles.md, Termination; docs/concepts/workers.md).

In one process a loop is empty when its count of records in flight is zero
(``runtime/exchange/loops.py``). Over workers a record is put into the loop
in one worker and consumed in another, so each worker ``w`` keeps two counts
per loop that only ever grow: ``S_w``, the records its tasks put into the
loop (buffered into one of the loop's channels, admitted by a ``map_async``
in the loop, re-injected from a back-edge log), and ``D_w``, the loop's
records its tasks consumed (processed, with their outputs counted in
``S``). Written ``S(t)`` and ``D(t)`` for the sums over the workers at a
real instant ``t``:

* ``D(t) <= S(t)`` at every instant, and ``S(t) - D(t)`` is the number of
  records in the loop at ``t`` (buffered, on a socket, queued, or being
  processed: a record's consumption is counted only after its outputs are
  counted as put in, and a record is counted as put in before it leaves its
  worker);
* once every channel into the loop from outside has ended and ``S(t) =
  D(t)``, nothing can ever put a record into the loop again: the loop is
  empty for good. (This is the one-process condition, summed.)

No worker sees the sums, and counts read in different workers at different
moments are no snapshot. The coordinator in the calling process therefore
runs *waves* (Mattern's four-counter method): it asks every worker for its
counts (:class:`ProbeLoop`); each worker answers at once from its own event
loop (:class:`LoopCounts`: ``S_w``, ``D_w`` and its channels into the loop
still open), so each answer is one instant of that worker. Let wave ``k``
read ``S_k``, ``D_k`` in total and end, with its last answer, at ``t1``,
and wave ``k+1`` start after ``t1``. The counts only grow, so

    D_k <= D(t1) <= S(t1) <= S_{k+1}

and when ``D_k = S_{k+1}`` all of these are equal: at the instant ``t1``
nothing was in the loop. If every worker also reported its entries ended in
wave ``k`` (they stay ended), the loop was empty for good at ``t1``: the
coordinator tells every worker (:class:`EndLoop`), whose loop heads then end
the loop as in one process (end of input round the loop). Two waves are
needed: one wave alone can read ``S_k = D_k`` with records in the loop (a
record put in after one worker answered and consumed before another did is
in neither count, while its outputs are).

Waves are run when they can succeed, not on a timer, so a bounded job ends
as soon as its loops are empty, and a busy loop is not probed all the time:

* a worker reports (:class:`LoopIdle`) when a task of the loop runs out of
  input, the worker's own entries into the loop have all ended, and its
  counts changed since its last report; the coordinator starts a wave on a
  report (or runs one more after the wave in flight);
* while a worker is known to have entries open (it said so in a wave), no
  wave starts: that worker reports once its last entry has ended;
* a wave that reads nothing in flight is followed at once by the one that
  may confirm it.

That it ends: once the loop is empty and its entries ended, each worker's
counts stopped changing at some last change, after which one of its loop
tasks ran out of input and reported (links are FIFO: an answer a worker
sent before its entries ended arrives before that report, so no worker is
then still known to have one open). The coordinator starts a wave after the
last of these reports, at once or when the wave in flight ends; it reads
the final counts everywhere, nothing in flight, and the confirming wave
concludes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eddyflow.runtime.exchange.loops import LoopTracker
from eddyflow.runtime.workers.protocol import EndLoop, LoopCounts, LoopIdle, ProbeLoop

__all__ = ["LoopReports", "LoopTermination"]


class LoopReports:
    """A worker's side: its trackers report when a task of their loop runs
    out of input, and it answers the coordinator's probes and ends."""

    def __init__(self, loops: list[LoopTracker], send: Callable[[Any], None]) -> None:
        self.loops = loops
        self.send = send
        self._reported: dict[int, tuple[int, int]] = {}
        for tracker in loops:
            tracker.watcher = self.idle

    def idle(self, tracker: LoopTracker) -> None:
        """A task of ``tracker``'s loop has nothing to read: report the
        counts if the worker's entries into it have ended and they changed."""
        if tracker.concluded or tracker.open_entries:
            return
        counts = (tracker.sent, tracker.done)
        if self._reported.get(tracker.index) != counts:
            self._reported[tracker.index] = counts
            self.send(LoopIdle(tracker.index, *counts))

    def on_probe(self, probe: ProbeLoop) -> None:
        """Answer ``probe`` with this instant's counts."""
        t = self.loops[probe.loop]
        self.send(LoopCounts(probe.loop, probe.wave, t.sent, t.done, t.open_entries))

    def on_end(self, end: EndLoop) -> None:
        """The loop is empty everywhere: its heads here end it."""
        self.loops[end.loop].conclude()


class _Waves:
    """The coordinator's waves over one loop."""

    def __init__(self, loop: int, workers: int, send: Callable[[int, Any], None]) -> None:
        self.loop = loop
        self.workers = workers
        self.send = send
        self.wave = 0
        self.running = False
        self.pending = False  # a report came while a wave ran
        self.answers: dict[int, LoopCounts] = {}
        #: Workers that last said they have entries into the loop open.
        self.blocked: set[int] = set()
        #: The last completed wave: consumed records read, entries open.
        self.previous: tuple[int, int] | None = None
        self.concluded = False

    def start(self) -> None:
        self.wave += 1
        self.running = True
        self.pending = False
        self.answers = {}
        for w in range(self.workers):
            self.send(w, ProbeLoop(self.loop, self.wave))

    def on_idle(self, worker: int) -> None:
        self.blocked.discard(worker)  # (it reports only with its entries ended)
        if self.concluded:
            return
        if self.running:
            self.pending = True
        elif not self.blocked:
            self.start()

    def on_counts(self, worker: int, counts: LoopCounts) -> None:
        if self.concluded or counts.wave != self.wave:
            return
        if counts.open_entries:
            self.blocked.add(worker)
        else:
            self.blocked.discard(worker)
        self.answers[worker] = counts
        if len(self.answers) < self.workers:
            return
        sent = sum(a.sent for a in self.answers.values())
        done = sum(a.done for a in self.answers.values())
        open_entries = sum(a.open_entries for a in self.answers.values())
        previous, self.previous = self.previous, (done, open_entries)
        if previous is not None and previous == (sent, 0):
            # D_k = S_{k+1}, entries ended in wave k: empty (module docstring).
            self.concluded = True
            self.running = False
            for w in range(self.workers):
                self.send(w, EndLoop(self.loop))
        elif open_entries == 0 and sent == done:
            self.start()  # nothing in flight: the wave that may confirm it
        elif self.pending and not self.blocked:
            self.start()
        else:
            self.running = False


class LoopTermination:
    """The coordinator's side, for every loop of the job: waves of probes
    on the workers' reports, and the end of each loop once two waves prove
    it empty (module docstring)."""

    def __init__(self, loops: int, workers: int, send: Callable[[int, Any], None]) -> None:
        self.loops = [_Waves(i, workers, send) for i in range(loops)]

    def on_idle(self, worker: int, idle: LoopIdle) -> None:
        """``worker`` reported a moment to probe ``idle.loop``."""
        self.loops[idle.loop].on_idle(worker)

    def on_counts(self, worker: int, counts: LoopCounts) -> None:
        """``worker`` answered a probe."""
        self.loops[counts.loop].on_counts(worker, counts)
