"""Checkpoints under back-pressure: aligned against unaligned.

The job, back-pressured from its first second by a slow operator before the
sink::

    numbers 0..N-1 (``--parallelism`` source subtasks, a slice each)
      -> key_by(i % keys) -> running count            # 'count', same parallelism
      -> flat_map: each result ``--fanout`` times      # 'fan-out'
      -> busy map, ``--cost`` µs per record            # 'slow', parallelism 1
      -> exactly-once sink keeping counts only (overhead.py's GroupTotalsSink)

Tasks share one event loop and take turns, a batch a turn, however big the
batch: 'slow' falls behind only if more batches reach it per turn than the
one it takes, so there are several producers (and the fan-out makes their
batches costly). Every channel in front of 'slow' is then full all the time, so an aligned barrier
waits behind every record queued there (channel capacity x batch size per
channel) before 'slow' can snapshot, while an unaligned barrier overtakes
them and they become channel state.

Batches are small (64 records) and channels long (64 batches), as in a job
tuned for latency: a task's turn on the event loop is one batch, and every
step of a snapshot's asynchronous write waits for a turn, so the batch's
cost bounds how fast any checkpoint can complete.

Runs, interleaved round by round (a run without checkpoints, then aligned
``exactly_once`` and ``unaligned``, their order alternating), at one
checkpoint interval. Reported: checkpoint duration (trigger to completion)
p50 and p99 pooled over all rounds (the final checkpoint at the end of input
left out), the channel state an unaligned checkpoint holds (records and
bytes, median), and throughput relative to the runs without checkpoints in
the same round (median). Every run's output is checked: every record once,
the right final counts.

The goal: unaligned p99 <= 10% of aligned p99.

    python benchmarks/backpressure.py            # 3 rounds
    python benchmarks/backpressure.py --quick    # 1 round, fewer records
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from overhead import GroupTotalsSink, NumberSource  # benchmarks/: the script's folder

import eddyflow as ef

GOAL = 0.10


class Busy:
    def __init__(self, micros: float) -> None:
        self.seconds = micros / 1e6

    def __call__(self, r: Any) -> Any:
        until = time.perf_counter() + self.seconds
        while time.perf_counter() < until:
            pass
        return r


def run_once(mode: str | None, n: int, keys: int, cost: float, interval: float,
             chk: Path, batch_size: int = 64, capacity: int = 64, fanout: int = 4,
             parallelism: int = 4) -> tuple[float, list[ef.CheckpointInfo]]:
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=batch_size,
                               channel_capacity=capacity)
    if mode is not None:
        env.enable_checkpointing(interval, chk, mode=mode, retained=10_000, timeout=600.0)
    sink = GroupTotalsSink()  # keeps (key, running count) pairs' count and last counts

    def count(r: int, state: int | None) -> tuple[tuple[int, int], int]:
        n = (state or 0) + 1
        return (r % keys, n), n

    counted = (env.from_source(NumberSource(n)).name("src")
               .key_by(lambda i: i % keys).map_with_state(count).name("count"))
    fanned = counted.flat_map(lambda r: [r] * fanout).name("fan-out")
    fanned.map(Busy(cost)).name("slow").set_parallelism(1).sink_to(sink).name("sink") \
        .set_parallelism(1)
    gc.collect()
    t0 = time.perf_counter()
    env.execute(f"backpressure-{mode}")
    elapsed = time.perf_counter() - t0
    want = {k: len(range(k, n, keys)) for k in range(min(keys, n))}
    if sink.committed != n * fanout or sink.last != want:
        raise SystemExit(f"{mode}: wrong output: {sink.committed} of {n * fanout} records "
                         "committed, or wrong final counts")
    infos = [c for c in ef.list_checkpoints(chk) if not c.final] if mode is not None else []
    shutil.rmtree(chk, ignore_errors=True)
    return elapsed, infos


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--cost", type=float, default=100.0, help="µs per record in 'slow'")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--capacity", type=int, default=64, help="channel capacity, in batches")
    ap.add_argument("--fanout", type=int, default=4)
    ap.add_argument("--parallelism", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.rounds = 10_000, 1
    base = Path(tempfile.mkdtemp(prefix="eddyflow-backpressure-"))
    durations: dict[str, list[float]] = {"exactly_once": [], "unaligned": []}
    ratios: dict[str, list[float]] = {"exactly_once": [], "unaligned": []}
    held_records: list[int] = []
    held_bytes: list[int] = []
    counts: dict[str, list[int]] = {"exactly_once": [], "unaligned": []}
    try:
        for r in range(args.rounds):
            sizes = dict(batch_size=args.batch_size, capacity=args.capacity,
                         fanout=args.fanout, parallelism=args.parallelism)
            none, _ = run_once(None, args.records, args.keys, args.cost, args.interval,
                               base / "none", **sizes)
            order = ["exactly_once", "unaligned"] if r % 2 == 0 else ["unaligned", "exactly_once"]
            for mode in order:
                elapsed, infos = run_once(mode, args.records, args.keys, args.cost,
                                          args.interval, base / mode, **sizes)
                ratios[mode].append(none / elapsed)
                durations[mode].extend(c.duration for c in infos)
                counts[mode].append(len(infos))
                if mode == "unaligned":
                    for c in infos:
                        held_records.append(c.meta.channel_state_records)
                        held_bytes.append(c.meta.channel_state_size)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"{args.records:,} records x {args.fanout}, {args.keys} keys, "
          f"'slow' {args.cost:g} µs/record, batches of {args.batch_size}, "
          f"channels of {args.capacity} batches, interval {args.interval:g} s, "
          f"{args.rounds} rounds")
    print(f"{'mode':<14} {'checkpoints':>11} {'p50 (s)':>9} {'p99 (s)':>9} "
          f"{'throughput vs none':>19}")
    for mode in ("exactly_once", "unaligned"):
        d = durations[mode]
        print(f"{mode:<14} {sum(counts[mode]):>11} {pct(d, 0.5):>9.3f} {pct(d, 0.99):>9.3f} "
              f"{statistics.median(ratios[mode]):>18.2f}x")
    if held_records:
        print(f"channel state per unaligned checkpoint (median): "
              f"{statistics.median(held_records):,.0f} records, "
              f"{statistics.median(held_bytes) / 1024:,.1f} KiB")
    aligned, unaligned = pct(durations["exactly_once"], 0.99), pct(durations["unaligned"], 0.99)
    ratio = unaligned / aligned if aligned else float("nan")
    met = ratio <= GOAL
    print(f"unaligned p99 / aligned p99 = {ratio:.3f} (goal <= {GOAL:.2f}): "
          f"{'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
