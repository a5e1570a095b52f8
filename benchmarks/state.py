"""Checkpoint cost against state size: a keyed running sum over a million keys
on the memory backend, and the RocksDB backend against it.

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

**RocksDB rows** (``--backend rocksdb``, or ``both``, the default): the
same jobs with ``ef.RocksDBStateBackend(path, incremental=True,
cache_size=--rocksdb-cache-size, block_cache_bytes=--rocksdb-block-cache-mb,
write_buffer_bytes=--rocksdb-write-buffer-mb)`` (defaults 2,000,000
entries, so that the 1M keys fit the cache as a user would size it, 64 MB,
32 MB; the RSS row has its own small cache), its local databases in a fresh temporary
folder per run, removed after the run's result is verified. Every ratio is
against a memory-backend baseline of the same run:

4. **Throughput, checkpoints on** (``rocksdb-throughput``): the word count
   of ``benchmarks/throughput.py`` (its seeded Zipf dataset, ``--words``
   3,000,000 over a ``--vocabulary`` of 50,000, three times throughput.py's
   default: at 1,000,000 words a RocksDB run, ~2.5 s, completed no periodic
   checkpoint at 1 s intervals, all in flight being subsumed by the final
   one; ``flat_map(str.split) -> key_by(word) -> count``) and the running
   sum of scenario 1, each with ABS checkpoints every ``--interval`` on
   both backends, parallelism 1. ``--warmup`` untimed memory runs per job,
   then ``--rocksdb-repeat`` rounds (default ``--repeat``) of a memory and
   a RocksDB run, the order alternating; the figure is the median over
   rounds of the ratio of the two runs' throughputs (records the sink
   received per second of ``execute``; words for the word count). Runs are
   cut at ``--rocksdb-max-run-seconds`` (180; 60 with ``--quick``), not
   ``--max-run-seconds``: a RocksDB running sum over 1M keys takes 60-100 s
   here, and cancelling a RocksDB job while a snapshot's forked child runs
   currently fails it (``JobFailed``: "the snapshot process died without an
   answer", from the backend's ``close`` killing the child) instead of
   cancelling it, which loses the round (reported as a crash).
5. **1% change** (``rocksdb-change``): scenario 2 on RocksDB; median
   ``checkpointed_size / full_size`` over the measured checkpoints.
6. **Synchronous phase**: the keyed task's ``sync_duration`` in each
   periodic checkpoint's metadata (``ef.list_checkpoints(dir)[i]
   .metadata["tasks"]``; the final checkpoint, at the end of the input, is
   left out) of the RocksDB 1% change run and of the RocksDB running-sum
   runs of 4 (the word count's and the memory runs' are shown for
   reference): p50, p99 (nearest rank) and max.
7. **Restore** (``rocksdb-restore``): scenario 3 on RocksDB, from the final
   checkpoint of 5 at p=1 and p=2, and at p=3 from the final checkpoint of
   the same input loaded (unpaced) at p=2; seconds of ``execute``, median
   of ``--restore-repeat``, next to the empty-input job on RocksDB.
9. **Distinct keys** (``distinct-keys``): a keyed count over
   ``--distinct-keys`` (3,000,000) keys that never repeat, in a seeded
   random order (a dedup by event id, the classic large-state job: nearly
   every key is new to the state), ABS every ``--interval``, parallelism 1,
   the RocksDB backend at its own default cache (``--distinct-cache-size``
   100,000 entries, so that the state outgrows it as it would in production);
   ``from_collection(ids) -> key_by(id) -> count``. Rounds and ratio as in
   4; the goal is >= 0.3x of memory (a key seen for the first time must cost
   RocksDB little more than a cached one: the cache cannot answer for it).
8. **Peak RSS** (``rss``): the running sum over ``--rss-keys`` keys
   (5,000,000), each once, generated as they are read so that the input
   takes no memory, ABS every ``--interval``, parallelism 1, in a fresh
   child process per run (this script with a hidden ``--rss-child
   BACKEND``): memory against RocksDB with a small cache
   (``--rss-cache-size`` 50,000 entries, ``--rss-block-cache-mb`` 16).
   The figure is the child's ``VmHWM`` (peak resident set of its own
   image) when the job returns; ``ru_maxrss`` would not do: Linux carries
   it over ``fork``/``exec`` from the parent, so a child reports the
   benchmark's own peak. ``--rss-repeat`` rounds (default 1).

**Hot keys** (``hot-keys``, both backends; not in the default selection):
``--hot-state-keys`` keys (300,000) loaded, then ``--hot-updates``
(5,000,000) updates to ``--hot-fraction`` of them (1%), a keyed sum at
parallelism 2 with ABS checkpoints every ``--hot-interval`` (0.1 s): median
checkpointed/full of the checkpoints after the load, aborted checkpoints,
the longest gap between two completions (``benchmarks/state_hotkeys.py``).

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
full_size`` <= 0.05. The restore time is reported, without a goal. RocksDB:
word count and running sum >= 0.6x of the memory backend's throughput (both
with ABS checkpoints); 1% change median ``checkpointed_size / full_size`` <=
0.05; synchronous phase p99 <= 50 ms; restore of 1M keys at the same
parallelism (p=1) <= 2 s (2 -> 3 reported, without a goal); peak RSS with
5M keys <= 0.5x the memory backend's; a count over 3M distinct keys >= 0.3x
the memory backend's throughput. A goal whose runs took no checkpoint is
OPEN.

``--backend memory|rocksdb|both`` picks the rows (scenarios 1-3, 4-8, all);
``--scenarios`` names them instead (``sum change restore rocksdb-throughput
rocksdb-change rocksdb-restore rss distinct-keys hot-keys``). Sizes: ``--keys`` (running sum,
1% change, restore), ``--records``, ``--words``, ``--rss-keys``; ``--quick``
shrinks them all.

``gc.collect()`` runs before every timed run and ``os.sync()`` after it
(untimed); the input and the expected sums are frozen out of the collector's
reach (``gc.freeze()``). Checkpoints go under the system's temporary folder
(``--chk-dir``) and are deleted after each run.

    python benchmarks/state.py                  # all rows, 1M keys, 5M for RSS (~20 min)
    python benchmarks/state.py --backend memory # scenarios 1-3 only (3-6 min)
    python benchmarks/state.py --backend rocksdb --keys 100000 --rss-keys 500000
    python benchmarks/state.py --quick          # 100k keys, 1M records, 1 round (1-2 min)
    python benchmarks/state.py --quick --scenarios rss       # only the peak-RSS rows
    python benchmarks/state.py --scenarios hot-keys          # only the hot-key rows
    python benchmarks/state.py --scenarios distinct-keys rocksdb-throughput  # RocksDB on new keys
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
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import eddyflow as ef

if TYPE_CHECKING:
    from state_hotkeys import HotResults

DEFAULT_KEYS = 1_000_000
DEFAULT_RECORDS = 3_000_000
QUICK_KEYS = 100_000
QUICK_RECORDS = 1_000_000
DEFAULT_WORDS = 3_000_000
QUICK_WORDS = 500_000
DEFAULT_RSS_KEYS = 5_000_000
QUICK_RSS_KEYS = 500_000
DEFAULT_DISTINCT_KEYS = 3_000_000
QUICK_DISTINCT_KEYS = 300_000
MEMORY_SCENARIOS = ("sum", "change", "restore")
ROCKSDB_SCENARIOS = ("rocksdb-throughput", "rocksdb-change", "rocksdb-restore", "rss",
                     "distinct-keys")
#: Scenarios run only when ``--scenarios`` names them.
OTHER_SCENARIOS = ("hot-keys",)
SCENARIOS = MEMORY_SCENARIOS + ROCKSDB_SCENARIOS + OTHER_SCENARIOS
BACKENDS = ("memory", "rocksdb")
#: Goals of the issue.
ABS_MIN_RATIO = 0.85
ABS_MAX_PAUSE = 0.100  # seconds
ABS_MAX_PAUSE_VS_SYNC = 1 / 3
MAX_CHANGE_RATIO = 0.05
ROCKS_MIN_RATIO = 0.6  # RocksDB throughput / memory's, both with ABS checkpoints
ROCKS_MIN_DISTINCT_RATIO = 0.3  # the same, on keys that never repeat
ROCKS_MAX_SYNC_P99 = 0.050  # seconds: p99 of the keyed task's synchronous phase
ROCKS_MAX_RESTORE = 2.0  # seconds: restore at the same parallelism
ROCKS_MAX_RSS_RATIO = 0.5  # RocksDB's peak RSS / memory's
#: The restore cases of the RocksDB rows that goals and reports name.
ROCKS_RESTORE_SAME = "restore, p=1 (from p=1)"
ROCKS_RESTORE_2_3 = "restore, p=3 (from p=2)"
#: A gap between two sink writes at least this long counts as a pause.
PAUSE_THRESHOLD = 0.100
#: The paced source starts a round this long after it saw the checkpoint of
#: the round before complete.
ROUND_DELAY = 0.1
#: The paced source's longest sleep inside one read (it returns an empty
#: batch after it, so that a barrier waits at most this long).
PACE_SLICE = 0.01
OPERATOR = "sum"
WC_OPERATOR = "count"  # the word count's keyed operator

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


def use_backend(env: ef.StreamEnvironment, backend: str, args: argparse.Namespace, *,
                cache_size: int | None = None, block_cache_mb: int | None = None) -> str | None:
    """Sets ``env``'s state backend; for RocksDB, returns the new local
    folder of its databases (for :func:`drop_local` once the run's result
    has been verified: the final state's views read it)."""
    if backend == "memory":
        env.set_state_backend(ef.MemoryStateBackend())
        return None
    if backend != "rocksdb":
        raise ValueError(f"unknown backend {backend!r}")
    local = tempfile.mkdtemp(prefix="eddyflow-rocksdb-", dir=args.chk_dir)
    env.set_state_backend(ef.RocksDBStateBackend(
        local, incremental=True,
        cache_size=args.rocksdb_cache_size if cache_size is None else cache_size,
        block_cache_bytes=(args.rocksdb_block_cache_mb if block_cache_mb is None
                           else block_cache_mb) << 20,
        write_buffer_bytes=args.rocksdb_write_buffer_mb << 20))
    return local


def drop_local(local: str | None) -> None:
    """Removes a RocksDB backend's local folder (after the collector has run
    the finalizers of what the caller dropped: they close the databases)."""
    if local is not None:
        gc.collect()
        remove_chk_dir(local)


def keyed_sync_durations(infos: list[ef.CheckpointInfo], operator: str = OPERATOR
                         ) -> list[float]:
    """The synchronous phase (``sync_duration``, seconds) of every task that
    runs ``operator``, per periodic checkpoint (not the final one, taken at
    the end of the input, when no record waits): from each checkpoint's
    metadata ``tasks``, keyed ``'a -> b -> c[subtask]'``."""
    out: list[float] = []
    for c in infos:
        if c.final:
            continue
        for task, stats in c.metadata.get("tasks", {}).items():
            if operator in task.rsplit("[", 1)[0].split(" -> "):
                out.append(float(stats["sync_duration"]))
    return out


def verify(label: str, sink: ProgressSink, result: ef.JobResult | None,
           records: list[Record], expected: Expected, operator: str = OPERATOR) -> list[str]:
    """The run's committed output and final state (of ``operator``) against
    the independent computation (of the committed prefix, for a cancelled
    run)."""
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
        state = state_dict(result.state(operator))
        if state != expected.sums:
            errors.append(f"{label}: final keyed state of {diff_count(state, expected.sums):,} "
                          "keys differs from the independent computation, e.g. "
                          + diff_examples(state, expected.sums))
    return errors


def state_dict(state: Mapping[Any, Any]) -> dict[Any, Any]:
    """A final keyed state as a dict: the memory backend's is one already; a
    RocksDB backend's (a read-only view per subtask, their union at p > 1)
    is read once, in key order per subtask, rather than a lookup a key."""
    if isinstance(state, dict):
        return state
    parts = getattr(state, "parts", None)  # result._Union: one view per subtask
    out: dict[Any, Any] = {}
    for part in (parts if parts is not None else [state]):
        out.update(part.items())
    return out


def diff_count(a: dict[Any, Any], b: dict[Any, Any]) -> int:
    return sum(1 for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def diff_examples(got: dict[Any, Any], want: dict[Any, Any], n: int = 3) -> str:
    """A few keys whose values differ: 'key: got, expected want'."""
    out = []
    for k in sorted(got.keys() | want.keys(), key=repr):
        if got.get(k, "absent") != want.get(k, "absent"):
            out.append(f"{k!r}: {got.get(k, 'absent')}, expected {want.get(k, 'absent')}")
            if len(out) == n:
                break
    return "; ".join(out)


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
    backend: str = "memory"
    #: synchronous phase of the keyed task, per periodic checkpoint (seconds)
    sync: list[float] = field(default_factory=list)
    #: the job's final keyed state (kept for RocksDB only: a restore of its
    #: checkpoint that differs from the expected state is compared with it)
    final_state: dict[Any, Any] | None = None

    def measured(self) -> list[ChangeCheckpoint]:
        return [c for c in self.checkpoints if c.role == "measured"]

    def median_ratio(self) -> float | None:
        m = self.measured()
        return statistics.median(c.ratio for c in m) if m else None


def change_scenario(data: ChangeData, expected: Expected, args: argparse.Namespace,
                    backend: str = "memory") -> tuple[ChangeOutcome, list[str]]:
    """Runs the paced job with ABS checkpoints; the checkpoint folder is kept
    for the restore scenario (the caller removes it)."""
    env = ef.StreamEnvironment(parallelism=1)
    folder = new_chk_dir(args)
    local = use_backend(env, backend, args)
    env.enable_checkpointing(interval=args.change_interval, directory=folder,
                             mode="exactly_once", retained=1_000_000)
    sink = ProgressSink()
    source = PacedSource(data, lambda: sink.committed, args.gate_timeout)
    started = time.time()
    label = "1% change" if backend == "memory" else f"{backend} 1% change"
    try:
        ex = execute(env, change_job(source, sink), f"state {label}")
        errors = verify(label, sink, ex.result, data.records, expected)
        seconds = ex.seconds
        final_state = (None if backend == "memory" or ex.result is None
                       else state_dict(ex.result.state(OPERATOR)))
        del ex
    finally:
        drop_local(local)
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
    return ChangeOutcome(out, seconds, restore_from, folder, source.gate_timeouts, backend,
                         keyed_sync_durations(infos), final_state), errors


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


RestoreCase = tuple[str, int, str | None]  # label, parallelism, checkpoint to restore


def memory_restore_cases(path: str) -> list[RestoreCase]:
    return [
        ("empty input, no restore, p=1", 1, None),
        ("restore, p=1", 1, path),
        ("restore, p=2", 2, path),
    ]


def restore_scenario(cases: list[RestoreCase], data: ChangeData, expected: Expected,
                     args: argparse.Namespace, verbose: bool, backend: str = "memory",
                     references: dict[str, dict[Any, Any] | None] | None = None
                     ) -> tuple[RestoreTimes, list[str]]:
    """Each case ``--restore-repeat`` times, interleaved: the seconds of
    ``execute`` (restore included), and the restored state checked against
    the independent computation; when it differs, also against
    ``references[path]``, the final state of the job that took the
    checkpoint (was the checkpoint wrong already, or the restore?)."""
    out = RestoreTimes()
    errors: list[str] = []
    empty = ChangeData([], [0])
    prefix = "" if backend == "memory" else f"{backend} "
    for r in range(args.restore_repeat):
        for label, parallelism, restore in cases:
            if label in out.failures:
                continue
            env = ef.StreamEnvironment(parallelism=parallelism)
            local = use_backend(env, backend, args)
            source = PacedSource(data if restore else empty)
            sink = ProgressSink()
            try:
                try:
                    ex = execute(env, change_job(source, sink), f"state {prefix}{label}",
                                 restore=restore, timeout=args.max_run_seconds)
                except Exception as exc:  # reported, not fatal: e.g. p=2 unsupported
                    out.failures[label] = f"{type(exc).__name__}: {exc}"
                    continue
                out.seconds.setdefault(label, []).append(ex.seconds)
                if ex.result is None:
                    errors.append(f"{prefix}{label}: did not finish within "
                                  f"{args.max_run_seconds} s")
                    continue
                if sink.committed:
                    errors.append(f"{prefix}{label}: {sink.committed:,} records committed, "
                                  "expected none")
                want = expected.sums if restore else {}
                state = state_dict(ex.result.state(OPERATOR)) if restore else {}
                if state != want:
                    ref = (references or {}).get(restore or "")
                    if ref is None:
                        why = ""
                    elif state == ref:
                        why = ("; it equals the final state of the job that took the "
                               "checkpoint")
                    else:
                        why = (f"; it differs from the final state of the job that took the "
                               f"checkpoint in {diff_count(state, ref):,} keys, e.g. "
                               + diff_examples(state, ref))
                    errors.append(f"{prefix}{label}: restored state of "
                                  f"{diff_count(state, want):,} keys differs from the "
                                  "independent computation, e.g. " + diff_examples(state, want)
                                  + why)
                del ex, state
            finally:
                drop_local(local)
        if verbose:
            print(f"  {prefix}restore, round {r + 1}/{args.restore_repeat}: " + ", ".join(
                f"{k} {v[-1]:.2f}s" for k, v in out.seconds.items()), file=sys.stderr,
                flush=True)
    return out, errors


# -- RocksDB rows ----------------------------------------------------------------------------


@dataclass
class JobSpec:
    """A job of the RocksDB-vs-memory throughput rows."""

    key: str  # "wordcount" or "sum"
    title: str
    operator: str  # the keyed operator's name: its final state is verified
    build: Callable[[ef.StreamEnvironment, ProgressSink], None]
    #: the keyed records in order (a word count's: (word, 1) per word), from
    #: which verification recomputes what the job must produce
    records: list[Record]
    expected: Expected
    keys: int  # distinct keys
    #: the RocksDB runs' cache (None: --rocksdb-cache-size)
    cache_size: int | None = None
    min_ratio: float = ROCKS_MIN_RATIO  # the goal, RocksDB's throughput / memory's


def distinct_spec(args: argparse.Namespace) -> JobSpec:
    """A keyed count over ``--distinct-keys`` keys each seen once, in a
    seeded random order (scenario 9)."""
    ids = [f"e{i:09d}" for i in range(args.distinct_keys)]
    random.Random(args.seed).shuffle(ids)
    records: list[Record] = [(k, 1) for k in ids]

    def build(env: ef.StreamEnvironment, sink: ProgressSink) -> None:
        (env.from_collection(ids)
         .key_by(distinct_id).count().name(WC_OPERATOR)
         .sink_to(sink))
    return JobSpec("distinct", "distinct ids", WC_OPERATOR, build, records, expect(records),
                   len(ids), cache_size=args.distinct_cache_size,
                   min_ratio=ROCKS_MIN_DISTINCT_RATIO)


def distinct_id(event_id: str) -> str:
    return event_id


def sum_spec(records: list[Record], expected: Expected) -> JobSpec:
    def build(env: ef.StreamEnvironment, sink: ProgressSink) -> None:
        build_sum(env, records, sink)
    return JobSpec("sum", "running sum", OPERATOR, build, records, expected, len(expected.sums))


def wordcount_spec(args: argparse.Namespace) -> JobSpec:
    """``benchmarks/throughput.py``'s word count (its seeded Zipf dataset,
    ``--words`` over a ``--vocabulary``), into a :class:`ProgressSink`:
    ``flat_map(str.split) -> key_by(word) -> count``."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import throughput  # the benchmark's own dataset and key function

    data = throughput.make_dataset(args.words, args.vocabulary, args.seed, 1.0)
    lines = data.lines
    words: list[Record] = [(w, 1) for line in lines for w in line.split()]

    def build(env: ef.StreamEnvironment, sink: ProgressSink) -> None:
        (env.from_collection(lines)
         .flat_map(str.split)
         .key_by(throughput.word).count().name(WC_OPERATOR)
         .sink_to(sink))
    return JobSpec("wordcount", "word count", WC_OPERATOR, build, words, expect(words),
                   data.distinct)


@dataclass
class BackendRun:
    job: str
    backend: str
    seconds: float
    written: int  # records the sink received
    cut: bool  # cancelled at --max-run-seconds
    pause: float  # longest gap between two sink writes
    checkpoints: int  # periodic ones
    sync: list[float]  # the keyed task's synchronous phase per periodic checkpoint

    @property
    def rate(self) -> float:
        return self.written / self.seconds


def crashed(label: str, exc: BaseException) -> str:
    """A run that raised: the error for the report, the traceback on stderr."""
    print(f"{label}: crashed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    return f"{label}: crashed: {type(exc).__name__}: {exc} (traceback on stderr)"


def run_backend_job(spec: JobSpec, backend: str, args: argparse.Namespace, label: str
                    ) -> tuple[BackendRun | None, list[str]]:
    """One run of ``spec`` on ``backend`` with ABS checkpoints every
    ``--interval``, verified (None: it crashed)."""
    env = ef.StreamEnvironment(parallelism=1)
    folder = new_chk_dir(args)
    local = use_backend(env, backend, args, cache_size=spec.cache_size)
    sink = ProgressSink()
    try:
        env.enable_checkpointing(interval=args.interval, directory=folder, mode="exactly_once",
                                 retained=1_000_000)
        ex = execute(env, lambda e: spec.build(e, sink), f"state {backend} {spec.key}",
                     timeout=args.rocksdb_max_run_seconds)
        infos = ef.list_checkpoints(folder)
        errors = verify(label, sink, ex.result, spec.records, spec.expected, spec.operator)
        seconds, cut = ex.seconds, ex.result is None
        del ex
    except Exception as exc:
        return None, [crashed(label, exc)]
    finally:
        remove_chk_dir(folder)
        drop_local(local)
    pause, _ = sink.pauses()
    return BackendRun(spec.key, backend, seconds, sink.records_written(), cut, pause,
                      sum(not c.final for c in infos),
                      keyed_sync_durations(infos, spec.operator)), errors


def rocksdb_throughput_scenario(specs: list[JobSpec], args: argparse.Namespace, verbose: bool
                                ) -> tuple[dict[str, dict[str, Any]], list[str], int]:
    """Per job: ``--warmup`` untimed memory runs, then ``--rocksdb-repeat``
    rounds of a memory and a RocksDB run (the order alternating), both with
    ABS checkpoints every ``--interval``. Returns the summary per job, the
    mismatches and the number of runs."""
    errors: list[str] = []
    runs: dict[str, dict[str, list[BackendRun]]] = {
        s.key: {b: [] for b in BACKENDS} for s in specs}
    ratios: dict[str, list[float]] = {s.key: [] for s in specs}
    n = 0
    for spec in specs:
        for w in range(args.warmup):
            _, errs = run_backend_job(spec, "memory", args, f"{spec.title}, memory warm-up {w + 1}")
            errors += errs
            n += 1
    for r in range(args.rocksdb_repeat):
        for spec in specs:
            order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
            pair: dict[str, BackendRun] = {}
            for backend in order:
                run, errs = run_backend_job(spec, backend, args,
                                            f"{spec.title}, {backend}, round {r + 1}")
                errors += errs
                n += 1
                if run is not None:
                    pair[backend] = run
                    runs[spec.key][backend].append(run)
            if len(pair) == 2:
                ratios[spec.key].append(pair["rocksdb"].rate / pair["memory"].rate)
            if verbose:
                print(f"  {spec.title}, round {r + 1}/{args.rocksdb_repeat}: " + ", ".join(
                    f"{x.backend} {x.seconds:.1f}s{' (cut)' if x.cut else ''} "
                    f"{x.rate:,.0f}/s {x.checkpoints}chk" for x in pair.values()),
                    file=sys.stderr, flush=True)
    summary: dict[str, dict[str, Any]] = {}
    for spec in specs:
        row: dict[str, Any] = {"title": spec.title, "keys": spec.keys,
                               "records": spec.expected.records, "ratios": ratios[spec.key],
                               "min_ratio": spec.min_ratio,
                               "cache_size": spec.cache_size or args.rocksdb_cache_size}
        rs = ratios[spec.key]
        row.update(ratio=statistics.median(rs) if rs else None,
                   ratio_min=min(rs, default=None), ratio_max=max(rs, default=None))
        for b in BACKENDS:
            xs = runs[spec.key][b]
            row[b] = {
                "runs": len(xs),
                "cut": sum(x.cut for x in xs),
                "seconds": [x.seconds for x in xs],
                "records_per_second": statistics.median(x.rate for x in xs) if xs else None,
                "checkpoints_per_run": [x.checkpoints for x in xs],
                "longest_pause": statistics.median(x.pause for x in xs) if xs else None,
                "sync_durations": [d for x in xs for d in x.sync],
            }
        summary[spec.key] = row
    return summary, errors, n


def checkpoint_at(data: ChangeData, expected: Expected, args: argparse.Namespace,
                  parallelism: int, backend: str
                  ) -> tuple[str | None, str, dict[Any, Any] | None, list[str]]:
    """The change job's whole input, unpaced, with the keyed operator at
    ``parallelism`` and ABS checkpoints every ``--change-interval``; returns
    its final checkpoint's path, the checkpoint folder (the caller removes
    it), the job's final state and the run's mismatches."""
    env = ef.StreamEnvironment(parallelism=parallelism)
    folder = new_chk_dir(args)
    local = use_backend(env, backend, args)
    env.enable_checkpointing(interval=args.change_interval, directory=folder,
                             mode="exactly_once", retained=1_000_000)
    sink = ProgressSink()
    label = f"{backend} load at p={parallelism}"
    try:
        ex = execute(env, change_job(PacedSource(data), sink), f"state {label}")
        errors = verify(label, sink, ex.result, data.records, expected)
        state = None if ex.result is None else state_dict(ex.result.state(OPERATOR))
        del ex
    except Exception as exc:
        return None, folder, None, [crashed(label, exc)]
    finally:
        drop_local(local)
    final = [c for c in ef.list_checkpoints(folder) if c.final]
    return (final[-1].path if final else None), folder, state, errors


def rocksdb_restore_cases(from_p1: str, from_p2: str | None) -> list[RestoreCase]:
    cases: list[RestoreCase] = [
        ("empty input, no restore, p=1", 1, None),
        (ROCKS_RESTORE_SAME, 1, from_p1),
        ("restore, p=2 (from p=1)", 2, from_p1),
    ]
    if from_p2 is not None:
        cases.append((ROCKS_RESTORE_2_3, 3, from_p2))
    return cases


# -- peak RSS (a fresh child process per run) -----------------------------------------------


class CountingSource(ef.Source):
    """``n`` records ``(f"k{i:08d}", i % 9 + 1)``, ``i`` = 0 .. n-1, made as
    they are read: the input is not held in memory, so the peak RSS is the
    job's. The position is the index of the next record. One subtask only."""

    def __init__(self, n: int) -> None:
        self.n = n

    @property
    def name(self) -> str:
        return "counting"

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        if parallelism != 1:
            raise ValueError("CountingSource runs with parallelism 1")
        return _CountingReader(self.n)


class _CountingReader(ef.SourceReader):
    def __init__(self, n: int) -> None:
        self._n = n
        self._pos = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self._pos >= self._n:
            return None
        stop = min(self._pos + max_records, self._n)
        batch = [(f"k{i:08d}", i % 9 + 1) for i in range(self._pos, stop)]
        self._pos = stop
        return batch

    def position(self) -> int:
        return self._pos

    def seek(self, position: Any) -> None:
        if not isinstance(position, int) or not 0 <= position <= self._n:
            raise ValueError(f"position {position!r} outside [0, {self._n}]")
        self._pos = position


def counting_total(n: int) -> int:
    """The sum of ``i % 9 + 1`` over i < n: the total of the running sums of
    :class:`CountingSource` (each key once, so each running sum is its value)."""
    return n // 9 * 45 + sum(range(1, n % 9 + 1))


RSS_MARK = "RSS-RESULT "


def peak_rss_kb() -> int:
    """This process's peak resident set size, KiB: ``VmHWM`` of
    ``/proc/self/status`` (Linux), the high-water mark of this process
    image's memory since its ``exec``. Not ``ru_maxrss``: Linux carries a
    process's ``ru_maxrss`` over ``fork`` and ``exec``, so a child of a
    benchmark holding 500 MB reports 500 MB before it has done anything
    (measured here); ``ru_maxrss`` is the fallback elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def rss_child(args: argparse.Namespace) -> int:
    """In a fresh process: the running sum over ``--rss-keys`` keys, each
    once (:class:`CountingSource`), with ABS checkpoints every
    ``--interval``, on ``--rss-child``'s backend (RocksDB with the small
    cache of ``--rss-cache-size`` and ``--rss-block-cache-mb``). Prints one
    line, ``RSS_MARK`` and JSON: the peak RSS of this process
    (:func:`peak_rss_kb`) before the job was built and as soon as it
    returned (before verification), and the mismatches. The children
    (forked snapshot writers, the checkpoint writer process) are not
    counted: a forked child's RSS counts the pages it shares with this
    process, and their ``ru_maxrss`` carries this process's over."""
    backend = args.rss_child
    n = args.rss_keys
    start_kb = peak_rss_kb()
    env = ef.StreamEnvironment(parallelism=1)
    folder = new_chk_dir(args)
    local = use_backend(env, backend, args, cache_size=args.rss_cache_size,
                        block_cache_mb=args.rss_block_cache_mb)
    env.enable_checkpointing(interval=args.interval, directory=folder, mode="exactly_once",
                             retained=1_000_000)
    sink = ProgressSink()
    (env.from_source(CountingSource(n)).name("counting").set_parallelism(1)
     .key_by(record_key).sum(record_value).name(OPERATOR)
     .sink_to(sink))
    errors: list[str] = []
    label = f"peak RSS, {backend}, {n:,} keys"
    try:
        gc.collect()
        t0 = time.perf_counter()
        result = asyncio.run(env.execute_async(f"state rss {backend}"))
        seconds = time.perf_counter() - t0
        peak_kb = peak_rss_kb()
        maxrss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        infos = ef.list_checkpoints(folder)
        if sink.committed != n:
            errors.append(f"{label}: {sink.committed:,} records committed, expected {n:,}")
        if sink.committed_total != counting_total(n):
            errors.append(f"{label}: the committed running sums total "
                          f"{sink.committed_total:,}, expected {counting_total(n):,}")
        seen, wrong, example = 0, 0, ""
        for k, v in state_dict(result.state(OPERATOR)).items():
            seen += 1
            if v != int(k[1:]) % 9 + 1:
                wrong += 1
                example = example or f"{k!r}: {v}, expected {int(k[1:]) % 9 + 1}"
        if seen != n or wrong:
            errors.append(f"{label}: final state has {seen:,} keys (expected {n:,}), "
                          f"{wrong:,} with a wrong sum{', e.g. ' + example if example else ''}")
        del result
    finally:
        remove_chk_dir(folder)
        drop_local(local)
    print(RSS_MARK + json.dumps({
        "backend": backend, "keys": n, "seconds": seconds, "start_kb": start_kb,
        "peak_kb": peak_kb, "ru_maxrss_kb": maxrss_kb,
        "checkpoints": sum(not c.final for c in infos), "errors": errors,
    }), flush=True)
    return 0


