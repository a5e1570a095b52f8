"""Iteration benchmark: a cyclic job with and without checkpoints.

The job runs Collatz sequences round a loop (examples/collatz.py's shape, at
parallelism 2, with keyed feedback and a keyed count after the loop):

    numbers -> iterate -> step -> [not 1: key_by(start) back to the head]
                               -> [reached 1: key_by(start % 1000) -> count -> ListSink]

It is measured in loop steps per second (records through ``step``) without
checkpoints and with asynchronous barrier snapshots (``exactly_once``) every
1 s and every 0.1 s; median of interleaved repetitions, every run's result
verified against the no-checkpoint run. It also reports the checkpoints'
back-edge logs: how many records were in flight round the loop when each
checkpoint was taken (their channel state) and their size on disk.

Goal: ABS at 1 s >= 0.9x the throughput without checkpoints.

    python benchmarks/iterations.py            # 100,000 numbers (~10.8M steps), 3 rounds
    python benchmarks/iterations.py --quick    # 8,000 numbers, 2 rounds
    python benchmarks/iterations.py --quick --workers 2   # over 2 worker processes

With ``--workers N`` the subtasks run in N worker processes: the keyed
feedback then crosses between them, and the loop ends when the caller has
found it empty in every worker (runtime/workers/termination.py). It also
prints how long a loop of ten numbers takes end to end (start-up, the loop,
its end, shutdown: best of three), which shows that the end of a loop is not
waited for.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import eddyflow as ef

PARALLELISM = 2
GOAL_AT_1S = 0.9


def step(record: tuple[int, int]) -> tuple[int, int]:
    start, n = record
    return start, (n // 2 if n % 2 == 0 else 3 * n + 1)


def build(env: ef.StreamEnvironment, numbers: int, sink: ef.ListSink) -> None:
    loop = env.from_collection(range(1, numbers + 1)).map(lambda n: (n, n)).iterate()
    stepped = loop.map(step).name("step")
    loop.close_with(stepped.filter(lambda r: r[1] != 1).key_by(lambda r: r[0]))
    (
        stepped.filter(lambda r: r[1] == 1)
        .key_by(lambda r: r[0] % 1000).count().name("finished")
        .sink_to(sink)
    )


@dataclass
class Run:
    seconds: float
    steps: int
    final: dict[Any, Any]
    checkpoints: list[ef.CheckpointInfo] = field(default_factory=list)


def run_once(numbers: int, interval: float | None, workers: int = 1) -> Run:
    env = ef.StreamEnvironment(parallelism=PARALLELISM, workers=workers)
    folder = tempfile.mkdtemp(prefix="eddyflow-iterations-")
    try:
        if interval is not None:
            env.enable_checkpointing(interval=interval, directory=folder, retained=1_000_000)
        sink = ef.ListSink()
        build(env, numbers, sink)
        gc.collect()
        t0 = time.perf_counter()
        result = env.execute("iterations")
        seconds = time.perf_counter() - t0
        done = [c for c in ef.list_checkpoints(folder) if not c.final] if interval else []
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Run(seconds, result.records_in["step"], result.state("finished"), done)


def backedge_log(info: ef.CheckpointInfo) -> tuple[int, int]:
    """Records and bytes of a checkpoint's back-edge logs."""
    records = size = 0
    for op in info.operators.values():
        for part in op["subtasks"].values():
            log = part.get("backedge")
            if log:
                records += int(log["records"])
                size += int(log["file"]["size"])
    return records, size


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--numbers", type=int, default=None, help="numbers to run (default 100,000)")
    p.add_argument("--repeat", type=int, default=None, help="interleaved rounds (default 3)")
    p.add_argument("--quick", action="store_true", help="8,000 numbers, 2 rounds")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--json", default=None, help="write results to this file")
    args = p.parse_args(argv)
    workers = args.workers
    numbers = args.numbers or (8_000 if args.quick else 100_000)
    repeat = args.repeat or (2 if args.quick else 3)
    cases: dict[str, float | None] = {"none": None, "ABS 1 s": 1.0, "ABS 0.1 s": 0.1}
    runs: dict[str, list[Run]] = {k: [] for k in cases}
    run_once(min(numbers, 2000), None, workers)  # warm-up
    print(f"iterations: Collatz loop over 1..{numbers:,}, parallelism {PARALLELISM}, "
          f"{workers} worker process{'es' if workers > 1 else ''}, "
          f"{repeat} interleaved rounds", flush=True)
    tiny = min(run_once(10, None, workers).seconds for _ in range(3))
    print(f"  a loop of 10 numbers end to end: {tiny * 1000:.0f} ms", flush=True)
    mismatches = []
    for r in range(repeat):
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for name in order:
            run = run_once(numbers, cases[name], workers)
            runs[name].append(run)
            ref = runs["none"][0] if runs["none"] else None
            if ref is not None and (run.final != ref.final or run.steps != ref.steps):
                mismatches.append(f"{name} round {r + 1}: result differs from no checkpoints")
            print(f"  round {r + 1}: {name:<10} {run.seconds:6.2f} s, "
                  f"{len(run.checkpoints)} checkpoints", flush=True)
    base = statistics.median(x.steps / x.seconds for x in runs["none"])
    print()
    print(f"{'case':<10} {'steps/s':>12} {'vs none':>8} {'chk/run':>8} {'dur p50':>8} "
          f"{'log recs p50':>13} {'log recs max':>13} {'log bytes max':>14}")
    report: dict[str, Any] = {"numbers": numbers, "repeat": repeat, "workers": workers,
                              "ten_numbers_seconds": tiny, "cases": {}}
    for name, rs in runs.items():
        rate = statistics.median(x.steps / x.seconds for x in rs)
        chks = [c for x in rs for c in x.checkpoints]
        logs = [backedge_log(c) for c in chks]
        durs = [c.duration for c in chks]
        row = {
            "steps_per_second": rate, "vs_none": rate / base,
            "checkpoints_per_run": len(chks) / len(rs),
            "duration_p50": statistics.median(durs) if durs else None,
            "log_records_p50": statistics.median(r for r, _ in logs) if logs else None,
            "log_records_max": max((r for r, _ in logs), default=None),
            "log_bytes_max": max((b for _, b in logs), default=None),
        }
        report["cases"][name] = row

        def fmt(v: Any, spec: str) -> str:
            return "-" if v is None else format(v, spec)

        print(f"{name:<10} {rate:>12,.0f} {rate / base:>7.3f}x {row['checkpoints_per_run']:>8.1f} "
              f"{fmt(row['duration_p50'] and row['duration_p50'] * 1000, '>6.0f')}ms "
              f"{fmt(row['log_records_p50'], '>13,.0f')} {fmt(row['log_records_max'], '>13,')} "
              f"{fmt(row['log_bytes_max'], '>14,')}")
    at_1s = report["cases"]["ABS 1 s"]["vs_none"]
    status = "PASS" if at_1s >= GOAL_AT_1S else "FAIL"
    print(f"\ngoal: {status}  ABS at 1 s >= {GOAL_AT_1S}x of no checkpoints "
          f"(measured {at_1s:.3f}x)")
    print("results: " + ("OK, every run equals the no-checkpoint run" if not mismatches
                         else "MISMATCH: " + "; ".join(mismatches)))
    report["goal"] = {"status": status, "measured": at_1s}
    report["mismatches"] = mismatches
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
