"""Checkpoint cost against state size: a keyed running sum over a million keys
on the memory backend.

Checkpointing a job whose keyed state is large is where the difference
between asynchronous barrier snapshots and a stop-the-world snapshot should
show: the synchronous phase of an ABS checkpoint is meant to be short
whatever the state size, the writing to happen while records flow, and a
checkpoint of state that barely changed to write little. Three scenarios,
each measured against a baseline in the same run:

1. **Running sum over 1M keys.** Records ``(key, value)`` whose keys are
   1,000,000 distinct strings (``--keys``): each key once, in a seeded
   random order, then keys drawn uniformly (seeded) up to 3,000,000 records
   (``--records``), at parallelism 1::

       from_collection(records)
         -> key_by(record[0]) -> sum(record[1])    # 'sum'
         -> ProgressSink

   without checkpoints (the baseline), with ABS (``mode="exactly_once"``)
   and with ``mode="synchronous"``, every ``--interval`` seconds (1 s).
   Reported: throughput (records per second of ``execute``; building the
   job is not timed) and its ratio to the no-checkpoint runs just before
   and after each ABS/synchronous pair (repetitions interleaved: a
   no-checkpoint run between every two pairs, the pair's order alternating;
   median over rounds), and the **longest pause in output progress**: the
   sink notes ``time.perf_counter()`` at every ``write(batch)`` call, and a
   run's longest pause is the longest gap between two consecutive calls
   (the time before the first and after the last record does not count).
   A run that takes more than ``--max-run-seconds`` is cancelled (through
   ``execute_async``, as an embedding program would) and measured up to
   there: its throughput is the records its sink received over the time it
   ran, and its verification covers the records its committed checkpoints
   cover. (Without the cap, a checkpoint that takes longer than the interval
   can stop a synchronous run's world for good: the next one is triggered as
   soon as the last completes.)
2. **1% change.** Every key once (the load), then ``--rounds`` rounds that
   each add 1 to a random 1% of the keys (``--change``), with ABS
   checkpoints every ``--change-interval`` (0.5 s). A paced source emits a
   round, then waits until a checkpoint covering it has completed (the
   sink's commits say so), so that each checkpoint covers at most one round
   however long checkpoints take. Reported per checkpoint, from
   ``ef.list_checkpoints``: ``checkpointed_size``, ``full_size``, their
   ratio, and the records and distinct keys it covers (from the source's
   positions at the checkpoint's trigger time, ``completed_at - duration``).
   The figure is the median ratio over the periodic checkpoints after the
   first one triggered after the load (the first whose state has every key,
   role "load done"; an incremental one may write only what the end of the
   load added), leaving out any that cover no record (triggered while the
   source waited) or less than half a round (triggered while a round was
   read, which the source's pacing makes rare).
3. **Restore of 1M keys.** The job of scenario 2 restored from its final
   checkpoint (taken at the end of its input): its source is at its end,
   so it only restores its state and finishes; checkpointing is off, so no
   checkpoint of its own is timed. Seconds of
   ``env.execute(restore=<path>)`` at parallelism 1 and 2 (the keyed
   operator's key groups split over two subtasks), median of
   ``--restore-repeat`` interleaved runs, next to the same job with empty
   input and no restore (start-up and teardown alone).

The sink is exactly-once like every eddyflow sink (it stages a transaction
per checkpoint and commits it when the checkpoint completes) but keeps only
what the benchmark verifies: the number of committed records and the total
of their running sums (see ``ProgressSink`` for why not each key's last
sum). Every run's result is verified against an independent computation (a
plain dict of sums over the input): the number of committed records, the
total of their running sums, and the final keyed state
``result.state("sum")`` key by key. The exit code is 0 whatever the
timings (this is a report), and 1 when any result is wrong.

Goals (from the issue): ABS >= 0.85x of no checkpoints; ABS's longest pause
<= 100 ms and at most a third of synchronous's (medians over runs); with 1%
of the keys changing between checkpoints, median ``checkpointed_size /
full_size`` <= 0.05. The restore time is reported, without a goal.

``gc.collect()`` runs before every timed run and ``os.sync()`` after it
(untimed); the input and the expected sums are frozen out of the collector's
reach (``gc.freeze()``). Checkpoints go under the system's temporary folder
(``--chk-dir``) and are deleted after each run.

    python benchmarks/state.py                  # 1M keys, 3M records, 3 rounds (3-6 min)
    python benchmarks/state.py --quick          # 100k keys, 1M records, 1 round (< 1 min)
    python benchmarks/state.py --json benchmarks/results/state.json
    python benchmarks/state.py --profile --scenarios   # only a profile of one ABS run
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import operator
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import eddyflow as ef

DEFAULT_KEYS = 1_000_000
DEFAULT_RECORDS = 3_000_000
QUICK_KEYS = 100_000
QUICK_RECORDS = 1_000_000
SCENARIOS = ("sum", "change", "restore")
#: Goals of the issue.
ABS_MIN_RATIO = 0.85
ABS_MAX_PAUSE = 0.100  # seconds
ABS_MAX_PAUSE_VS_SYNC = 1 / 3
MAX_CHANGE_RATIO = 0.05
#: A gap between two sink writes at least this long counts as a pause.
PAUSE_THRESHOLD = 0.100
#: The paced source starts a round this long after it saw the checkpoint of
#: the round before complete.
ROUND_DELAY = 0.1
#: The paced source's longest sleep inside one read (it returns an empty
#: batch after it, so that a barrier waits at most this long).
PACE_SLICE = 0.01
OPERATOR = "sum"

Record = tuple[str, int]


# -- data --------------------------------------------------------------------------


def make_keys(n: int) -> list[str]:
    return [f"k{i:07d}" for i in range(n)]


def make_sum_records(keys: list[str], records: int, seed: int) -> list[Record]:
    """Every key once in a seeded random order, then keys drawn uniformly
    (seeded); values 1..9. Fewer records than keys: a prefix of the first
    part."""
    rng = random.Random(seed)
    order = list(keys)
    rng.shuffle(order)
    if records > len(order):
        order += rng.choices(keys, k=records - len(order))
    else:
        del order[records:]
    return [(k, i % 9 + 1) for i, k in enumerate(order)]


@dataclass(frozen=True)
class ChangeData:
    records: list[Record]
    #: index just past each phase: the load, then each round
    boundaries: list[int]


def make_change_records(keys: list[str], rounds: int, fraction: float,
                        seed: int) -> ChangeData:
    """The load (every key once, value 1, in a seeded random order), then
    ``rounds`` rounds, each a seeded random sample of ``fraction`` of the
    keys with value 1."""
    rng = random.Random(seed + 1)
    order = list(keys)
    rng.shuffle(order)
    records: list[Record] = [(k, 1) for k in order]
    boundaries = [len(records)]
    per_round = max(1, round(len(keys) * fraction))
    for _ in range(rounds):
        records += [(k, 1) for k in rng.sample(keys, per_round)]
        boundaries.append(len(records))
    return ChangeData(records, boundaries)


@dataclass(frozen=True)
class Expected:
    """What a job over some records must produce, computed without eddyflow."""

    sums: dict[str, int]  # each key's sum: the final keyed state
    records: int  # output records: one running sum per input record
    total: int  # the total of all the running sums the job emits


def expect(records: Sequence[Record]) -> Expected:
    sums: dict[str, int] = {}
    get = sums.get
    total = 0
    for k, v in records:
        s = get(k, 0) + v
        sums[k] = s
        total += s
    return Expected(sums, len(records), total)


# -- the sink ------------------------------------------------------------------------


class ProgressSink(ef.Sink):
    """Exactly-once, and keeps no records: a committed transaction adds its
    record count and the total of its records' running sums, which the
    benchmark compares with an independent computation's (the final state
    is compared key by key). Each writer notes the time of every ``write``
    call. Commit is idempotent, as the protocol requires.

    Keeping each key's last committed sum instead (``dict.update`` per
    batch) would check more, but a dict of a million keys is a cache miss
    per record: it halved the throughput of the job without checkpoints,
    and so hid half of what checkpoints cost; the total costs the records'
    second fields, summed at C speed while they are hot in the cache."""

    def __init__(self) -> None:
        self.committed = 0  # records
        self.committed_total = 0  # of their running sums
        self.write_times: list[list[float]] = []  # one list per writer
        self.written: list[int] = []  # records received, per writer
        self._staged: dict[tuple[int, int], tuple[int, int]] = {}
        self._next_txn = 0

    @property
    def name(self) -> str:
        return "progress"

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        times: list[float] = []
        self.write_times.append(times)
        self.written.append(0)
        return _ProgressWriter(self, subtask, len(self.written) - 1, times)

    def stage(self, subtask: int, n: int, total: int) -> list[int]:
        txn = self._next_txn
        self._next_txn += 1
        self._staged[(subtask, txn)] = (n, total)
        return [subtask, txn]

    def commit(self, committables: list[Any]) -> None:
        for subtask, txn in committables:
            staged = self._staged.pop((subtask, txn), None)
            if staged is None:
                continue  # committed already, or another sink instance's
            n, total = staged
            self.committed += n
            self.committed_total += total

    def recover(self, committed: list[Any]) -> None:
        self.commit(committed)
        self._staged.clear()

    def records_written(self) -> int:
        return sum(self.written)

    def pauses(self) -> tuple[float, int]:
        """The longest gap between two consecutive ``write`` calls of a
        writer, and how many gaps were at least ``PAUSE_THRESHOLD``."""
        longest, over = 0.0, 0
        for times in self.write_times:
            for a, b in itertools.pairwise(times):
                gap = b - a
                longest = max(longest, gap)
                over += gap >= PAUSE_THRESHOLD
        return longest, over


_running_sum = operator.itemgetter(1)  # of an output record (key, running sum)


class _ProgressWriter(ef.SinkWriter):
    def __init__(self, sink: ProgressSink, subtask: int, slot: int, times: list[float]) -> None:
        self._sink = sink
        self._subtask = subtask
        self._slot = slot
        self._times = times
        self._clock = time.perf_counter
        self._n = 0
        self._total = 0

    def write(self, records: list[Any]) -> None:
        self._times.append(self._clock())
        self._total += sum(map(_running_sum, records))
        self._n += len(records)
        self._sink.written[self._slot] += len(records)

    def prepare_commit(self, checkpoint_id: int) -> Any:
        if not self._n:
            return None
        staged = self._sink.stage(self._subtask, self._n, self._total)
        self._n, self._total = 0, 0
        return staged

    def abort(self) -> None:
        self._n, self._total = 0, 0


# -- the paced source of scenario 2 ---------------------------------------------------


class PacedSource(ef.Source):
    """The records of a :class:`ChangeData`, phase by phase (the load, then
    each round): a phase's records as fast as the job takes them, then a
    wait until ``committed()`` (the sink's count of committed records) has
    reached the end of the phase, i.e. a checkpoint that covers the phase
    has completed, and ``ROUND_DELAY`` more seconds have passed (or
    ``gate_timeout`` seconds in all, counted in ``gate_timeouts``).

    So each checkpoint covers at most one round, whatever it takes to
    complete. The delay keeps a round from starting just as the next
    checkpoint is triggered, which would split the round over two
    checkpoints: when checkpoints take longer than the interval, the next
    one is triggered as soon as one completes (it then covers no round).
    Without ``committed`` (a restore), phases follow each other at once.
    Waits happen in slices of ``PACE_SLICE`` that end in an empty batch, so
    a checkpoint barrier is never held up by one. The position is the index
    of the next record (replayable); each non-empty batch is logged with its
    Unix time, to tell which records a checkpoint covers. One subtask only."""

    def __init__(self, data: ChangeData, committed: Callable[[], int] | None = None,
                 gate_timeout: float = 0.0) -> None:
        self.data = data
        self.committed = committed
        self.gate_timeout = gate_timeout
        self.gate_timeouts = 0
        #: (time.time() just after a non-empty batch was read, position after it)
        self.log: list[tuple[float, int]] = []

    @property
    def name(self) -> str:
        return "paced-changes"

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        if parallelism != 1:
            raise ValueError("PacedSource runs with parallelism 1")
        return _PacedReader(self)


class _PacedReader(ef.SourceReader):
    def __init__(self, source: PacedSource) -> None:
        self._src = source
        self._records = source.data.records
        self._boundaries = source.data.boundaries
        self._pos = 0
        self._phase = 0  # index into boundaries of the phase being read
        self._waiting = False
        self._resume_at: float | None = None  # monotonic: the phase's commit seen + delay
        self._gate_deadline = 0.0  # monotonic: stop waiting for the commit

    def _may_resume(self) -> bool:
        now = time.monotonic()
        if self._resume_at is None:
            committed = self._src.committed
            if committed is not None and committed() >= self._pos:
                self._resume_at = now + ROUND_DELAY
            elif now >= self._gate_deadline:
                self._src.gate_timeouts += 1
                return True
            else:
                return False
        return now >= self._resume_at

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self._pos >= len(self._records):
            return None
        if self._waiting:
            if not self._may_resume():
                await asyncio.sleep(PACE_SLICE)
                return []
            self._waiting = False
        boundary = self._boundaries[self._phase]
        stop = min(self._pos + max_records, boundary)
        batch = self._records[self._pos : stop]
        self._pos = stop
        self._src.log.append((time.time(), stop))
        if stop == boundary and stop < len(self._records):
            self._phase += 1
            if self._src.committed is not None:
                self._waiting = True
                self._resume_at = None
                self._gate_deadline = time.monotonic() + self._src.gate_timeout
        return batch

    def position(self) -> int:
        return self._pos

    def seek(self, position: Any) -> None:
        if not isinstance(position, int) or not 0 <= position <= len(self._records):
            raise ValueError(f"position {position!r} outside [0, {len(self._records)}]")
        self._pos = position
        self._phase = sum(1 for b in self._boundaries if b <= position)
        self._phase = min(self._phase, len(self._boundaries) - 1)
        self._waiting = False


# -- running a job ---------------------------------------------------------------------


def record_key(record: Record) -> str:
    return record[0]


def record_value(record: Record) -> int:
    return record[1]


def build_sum(env: ef.StreamEnvironment, records: list[Record], sink: ef.Sink) -> None:
    (env.from_collection(records)
     .key_by(record_key).sum(record_value).name(OPERATOR)
     .sink_to(sink))


def build_change(env: ef.StreamEnvironment, source: PacedSource, sink: ef.Sink) -> None:
    (env.from_source(source).name("paced-changes").set_parallelism(1)
     .key_by(record_key).sum(record_value).name(OPERATOR)
     .sink_to(sink))


def change_job(source: PacedSource, sink: ef.Sink) -> Callable[[ef.StreamEnvironment], None]:
    def build(env: ef.StreamEnvironment) -> None:
        build_change(env, source, sink)
    return build


async def _bounded(env: ef.StreamEnvironment, name: str, restore: str | None,
                   limit: float | None) -> ef.JobResult:
    # Cancelling execute_async cancels every task of the job.
    async with asyncio.timeout(limit):
        return await env.execute_async(name, restore=restore)


@dataclass
class Execution:
    seconds: float
    result: ef.JobResult | None  # None: cancelled at the time limit


def execute(env: ef.StreamEnvironment, build: Callable[[ef.StreamEnvironment], None],
            name: str, restore: str | None = None,
            timeout: float | None = None) -> Execution:
    """Build the job, then run it (timed), cancelling it after ``timeout``
    seconds. Building is not timed: it is the same in every mode, and a
    ``from_collection`` that checks its records (1-2 s for 3M records)
    would dilute what checkpoints cost."""
    build(env)
    gc.collect()
    t0 = time.perf_counter()
    try:
        result: ef.JobResult | None = asyncio.run(_bounded(env, name, restore, timeout))
    except TimeoutError:
        result = None
    return Execution(time.perf_counter() - t0, result)


def new_chk_dir(args: argparse.Namespace) -> str:
    return tempfile.mkdtemp(prefix="eddyflow-state-", dir=args.chk_dir)


def remove_chk_dir(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    # Untimed: let the disk finish this run's writes and deletions, which
    # would otherwise be flushed during the next run and slow it down.
    os.sync()


def verify(label: str, sink: ProgressSink, result: ef.JobResult | None,
           records: list[Record], expected: Expected) -> list[str]:
    """The run's committed output and final state against the independent
    computation (of the committed prefix, for a cancelled run)."""
    errors: list[str] = []
    if result is None:
        # Cancelled: the committed records are a prefix of the input (one
        # source subtask, in order), and their output must be the prefix's.
        expected = expect(records[: sink.committed])
    elif sink.committed != expected.records:
        errors.append(f"{label}: {sink.committed:,} records committed, expected "
                      f"{expected.records:,}")
    if sink.committed_total != expected.total:
        errors.append(f"{label}: the committed running sums total {sink.committed_total:,}, "
                      f"expected {expected.total:,}")
    if result is not None:
        state = result.state(OPERATOR)
        if state != expected.sums:
            errors.append(f"{label}: final keyed state of {diff_count(state, expected.sums):,} "
                          "keys differs from the independent computation")
    return errors


def diff_count(a: dict[Any, Any], b: dict[Any, Any]) -> int:
    return sum(1 for k in a.keys() | b.keys() if a.get(k) != b.get(k))


# -- scenario 1: running sum -----------------------------------------------------------


MODES: dict[str, str | None] = {"none": None, "ABS": "exactly_once", "sync": "synchronous"}


@dataclass
class SumRun:
    mode: str  # a key of MODES
    seconds: float
    written: int  # records the sink received
    cut: bool  # cancelled at --max-run-seconds
    pause: float  # longest gap between two sink writes
    pauses_over: int  # gaps >= PAUSE_THRESHOLD
    checkpoints: list[ef.CheckpointInfo]  # periodic ones (not the final one)
    #: mean throughput of the no-checkpoint runs just before and after this
    #: run's pair (0 for those runs themselves)
    local_base: float = 0.0

    @property
    def rate(self) -> float:
        return self.written / self.seconds

    @property
    def ratio(self) -> float:
        return self.rate / self.local_base


def run_sum(mode: str, records: list[Record], expected: Expected,
            args: argparse.Namespace, label: str) -> tuple[SumRun, list[str]]:
    env = ef.StreamEnvironment(parallelism=1)
    chk_mode = MODES[mode]
    folder = new_chk_dir(args)
    try:
        if chk_mode is not None:
            env.enable_checkpointing(interval=args.interval, directory=folder, mode=chk_mode,
                                     retained=1_000_000)
        sink = ProgressSink()
        ex = execute(env, lambda e: build_sum(e, records, sink), f"state {mode}",
                     timeout=args.max_run_seconds)
        done = ef.list_checkpoints(folder) if chk_mode is not None else []
    finally:
        remove_chk_dir(folder)
    errors = verify(label, sink, ex.result, records, expected)
    pause, over = sink.pauses()
    run = SumRun(mode, ex.seconds, sink.records_written(), ex.result is None, pause, over,
                 [c for c in done if not c.final])
    return run, errors


def sum_scenario(records: list[Record], expected: Expected, args: argparse.Namespace,
                 verbose: bool) -> tuple[dict[str, list[SumRun]], list[str]]:
    runs: dict[str, list[SumRun]] = {m: [] for m in MODES}
    errors: list[str] = []
    for w in range(args.warmup):  # untimed: heap growth, first calls, the writer process
        _, errs = run_sum("none", records, expected, args, f"warm-up {w + 1}")
        errors += errs
    base, errs = run_sum("none", records, expected, args, "none, round 1")
    runs["none"].append(base)
    errors += errs
    for r in range(args.repeat):
        pair = ("ABS", "sync") if r % 2 == 0 else ("sync", "ABS")
        mine: list[SumRun] = []
        for mode in pair:
            run, errs = run_sum(mode, records, expected, args, f"{mode}, round {r + 1}")
            errors += errs
            mine.append(run)
            runs[mode].append(run)
        after, errs = run_sum("none", records, expected, args, f"none, after round {r + 1}")
        errors += errs
        runs["none"].append(after)
        for run in mine:
            run.local_base = (base.rate + after.rate) / 2
        if verbose:
            print(f"  running sum, round {r + 1}/{args.repeat}: " + ", ".join(
                f"{x.mode} {x.seconds:.1f}s{' (cut)' if x.cut else ''} "
                f"{len(x.checkpoints)}chk pause {x.pause * 1000:.0f}ms"
                for x in [base, *mine, after]), file=sys.stderr, flush=True)
        base = after
    return runs, errors


# -- scenario 2: 1% change --------------------------------------------------------------


@dataclass
class ChangeCheckpoint:
    id: int
    trigger: float  # seconds after the job started
    duration: float
    checkpointed_size: int
    full_size: int
    records: int  # records between the previous checkpoint's position and this one's
    keys_changed: int  # distinct keys among them
    #: "load" (triggered before the load was read), "load done" (the first
    #: after it), "measured", "idle" (no record since the previous one) or
    #: "partial" (less than half a round: its trigger came while a round was
    #: read), both left out of the median, which they would flatter, "final"
    #: (end of input)
    role: str

    @property
    def ratio(self) -> float:
        return self.checkpointed_size / self.full_size if self.full_size else float("nan")


@dataclass
class ChangeOutcome:
    checkpoints: list[ChangeCheckpoint]
    seconds: float
    restore_from: str | None  # the final checkpoint's path (kept until the restores ran)
    folder: str
    gate_timeouts: int  # rounds started without their checkpoint having completed

    def measured(self) -> list[ChangeCheckpoint]:
        return [c for c in self.checkpoints if c.role == "measured"]

    def median_ratio(self) -> float | None:
        m = self.measured()
        return statistics.median(c.ratio for c in m) if m else None


def change_scenario(data: ChangeData, expected: Expected, args: argparse.Namespace
                    ) -> tuple[ChangeOutcome, list[str]]:
    """Runs the paced job with ABS checkpoints; the checkpoint folder is kept
    for the restore scenario (the caller removes it)."""
    env = ef.StreamEnvironment(parallelism=1)
    folder = new_chk_dir(args)
    env.enable_checkpointing(interval=args.change_interval, directory=folder,
                             mode="exactly_once", retained=1_000_000)
    sink = ProgressSink()
    source = PacedSource(data, lambda: sink.committed, args.gate_timeout)
    started = time.time()
    ex = execute(env, change_job(source, sink), "state 1% change")
    errors = verify("1% change", sink, ex.result, data.records, expected)
    infos = ef.list_checkpoints(folder)
    load_end = source.log[_log_index(source.log, data.boundaries[0])][0]
    per_round = data.boundaries[1] - data.boundaries[0] if len(data.boundaries) > 1 else 0
    out: list[ChangeCheckpoint] = []
    prev_pos = 0
    seen_full = False
    for c in infos:
        trigger = c.completed_at - c.duration
        if c.final:
            pos, role = len(data.records), "final"
        else:
            pos = position_at(source.log, trigger)
            if trigger <= load_end:
                role = "load"
            elif not seen_full:
                role, seen_full = "load done", True
            else:
                role = "measured" if pos > prev_pos else "idle"
                if 0 < pos - prev_pos < per_round / 2:
                    role = "partial"
        covered = data.records[prev_pos:pos]
        out.append(ChangeCheckpoint(c.id, trigger - started, c.duration, c.checkpointed_size,
                                    c.full_size, len(covered),
                                    len({k for k, _ in covered}), role))
        prev_pos = pos
    final = [c for c in infos if c.final]
    restore_from = final[-1].path if final else (infos[-1].path if infos else None)
    return ChangeOutcome(out, ex.seconds, restore_from, folder, source.gate_timeouts), errors


def _log_index(log: list[tuple[float, int]], position: int) -> int:
    """The index of the log entry whose batch ended at ``position``."""
    for i, (_, pos) in enumerate(log):
        if pos >= position:
            return i
    raise ValueError(f"the source never reached position {position}")


def position_at(log: list[tuple[float, int]], when: float) -> int:
    """The source's position at Unix time ``when`` (after the last batch read by then)."""
    pos = 0
    for t, p in log:
        if t > when:
            break
        pos = p
    return pos


# -- scenario 3: restore ------------------------------------------------------------------


@dataclass
class RestoreTimes:
    seconds: dict[str, list[float]] = field(default_factory=dict)  # case -> runs
    failures: dict[str, str] = field(default_factory=dict)  # case -> why it did not run


def restore_scenario(path: str, data: ChangeData, expected: Expected,
                     args: argparse.Namespace, verbose: bool
                     ) -> tuple[RestoreTimes, list[str]]:
    out = RestoreTimes()
    errors: list[str] = []
    empty = ChangeData([], [0])
    cases: list[tuple[str, int, str | None]] = [
        ("empty input, no restore, p=1", 1, None),
        ("restore, p=1", 1, path),
        ("restore, p=2", 2, path),
    ]
    for r in range(args.restore_repeat):
        for label, parallelism, restore in cases:
            if label in out.failures:
                continue
            env = ef.StreamEnvironment(parallelism=parallelism)
            source = PacedSource(data if restore else empty)
            sink = ProgressSink()
            try:
                ex = execute(env, change_job(source, sink), f"state {label}",
                             restore=restore, timeout=args.max_run_seconds)
            except Exception as exc:  # reported, not fatal: e.g. p=2 unsupported
                out.failures[label] = f"{type(exc).__name__}: {exc}"
                continue
            out.seconds.setdefault(label, []).append(ex.seconds)
            if ex.result is None:
                errors.append(f"{label}: did not finish within {args.max_run_seconds} s")
                continue
            if sink.committed:
                errors.append(f"{label}: {sink.committed:,} records committed, expected none")
            want = expected.sums if restore else {}
            state = ex.result.state(OPERATOR) if restore else {}
            if state != want:
                errors.append(f"{label}: restored state of {diff_count(state, want):,} keys "
                              "differs from the independent computation")
            del ex, state
        if verbose:
            print(f"  restore, round {r + 1}/{args.restore_repeat}: " + ", ".join(
                f"{k} {v[-1]:.2f}s" for k, v in out.seconds.items()), file=sys.stderr,
                flush=True)
    return out, errors


# -- profile -------------------------------------------------------------------------------


def profile_abs(records: list[Record], expected: Expected, args: argparse.Namespace
                ) -> tuple[str, list[str]]:
    """One ABS run of scenario 1 under pyinstrument (cProfile if it is not
    installed): the report, and the run's mismatches."""
    env = ef.StreamEnvironment(parallelism=1)
    folder = new_chk_dir(args)
    env.enable_checkpointing(interval=args.interval, directory=folder, mode="exactly_once",
                             retained=1_000_000)
    sink = ProgressSink()

    def run() -> Execution:
        return execute(env, lambda e: build_sum(e, records, sink), "state ABS (profiled)",
                       timeout=args.max_run_seconds)

    try:
        try:
            from pyinstrument import Profiler
        except ImportError:
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            ex = prof.runcall(run)
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
            return ("pyinstrument is not installed; cProfile, top 40 by cumulative time:\n"
                    + buf.getvalue(),
                    verify("profiled ABS run", sink, ex.result, records, expected))
        # async_mode="disabled": sample the whole thread, whichever coroutine runs.
        profiler = Profiler(interval=args.profile_interval, async_mode="disabled")
        profiler.start()
        ex = run()
        profiler.stop()
        done = [c for c in ef.list_checkpoints(folder) if not c.final]
    finally:
        remove_chk_dir(folder)
    pause, over = sink.pauses()
    head = (f"{ex.seconds:.2f} s{' (cut at the time limit)' if ex.result is None else ''}, "
            f"{sink.records_written():,} records, {len(done)} periodic checkpoints "
            f"(p50 {ms(percentile([c.duration for c in done], 50))} ms), longest pause "
            f"{pause * 1000:.0f} ms, {over} pauses >= {PAUSE_THRESHOLD * 1000:.0f} ms\n")
    text = profiler.output_text(unicode=True, color=False, show_all=True,
                                processor_options={"filter_threshold": 0.01})
    return head + text, verify("profiled ABS run", sink, ex.result, records, expected)


# -- reporting ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    label: str
    status: str  # PASS, FAIL, OPEN
    detail: str


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    rank = max(1, -(-len(s) * q // 100))
    return s[int(rank) - 1]


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:,.0f}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def sum_summary(runs: dict[str, list[SumRun]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for mode, rs in runs.items():
        if not rs:
            continue
        ratios = [r.ratio for r in rs] if mode != "none" else [1.0]
        durations = [c.duration for r in rs for c in r.checkpoints]
        out[mode] = {
            "mode": MODES[mode],
            "runs": len(rs),
            "cut": sum(r.cut for r in rs),
            "seconds": [r.seconds for r in rs],
            "records_per_second": statistics.median(r.rate for r in rs),
            "vs_none": statistics.median(ratios),
            "vs_none_min": min(ratios), "vs_none_max": max(ratios),
            "longest_pause": statistics.median(r.pause for r in rs),
            "longest_pause_max": max(r.pause for r in rs),
            "longest_pause_per_run": [r.pause for r in rs],
            "pauses_over_threshold": statistics.median(r.pauses_over for r in rs),
            "checkpoints_per_run": [len(r.checkpoints) for r in rs],
            "duration_p50": percentile(durations, 50),
            "duration_max": max(durations, default=None),
        }
    return out


def evaluate(summary: dict[str, dict[str, Any]], change: ChangeOutcome | None) -> list[Goal]:
    goals: list[Goal] = []
    a, s = summary.get("ABS"), summary.get("sync")
    if a is not None:
        took = statistics.median(a["checkpoints_per_run"]) > 0
        note = "" if took else " (but the ABS runs took no checkpoint: lengthen --records)"
        goals.append(Goal(f"ABS >= {ABS_MIN_RATIO:g}x of no checkpoints",
                          verdict(a["vs_none"] >= ABS_MIN_RATIO) if took else "OPEN",
                          f"{a['vs_none']:.3f}x{note}"))
        goals.append(Goal(f"ABS longest pause <= {ABS_MAX_PAUSE * 1000:.0f} ms",
                          verdict(a["longest_pause"] <= ABS_MAX_PAUSE) if took else "OPEN",
                          f"{ms(a['longest_pause'])} ms (median of runs; max "
                          f"{ms(a['longest_pause_max'])} ms){note}"))
    if a is not None and s is not None:
        limit = s["longest_pause"] * ABS_MAX_PAUSE_VS_SYNC
        both = min(statistics.median(x["checkpoints_per_run"]) for x in (a, s)) > 0
        ratio = a["longest_pause"] / s["longest_pause"] if s["longest_pause"] else float("inf")
        goals.append(Goal("ABS longest pause <= 1/3 of synchronous's",
                          verdict(a["longest_pause"] <= limit) if both else "OPEN",
                          f"{ms(a['longest_pause'])} ms vs {ms(s['longest_pause'])} ms "
                          f"(limit {ms(limit)} ms; ABS/sync {ratio:.2f})"
                          + ("" if both else " (but a mode took no checkpoint: lengthen "
                             "--records)")))
    if change is not None:
        m = change.median_ratio()
        n = len(change.measured())
        if m is None:
            goals.append(Goal(f"1% change: median checkpointed/full <= {MAX_CHANGE_RATIO:g}",
                              "OPEN", "no checkpoint after the 'load done' one: raise --rounds"))
        else:
            goals.append(Goal(f"1% change: median checkpointed/full <= {MAX_CHANGE_RATIO:g}",
                              verdict(m <= MAX_CHANGE_RATIO),
                              f"{m:.3f} over {n} checkpoint(s)"))
    return goals


def environment_line() -> str:
    return (f"Python {platform.python_version()} ({platform.python_implementation()}), "
            f"eddyflow {ef.__version__} from {Path(ef.__file__).parent}, {os.cpu_count()} CPUs, "
            f"{platform.system()} {platform.machine()}, load average "
            + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


def render(args: argparse.Namespace, summary: dict[str, dict[str, Any]],
           change: ChangeOutcome | None, restore: RestoreTimes | None, goals: list[Goal],
           errors: list[str], total_runs: int) -> str:
    lines = [
        "eddyflow checkpoint cost against state size (memory backend)",
        f"env:   {environment_line()}",
        "",
    ]
    if summary:
        lines += [
            f"1. running sum: {args.records:,} records over {args.keys:,} keys, parallelism 1, "
            f"checkpoints every {args.interval:g} s",
            f"   {args.repeat} interleaved round(s) (a no-checkpoint run between pairs) after "
            f"{args.warmup} untimed run(s); runs cut at {args.max_run_seconds:g} s",
            "",
        ]
        header = (f"   {'mode':<6} {'records/s':>10} {'vs none [min-max]':>20} "
                  f"{'longest pause ms':>17} {'(max)':>7} {'pauses>=100ms':>14} "
                  f"{'chk/run':>8} {'dur p50 ms':>11} {'cut':>4}")
        lines += [header, "   " + "-" * (len(header) - 3)]
        for mode, x in summary.items():
            vs = ("1.000x" if mode == "none" else
                  f"{x['vs_none']:.3f}x [{x['vs_none_min']:.2f}-{x['vs_none_max']:.2f}]")
            chk = "-" if mode == "none" else f"{statistics.median(x['checkpoints_per_run']):g}"
            lines.append(
                f"   {mode:<6} {x['records_per_second']:>10,.0f} {vs:>20} "
                f"{ms(x['longest_pause']):>17} {ms(x['longest_pause_max']):>7} "
                f"{x['pauses_over_threshold']:>14g} {chk:>8} {ms(x['duration_p50']):>11} "
                f"{x['cut']:>2}/{x['runs']}")
        lines += [
            "",
            "   vs none: median over rounds of the throughput ratio to the no-checkpoint runs",
            "   just before and after the pair; longest pause: the longest gap between two sink",
            "   writes in a run, median over runs; cut: runs cancelled at --max-run-seconds",
            "   (measured up to there)",
            "",
        ]
    if change is not None:
        lines += [
            f"2. 1% change: {args.change_keys:,} keys loaded, then {args.rounds} rounds of "
            f"{args.change:.1%} of the keys, each {ROUND_DELAY:g} s after the checkpoint "
            "covering the one before",
            f"   completed (ABS every {args.change_interval:g} s); run {change.seconds:.1f} s",
        ]
        if change.gate_timeouts:
            lines.append(f"   ({change.gate_timeouts} round(s) started before the checkpoint of "
                         f"the one before completed: --gate-timeout {args.gate_timeout:g} s)")
        lines.append("")
        header = (f"   {'chk':>4} {'trigger s':>9} {'dur ms':>7} {'records':>9} "
                  f"{'keys changed':>12} {'checkpointed':>13} {'full':>12} {'ratio':>6}  role")
        lines += [header, "   " + "-" * (len(header) - 3)]
        for c in change.checkpoints:
            lines.append(
                f"   {c.id:>4} {c.trigger:>9.2f} {c.duration * 1000:>7,.0f} {c.records:>9,} "
                f"{c.keys_changed:>12,} {c.checkpointed_size:>13,} {c.full_size:>12,} "
                f"{c.ratio:>6.3f}  {c.role}")
        m = change.median_ratio()
        lines += [
            "",
            "   median checkpointed/full over the 'measured' checkpoints: "
            + ("-" if m is None else f"{m:.3f}"),
            "   (records and keys changed: what the source had read by the checkpoint's "
            "trigger time,",
            "   since the previous checkpoint's; sizes in bytes, from ef.list_checkpoints)",
            "",
        ]
    if restore is not None:
        lines += [f"3. restore of {args.change_keys:,} keys from the final checkpoint of the "
                  f"1% change job (median of {args.restore_repeat})", ""]
        for label, secs in restore.seconds.items():
            lines.append(f"   {label:<32} {statistics.median(secs):>7.3f} s   "
                         f"(runs: {', '.join(f'{s:.3f}' for s in secs)})")
        for label, why in restore.failures.items():
            lines.append(f"   {label:<32} did not run: {why}")
        lines.append("")
    if goals:
        lines.append("goals:")
        lines += [f"  {g.status}  {g.label:<48} {g.detail}" for g in goals]
        lines.append("")
    if errors:
        lines.append(f"RESULTS MISMATCH ({len(errors)}):")
        lines += [f"  {e}" for e in errors]
    else:
        lines.append(f"results: OK, all {total_runs} runs: committed records, the total of "
                     "their running sums and the final")
        lines.append("         keyed state equal an independent computation's (cut runs: "
                     "committed records and total, of their prefix)")
    return "\n".join(lines)


def write_json(path: Path, args: argparse.Namespace, summary: dict[str, dict[str, Any]],
               change: ChangeOutcome | None, restore: RestoreTimes | None, goals: list[Goal],
               errors: list[str]) -> None:
    report: dict[str, Any] = {
        "benchmark": "checkpoint cost against state size, memory backend",
        "environment": {"python": platform.python_version(), "eddyflow": ef.__version__,
                        "eddyflow_path": str(Path(ef.__file__).parent),
                        "cpus": os.cpu_count(), "platform": platform.platform()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "running_sum": summary,
        "change": None if change is None else {
            "median_ratio": change.median_ratio(),
            "checkpoints": [{"id": c.id, "trigger": c.trigger, "duration": c.duration,
                             "checkpointed_size": c.checkpointed_size,
                             "full_size": c.full_size, "ratio": c.ratio,
                             "records": c.records, "keys_changed": c.keys_changed,
                             "role": c.role} for c in change.checkpoints],
        },
        "restore": None if restore is None else {
            "seconds": restore.seconds,
            "median": {k: statistics.median(v) for k, v in restore.seconds.items()},
            "failures": restore.failures,
        },
        "goals": [{"goal": g.label, "status": g.status, "detail": g.detail} for g in goals],
        "mismatches": errors,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Checkpoint cost against state size on the memory backend: ABS vs "
                    "synchronous vs none over 1M keys, 1%% change, restore.")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_KEYS:,} keys, {QUICK_RECORDS:,} records, 0.25 s intervals, "
                        "1 round, unless given")
    p.add_argument("--keys", type=int, default=None,
                   help=f"distinct keys of the running sum (default {DEFAULT_KEYS:,})")
    p.add_argument("--records", type=int, default=None,
                   help=f"records of the running sum (default {DEFAULT_RECORDS:,})")
    p.add_argument("--interval", type=float, default=None,
                   help="checkpoint interval of the running sum, seconds (default 1; "
                        "0.25 with --quick)")
    p.add_argument("--repeat", type=int, default=None,
                   help="interleaved rounds of the running sum (default 3; 1 with --quick)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed no-checkpoint runs first (default 1)")
    p.add_argument("--max-run-seconds", type=float, default=None,
                   help="cancel a run after this long and measure it up to there "
                        "(default 60; 20 with --quick)")
    p.add_argument("--change-keys", type=int, default=None,
                   help="keys of the 1%% change job (default: --keys)")
    p.add_argument("--change", type=float, default=0.01,
                   help="fraction of the keys changed per round (default 0.01)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of changes (default 12; 6 with --quick)")
    p.add_argument("--change-interval", type=float, default=None,
                   help="checkpoint interval of the change job, seconds "
                        "(default 0.5; 0.25 with --quick)")
    p.add_argument("--gate-timeout", type=float, default=30.0,
                   help="longest wait of the change job for a round's checkpoint to complete "
                        "before the next round starts anyway, seconds (default 30)")
    p.add_argument("--restore-repeat", type=int, default=None,
                   help="interleaved repetitions of the restores (default 3; 1 with --quick)")
    p.add_argument("--scenarios", nargs="*", choices=SCENARIOS, default=list(SCENARIOS),
                   help="which to run (default all; 'restore' also runs the change job, "
                        "whose checkpoint it restores)")
    p.add_argument("--seed", type=int, default=42, help="data seed (default 42)")
    p.add_argument("--chk-dir", default=None, metavar="DIR",
                   help="where the checkpoint folders go (default: the temporary folder)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    p.add_argument("--profile", action="store_true",
                   help="add a pyinstrument profile of one ABS run of the running sum")
    p.add_argument("--profile-interval", type=float, default=0.001,
                   help="pyinstrument sampling interval in seconds (default 0.001)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    q = args.quick
    defaults = {
        "keys": QUICK_KEYS if q else DEFAULT_KEYS,
        "records": QUICK_RECORDS if q else DEFAULT_RECORDS,
        "interval": 0.25 if q else 1.0,
        "repeat": 1 if q else 3,
        "max_run_seconds": 20.0 if q else 60.0,
        "rounds": 6 if q else 12,
        "change_interval": 0.25 if q else 0.5,
        "restore_repeat": 1 if q else 3,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.change_keys is None:
        args.change_keys = args.keys
    for name in ("keys", "records", "repeat", "rounds", "restore_repeat", "change_keys"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    for name in ("interval", "change_interval", "max_run_seconds", "profile_interval",
                 "gate_timeout"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not 0 < args.change <= 1:
        p.error("--change must be in (0, 1]")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    verbose = not args.quiet
    wanted = set(args.scenarios)
    errors: list[str] = []
    total_runs = 0

    def note(msg: str) -> None:
        if verbose:
            print(msg, file=sys.stderr, flush=True)

    summary: dict[str, dict[str, Any]] = {}
    records: list[Record] = []
    expected = Expected({}, 0, 0)
    if "sum" in wanted or args.profile:
        note(f"generating {args.records:,} records over {args.keys:,} keys ...")
        records = make_sum_records(make_keys(args.keys), args.records, args.seed)
        expected = expect(records)
        # The input and the expected sums live through every run: keep the
        # collector from re-scanning them, so no run pays for the harness's heap.
        gc.collect()
        gc.freeze()
        if "sum" in wanted:
            note(f"running sum: {args.repeat} round(s) of none/ABS/sync ...")
            runs, errs = sum_scenario(records, expected, args, verbose)
            errors += errs
            summary = sum_summary(runs)
            total_runs += sum(len(r) for r in runs.values())

    change: ChangeOutcome | None = None
    restore: RestoreTimes | None = None
    if wanted & {"change", "restore"}:
        note(f"1% change: {args.change_keys:,} keys, {args.rounds} rounds ...")
        data = make_change_records(make_keys(args.change_keys), args.rounds, args.change,
                                   args.seed)
        change_expected = expect(data.records)
        gc.collect()
        gc.freeze()
        outcome, errs = change_scenario(data, change_expected, args)
        errors += errs
        total_runs += 1
        try:
            if "change" in wanted:
                change = outcome
            if "restore" in wanted:
                if outcome.restore_from is None:
                    errors.append("restore: the change job left no checkpoint to restore")
                else:
                    note(f"restore from {outcome.restore_from} ...")
                    restore, errs = restore_scenario(outcome.restore_from, data,
                                                     change_expected, args, verbose)
                    errors += errs
                    total_runs += sum(len(v) for v in restore.seconds.values())
        finally:
            remove_chk_dir(outcome.folder)

    profile = ""
    if args.profile:
        note("profiling one ABS run of the running sum ...")
        profile, errs = profile_abs(records, expected, args)
        errors += errs
        total_runs += 1
    goals = evaluate(summary, change)
    print(render(args, summary, change, restore, goals, errors, total_runs))
    if args.json:
        write_json(args.json, args, summary, change, restore, goals, errors)
        print(f"wrote {args.json}")
    if profile:
        print("\nprofile of one ABS run of the running sum (pyinstrument; sampling overhead "
              "slows it down):")
        print(profile)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
