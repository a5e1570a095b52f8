"""The end of a loop over worker processes (``runtime/workers/termination.py``).

The workers' trackers and reports and the caller's waves are the real ones;
the processes, links and tasks are simulated: every message and record is
delivered, and every worker acts, in an order a random scheduler picks
(links are FIFO, as sockets are; records travel on links of their own, in
any order relative to the control messages). A loop is concluded empty only
when no record is anywhere in it and every entry has ended (safety), and
every run ends with the loop concluded (liveness: nothing is left to do
otherwise, no timer exists)."""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import pytest

from eddyflow.runtime.exchange.loops import LoopTracker
from eddyflow.runtime.workers.protocol import EndLoop, LoopCounts, LoopIdle, ProbeLoop
from eddyflow.runtime.workers.termination import LoopReports, LoopTermination

#: Runs per worker count (a single-wave rule fails within a few hundred).
SEEDS = 800


class World:
    """``workers`` simulated workers of one loop and the calling process."""

    def __init__(self, rng: random.Random, workers: int, records: int, hops: int) -> None:
        self.rng = rng
        self.n = workers
        self.down: list[deque[Any]] = [deque() for _ in range(workers)]  # caller -> worker
        self.up: list[deque[Any]] = [deque() for _ in range(workers)]  # worker -> caller
        # Records in flight, per (from, to) link; then queued at the consumer.
        self.links: dict[tuple[int, int], deque[int]] = {
            (a, b): deque() for a in range(workers) for b in range(workers)}
        self.queued: list[deque[int]] = [deque() for _ in range(workers)]
        self.trackers = [LoopTracker(0) for _ in range(workers)]
        self.reports = [LoopReports([t], self.up[w].append) for w, t in enumerate(self.trackers)]
        self.caller = LoopTermination(1, workers, lambda w, m: self.down[w].append(m))
        # Each worker has one entry into the loop, feeding some records.
        self.to_enter = [rng.randint(0, records) for _ in range(workers)]
        for t in self.trackers:
            t.open_entries = 1
        self.hops = hops
        self.waiting = [False] * workers  # a task waits on its empty gate
        self.ended = [False] * workers  # EndLoop arrived
        self.waves = 0

    def in_loop(self) -> int:
        return (sum(map(len, self.links.values())) + sum(map(len, self.queued)))

    def entries_open(self) -> bool:
        return any(t.open_entries for t in self.trackers)

    def send_record(self, w: int, hops: int) -> None:
        self.trackers[w].in_flight += 1  # counted before it leaves (as writers do)
        self.links[(w, self.rng.randrange(self.n))].append(hops)

    def actions(self) -> list[Any]:
        acts: list[Any] = []
        for w in range(self.n):
            if self.down[w]:
                acts.append(("down", w))
            if self.up[w]:
                acts.append(("up", w))
            if self.to_enter[w]:
                acts.append(("enter", w))
            elif self.trackers[w].open_entries:
                acts.append(("entry-ends", w))
            if self.queued[w]:
                acts.append(("process", w))
            elif not self.waiting[w]:
                acts.append(("idle", w))
        acts.extend(("deliver", k) for k, q in self.links.items() if q)
        return acts

    def step(self, act: Any) -> None:
        kind, w = act
        if kind == "down":
            msg = self.down[w].popleft()
            if isinstance(msg, ProbeLoop):
                self.reports[w].on_probe(msg)
            else:
                assert isinstance(msg, EndLoop)
                # Safety: the loop is empty for good when it is concluded.
                assert self.in_loop() == 0 and not self.entries_open() \
                    and not any(self.to_enter), "concluded with records in the loop"
                self.reports[w].on_end(msg)
                self.ended[w] = True
        elif kind == "up":
            msg = self.up[w].popleft()
            if isinstance(msg, LoopIdle):
                self.caller.on_idle(w, msg)
            else:
                assert isinstance(msg, LoopCounts)
                self.waves += msg.wave != self.waves
                self.caller.on_counts(w, msg)
        elif kind == "enter":
            self.to_enter[w] -= 1
            self.send_record(w, self.rng.randint(0, self.hops))
            self.waiting[w] = False
        elif kind == "entry-ends":
            self.trackers[w].entry_ended()
            self.waiting[w] = False
        elif kind == "process":
            hops = self.queued[w].popleft()
            for _ in range(self.rng.choice([0, 1, 1, 1, 2]) if hops else 0):
                self.send_record(w, hops - 1)  # outputs counted before the input
            self.trackers[w].consumed(1)
            self.waiting[w] = False
        elif kind == "idle":
            self.trackers[w].idle()
            self.waiting[w] = True
        else:
            a, b = w
            self.queued[b].append(self.links[(a, b)].popleft())


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_a_loop_is_concluded_empty_exactly_when_it_is(workers: int) -> None:
    for seed in range(SEEDS):
        rng = random.Random(seed * 31 + workers)
        world = World(rng, workers, records=rng.randint(0, 8), hops=rng.randint(0, 6))
        for _ in range(200_000):
            acts = world.actions()
            if not acts:
                break
            world.step(rng.choice(acts))
        assert not world.actions(), f"seed {seed}: did not settle"
        # Liveness: with nothing left to do, every worker heard the end.
        assert all(world.ended), f"seed {seed}: the loop was never concluded empty"
        assert all(t.empty for t in world.trackers)


