"""Scenario ``hot-keys`` of ``benchmarks/state.py``: checkpoints of a state
whose writes go to a few hot keys.

Most real key distributions are skewed: a small set of keys takes most of
the writes. ``--hot-state-keys`` keys (300,000) are loaded (each once, in a
seeded random order), then ``--hot-updates`` records (5,000,000) update
``--hot-fraction`` of them (1%: 3,000 hot keys, drawn uniformly, seeded)::

    from_collection(records).set_parallelism(1)
      -> key_by(record[0]) -> sum(record[1])    # 'sum', parallelism 2
      -> ProgressSink

with ABS checkpoints every ``--hot-interval`` seconds (0.1), on both
backends (RocksDB configured as the other rows). Between two checkpoints the
hot phase writes each hot key many times: a checkpoint should cost what
changed (the hot keys), not what was written, nor the whole state, and
checkpoints should keep completing at the interval.

Reported per backend (median over ``--hot-repeat`` runs, backends
alternating): throughput; the median ``checkpointed_size / full_size`` of
the periodic checkpoints of the hot phase (those whose previous checkpoint's
source position is past the load, read from their metadata); periodic
checkpoints completed and aborted (from the coordinator's log: a checkpoint
still in flight when the input ends is subsumed by the final one, counted
apart); the longest gap between two checkpoint completions (the final one
included); checkpoint duration p50/max; the keyed task's synchronous phase
p99; and the sink's longest pause. Every run is verified like the others
(committed records and running sums, the final state key by key).

Goals (issue 26): median checkpointed/full <= 0.05 on both backends; no
periodic checkpoint aborted; the longest gap between two completions <= 2 s.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from state import (
    BACKENDS,
    OPERATOR,
    Expected,
    Goal,
    ProgressSink,
    Record,
    crashed,
    drop_local,
    execute,
    expect,
    keyed_sync_durations,
    make_keys,
    ms,
    new_chk_dir,
    percentile,
    record_key,
    record_value,
    remove_chk_dir,
    use_backend,
    verdict,
    verify,
)

import eddyflow as ef

#: Goals of the issue.
MAX_RATIO = 0.05
MAX_GAP = 2.0  # seconds between two checkpoint completions
PARALLELISM = 2
_ABORTED = re.compile(r"checkpoint (\d+) aborted: (.*)")
_SUBSUMED = "subsumed by the final checkpoint"


@dataclass(frozen=True)
class HotData:
    records: list[Record]
    load: int  # records of the load (each key once)
    hot: int  # how many hot keys


def make_hot_records(keys: int, updates: int, fraction: float, seed: int) -> HotData:
    """Every key once (value 1..9, seeded order), then ``updates`` records of
    keys drawn uniformly from a seeded sample of ``fraction`` of them."""
    names = make_keys(keys)
    rng = random.Random(seed + 2)
    order = list(names)
    rng.shuffle(order)
    hot = rng.sample(names, max(1, round(keys * fraction)))
    drawn = order + rng.choices(hot, k=updates)
    return HotData([(k, i % 9 + 1) for i, k in enumerate(drawn)], len(order), len(hot))


class _AbortLog(logging.Handler):
    """The coordinator's 'checkpoint N aborted: reason' lines of one run."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.aborted: dict[int, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        m = _ABORTED.match(record.getMessage())
        if m:
            self.aborted[int(m.group(1))] = m.group(2)


@dataclass
class HotRun:
    backend: str
    seconds: float
    written: int
    cut: bool
    ratios: list[float]  # checkpointed/full of the hot phase's periodic checkpoints
    periodic: int  # periodic checkpoints completed
    aborted: dict[int, str]  # id -> reason, not counting those the final one subsumed
    subsumed: int
    longest_gap: float | None  # between two completions
    durations: list[float]
    #: The keyed tasks' synchronous phases in the hot phase's checkpoints,
    #: and the records each of those checkpoints covers.
    syncs: list[float]
    covered: list[int]
    pause: float
    #: The longest periodic checkpoint, where its time went (see ``_anatomy``).
    slowest: str = ""
    #: Periodic checkpoints after the load that wrote at least half the state.
    full: int = 0

    @property
    def rate(self) -> float:
        return self.written / self.seconds

    @property
    def median_ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None


def _position(info: ef.CheckpointInfo) -> int:
    for op in info.operators.values():
        if op.get("kind") == "source":
            return sum(int(s.get("source", 0)) for s in op["subtasks"].values())
    return 0


