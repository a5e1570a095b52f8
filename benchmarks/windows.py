"""Event-time windows benchmark (issue 14): eddyflow's window operator against a
keyed count without windows, against Bytewax, and with checkpoints.

The input is a click stream, ``(user, timestamp, 1)`` tuples: users drawn
uniformly from ``--users`` (10,000) names, timestamps (float seconds since the
epoch, from 2023-11-14) advancing ``--rate`` (1,000) events per second of
event time, each event up to ``--disorder`` (5 s) behind its place in the
stream (uniformly). It is generated once, before anything is timed, and the
same list is read by every contender through a source that only slices it
(``ef.Source`` for eddyflow, a ``DynamicSource`` for Bytewax), so generating
or scanning the input is not what is measured. Every job runs at parallelism
1 (Bytewax: one worker, ``run_main``), reads batches of ``--batch-size`` (1024)
records, and ends in an equivalent sink that counts what it receives and
keeps the window results for checking.

Measured, in events per second of wall-clock time (building and running the
job), over ``--events`` events (default 10,000,000):

* the baseline: ``key_by(user).count()``, a running count per user with no
  windows and no timestamps;
* eddyflow tumbling event-time windows of ``--size`` (60 s) counting each
  user's events: ``assign_timestamps_and_watermarks(bounded_out_of_orderness(
  disorder))`` -> ``key_by(user)`` -> ``window(TumblingEventTimeWindows)`` ->
  ``count()``; session windows (``EventTimeSessionWindows``) with a gap of
  ``--gap`` (30 s) likewise;
* the tumbling job with checkpoints every ``--interval`` (1 s) into a
  temporary folder (``exactly_once``, the memory backend): windows are open
  at every checkpoint, and their contents and timers are checkpointed. (The
  memory backend snapshots in a ``fork()``ed child; the fork's cost grows with
  the process, and this process holds the whole input, about 1 GB at 10M
  events, plus the expected results: the RSS is printed with the results.)

Session windows, which eddyflow processes at a few tens of thousands of
events a second, run over the first ``--session-events`` events (default
2,000,000; the whole input would take several minutes per run), beside
baseline runs over the same prefix.

And, over the first ``--bytewax-events`` events of the same input (default
500,000; Bytewax processes some tens of thousands of events a second, so the
whole input would take it minutes per run), Bytewax 0.21's
``count_window`` with an ``EventClock`` and a ``TumblingWindower`` (same
size, aligned to the epoch like eddyflow's windows) or a ``SessionWindower``
(same gap), each beside eddyflow's job on the same prefix. Throughput is per
event and the state of both jobs is bounded by the users' open windows, so
the rate over a prefix is the steady-state rate.

Equivalent semantics. Both engines get the same allowed disorder: eddyflow's
watermark is the largest timestamp seen minus ``disorder``; Bytewax's
``EventClock(wait_for_system_duration=disorder)`` is the same, *plus the
system time elapsed since that largest timestamp*, and by default it wakes
the window operator up at the system time each window closes. Replaying
timestamps from the past, that makes Bytewax about ten times slower (every
window's close time has passed, so the operator is woken constantly) and its
results depend on its speed (the watermark runs ahead by the wall-clock time
of the run, so on-time records can be late). The benchmark therefore gives
Bytewax's clock a fixed "now" and no wake-ups (``now_getter`` returns one
instant, ``to_system_utc`` returns ``None``): its watermark is then exactly
eddyflow's, windows close as events arrive or at the end of input, and this
is the faster of the two configurations. Bytewax takes aware ``datetime``
timestamps: its copy of the prefix carries them, converted before timing.

No record is ever late: an event is less than ``disorder`` behind every
event before it. So every window fires exactly once
with all its events, whatever the watermark's timing, and the results are
deterministic. Timestamps are whole microseconds on a grid of a prime that
does not divide the gap, so no two events of a user are exactly one gap
apart (where float and integer arithmetic might disagree about merging).

Every run's output is checked against an independent plain-Python
computation of the windows: the baseline's final count per user (and records
out); each eddyflow window ``(user, start, end, count)``; Bytewax's tumbling
windows ``(user, start, count)`` and its sessions' ``(user, count)``
multiset. Equal results across engines follow.

Ratios are paired: a baseline run sits before and after each eddyflow window
run (each window run is compared with the mean of its two neighbours), the
checkpointed run follows its plain twin, and each Bytewax run sits next to
eddyflow's run of the same job on the same prefix; the median over rounds is
reported (with ``--repeat 1``, the one round's ratio). Goal (issue 14):
eddyflow's windows at least 4x Bytewax's throughput. The exit code is 0
whatever the timings (this is a report), and 1 when any run's output is
wrong.

    python benchmarks/windows.py                     # 10M events (7-10 min)
    python benchmarks/windows.py --quick             # 300k events, a smoke run
    python benchmarks/windows.py --events 2000000 --repeat 3
    python benchmarks/windows.py --profile session   # also profile one eddyflow run
    python benchmarks/windows.py --json benchmarks/results/windows.json --plot /tmp/windows.png
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib.metadata
import itertools
import json
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import eddyflow as ef

try:
    import bytewax.operators as bw_op
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import DynamicSource, StatelessSourcePartition
    from bytewax.operators import windowing as bw_win
    from bytewax.outputs import DynamicSink, StatelessSinkPartition
    from bytewax.testing import run_main
except ImportError:  # the benchmark still runs, without the Bytewax rows
    HAVE_BYTEWAX = False
else:
    HAVE_BYTEWAX = True

Event = tuple[str, float, int]

GOAL_VS_BYTEWAX = 4.0
DEFAULT_EVENTS = 10_000_000
QUICK_EVENTS = 300_000
DEFAULT_SESSION_EVENTS = 2_000_000
DEFAULT_BYTEWAX_EVENTS = 300_000
#: Event time of the first event: 2023-11-14T22:13:20Z, in microseconds.
T0_US = 1_700_000_000_000_000
CHUNK = 100_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
COUNT_UID = "count"


# -- data ------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    users: int
    rate: int  # events per second of event time
    disorder: float  # seconds
    size: float  # tumbling window, seconds
    gap: float  # session gap, seconds
    seed: int

    @property
    def disorder_us(self) -> int:
        return round(self.disorder * 1_000_000)

    @property
    def gap_us(self) -> int:
        return round(self.gap * 1_000_000)

    @property
    def step_us(self) -> int:
        return 1_000_000 // self.rate


def grid_step(gap_us: int) -> int:
    """The smallest prime that does not divide ``gap_us``: timestamps on this
    grid of microseconds are never exactly one gap apart."""
    p = 2
    while gap_us % p == 0 or any(p % d == 0 for d in range(2, p)):
        p += 1
    return p


def make_events(n: int, shape: Shape) -> list[Event]:
    """``n`` click events, in chunks: event ``i`` belongs at ``T0 + i * step``
    and lags there by a uniform ``[0, disorder)``, snapped down to the grid.
    Since the grid is finer than the step, an event is less than
    ``disorder`` behind every event before it: none is ever late."""
    rng = random.Random(shape.seed)
    names = [f"user-{i:05d}" for i in range(shape.users)]
    step, lag, grid = shape.step_us, shape.disorder_us, grid_step(shape.gap_us)
    if grid >= step:
        raise SystemExit(f"--rate {shape.rate} is too high: events would be closer than "
                         f"the {grid} us timestamp grid")
    rand = rng.random
    events: list[Event] = []
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        who = rng.choices(names, k=hi - lo)
        due = range(T0_US + lo * step, T0_US + hi * step, step)
        at = [t - int(rand() * lag) for t in due]
        events.extend([(u, (t - t % grid) / 1_000_000, 1) for u, t in zip(who, at, strict=True)])
    return events


def to_bytewax(events: list[Event]) -> list[tuple[str, datetime, int]]:
    """The same events with aware UTC datetimes, Bytewax's timestamps (exact:
    the floats hold whole microseconds)."""
    return [(u, EPOCH + timedelta(microseconds=round(t * 1_000_000)), n) for u, t, n in events]


# -- the expected results, computed without either engine ---------------------------


@dataclass(frozen=True)
class Expected:
    events: int
    per_user: dict[str, int]
    #: (user, start, end, count) per window; each window fires once.
    tumbling: collections.Counter[tuple[str, float, float, int]]
    sessions: collections.Counter[tuple[str, float, float, int]]

    def windows(self, kind: str) -> int:
        return sum((self.tumbling if kind == "tumbling" else self.sessions).values())


def expected_results(events: list[Event], shape: Shape) -> Expected:
    """The windows of ``events`` by plain Python (counting at C speed where it can)."""
    users = [e[0] for e in events]
    stamps = [e[1] for e in events]
    d = shape.disorder
    newest = itertools.accumulate(stamps, max)  # before event i + 1: the first i + 1's
    later = itertools.islice(stamps, 1, None)
    if any(t <= m - d for t, m in zip(later, newest, strict=False)):
        raise AssertionError("the generator made an event that can be late")
    size, size_us = shape.size, round(shape.size * 1_000_000)
    index = [round(t * 1_000_000) // size_us for t in stamps]
    in_window = collections.Counter(zip(users, index, strict=True))
    tumbling = collections.Counter(
        (u, k * size, (k + 1) * size, c) for (u, k), c in in_window.items())
    times: dict[str, list[float]] = collections.defaultdict(list)
    for u, t in zip(users, stamps, strict=True):
        times[u].append(t)
    sessions: collections.Counter[tuple[str, float, float, int]] = collections.Counter()
    gap = shape.gap
    for u, ts in times.items():
        ts.sort()
        first = last = ts[0]
        count = 0
        for t in ts:
            if t > last + gap:  # [t, t + gap) does not meet [first, last + gap)
                sessions[(u, first, last + gap, count)] += 1
                first, count = t, 0
            last = t
            count += 1
        sessions[(u, first, last + gap, count)] += 1
    return Expected(len(events), dict(collections.Counter(users)), tumbling, sessions)


# -- eddyflow ------------------------------------------------------------------------


class EventSource(ef.Source):
    """The pre-built events, read in slices; the position is an index."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events

    @property
    def name(self) -> str:
        return "clicks"

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        n = len(self.events)
        return _EventReader(self.events, n * subtask // parallelism,
                            n * (subtask + 1) // parallelism)


class _EventReader(ef.SourceReader):
    def __init__(self, events: list[Event], start: int, end: int) -> None:
        self.events = events
        self.start = start
        self.end = end
        self.pos = start

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.pos >= self.end:
            return None
        stop = min(self.pos + max_records, self.end)
        batch = self.events[self.pos:stop]
        self.pos = stop
        return batch

    def position(self) -> int:
        return self.pos

    def seek(self, position: Any) -> None:
        if not isinstance(position, int) or not self.start <= position <= self.end:
            raise ValueError(f"position {position!r} outside [{self.start}, {self.end}]")
        self.pos = position


class TallySink(ef.Sink):
    """Exactly-once like every eddyflow sink (a transaction per checkpoint,
    committed when it completes): counts the committed records, and keeps
    them if ``keep`` (the window results, a fraction of the input; the
    baseline's one record per event is checked through its final state)."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.committed = 0
        self.records: list[Any] = []
        self._staged: dict[tuple[int, int], tuple[int, list[Any]]] = {}
        self._next_txn = 0

    @property
    def name(self) -> str:
        return "tally"

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        return _TallyWriter(self, subtask)

    def stage(self, subtask: int, n: int, records: list[Any]) -> list[int]:
        txn = self._next_txn
        self._next_txn += 1
        self._staged[(subtask, txn)] = (n, records)
        return [subtask, txn]

    def commit(self, committables: list[Any]) -> None:
        for subtask, txn in committables:
            staged = self._staged.pop((subtask, txn), None)
            if staged is None:
                continue  # committed already
            self.committed += staged[0]
            self.records.extend(staged[1])

    def recover(self, committed: list[Any]) -> None:
        self.commit(committed)
        self._staged.clear()


class _TallyWriter(ef.SinkWriter):
    def __init__(self, sink: TallySink, subtask: int) -> None:
        self._sink = sink
        self._subtask = subtask
        self._n = 0
        self._records: list[Any] = []

    def write(self, records: list[Any]) -> None:
        self._n += len(records)
        if self._sink.keep:
            self._records.extend(records)

    def prepare_commit(self, checkpoint_id: int) -> Any:
        if not self._n:
            return None
        staged = self._sink.stage(self._subtask, self._n, self._records)
        self._n, self._records = 0, []
        return staged

    def abort(self) -> None:
        self._n, self._records = 0, []


def user(event: Any) -> str:
    return event[0]  # type: ignore[no-any-return]


def event_time(event: Any) -> Any:
    return event[1]


@dataclass
class Output:
    """What a run produced, for checking."""

    committed: int
    records: list[Any]
    final_counts: dict[str, int] | None = None  # the baseline's final keyed state
    checkpoints: int | None = None


Runner = Callable[[], Output]


def eddyflow_job(events: list[Event], kind: str, shape: Shape, batch_size: int,
                 interval: float | None = None, chk_root: str | None = None) -> Output:
    env = ef.StreamEnvironment(parallelism=1, batch_size=batch_size)
    folder = None
    if interval is not None:
        folder = tempfile.mkdtemp(prefix="eddyflow-windows-", dir=chk_root)
        env.enable_checkpointing(interval=interval, directory=folder)
    sink = TallySink(keep=kind != "count")
    stream = env.from_source(EventSource(events))
    if kind == "count":
        stream.key_by(user).count().name(COUNT_UID).sink_to(sink)
    else:
        strategy = ef.WatermarkStrategy.bounded_out_of_orderness(shape.disorder, event_time)
        assigner = (ef.TumblingEventTimeWindows(size=shape.size) if kind == "tumbling"
                    else ef.EventTimeSessionWindows(gap=shape.gap))
        (stream.assign_timestamps_and_watermarks(strategy)
         .key_by(user).window(assigner).count().name("windows")
         .sink_to(sink))
    try:
        result = env.execute(f"windows-{kind}")
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    final = dict(result.state(COUNT_UID)) if kind == "count" else None
    return Output(sink.committed, sink.records, final,
                  len(result.completed_checkpoints) if interval is not None else None)


# -- Bytewax -------------------------------------------------------------------------


if HAVE_BYTEWAX:

    class _BwSlices(StatelessSourcePartition[Any]):
        def __init__(self, events: list[Any], batch_size: int) -> None:
            self.events = events
            self.batch_size = batch_size
            self.pos = 0

        def next_batch(self) -> list[Any]:
            if self.pos >= len(self.events):
                raise StopIteration
            stop = self.pos + self.batch_size
            batch = self.events[self.pos:stop]
            self.pos = stop
            return batch

    class BwEventSource(DynamicSource[Any]):
        """The pre-built events in slices of ``batch_size``, one worker."""

        def __init__(self, events: list[Any], batch_size: int) -> None:
            self.events = events
            self.batch_size = batch_size

        def build(self, step_id: str, worker_index: int, worker_count: int) -> _BwSlices:
            n = len(self.events)
            mine = self.events[n * worker_index // worker_count:
                               n * (worker_index + 1) // worker_count]
            return _BwSlices(mine, self.batch_size)

    class _BwTallyPart(StatelessSinkPartition[Any]):
        def __init__(self, sink: BwTallySink) -> None:
            self.sink = sink

        def write_batch(self, items: list[Any]) -> None:
            self.sink.committed += len(items)
            self.sink.records.extend(items)

    class BwTallySink(DynamicSink[Any]):
        """Counts and keeps the window results, as ``TallySink``."""

        def __init__(self) -> None:
            self.committed = 0
            self.records: list[Any] = []

        def build(self, step_id: str, worker_index: int, worker_count: int) -> _BwTallyPart:
            return _BwTallyPart(self)


def no_wakeup(_close_time: datetime) -> datetime | None:
    """``EventClock.to_system_utc``: never wake the operator on system time."""
    return None


def bytewax_job(events: list[Any], kind: str, shape: Shape, batch_size: int) -> Output:
    frozen = datetime.now(UTC)

    def now() -> datetime:  # the watermark is max timestamp - disorder, as eddyflow's
        return frozen

    flow = Dataflow(f"windows_{kind}")
    inp = bw_op.input("clicks", flow, BwEventSource(events, batch_size))
    clock = bw_win.EventClock(event_time, wait_for_system_duration=timedelta(
        microseconds=shape.disorder_us), now_getter=now, to_system_utc=no_wakeup)
    windower: Any = (
        bw_win.TumblingWindower(length=timedelta(seconds=shape.size), align_to=EPOCH)
        if kind == "tumbling" else bw_win.SessionWindower(gap=timedelta(seconds=shape.gap)))
    out = bw_win.count_window("windows", inp, clock, windower, user)
    sink = BwTallySink()
    bw_op.output("out", out.down, sink)  # (user, (window id, count))
    run_main(flow)  # type: ignore[no-untyped-call]
    return Output(sink.committed, sink.records)


# -- checking ------------------------------------------------------------------------


class Mismatch(Exception):
    """A run's output is not what the input makes."""


def diff(got: collections.Counter[Any], want: collections.Counter[Any]) -> str:
    missing, extra = want - got, got - want
    return (f"{sum(missing.values())} missing (e.g. {sorted(missing)[:2]}), "
            f"{sum(extra.values())} extra (e.g. {sorted(extra)[:2]})")


def check(case: Case, out: Output, expected: Expected, shape: Shape) -> None:
    if case.kind == "count":
        if out.committed != expected.events:
            raise Mismatch(f"{out.committed:,} records out, expected {expected.events:,}")
        if out.final_counts != expected.per_user:
            raise Mismatch("final counts per user differ from the input's")
        return
    want = expected.tumbling if case.kind == "tumbling" else expected.sessions
    if out.committed != len(out.records):
        raise Mismatch(f"{out.committed} records counted, {len(out.records)} kept")
    if case.engine == "eddyflow":
        got = collections.Counter(tuple(r) for r in out.records)
    elif case.kind == "tumbling":  # window ids count from align_to, the epoch
        size = shape.size
        got = collections.Counter((u, w * size, (w + 1) * size, c) for u, (w, c) in out.records)
    else:  # Bytewax's session results carry ids, not bounds: compare (user, count)
        got = collections.Counter((u, c) for u, (_w, c) in out.records)
        per_user: collections.Counter[Any] = collections.Counter()
        for (u, _s, _e, c), m in want.items():
            per_user[(u, c)] += m
        want = per_user
    if got != want:
        raise Mismatch(f"{case.kind} windows differ from the reference: {diff(got, want)}")


# -- the cases and their runs ----------------------------------------------------------


@dataclass
class Run:
    seconds: float
    cpu_seconds: float
    windows: int
    checkpoints: int | None
    #: The time of the run this one is paired with (``Case.against``): the mean
    #: of the baseline runs just before and after, or the twin's or rival's;
    #: wall-clock and process CPU seconds.
    reference: float | None = None
    reference_cpu: float | None = None


@dataclass
class Case:
    key: str
    label: str
    engine: str  # eddyflow | bytewax
    kind: str  # count | tumbling | session
    events: int
    run: Runner
    expected: Expected
    #: The case this one's paired ratio is taken against: the baseline run
    #: before and after it, the twin just before it, or the run beside it.
    against: str | None = None
    runs: list[Run] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(r.seconds for r in self.runs)

    def rate(self) -> float:
        return self.events / self.median()

    def spread(self) -> float:
        s = [r.seconds for r in self.runs]
        return (max(s) - min(s)) / 2 / statistics.median(s)

    def cpu_share(self) -> float:
        """Process CPU time over wall-clock time (median): below 1, the run
        waited, for the CPU (other load on the machine) or for I/O."""
        return statistics.median(r.cpu_seconds / r.seconds for r in self.runs)

    def paired(self) -> float | None:
        """Median over rounds of this case's throughput relative to ``against``'s."""
        pairs = [r.reference / r.seconds for r in self.runs if r.reference]
        return statistics.median(pairs) if pairs else None

    def paired_cpu(self) -> float | None:
        """The same by process CPU time (blind to waiting for the CPU or I/O)."""
        pairs = [r.reference_cpu / r.cpu_seconds for r in self.runs if r.reference_cpu]
        return statistics.median(pairs) if pairs else None


def make_cases(events: list[Event], shape: Shape, expected: dict[int, Expected],
               args: argparse.Namespace) -> dict[str, Case]:
    n, s, m, b = len(events), args.session_events, args.bytewax_events, args.batch_size
    tum, ses = f"tumbling {shape.size:g} s", f"sessions, gap {shape.gap:g} s"
    sessions, prefix = events[:s], events[:m]

    def eddyflow(data: list[Event], kind: str, interval: float | None = None) -> Runner:
        return lambda: eddyflow_job(data, kind, shape, b, interval, args.chk_dir)

    cases = [
        Case("count", "eddyflow keyed count, no windows (baseline)", "eddyflow", "count", n,
             eddyflow(events, "count"), expected[n]),
        Case("tumbling", f"eddyflow {tum}", "eddyflow", "tumbling", n,
             eddyflow(events, "tumbling"), expected[n], "count"),
        Case("tumbling_chk", f"eddyflow {tum}, checkpoints every {args.interval:g} s",
             "eddyflow", "tumbling", n, eddyflow(events, "tumbling", args.interval), expected[n],
             "tumbling"),
    ]
    if s != n:
        cases.append(Case("count_s", "eddyflow keyed count (baseline of the sessions)",
                          "eddyflow", "count", s, eddyflow(sessions, "count"), expected[s]))
    cases.append(Case("session", f"eddyflow {ses}", "eddyflow", "session", s,
                      eddyflow(sessions, "session"), expected[s],
                      "count_s" if s != n else "count"))
    if HAVE_BYTEWAX and not args.no_bytewax:
        version = importlib.metadata.version("bytewax")
        bw_prefix = to_bytewax(prefix)

        def bytewax(kind: str) -> Runner:
            return lambda: bytewax_job(bw_prefix, kind, shape, b)

        cases += [
            Case("tumbling_p", f"eddyflow {tum}", "eddyflow", "tumbling", m,
                 eddyflow(prefix, "tumbling"), expected[m], "bw_tumbling"),
            Case("bw_tumbling", f"Bytewax {version} {tum}", "bytewax", "tumbling", m,
                 bytewax("tumbling"), expected[m]),
            Case("session_p", f"eddyflow {ses}", "eddyflow", "session", m,
                 eddyflow(prefix, "session"), expected[m], "bw_session"),
            Case("bw_session", f"Bytewax {version} {ses}", "bytewax", "session", m,
                 bytewax("session"), expected[m]),
        ]
    return {c.key: c for c in cases}


def schedule(cases: dict[str, Case], r: int, args: argparse.Namespace) -> list[str]:
    """Round ``r``: (in the first ``--repeat`` rounds) a baseline run before
    and after each window run over the same events, the checkpointed run
    right after its twin; then (in the first ``--bytewax-repeat`` rounds) each
    eddyflow/Bytewax pair, which of the two goes first alternating."""
    order = []
    if r < args.repeat:
        order = ["count", "tumbling", "tumbling_chk", "count"]
        base = cases["session"].against
        order += ["session", "count"] if base == "count" else ["count_s", "session", "count_s"]
    if r < args.bytewax_repeat:
        for ours, theirs in (("tumbling_p", "bw_tumbling"), ("session_p", "bw_session")):
            if theirs in cases:
                order += [ours, theirs] if r % 2 == 0 else [theirs, ours]
    return order


def pair_up(cases: dict[str, Case], sequence: list[tuple[str, Run]]) -> None:
    """Set each run's reference time from its neighbours in one round's sequence."""
    for i, (key, run) in enumerate(sequence):
        against = cases[key].against
        if against is None:
            continue
        if cases[against].kind == "count":  # the baseline runs just before and after
            near = [r for k, r in reversed(sequence[:i]) if k == against][:1]
            near += [r for k, r in sequence[i + 1:] if k == against][:1]
        else:  # the twin or the competitor beside it
            near = [r for k, r in sequence if k == against][:1]
        run.reference = statistics.mean(r.seconds for r in near) if near else None
        run.reference_cpu = statistics.mean(r.cpu_seconds for r in near) if near else None


def timed(run: Runner) -> tuple[Output, float, float]:
    gc.collect()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    out = run()
    t1 = time.perf_counter()
    cpu1 = time.process_time()
    return out, t1 - t0, cpu1 - cpu0


def warm_up(events: list[Event], shape: Shape, args: argparse.Namespace) -> None:
    """Imports, first calls and Bytewax's runtime, on a slice; untimed."""
    some = events[:20_000]
    for kind in ("count", "tumbling", "session"):
        eddyflow_job(some, kind, shape, args.batch_size)
    eddyflow_job(some, "tumbling", shape, args.batch_size, args.interval, args.chk_dir)
    if HAVE_BYTEWAX and not args.no_bytewax:
        for kind in ("tumbling", "session"):
            bytewax_job(to_bytewax(some), kind, shape, args.batch_size)


def benchmark(cases: dict[str, Case], shape: Shape, args: argparse.Namespace) -> list[str]:
    """Runs the rounds; returns the mismatches found (empty when all is well)."""
    errors: list[str] = []
    verbose = not args.quiet
    repeat = max(args.repeat, args.bytewax_repeat if "bw_tumbling" in cases else 0)
    for r in range(repeat):
        sequence: list[tuple[str, Run]] = []
        for key in schedule(cases, r, args):
            case = cases[key]
            if verbose:
                print(f"  round {r + 1}/{repeat}: {case.label} over {case.events:,} events ...",
                      file=sys.stderr, end="", flush=True)
            out, seconds, cpu = timed(case.run)
            try:
                check(case, out, case.expected, shape)
            except Mismatch as exc:
                errors.append(f"{case.label} ({case.events:,} events), round {r + 1}: {exc}")
            run = Run(seconds, cpu, len(out.records), out.checkpoints)
            del out
            case.runs.append(run)
            sequence.append((key, run))
            if verbose:
                extra = "" if run.checkpoints is None else f", {run.checkpoints} checkpoints"
                print(f" {seconds:.1f} s, {case.events / seconds:,.0f} events/s{extra}",
                      file=sys.stderr, flush=True)
        pair_up(cases, sequence)
    return errors


# -- reporting -------------------------------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    key: str  # the case
    label: str
    short: str  # for the plot
    value: float | None  # paired (median of per-round ratios)
    of_medians: float | None  # ratio of the median throughputs
    cpu: float | None  # paired, by process CPU time
    target: float | None = None

    @property
    def status(self) -> str:
        if self.target is None:
            return ""
        if self.value is None:
            return "SKIP"
        return "PASS" if self.value >= self.target else "FAIL"


#: The ratios reported, in order: (case, what it is measured against, goal, short name).
RATIOS = (
    ("tumbling", "vs keyed count", None, "tumbling / keyed count"),
    ("session", "vs keyed count", None, "sessions / keyed count"),
    ("tumbling_chk", "vs no checkpoints", None, "tumbling, checkpoints / none"),
    ("tumbling_p", "vs Bytewax", GOAL_VS_BYTEWAX, "tumbling: eddyflow / Bytewax"),
    ("session_p", "vs Bytewax", GOAL_VS_BYTEWAX, "sessions: eddyflow / Bytewax"),
)


def ratios(cases: dict[str, Case]) -> list[Ratio]:
    out = []
    for key, what, target, short in RATIOS:
        c = cases.get(key)
        if c is None or c.against is None:
            continue
        other = cases[c.against]
        out.append(Ratio(key, f"{c.label} ({c.events:,} events) {what}",
                         f"{short}\n({c.events:,} events)", c.paired(),
                         c.rate() / other.rate(), c.paired_cpu(), target))
    return out


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}x"