def test_one_wave_that_reads_nothing_in_flight_is_not_enough() -> None:
    """A record put in by worker 1 after worker 0 answered, and consumed by
    worker 1 before it answered, is in neither count: the first wave reads
    as many records consumed as put in while one is still in flight (the
    output worker 1 sent to worker 0). The confirming wave tells."""
    sent: list[tuple[int, Any]] = []
    caller = LoopTermination(1, 2, lambda w, m: sent.append((w, m)))
    caller.on_idle(0, LoopIdle(0, 1, 0))
    assert [m for _, m in sent] == [ProbeLoop(0, 1), ProbeLoop(0, 1)]
    sent.clear()
    caller.on_counts(0, LoopCounts(0, 1, sent=0, done=0, open_entries=0))
    caller.on_counts(1, LoopCounts(0, 1, sent=1, done=1, open_entries=0))
    # Reads as empty: the confirming wave starts, nothing is concluded.
    assert [m for _, m in sent] == [ProbeLoop(0, 2), ProbeLoop(0, 2)]
    sent.clear()
    caller.on_counts(0, LoopCounts(0, 2, sent=0, done=0, open_entries=0))
    caller.on_counts(1, LoopCounts(0, 2, sent=2, done=1, open_entries=0))
    assert not any(isinstance(m, EndLoop) for _, m in sent)
    # Once worker 0 consumed that record, two waves agree: the end.
    caller.on_idle(0, LoopIdle(0, 0, 1))
    for wave in (3, 4):
        caller.on_counts(0, LoopCounts(0, wave, sent=0, done=1, open_entries=0))
        caller.on_counts(1, LoopCounts(0, wave, sent=2, done=1, open_entries=0))
    assert [m for _, m in sent][-2:] == [EndLoop(0), EndLoop(0)]


def test_no_wave_while_a_worker_has_entries_open() -> None:
    sent: list[tuple[int, Any]] = []
    caller = LoopTermination(1, 2, lambda w, m: sent.append((w, m)))
    caller.on_idle(1, LoopIdle(0, 5, 5))
    caller.on_counts(0, LoopCounts(0, 1, sent=3, done=0, open_entries=1))
    caller.on_counts(1, LoopCounts(0, 1, sent=5, done=5, open_entries=0))
    sent.clear()
    caller.on_idle(1, LoopIdle(0, 6, 6))  # worker 0's entry is still open
    assert sent == []
    caller.on_idle(0, LoopIdle(0, 3, 3))  # its entries ended: a wave
    assert [m for _, m in sent] == [ProbeLoop(0, 2), ProbeLoop(0, 2)]


def test_a_worker_reports_only_with_its_entries_ended_and_new_counts() -> None:
    out: list[Any] = []
    tracker = LoopTracker(0)
    LoopReports([tracker], out.append)
    tracker.open_entries = 1
    tracker.in_flight = 2
    tracker.idle()
    assert out == []
    tracker.entry_ended()
    assert not tracker.empty  # only the coordinator concludes, over workers
    tracker.idle()
    tracker.idle()
    assert out == [LoopIdle(0, 2, 0)]
    tracker.consumed(2)
    tracker.idle()
    assert out[-1] == LoopIdle(0, 2, 2)