def _anatomy(info: ef.CheckpointInfo, load: int) -> str:
    """Checkpoint ``info``: its duration, whether it was triggered during the
    load, and the task whose part took longest (alignment/sync/async)."""
    phase = "load" if _position(info) < load else "hot phase"
    worst = ""
    longest = -1.0
    for task, st in info.metadata.get("tasks", {}).items():
        parts = (float(st["alignment_duration"]), float(st["sync_duration"]),
                 float(st["async_duration"]))
        if sum(parts) > longest:
            longest = sum(parts)
            worst = (f"{task}: align {ms(parts[0])} / sync {ms(parts[1])} / async "
                     f"{ms(parts[2])} ms")
    return f"checkpoint {info.id} ({phase}) {ms(info.duration)} ms; {worst}"


def run_hot(backend: str, data: HotData, expected: Expected, args: argparse.Namespace,
            label: str) -> tuple[HotRun | None, list[str]]:
    """One verified run of the hot-key job on ``backend`` (None: it crashed)."""
    env = ef.StreamEnvironment(parallelism=PARALLELISM)
    folder = new_chk_dir(args)
    local = use_backend(env, backend, args)
    env.enable_checkpointing(interval=args.hot_interval, directory=folder, retained=1_000_000)
    sink = ProgressSink()
    aborts = _AbortLog()
    log = logging.getLogger("eddyflow.checkpoint.listing")
    log.addHandler(aborts)

    def build(e: ef.StreamEnvironment) -> None:
        (e.from_collection(data.records).set_parallelism(1)
         .key_by(record_key).sum(record_value).name(OPERATOR)
         .sink_to(sink))

    try:
        ex = execute(env, build, f"state hot keys {backend}", timeout=args.max_run_seconds)
        infos = ef.list_checkpoints(folder)
        errors = verify(label, sink, ex.result, data.records, expected)
        seconds, cut = ex.seconds, ex.result is None
        del ex  # its final state reads the RocksDB folder, removed next
    except Exception as exc:
        return None, [crashed(label, exc)]
    finally:
        log.removeHandler(aborts)
        remove_chk_dir(folder)
        drop_local(local)
    periodic = [c for c in infos if not c.final]
    hot_phase = [(before, c) for before, c in itertools.pairwise(periodic)
                 if _position(before) >= data.load]
    ratios = [c.checkpointed_size / c.full_size for _, c in hot_phase if c.full_size]
    done = sorted(c.completed_at for c in infos)
    gaps = [b - a for a, b in itertools.pairwise(done)]
    subsumed = sum(reason == _SUBSUMED for reason in aborts.aborted.values())
    pause, _ = sink.pauses()
    slowest = max(periodic, key=lambda c: c.duration, default=None)
    run = HotRun(backend, seconds, sink.records_written(), cut, ratios,
                 len(periodic),
                 {n: r for n, r in aborts.aborted.items() if r != _SUBSUMED}, subsumed,
                 max(gaps, default=None), [c.duration for c in periodic],
                 keyed_sync_durations([c for _, c in hot_phase]),
                 [_position(c) - _position(before) for before, c in hot_phase], pause,
                 "" if slowest is None else _anatomy(slowest, data.load),
                 sum(r > 0.5 for r in ratios))
    return run, errors


@dataclass
class HotResults:
    data_keys: int = 0
    hot_keys: int = 0
    updates: int = 0
    runs: dict[str, list[HotRun]] = field(default_factory=lambda: {b: [] for b in BACKENDS})


