"""Nexmark q0-q8 on eddyflow, each checked against a plain-Python reference.

The events come from a seeded Nexmark generator (``nexmark_suite/
generator.py``, after Beam's and Flink's: persons, auctions and bids in the
proportions 1:3:46, Nexmark's ids, prices and categories, event time at
``--rate`` events per second of event time with bounded disorder), generated
once before anything is timed. Each query (``nexmark_suite/queries.py``)
runs as one eddyflow job at ``--parallelism`` (default 1): the events read
from a replayable collection source, timestamps and watermarks assigned
(the generator's disorder bound as ``max_delay``), the query, and a
``ListSink``, with exactly-once checkpoints every ``--interval`` seconds
into a temporary folder (the memory backend).

Measured per query, over ``--events`` events (default 500,000; the median
of ``--repeat`` runs by wall time): wall-clock seconds of the job (building
and running it), events per second of wall time, and events per CPU-second
of this process (the "per core" figure that Nexmark reports; the memory
backend's forked snapshot children are not counted, and since this process
holds the whole input, each fork costs more than it would in a job reading
from a log). For the stateless queries (q0-q2) a plain-Python loop doing the
same work over the same list runs beside, the floor a framework pays on
top of. Every run's output is compared with its reference
(``nexmark_suite/reference.py``) as a multiset of rows; the exit code is
1 if any differs (or any query failed), else 0 whatever the timings.

    python benchmarks/nexmark.py                  # q0-q8, 500k events
    python benchmarks/nexmark.py --quick          # 50k events, a smoke run
    python benchmarks/nexmark.py --queries q5,q7 --events 1000000 --repeat 3
    python benchmarks/nexmark.py --json benchmarks/results/nexmark.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nexmark_suite import queries, reference
from nexmark_suite.generator import GeneratorConfig, generate
from nexmark_suite.model import Bid, Event

import eddyflow as ef

DEFAULT_EVENTS = 500_000
QUICK_EVENTS = 50_000

#: Flink 1.13's published Nexmark figures (github.com/nexmark/nexmark, README,
#: "Benchmark Results"): throughput per core, K events/s, 100M events, 3
#: workers of 8 cores, parallelism 8, RocksDB with incremental checkpoints
#: every 3 minutes. Context only: another machine, another run. q6 is not
#: run there (FLINK-19059).
FLINK_PER_CORE_K = {"q0": 155.02, "q1": 157.94, "q2": 175.21, "q3": 152.12, "q4": 34.33,
                    "q5": 22.14, "q7": 12.33, "q8": 146.14}


# -- the plain loops beside the stateless queries --------------------------------


def plain_q0(events: list[Event]) -> list[Any]:
    out: list[Any] = []
    append = out.append
    for e in events:
        if type(e) is Bid:
            append(e)
    return out


def plain_q1(events: list[Event]) -> list[Any]:
    out: list[Any] = []
    append = out.append
    for e in events:
        if type(e) is Bid:
            append((e.auction, e.bidder, e.price * 908 / 1000, e.date_time, e.extra))
    return out


def plain_q2(events: list[Event]) -> list[Any]:
    out: list[Any] = []
    append = out.append
    for e in events:
        if type(e) is Bid and e.auction % 123 == 0:
            append((e.auction, e.price))
    return out


PLAIN: dict[str, Callable[[list[Event]], list[Any]]] = {
    "q0": plain_q0, "q1": plain_q1, "q2": plain_q2}


# -- runs --------------------------------------------------------------------------


@dataclass
class Run:
    """One timed run and its check."""

    seconds: float
    cpu_seconds: float
    rows: int
    checkpoints: int = 0
    error: str | None = None


@dataclass
class Row:
    """What the table shows for one query."""

    query: str
    events: int
    run: Run
    plain: Run | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.events / self.run.seconds

    @property
    def cpu_rate(self) -> float:
        return self.events / self.run.cpu_seconds


def median(runs: list[Run]) -> Run:
    """The median run by wall time (with its own CPU time and checkpoints);
    the first error of any run."""
    ordered = sorted(runs, key=lambda r: r.seconds)
    mid = ordered[(len(ordered) - 1) // 2]
    error = next((r.error for r in runs if r.error), None)
    return Run(mid.seconds, mid.cpu_seconds, mid.rows, mid.checkpoints, error)


def check(name: str, got: list[Any], want: Counter[tuple[Any, ...]]) -> str | None:
    """None if ``got`` is the reference's multiset of rows, else what differs."""
    have = Counter(tuple(r) for r in got)
    if have == want:
        return None
    lost, extra = want - have, have - want
    return (f"{name}: {sum(lost.values())} rows missing (e.g. {list(lost)[:2]}), "
            f"{sum(extra.values())} unexpected (e.g. {list(extra)[:2]})")