def rss_mb() -> float:
    """This process's resident memory, in MB (Linux; the peak elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def environment_line() -> str:
    bw = importlib.metadata.version("bytewax") if HAVE_BYTEWAX else "not installed"
    return (f"Python {platform.python_version()} ({platform.python_implementation()}), "
            f"eddyflow {ef.__version__}, bytewax {bw}, {os.cpu_count()} CPUs, "
            f"{platform.system()} {platform.machine()}, load average "
            + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


SHORT = {"count": "baseline", "count_s": "baseline", "tumbling": "no checkpoints",
         "bw_tumbling": "Bytewax", "bw_session": "Bytewax"}


def render(console: Console, cases: dict[str, Case], shape: Shape, args: argparse.Namespace,
           errors: list[str]) -> None:
    n = cases["count"].events

    def say(text: str, markup: bool = True) -> None:
        console.print(text, highlight=False, soft_wrap=True, markup=markup)

    console.print("[bold]eddyflow event-time windows: throughput against a keyed count, "
                  "against Bytewax, with checkpoints[/bold]")
    say(f"data:  {n:,} click events (user, timestamp, 1), {shape.users:,} users, "
        f"{shape.rate:,} events/s of event time ({n / shape.rate / 3600:.1f} h), "
        f"disorder up to {shape.disorder:g} s, seed {shape.seed}")
    say(f"jobs:  parallelism 1, batch size {args.batch_size}; watermark = max timestamp - "
        f"{shape.disorder:g} s in both engines (no record is late); "
        f"{args.repeat} round(s), gc.collect() before each run")
    if cases["session"].events != n:
        say(f"       sessions over the first {cases['session'].events:,} events, with their "
            "own baseline runs (throughput is per event)")
    if "bw_tumbling" in cases:
        say(f"       eddyflow vs Bytewax over the first {cases['bw_tumbling'].events:,} "
            f"events, the same prefix for both, {args.bytewax_repeat} round(s) of pairs")
    say(f"env:   {environment_line()}")
    say(f"       process RSS {args.rss_mb:,.0f} MB when the runs began (the input, its Bytewax "
        "copy and the expected results)")

    table = Table(title="throughput: events per second of wall-clock time, median of the "
                        "runs; ratio: median over rounds of the paired runs' ratio",
                  title_justify="left")
    for name, justify in (("case", "left"), ("events", "right"), ("events/s", "right"),
                          ("spread", "right"), ("cpu/wall", "right"), ("ratio", "right"),
                          ("against", "left"), ("windows", "right"), ("checkpoints", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for c in cases.values():
        chk = [r.checkpoints for r in c.runs if r.checkpoints is not None]
        against = SHORT[c.against] if c.against else ""
        table.add_row(
            c.label, f"{c.events:,}", f"{c.rate():,.0f}", f"±{c.spread():.0%}",
            f"{c.cpu_share():.2f}", fmt(c.paired()), against,
            f"{c.runs[-1].windows:,}" if c.kind != "count" else "-",
            f"{statistics.median(chk):g}" if chk else "-")
    console.print(table)

    goals = Table(title="ratios (paired: median over rounds of the paired runs' ratio; of "
                        "medians: ratio of the median throughputs; by CPU time: paired, by "
                        "process CPU seconds)", title_justify="left")
    for name, justify in (("measure", "left"), ("paired", "right"), ("of medians", "right"),
                          ("by CPU time", "right"), ("goal", "right"), ("", "left")):
        goals.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in ratios(cases):
        style = {"PASS": "green", "FAIL": "red"}.get(r.status, "")
        goals.add_row(r.label, fmt(r.value), fmt(r.of_medians), fmt(r.cpu),
                      f">= {r.target:g}x" if r.target else "",
                      f"[{style}]{r.status}[/{style}]" if style else r.status)
    console.print(goals)

    if errors:
        console.print(f"[red]RESULTS MISMATCH ({len(errors)}):[/red]")
        for e in errors:
            say(f"  {e}", markup=False)
    else:
        total = sum(len(c.runs) for c in cases.values())
        seen = {c.expected.events: c.expected for c in cases.values()}
        say(f"results: OK, all {total} runs equal the plain-Python reference:")
        for x in sorted(seen.values(), key=lambda x: -x.events):
            say(f"         {x.events:,} events: {x.windows('tumbling'):,} tumbling windows, "
                f"{x.windows('session'):,} sessions")
    console.print("\nfor the README:\n")
    say(markdown(cases), markup=False)


def markdown(cases: dict[str, Case]) -> str:
    by = {r.key: r for r in ratios(cases)}
    what = {key: w for key, w, _t, _s in RATIOS}
    lines = ["| case | events | events/s | ratio |", "|---|---:|---:|---|"]
    for c in cases.values():
        r = by.get(c.key)
        if c.kind == "count":
            cell = "baseline"
        elif r is None:
            cell = ""
        else:
            cell = f"**{fmt(r.value)}** {what[c.key]}"
            if r.target is not None:
                cell += f" (goal >= {r.target:g}x: {r.status.lower()})"
        lines.append(f"| {c.label} | {c.events:,} | {c.rate():,.0f} | {cell} |")
    return "\n".join(lines)


def plot(path: Path, cases: dict[str, Case]) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install -e '.[bench]')"
    rs = [r for r in ratios(cases) if r.value is not None]
    values = [r.value or 0.0 for r in rs]
    fig, ax = plt.subplots(figsize=(9, 5), dpi=120)
    ys = list(range(len(rs)))[::-1]
    colors = ["tab:green" if r.status == "PASS" else "tab:red" if r.status == "FAIL"
              else "tab:blue" for r in rs]
    ax.barh(ys, values, color=colors)
    for y, r in zip(ys, rs, strict=True):
        ax.annotate(f"{r.value:.2f}x", (r.value or 0.0, y), textcoords="offset points",
                    xytext=(4, -4), fontsize=9)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.axvline(GOAL_VS_BYTEWAX, color="tab:green", linestyle=":", linewidth=1.5,
               label=f"goal vs Bytewax: {GOAL_VS_BYTEWAX:g}x")
    ax.set_yticks(ys)
    ax.set_yticklabels([r.short for r in rs], fontsize=9)
    ax.set_xscale("log")
    ax.set_xlim(min(*values, 1.0) / 2, max(*values, GOAL_VS_BYTEWAX) * 3)
    ax.set_xlabel("throughput ratio (log scale)")
    ax.set_title("eddyflow event-time windows, parallelism 1: throughput ratios\n"
                 "(median over rounds of paired runs in one invocation)", fontsize=10)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return f"wrote {path}"


def write_json(path: Path, cases: dict[str, Case], shape: Shape, args: argparse.Namespace,
               errors: list[str]) -> None:
    report: dict[str, Any] = {
        "benchmark": "event-time windows: count per user per window vs key_by.count vs Bytewax",
        "environment": {
            "python": platform.python_version(), "eddyflow": ef.__version__,
            "bytewax": importlib.metadata.version("bytewax") if HAVE_BYTEWAX else None,
            "cpus": os.cpu_count(), "platform": platform.platform(),
        },
        "data": {"users": shape.users, "rate": shape.rate, "disorder": shape.disorder,
                 "size": shape.size, "gap": shape.gap, "seed": shape.seed},
        "repeat": args.repeat, "bytewax_repeat": args.bytewax_repeat,
        "batch_size": args.batch_size, "interval": args.interval,
        "rss_mb": args.rss_mb,
        "cases": {c.key: {
            "label": c.label, "engine": c.engine, "kind": c.kind, "events": c.events,
            "seconds": [r.seconds for r in c.runs],
            "cpu_seconds": [r.cpu_seconds for r in c.runs],
            "events_per_second": c.rate(), "paired_ratio": c.paired(),
            "windows": c.runs[-1].windows if c.runs else None,
            "checkpoints": [r.checkpoints for r in c.runs],
        } for c in cases.values()},
        "ratios": [{"measure": r.label, "paired": r.value, "of_medians": r.of_medians,
                    "paired_cpu": r.cpu,
                    "target": r.target, "status": r.status or None}
                   for r in ratios(cases)],
        "mismatches": errors,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def profile_eddyflow(events: list[Event], kind: str, shape: Shape, batch_size: int) -> str:
    """One eddyflow run under pyinstrument (cProfile if it is not installed)."""
    gc.collect()
    try:
        from pyinstrument import Profiler
    except ImportError:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.runcall(eddyflow_job, events, kind, shape, batch_size)
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        return "pyinstrument is not installed; cProfile, top 25 by own time:\n" + buf.getvalue()
    profiler = Profiler(interval=0.001, async_mode="disabled")
    profiler.start()
    eddyflow_job(events, kind, shape, batch_size)
    profiler.stop()
    return profiler.output_text(unicode=True, color=False, show_all=True,
                                processor_options={"filter_threshold": 0.01})


# -- main --------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Event-time windows: eddyflow vs a keyed count, vs Bytewax, "
                    "with checkpoints.")
    p.add_argument("--events", type=int, default=None,
                   help=f"events (default {DEFAULT_EVENTS:,}; {QUICK_EVENTS:,} with --quick)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS:,} events, a smoke run")
    p.add_argument("--session-events", type=int, default=DEFAULT_SESSION_EVENTS,
                   help="the prefix the session windows and their baseline run over "
                        f"(default {DEFAULT_SESSION_EVENTS:,}; at most --events)")
    p.add_argument("--bytewax-events", type=int, default=DEFAULT_BYTEWAX_EVENTS,
                   help="the prefix eddyflow and Bytewax are compared on "
                        f"(default {DEFAULT_BYTEWAX_EVENTS:,}; at most --events)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of the runs over --events and --session-events; medians are "
                        "reported (default 1)")
    p.add_argument("--bytewax-repeat", type=int, default=3,
                   help="rounds of the eddyflow/Bytewax pairs (default 3)")
    p.add_argument("--users", type=int, default=10_000, help="distinct users (default 10,000)")
    p.add_argument("--rate", type=int, default=1_000,
                   help="events per second of event time (default 1,000)")
    p.add_argument("--disorder", type=float, default=5.0,
                   help="how far (s) an event may lag; the watermark's allowed delay (default 5)")
    p.add_argument("--size", type=float, default=60.0,
                   help="tumbling window size, seconds (default 60)")
    p.add_argument("--gap", type=float, default=30.0, help="session gap, seconds (default 30)")
    p.add_argument("--interval", type=float, default=1.0,
                   help="checkpoint interval of the checkpointed run, seconds (default 1)")
    p.add_argument("--chk-dir", default=None, metavar="DIR",
                   help="where the checkpoint folders go (default: the temporary folder)")
    p.add_argument("--batch-size", type=int, default=1024,
                   help="eddyflow batch_size and Bytewax source batch size (default 1024)")
    p.add_argument("--seed", type=int, default=14, help="data seed (default 14)")
    p.add_argument("--no-bytewax", action="store_true", help="skip the Bytewax comparison")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    p.add_argument("--plot", type=Path, metavar="PATH", help="draw the ratios into this PNG")
    p.add_argument("--profile", choices=("tumbling", "session"),
                   help="after the benchmark, profile one eddyflow run of this job over the "
                        "prefix (pyinstrument)")
    p.add_argument("--quiet", action="store_true", help="no per-run progress on stderr")
    args = p.parse_args(argv)
    if args.events is None:
        args.events = QUICK_EVENTS if args.quick else DEFAULT_EVENTS
    args.session_events = min(args.session_events, args.events)
    args.bytewax_events = min(args.bytewax_events, args.events)
    for name in ("events", "session_events", "bytewax_events", "repeat", "bytewax_repeat",
                 "users", "rate", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("disorder", "size", "gap", "interval"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be > 0")
    if args.rate > 100_000:
        p.error("--rate must be <= 100,000 (timestamps are whole microseconds)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    verbose = not args.quiet
    shape = Shape(args.users, args.rate, args.disorder, args.size, args.gap, args.seed)
    if not HAVE_BYTEWAX and not args.no_bytewax:
        print("bytewax is not installed: skipping it (pip install -e '.[bench]')",
              file=sys.stderr)
    if verbose:
        print(f"generating {args.events:,} events and their expected windows ...",
              file=sys.stderr, flush=True)
    events = make_events(args.events, shape)
    sizes = {args.events, args.session_events}
    if HAVE_BYTEWAX and not args.no_bytewax:
        sizes.add(args.bytewax_events)
    expected = {n: expected_results(events[:n], shape) for n in sorted(sizes)}
    cases = make_cases(events, shape, expected, args)
    # The input, its Bytewax copy and the expected results live through every
    # run: keep the collector from re-scanning them, so no run pays for the
    # harness's heap.
    gc.collect()
    gc.freeze()
    if verbose:
        print("warming up ...", file=sys.stderr, flush=True)
    warm_up(events, shape, args)
    args.rss_mb = rss_mb()
    errors = benchmark(cases, shape, args)
    console = Console(width=max(Console().width, 132))
    render(console, cases, shape, args, errors)
    if args.plot:
        console.print("\n" + plot(args.plot, cases), highlight=False)
    if args.json:
        write_json(args.json, cases, shape, args, errors)
        console.print(f"wrote {args.json}", highlight=False)
    if args.profile:
        prefix = events[:args.bytewax_events]
        console.print(f"\nprofile of one eddyflow {args.profile} run over {len(prefix):,} events "
                      "(pyinstrument; its per-call overhead inflates Python-level calls):",
                      highlight=False)
        console.print(profile_eddyflow(prefix, args.profile, shape, args.batch_size),
                      highlight=False, markup=False, soft_wrap=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