def hot_scenario(args: argparse.Namespace, verbose: bool
                 ) -> tuple[HotResults, list[str], int]:
    data = make_hot_records(args.hot_state_keys, args.hot_updates, args.hot_fraction,
                            args.seed)
    expected = expect(data.records)
    results = HotResults(args.hot_state_keys, data.hot, args.hot_updates)
    errors: list[str] = []
    n = 0
    for rnd in range(args.hot_repeat):
        order = BACKENDS if rnd % 2 == 0 else tuple(reversed(BACKENDS))
        for backend in order:
            label = f"hot keys {backend} {rnd + 1}"
            t0 = time.perf_counter()
            run, errs = run_hot(backend, data, expected, args, label)
            errors += errs
            n += 1
            if run is None:
                continue
            results.runs[backend].append(run)
            if verbose:
                print(f"  {label}: {run.rate:,.0f} rec/s, ratio "
                      f"{_fmt(run.median_ratio)}, gap {_fmt(run.longest_gap)} s, "
                      f"aborted {len(run.aborted)} ({time.perf_counter() - t0:.1f} s)",
                      flush=True)
    return results, errors, n


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def render_hot(number: str, results: HotResults, args: argparse.Namespace) -> list[str]:
    lines = [
        f"{number} hot keys: {results.data_keys:,} keys loaded, then {results.updates:,} "
        f"updates to {results.hot_keys:,} hot keys ({args.hot_fraction:.0%}), parallelism "
        f"{PARALLELISM}, checkpoints every {args.hot_interval:g} s, {args.hot_repeat} run(s) "
        "per backend (alternating)",
        "",
    ]
    header = (f"   {'backend':<8} {'records/s':>10} {'chk/full':>9} {'full':>5} {'periodic':>9} "
              f"{'aborted':>8} {'subsumed':>9} {'max gap s':>10} {'dur p50 ms':>11} "
              f"{'dur max ms':>11} {'sync p99/max ms':>16} {'rec/chk max':>12} "
              f"{'pause ms':>9} {'cut':>4}")
    lines += [header, "   " + "-" * (len(header) - 3)]
    for backend, runs in results.runs.items():
        if not runs:
            continue
        durations = [d for r in runs for d in r.durations]
        syncs = [x for r in runs for x in r.syncs]
        lines.append(
            f"   {backend:<8} {statistics.median(r.rate for r in runs):>10,.0f} "
            f"{_fmt(_median([r.median_ratio for r in runs])):>9} "
            f"{sum(r.full for r in runs):>5} "
            f"{statistics.median(r.periodic for r in runs):>9g} "
            f"{sum(len(r.aborted) for r in runs):>8} {sum(r.subsumed for r in runs):>9} "
            f"{_fmt(max((r.longest_gap or 0.0) for r in runs)):>10} "
            f"{ms(percentile(durations, 50)):>11} {ms(max(durations, default=None)):>11} "
            f"{ms(percentile(syncs, 99)) + ' / ' + ms(max(syncs, default=None)):>16} "
            f"{max((n for r in runs for n in r.covered), default=0):>12,} "
            f"{ms(statistics.median(r.pause for r in runs)):>9} "
            f"{sum(r.cut for r in runs):>2}/{len(runs)}")
        for r in runs:
            lines.append(f"      slowest: {r.slowest}")
            for n, reason in sorted(r.aborted.items()):
                lines.append(f"      aborted: checkpoint {n}: {reason}")
    lines += [
        "",
        "   chk/full: median checkpointed/full of the periodic checkpoints after the load",
        "   (median over runs); full: those of them that wrote at least half of the state",
        "   (all runs); aborted: periodic checkpoints aborted (all runs), not counting",
        "   those in flight at the end of the input (subsumed by the final one); max gap: the",
        "   longest time between two checkpoint completions (worst run); sync: the keyed",
        "   tasks' synchronous phase in the hot phase's checkpoints, each covering at most",
        "   'rec/chk max' records (source positions); slowest: the longest periodic checkpoint",
        "",
    ]
    return lines


def evaluate_hot(results: HotResults) -> list[Goal]:
    goals: list[Goal] = []
    for backend, runs in results.runs.items():
        if not runs:
            continue
        ratio = _median([r.median_ratio for r in runs])
        label = f"hot keys, {backend}: median checkpointed/full <= {MAX_RATIO:g}"
        if ratio is None:
            goals.append(Goal(label, "OPEN", "no periodic checkpoint after the load"))
        else:
            goals.append(Goal(label, verdict(ratio <= MAX_RATIO), f"{ratio:.4f}"))
        aborted = sum(len(r.aborted) for r in runs)
        goals.append(Goal(f"hot keys, {backend}: no periodic checkpoint aborted",
                          verdict(aborted == 0), f"{aborted} aborted in {len(runs)} run(s)"))
        gaps = [r.longest_gap for r in runs]
        worst = max((g for g in gaps if g is not None), default=None)
        label = f"hot keys, {backend}: longest gap between completions <= {MAX_GAP:g} s"
        if worst is None:
            goals.append(Goal(label, "OPEN", "fewer than two checkpoints completed"))
        else:
            goals.append(Goal(label, verdict(worst <= MAX_GAP), f"{worst:.3f} s (worst run)"))
    return goals


def hot_json(results: HotResults | None) -> dict[str, Any] | None:
    if results is None:
        return None
    return {"keys": results.data_keys, "hot_keys": results.hot_keys,
            "updates": results.updates,
            "runs": {b: [{**vars(r), "aborted": {str(k): v for k, v in r.aborted.items()}}
                         for r in rs] for b, rs in results.runs.items()}}