def run_eddyflow(name: str, events: list[Event], config: GeneratorConfig,
                 args: argparse.Namespace, want: Counter[tuple[Any, ...]]) -> Run:
    with tempfile.TemporaryDirectory(prefix=f"nexmark-{name}-", dir=args.chk_dir) as tmp:
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        env = ef.StreamEnvironment(parallelism=args.parallelism, batch_size=args.batch_size)
        env.enable_checkpointing(interval=args.interval, directory=os.path.join(tmp, "chk"))
        sink = ef.ListSink()
        queries.QUERIES[name](queries.source(env, events, config)).sink_to(sink).name("sink")
        result = env.execute(f"nexmark-{name}")
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Run(seconds, cpu, len(sink.results), len(result.completed_checkpoints),
               check(name, sink.results, want))


def run_plain(name: str, events: list[Event], want: Counter[tuple[Any, ...]]) -> Run:
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    out = PLAIN[name](events)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Run(seconds, cpu, len(out), 0, check(f"{name} (plain loop)", out, want))


# -- report ------------------------------------------------------------------------


def table(rows: list[Row], args: argparse.Namespace) -> str:
    head = ("| query | events | s | events/s | events/CPU-s | plain loop events/s "
            "| eddyflow / plain | rows | checkpoints | Flink 1.13 per core (context) | check |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        plain = f"{r.events / r.plain.seconds:,.0f}" if r.plain else ""
        ratio = f"{r.plain.seconds / r.run.seconds:.2f}x" if r.plain else ""
        flink = f"{FLINK_PER_CORE_K[r.query] * 1000:,.0f}" if r.query in FLINK_PER_CORE_K else "-"
        errors = [e for e in (r.run.error, r.plain.error if r.plain else None) if e]
        ok = "MISMATCH" if errors else "= reference"
        lines.append(f"| {r.query} | {r.events:,} | {r.run.seconds:.2f} | {r.rate:,.0f} "
                     f"| {r.cpu_rate:,.0f} | {plain} | {ratio} | {r.run.rows:,} "
                     f"| {r.run.checkpoints} | {flink} | {ok} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Nexmark q0-q8 on eddyflow, checked against "
                                            "plain-Python references.")
    p.add_argument("--events", type=int, default=None,
                   help=f"events (default {DEFAULT_EVENTS:,}; {QUICK_EVENTS:,} with --quick)")
    p.add_argument("--quick", action="store_true", help="a smoke run")
    p.add_argument("--queries", default=",".join(queries.QUERIES),
                   help=f"comma-separated, of {', '.join(queries.QUERIES)} (default: all)")
    p.add_argument("--rate", type=int, default=10_000,
                   help="events per second of event time (default 10,000, Nexmark's)")
    p.add_argument("--disorder-group", type=int, default=1000,
                   help="out-of-order group size: events come shuffled in groups of this "
                        "many (default 1000; 1 = in order)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per query; the median by wall time is reported (default 1)")
    p.add_argument("--seed", type=int, default=42, help="generator seed (default 42)")
    p.add_argument("--parallelism", type=int, default=1, help="job parallelism (default 1)")
    p.add_argument("--batch-size", type=int, default=1024, help="eddyflow batch size")
    p.add_argument("--interval", type=float, default=1.0,
                   help="checkpoint interval, seconds (default 1)")
    p.add_argument("--chk-dir", default=None, metavar="DIR",
                   help="where the checkpoint folders go (default: the temporary folder)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.events is None:
        args.events = QUICK_EVENTS if args.quick else DEFAULT_EVENTS
    args.queries = [q.strip() for q in args.queries.split(",") if q.strip()]
    unknown = [q for q in args.queries if q not in queries.QUERIES]
    if unknown:
        p.error(f"--queries: unknown {', '.join(unknown)}; known: {', '.join(queries.QUERIES)}")
    for name in ("events", "repeat", "rate", "disorder_group", "parallelism", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.interval <= 0:
        p.error("--interval must be > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the queries (see the module docstring); 1 if an output differs from its reference."""
    frozen = gc.get_freeze_count()
    try:
        return _main(argv)
    finally:
        # The input was frozen out of the collector for the runs; a caller
        # that runs this in-process (the tests) gets its collector back.
        if frozen == 0:
            gc.unfreeze()


def _main(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    try:
        config = GeneratorConfig(events=args.events, seed=args.seed,
                                 first_event_rate=args.rate,
                                 out_of_order_group_size=args.disorder_group)
    except ValueError as e:
        print(f"nexmark.py: {e}", file=sys.stderr)
        return 2
    print(f"generating {args.events:,} events (seed {args.seed}, {args.rate:,}/s of event "
          f"time, disorder <= {config.max_disorder():g} s) ...", file=sys.stderr, flush=True)
    events = generate(config)
    gc.collect()
    gc.freeze()  # the input lives through every run: keep the collector off it
    rows: list[Row] = []
    for name in args.queries:
        want = reference.REFERENCES[name](events)
        print(f"{name} ...", file=sys.stderr, flush=True)
        runs: list[Run] = []
        plains: list[Run] = []
        for _ in range(args.repeat):  # interleaved: the loop beside each run
            try:
                runs.append(run_eddyflow(name, events, config, args, want))
            except ef.EddyflowError as e:
                runs.append(Run(float("nan"), float("nan"), 0, 0,
                                f"{name}: the job failed: {e}"))
            if name in PLAIN:
                plains.append(run_plain(name, events, want))
        rows.append(Row(name, args.events, median(runs), median(plains) if plains else None))
    print(f"\nNexmark on eddyflow {ef.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, parallelism {args.parallelism}, checkpoints every "
          f"{args.interval:g} s; Flink's column: its published per-core throughput "
          "(github.com/nexmark/nexmark README, Flink 1.13, 3x8 cores, 100M events), "
          "context only, not a same-run ratio\n")
    print(table(rows, args))
    errors = [e for r in rows for e in (r.run.error, r.plain.error if r.plain else None) if e]
    if errors:
        print(f"\nRESULTS MISMATCH ({len(errors)}):")
        for error in errors:
            print(f"  {error}")
    else:
        print(f"\nresults: OK, every query's output equals its plain-Python reference "
              f"({len(rows)} queries)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "environment": {"python": platform.python_version(), "eddyflow": ef.__version__,
                            "cpus": os.cpu_count(), "platform": platform.platform()},
            "config": {"events": args.events, "rate": args.rate, "seed": args.seed,
                       "disorder_group": args.disorder_group,
                       "parallelism": args.parallelism, "interval": args.interval,
                       "repeat": args.repeat},
            "queries": {r.query: {
                "seconds": r.run.seconds, "cpu_seconds": r.run.cpu_seconds,
                "events_per_second": r.rate, "events_per_cpu_second": r.cpu_rate,
                "rows": r.run.rows, "checkpoints": r.run.checkpoints,
                "plain_seconds": r.plain.seconds if r.plain else None,
                "flink_1_13_per_core": (FLINK_PER_CORE_K[r.query] * 1000
                                        if r.query in FLINK_PER_CORE_K else None),
                "error": r.run.error or (r.plain.error if r.plain else None),
            } for r in rows},
        }, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