@dataclass
class RssRun:
    backend: str
    keys: int
    seconds: float
    start_kb: int  # peak RSS before the job was built (the interpreter, eddyflow)
    peak_kb: int  # peak RSS of the job's process (VmHWM)
    ru_maxrss_kb: int  # for the record: inherits the parent's (see peak_rss_kb)
    checkpoints: int


def rss_scenario(args: argparse.Namespace, verbose: bool
                 ) -> tuple[dict[str, list[RssRun]], list[str], int]:
    """``--rss-repeat`` rounds of a memory and a RocksDB child (the order
    alternating), each a fresh interpreter running :func:`rss_child`."""
    runs: dict[str, list[RssRun]] = {b: [] for b in BACKENDS}
    errors: list[str] = []
    n = 0
    for r in range(args.rss_repeat):
        for backend in (BACKENDS if r % 2 == 0 else BACKENDS[::-1]):
            label = f"peak RSS, {backend}, round {r + 1}"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--rss-child", backend,
                   "--rss-keys", str(args.rss_keys), "--interval", repr(args.interval),
                   "--rss-cache-size", str(args.rss_cache_size),
                   "--rss-block-cache-mb", str(args.rss_block_cache_mb),
                   "--rocksdb-write-buffer-mb", str(args.rocksdb_write_buffer_mb), "--quiet"]
            if args.chk_dir is not None:
                cmd += ["--chk-dir", args.chk_dir]
            n += 1
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=args.rss_timeout, check=False)
            except subprocess.TimeoutExpired:
                errors.append(f"{label}: the child did not finish within {args.rss_timeout:g} s")
                continue
            found = [ln for ln in proc.stdout.splitlines() if ln.startswith(RSS_MARK)]
            if proc.returncode != 0 or not found:
                tail = " | ".join(proc.stderr.strip().splitlines()[-12:])
                errors.append(f"{label}: the child exited with {proc.returncode}: {tail}")
                continue
            got = json.loads(found[-1][len(RSS_MARK):])
            errors += got["errors"]
            run = RssRun(backend, got["keys"], got["seconds"], got["start_kb"], got["peak_kb"],
                         got["ru_maxrss_kb"], got["checkpoints"])
            runs[backend].append(run)
            if verbose:
                print(f"  {label}: {run.seconds:.1f}s, peak RSS {run.peak_kb / 1024:,.0f} MB "
                      f"(at start {run.start_kb / 1024:,.0f} MB), {run.checkpoints}chk",
                      file=sys.stderr, flush=True)
    return runs, errors, n


@dataclass
class RocksResults:
    throughput: dict[str, dict[str, Any]] = field(default_factory=dict)  # job key -> summary
    change: ChangeOutcome | None = None
    restore: RestoreTimes | None = None
    rss: dict[str, list[RssRun]] | None = None

    def sync_sources(self) -> list[tuple[str, list[float], bool]]:
        """(label, synchronous phases, counts for the goal) per source."""
        out: list[tuple[str, list[float], bool]] = []
        if self.change is not None:
            out.append(("1% change", self.change.sync, True))
        if "sum" in self.throughput:
            out.append(("running sum (ABS)", self.throughput["sum"]["rocksdb"]["sync_durations"],
                        True))
        if "wordcount" in self.throughput:
            out.append(("word count (ABS)",
                        self.throughput["wordcount"]["rocksdb"]["sync_durations"], False))
        return out

    def goal_syncs(self) -> list[float]:
        return [d for _, ds, goal in self.sync_sources() if goal for d in ds]


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
           errors: list[str], total_runs: int, rocks: RocksResults | None = None,
           hot: HotResults | None = None) -> str:
    both = rocks is not None or hot is not None
    backends = "memory and RocksDB backends" if both else "memory backend"
    lines = [
        f"eddyflow checkpoint cost against state size ({backends})",
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
        lines += render_change("2.", change, args)
    if restore is not None:
        lines += render_restore(f"3. restore of {args.change_keys:,} keys from the final "
                                "checkpoint of the 1% change job", restore, args)
    if rocks is not None:
        lines += render_rocks(args, rocks)
    if hot is not None:
        from state_hotkeys import render_hot

        lines += render_hot("9.", hot, args)
    if goals:
        lines.append("goals:")
        width = max(48, *(len(g.label) for g in goals))
        lines += [f"  {g.status}  {g.label:<{width}} {g.detail}" for g in goals]
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


def render_change(number: str, change: ChangeOutcome, args: argparse.Namespace,
                  note: str | None = None) -> list[str]:
    on = "" if change.backend == "memory" else f" with {change.backend}"
    lines = [
        f"{number} 1% change{on}: {args.change_keys:,} keys loaded, then {args.rounds} rounds of "
        f"{args.change:.1%} of the keys, each {ROUND_DELAY:g} s after the checkpoint "
        "covering the one before",
        f"   completed (ABS every {args.change_interval:g} s); run {change.seconds:.1f} s",
    ]
    if note:
        lines.append(f"   {note}")
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
    return lines


def render_restore(title: str, restore: RestoreTimes, args: argparse.Namespace) -> list[str]:
    lines = [f"{title} (median of {args.restore_repeat})", ""]
    for label, secs in restore.seconds.items():
        lines.append(f"   {label:<32} {statistics.median(secs):>7.3f} s   "
                     f"(runs: {', '.join(f'{s:.3f}' for s in secs)})")
    for label, why in restore.failures.items():
        lines.append(f"   {label:<32} did not run: {why}")
    lines.append("")
    return lines


def rocksdb_config(args: argparse.Namespace, cache_size: int, block_cache_mb: int) -> str:
    return (f"RocksDBStateBackend(incremental=True, cache_size={cache_size:,}, block cache "
            f"{block_cache_mb} MB, write buffer {args.rocksdb_write_buffer_mb} MB)")


def render_rocks(args: argparse.Namespace, rocks: RocksResults) -> list[str]:
    lines: list[str] = []
    config = rocksdb_config(args, args.rocksdb_cache_size, args.rocksdb_block_cache_mb)
    if rocks.throughput:
        lines += [
            "4. RocksDB vs memory throughput, both with ABS checkpoints every "
            f"{args.interval:g} s, parallelism 1",
            f"   {config}",
            f"   {args.rocksdb_repeat} round(s) per job of a memory and a RocksDB run (order "
            f"alternating) after {args.warmup} untimed memory run(s); runs cut at "
            f"{args.rocksdb_max_run_seconds:g} s",
            "",
        ]
        header = (f"   {'job':<12} {'keys':>10} {'records':>10} {'memory rec/s':>13} "
                  f"{'rocksdb rec/s':>14} {'rocksdb/memory [min-max]':>25} {'chk/run m/r':>12} "
                  f"{'pause ms m/r':>13} {'cut m/r':>8}")
        lines += [header, "   " + "-" * (len(header) - 3)]
        for x in rocks.throughput.values():
            m, r = x["memory"], x["rocksdb"]
            ratio = ("-" if x["ratio"] is None else
                     f"{x['ratio']:.3f}x [{x['ratio_min']:.2f}-{x['ratio_max']:.2f}]")
            chk = "/".join(f"{statistics.median(v['checkpoints_per_run']):g}"
                           if v["checkpoints_per_run"] else "-" for v in (m, r))
            pause = "/".join(ms(v["longest_pause"]) for v in (m, r))
            rate = ["-" if v["records_per_second"] is None else f"{v['records_per_second']:,.0f}"
                    for v in (m, r)]
            lines.append(
                f"   {x['title']:<12} {x['keys']:>10,} {x['records']:>10,} {rate[0]:>13} "
                f"{rate[1]:>14} {ratio:>25} {chk:>12} {pause:>13} "
                f"{m['cut']}/{r['cut']} of {m['runs']}/{r['runs']}")
        lines += [
            "",
            "   rec/s: median over runs of the records the sink received per second of execute "
            "(word count:",
            "   words); rocksdb/memory: median over rounds of the ratio within a round; "
            "pause: longest gap",
            "   between two sink writes, median over runs; cut: runs cancelled at "
            "--rocksdb-max-run-seconds (measured up to there)",
        ]
        lines += [f"   {x['title']}: RocksDB cache_size={x['cache_size']:,} (9. keys that "
                  "never repeat: a keyed count)" for x in rocks.throughput.values()
                  if x["cache_size"] != args.rocksdb_cache_size]
        lines.append("")
    if rocks.change is not None:
        lines += render_change("5. RocksDB,", rocks.change, args, config)
    sources = rocks.sync_sources()
    if sources:
        lines += [
            "6. RocksDB synchronous phase per periodic checkpoint: the keyed task's "
            "sync_duration in each checkpoint's",
            "   metadata 'tasks' (the final checkpoint, at the end of the input, left out)",
            "",
        ]
        header = (f"   {'checkpoints of':<34} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} "
                  f"{'max ms':>8}")
        lines += [header, "   " + "-" * (len(header) - 3)]
        rows = [(f"rocksdb, {label}", ds) for label, ds, _ in sources]
        rows.append(("rocksdb, all of the goal's", rocks.goal_syncs()))
        if rocks.throughput:
            for job in rocks.throughput.values():
                rows.append((f"(memory, {job['title']} (ABS))",
                             job["memory"]["sync_durations"]))
        for label, ds in rows:
            lines.append(f"   {label:<34} {len(ds):>5} {ms3(percentile(ds, 50)):>8} "
                         f"{ms3(percentile(ds, 99)):>8} {ms3(max(ds, default=None)):>8}")
        lines += ["", "   goal: p99 over the 1% change run's and the running sum's "
                  "RocksDB checkpoints; p99: nearest rank", ""]
    if rocks.restore is not None:
        lines += render_restore(f"7. RocksDB restore of {args.change_keys:,} keys ({config}): "
                                "from the final checkpoint of the 1% change job (p=1)\n"
                                "   and of the same input loaded at p=2", rocks.restore, args)
    if rocks.rss is not None:
        rss_config = rocksdb_config(args, args.rss_cache_size, args.rss_block_cache_mb)
        lines += [
            f"8. peak RSS: the running sum over {args.rss_keys:,} keys, each once (generated as "
            f"read), ABS every {args.interval:g} s,",
            f"   parallelism 1, a fresh child process per run; RocksDB: {rss_config}",
            "",
        ]
        header = (f"   {'backend':<8} {'runs':>4} {'peak RSS MB':>12} {'(runs)':>18} "
                  f"{'at start MB':>12} {'run s':>7} {'chk/run':>8}")
        lines += [header, "   " + "-" * (len(header) - 3)]
        for backend, rs in rocks.rss.items():
            if not rs:
                lines.append(f"   {backend:<8} {0:>4}  (no run completed)")
                continue
            lines.append(
                f"   {backend:<8} {len(rs):>4} "
                f"{statistics.median(r.peak_kb for r in rs) / 1024:>12,.0f} "
                f"{', '.join(f'{r.peak_kb / 1024:,.0f}' for r in rs):>18} "
                f"{statistics.median(r.start_kb for r in rs) / 1024:>12,.0f} "
                f"{statistics.median(r.seconds for r in rs):>7.1f} "
                f"{statistics.median(r.checkpoints for r in rs):>8g}")
        ratio = rss_ratio(rocks.rss)
        lines += [
            "",
            "   peak RSS: VmHWM of the job's process, read as the job returns (median of "
            "runs); at start: before the",
            "   job was built (the interpreter and eddyflow); its children (forked "
            "snapshot writers, the checkpoint",
            "   writer process) are not counted",
            "   rocksdb/memory peak RSS: " + ("-" if ratio is None else f"{ratio:.3f}"),
            "",
        ]
    return lines


def rss_ratio(rss: dict[str, list[RssRun]]) -> float | None:
    m, r = rss.get("memory"), rss.get("rocksdb")
    if not m or not r:
        return None
    return (statistics.median(x.peak_kb for x in r) / statistics.median(x.peak_kb for x in m))


def ms3(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:,.1f}"


def evaluate_rocks(rocks: RocksResults, args: argparse.Namespace) -> list[Goal]:
    goals: list[Goal] = []
    for x in rocks.throughput.values():
        goal = x["min_ratio"]
        label = f"RocksDB {x['title']} >= {goal:g}x of memory (ABS)"
        if x["ratio"] is None:
            goals.append(Goal(label, "OPEN", "no complete round"))
            continue
        took = all(v["checkpoints_per_run"] and statistics.median(v["checkpoints_per_run"]) > 0
                   for v in (x["memory"], x["rocksdb"]))
        note = "" if took else " (but a backend's runs took no checkpoint: lengthen the input)"
        goals.append(Goal(label, verdict(x["ratio"] >= goal) if took else "OPEN",
                          f"{x['ratio']:.3f}x (median of {len(x['ratios'])} round(s), "
                          f"{x['ratio_min']:.2f}-{x['ratio_max']:.2f}){note}"))
    if rocks.change is not None:
        m = rocks.change.median_ratio()
        label = f"RocksDB 1% change: median checkpointed/full <= {MAX_CHANGE_RATIO:g}"
        if m is None:
            goals.append(Goal(label, "OPEN", "no checkpoint after the 'load done' one: raise "
                                             "--rounds"))
        else:
            goals.append(Goal(label, verdict(m <= MAX_CHANGE_RATIO),
                              f"{m:.3f} over {len(rocks.change.measured())} checkpoint(s)"))
    syncs = rocks.goal_syncs()
    if rocks.change is not None or "sum" in rocks.throughput:
        p99 = percentile(syncs, 99)
        label = f"RocksDB sync phase p99 <= {ROCKS_MAX_SYNC_P99 * 1000:.0f} ms"
        if p99 is None:
            goals.append(Goal(label, "OPEN", "no periodic checkpoint"))
        else:
            goals.append(Goal(label, verdict(p99 <= ROCKS_MAX_SYNC_P99),
                              f"p99 {ms3(p99)} ms, max {ms3(max(syncs))} ms over {len(syncs)} "
                              "checkpoint(s)"))
    if rocks.restore is not None:
        label = (f"RocksDB restore of {args.change_keys:,} keys, p=1 <= "
                 f"{ROCKS_MAX_RESTORE:g} s")
        secs = rocks.restore.seconds.get(ROCKS_RESTORE_SAME)
        if not secs:
            goals.append(Goal(label, "OPEN", rocks.restore.failures.get(ROCKS_RESTORE_SAME,
                                                                        "did not run")))
        else:
            med = statistics.median(secs)
            goals.append(Goal(label, verdict(med <= ROCKS_MAX_RESTORE),
                              f"{med:.3f} s (median of {len(secs)})"))
    if rocks.rss is not None:
        label = (f"RocksDB peak RSS, {args.rss_keys:,} keys <= {ROCKS_MAX_RSS_RATIO:g}x "
                 "memory's")
        ratio = rss_ratio(rocks.rss)
        if ratio is None:
            goals.append(Goal(label, "OPEN", "a backend's run did not complete"))
        else:
            r = statistics.median(x.peak_kb for x in rocks.rss["rocksdb"]) / 1024
            m = statistics.median(x.peak_kb for x in rocks.rss["memory"]) / 1024
            goals.append(Goal(label, verdict(ratio <= ROCKS_MAX_RSS_RATIO),
                              f"{ratio:.3f}x ({r:,.0f} MB vs {m:,.0f} MB)"))
    return goals


def change_json(change: ChangeOutcome | None) -> dict[str, Any] | None:
    if change is None:
        return None
    return {
        "backend": change.backend,
        "seconds": change.seconds,
        "median_ratio": change.median_ratio(),
        "gate_timeouts": change.gate_timeouts,
        "sync_durations": change.sync,
        "checkpoints": [{"id": c.id, "trigger": c.trigger, "duration": c.duration,
                         "checkpointed_size": c.checkpointed_size,
                         "full_size": c.full_size, "ratio": c.ratio,
                         "records": c.records, "keys_changed": c.keys_changed,
                         "role": c.role} for c in change.checkpoints],
    }


def restore_json(restore: RestoreTimes | None) -> dict[str, Any] | None:
    if restore is None:
        return None
    return {
        "seconds": restore.seconds,
        "median": {k: statistics.median(v) for k, v in restore.seconds.items()},
        "failures": restore.failures,
    }


def rocks_json(rocks: RocksResults | None) -> dict[str, Any] | None:
    if rocks is None:
        return None
    syncs = rocks.goal_syncs()
    return {
        "throughput": rocks.throughput,
        "change": change_json(rocks.change),
        "sync": {"p50": percentile(syncs, 50), "p99": percentile(syncs, 99),
                 "max": max(syncs, default=None), "count": len(syncs),
                 "per_source": {label: ds for label, ds, _ in rocks.sync_sources()}},
        "restore": restore_json(rocks.restore),
        "rss": None if rocks.rss is None else {
            "ratio": rss_ratio(rocks.rss),
            "runs": {b: [vars(r) for r in rs] for b, rs in rocks.rss.items()},
        },
    }


def write_json(path: Path, args: argparse.Namespace, summary: dict[str, dict[str, Any]],
               change: ChangeOutcome | None, restore: RestoreTimes | None, goals: list[Goal],
               errors: list[str], rocks: RocksResults | None = None,
               hot: HotResults | None = None) -> None:
    report: dict[str, Any] = {
        "benchmark": "checkpoint cost against state size, memory"
                     + (" and RocksDB backends" if rocks is not None else " backend"),
        "environment": {"python": platform.python_version(), "eddyflow": ef.__version__,
                        "eddyflow_path": str(Path(ef.__file__).parent),
                        "cpus": os.cpu_count(), "platform": platform.platform()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "running_sum": summary,
        "change": change_json(change),
        "restore": restore_json(restore),
        "rocksdb": rocks_json(rocks),
        "hot_keys": None if hot is None else hot_json(hot),
        "goals": [{"goal": g.label, "status": g.status, "detail": g.detail} for g in goals],
        "mismatches": errors,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def hot_json(hot: HotResults) -> dict[str, Any] | None:
    from state_hotkeys import hot_json as as_json

    return as_json(hot)


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Checkpoint cost against state size: ABS vs synchronous vs none over 1M "
                    "keys, 1% change, restore on the memory backend; RocksDB against memory "
                    "(throughput, 1% change, synchronous phase, restore, peak RSS).")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_KEYS:,} keys, {QUICK_RECORDS:,} records, {QUICK_WORDS:,} "
                        f"words, {QUICK_RSS_KEYS:,} RSS keys, 0.25 s intervals, 1 round, "
                        "unless given")
    p.add_argument("--backend", choices=("memory", "rocksdb", "both"), default="both",
                   help="which rows to run unless --scenarios names them: 'memory' the "
                        f"memory backend's ({', '.join(MEMORY_SCENARIOS)}), 'rocksdb' the "
                        f"RocksDB rows ({', '.join(ROCKSDB_SCENARIOS)}; with their memory "
                        "baselines), 'both' (default) all")
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
    p.add_argument("--scenarios", nargs="*", choices=SCENARIOS, default=None,
                   help="which to run (default: those of --backend; 'restore' also runs the "
                        "change job, whose checkpoint it restores, 'rocksdb-restore' the "
                        "RocksDB change job and a load at p=2)")
    p.add_argument("--words", type=int, default=None,
                   help=f"words of the word count of the RocksDB rows (default "
                        f"{DEFAULT_WORDS:,}; {QUICK_WORDS:,} with --quick)")
    p.add_argument("--vocabulary", type=int, default=50_000,
                   help="vocabulary of the word count (default 50,000, as throughput.py)")
    p.add_argument("--rocksdb-repeat", type=int, default=None,
                   help="rounds of the RocksDB-vs-memory throughput rows (default: --repeat)")
    p.add_argument("--rocksdb-max-run-seconds", type=float, default=None,
                   help="cut of the runs of the RocksDB-vs-memory throughput rows (default "
                        "180; 60 with --quick)")
    p.add_argument("--rocksdb-cache-size", type=int, default=2_000_000,
                   help="RocksDB write-cache entries per state (default 2,000,000: the "
                        "1M-key jobs' keys fit, as a user sizes it; the backend's own "
                        "default is 100,000)")
    p.add_argument("--rocksdb-block-cache-mb", type=int, default=64,
                   help="RocksDB block cache, MB (default 64, the backend's default)")
    p.add_argument("--rocksdb-write-buffer-mb", type=int, default=32,
                   help="RocksDB write buffer (memtable), MB (default 32, the backend's "
                        "default; also in the RSS runs)")
    p.add_argument("--rss-keys", type=int, default=None,
                   help=f"keys of the peak-RSS runs (default {DEFAULT_RSS_KEYS:,}; "
                        f"{QUICK_RSS_KEYS:,} with --quick)")
    p.add_argument("--rss-cache-size", type=int, default=50_000,
                   help="RocksDB write-cache entries in the peak-RSS runs (default 50,000)")
    p.add_argument("--rss-block-cache-mb", type=int, default=16,
                   help="RocksDB block cache in the peak-RSS runs, MB (default 16)")
    p.add_argument("--rss-repeat", type=int, default=1,
                   help="rounds of the peak-RSS runs (a memory and a RocksDB child each; "
                        "default 1)")
    p.add_argument("--rss-timeout", type=float, default=1800.0,
                   help="longest a peak-RSS child may run, seconds (default 1800)")
    p.add_argument("--distinct-keys", type=int, default=None,
                   help=f"keys of the distinct-keys count, each once (default "
                        f"{DEFAULT_DISTINCT_KEYS:,}; {QUICK_DISTINCT_KEYS:,} with --quick)")
    p.add_argument("--distinct-cache-size", type=int, default=100_000,
                   help="RocksDB write-cache entries in the distinct-keys runs (default "
                        "100,000, the backend's default)")
    p.add_argument("--rss-child", choices=BACKENDS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--hot-state-keys", type=int, default=None,
                   help="hot keys: keys loaded (default 300,000; --quick 100,000)")
    p.add_argument("--hot-updates", type=int, default=None,
                   help="hot keys: updates after the load (default 5,000,000; --quick 1,000,000)")
    p.add_argument("--hot-fraction", type=float, default=0.01,
                   help="hot keys: the fraction of the keys updated (default 0.01)")
    p.add_argument("--hot-interval", type=float, default=0.1,
                   help="hot keys: checkpoint interval in seconds (default 0.1)")
    p.add_argument("--hot-repeat", type=int, default=None,
                   help="hot keys: runs per backend (default --repeat)")
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
        "words": QUICK_WORDS if q else DEFAULT_WORDS,
        "rocksdb_max_run_seconds": 60.0 if q else 180.0,
        "rss_keys": QUICK_RSS_KEYS if q else DEFAULT_RSS_KEYS,
        "hot_state_keys": 100_000 if q else 300_000,
        "hot_updates": 1_000_000 if q else 5_000_000,
        "distinct_keys": QUICK_DISTINCT_KEYS if q else DEFAULT_DISTINCT_KEYS,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.change_keys is None:
        args.change_keys = args.keys
    if args.rocksdb_repeat is None:
        args.rocksdb_repeat = args.repeat
    if args.hot_repeat is None:
        args.hot_repeat = args.repeat
    if args.scenarios is None:
        args.scenarios = list({"memory": MEMORY_SCENARIOS, "rocksdb": ROCKSDB_SCENARIOS,
                               "both": MEMORY_SCENARIOS + ROCKSDB_SCENARIOS}[args.backend])
    for name in ("keys", "records", "repeat", "rounds", "restore_repeat", "change_keys",
                 "words", "vocabulary", "rocksdb_repeat", "rocksdb_cache_size",
                 "rocksdb_block_cache_mb", "rocksdb_write_buffer_mb", "rss_keys",
                 "rss_cache_size", "rss_block_cache_mb", "rss_repeat", "hot_state_keys",
                 "hot_updates", "hot_repeat", "distinct_keys", "distinct_cache_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    for name in ("interval", "change_interval", "max_run_seconds", "profile_interval",
                 "gate_timeout", "rss_timeout", "rocksdb_max_run_seconds", "hot_interval"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not 0 < args.change <= 1:
        p.error("--change must be in (0, 1]")
    if not 0 < args.hot_fraction <= 1:
        p.error("--hot-fraction must be in (0, 1]")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rss_child is not None:
        return rss_child(args)
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
    if wanted & {"sum", "rocksdb-throughput"} or args.profile:
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

    rocks: RocksResults | None = None
    if wanted & set(ROCKSDB_SCENARIOS):
        rocks = RocksResults()
    if rocks is not None and "rocksdb-throughput" in wanted:
        note(f"generating the word count's {args.words:,} words ...")
        specs = [wordcount_spec(args), sum_spec(records, expected)]
        gc.collect()
        gc.freeze()
        note(f"RocksDB vs memory throughput: {args.rocksdb_repeat} round(s) of word count "
             "and running sum ...")
        rocks.throughput, errs, n = rocksdb_throughput_scenario(specs, args, verbose)
        errors += errs
        total_runs += n
    if rocks is not None and "distinct-keys" in wanted:
        note(f"RocksDB vs memory on {args.distinct_keys:,} distinct keys: "
             f"{args.rocksdb_repeat} round(s) ...")
        spec = distinct_spec(args)
        gc.collect()
        gc.freeze()
        distinct, errs, n = rocksdb_throughput_scenario([spec], args, verbose)
        rocks.throughput.update(distinct)
        errors += errs
        total_runs += n

    change: ChangeOutcome | None = None
    restore: RestoreTimes | None = None
    if wanted & {"change", "restore", "rocksdb-change", "rocksdb-restore"}:
        note(f"1% change: {args.change_keys:,} keys, {args.rounds} rounds ...")
        data = make_change_records(make_keys(args.change_keys), args.rounds, args.change,
                                   args.seed)
        change_expected = expect(data.records)
        gc.collect()
        gc.freeze()
        if wanted & {"change", "restore"}:
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
                        restore, errs = restore_scenario(
                            memory_restore_cases(outcome.restore_from), data, change_expected,
                            args, verbose)
                        errors += errs
                        total_runs += sum(len(v) for v in restore.seconds.values())
            finally:
                remove_chk_dir(outcome.folder)
        if rocks is not None and wanted & {"rocksdb-change", "rocksdb-restore"}:
            note(f"RocksDB 1% change: {args.change_keys:,} keys, {args.rounds} rounds ...")
            folders: list[str] = []
            try:
                try:
                    outcome, errs = change_scenario(data, change_expected, args, "rocksdb")
                except Exception as exc:
                    errors.append(crashed("rocksdb 1% change", exc))
                else:
                    folders.append(outcome.folder)
                    errors += errs
                    total_runs += 1
                    rocks.change = outcome if "rocksdb-change" in wanted else None
                    if "rocksdb-restore" in wanted and outcome.restore_from is None:
                        errors.append("rocksdb restore: the change job left no checkpoint")
                    elif "rocksdb-restore" in wanted:
                        assert outcome.restore_from is not None
                        note("RocksDB: the same input loaded at p=2, for a restore at p=3 ...")
                        from_p2, folder, p2_state, errs = checkpoint_at(
                            data, change_expected, args, 2, "rocksdb")
                        folders.append(folder)
                        errors += errs
                        total_runs += 1
                        if from_p2 is None:
                            errors.append("rocksdb restore: the load at p=2 left no final "
                                          "checkpoint")
                        note("RocksDB restores ...")
                        refs = {outcome.restore_from: outcome.final_state}
                        if from_p2 is not None:
                            refs[from_p2] = p2_state
                        rocks.restore, errs = restore_scenario(
                            rocksdb_restore_cases(outcome.restore_from, from_p2), data,
                            change_expected, args, verbose, backend="rocksdb",
                            references=refs)
                        errors += errs
                        total_runs += sum(len(v) for v in rocks.restore.seconds.values())
            finally:
                for folder in folders:
                    remove_chk_dir(folder)

    if rocks is not None and "rss" in wanted:
        note(f"peak RSS: {args.rss_keys:,} keys, {args.rss_repeat} round(s) of a memory and a "
             "RocksDB child ...")
        rocks.rss, errs, n = rss_scenario(args, verbose)
        errors += errs
        total_runs += n

    hot = None
    if "hot-keys" in wanted:
        from state_hotkeys import hot_scenario  # benchmarks/: the script's folder

        note(f"hot keys: {args.hot_state_keys:,} keys, {args.hot_updates:,} updates, "
             f"{args.hot_repeat} run(s) per backend ...")
        hot, errs, n = hot_scenario(args, verbose)
        errors += errs
        total_runs += n

    profile = ""
    if args.profile:
        note("profiling one ABS run of the running sum ...")
        profile, errs = profile_abs(records, expected, args)
        errors += errs
        total_runs += 1
    goals = evaluate(summary, change)
    if rocks is not None:
        goals += evaluate_rocks(rocks, args)
    if hot is not None:
        from state_hotkeys import evaluate_hot

        goals += evaluate_hot(hot)
    print(render(args, summary, change, restore, goals, errors, total_runs, rocks, hot))
    if args.json:
        write_json(args.json, args, summary, change, restore, goals, errors, rocks, hot)
        print(f"wrote {args.json}")
    if profile:
        print("\nprofile of one ABS run of the running sum (pyinstrument; sampling overhead "
              "slows it down):")
        print(profile)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
