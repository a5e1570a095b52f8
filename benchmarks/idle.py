"""Checkpoints beside a quiet source: an idle input must not hold them back.

The job (issue 26, item 4)::

    from_async_iterable: one record every --gap seconds   # quiet
      union
    numbers, as fast as the job takes them                 # busy, replayable
      -> key_by(i % keys) -> count -> a sink that keeps the counts

with a checkpoint every ``--interval`` seconds for ``--duration`` seconds
(the busy source stops then, and the quiet one after its last record). A
source with nothing to read must answer a checkpoint trigger at once
(DESIGN.md "Idle inputs"): checkpoints then take about as long beside the
quiet source as without it, instead of waiting for its next record.

Runs, interleaved round by round: the busy source alone (the reference),
the busy source beside the quiet one, and the quiet one alone. Reported per
scenario: periodic checkpoints completed (the final one at the end of
input left out), their duration (trigger to completion) p50 and p90 pooled
over the rounds, and p90 beside the quiet source relative to the busy
source alone.

The goal: beside the quiet source, p90 <= 0.3 s at a 0.2 s interval, and
checkpoints complete at about the rate of the busy source alone.

    python benchmarks/idle.py            # 3 rounds of 8 s
    python benchmarks/idle.py --quick    # 1 round of 4 s
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import eddyflow as ef

GOAL_P90 = 0.3


class BusyUntil(ef.Source):
    """The integers from 0, as fast as they are read, until ``seconds``
    after the first read (replayable: the position is the next integer)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @property
    def name(self) -> str:
        return "busy"

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return _BusyReader(self.seconds)


class _BusyReader(ef.SourceReader):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline: float | None = None
        self.pos = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.seconds
        if now >= self.deadline:
            return None
        batch = list(range(self.pos, self.pos + max_records))
        self.pos += max_records
        return batch

    def position(self) -> int:
        return self.pos

    def seek(self, position: Any) -> None:
        self.pos = int(position)


async def quiet(gap: float, seconds: float) -> AsyncIterator[int]:
    """One record every ``gap`` seconds for ``seconds`` (a quiet websocket)."""
    deadline = time.monotonic() + seconds
    i = 0
    while True:
        await asyncio.sleep(gap)
        if time.monotonic() >= deadline:
            return
        yield -1 - i
        i += 1


class CountsSink(ef.Sink):
    """Keeps the last running count per key (exactly-once: committed at
    checkpoints like every eddyflow sink)."""

    def __init__(self) -> None:
        self.last: dict[Any, int] = {}

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        sink = self

        class W(ef.SinkWriter):
            def write(self, records: list[Any]) -> None:
                for k, n in records:
                    sink.last[k] = n

        return W()


def run_once(scenario: str, args: argparse.Namespace, chk: Path) -> list[ef.CheckpointInfo]:
    env = ef.StreamEnvironment(parallelism=args.parallelism)
    env.enable_checkpointing(args.interval, chk, retained=100_000, timeout=600.0)
    streams = []
    if scenario in ("busy", "quiet+busy"):
        streams.append(env.from_source(BusyUntil(args.duration)).name("busy"))
    if scenario in ("quiet", "quiet+busy"):
        streams.append(env.from_async_iterable(quiet(args.gap, args.duration)).name("quiet"))
    first, *rest = streams
    joined = first.union(*rest) if rest else first
    joined.key_by(lambda i: i % args.keys).count().name("count").sink_to(CountsSink())
    env.execute(f"idle-{scenario}")
    infos = [c for c in ef.list_checkpoints(chk) if not c.final]
    shutil.rmtree(chk, ignore_errors=True)
    return infos


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


SCENARIOS = ("busy", "quiet+busy", "quiet")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per run")
    ap.add_argument("--gap", type=float, default=1.5, help="seconds between quiet records")
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 4.0, 1
    base = Path(tempfile.mkdtemp(prefix="eddyflow-idle-"))
    durations: dict[str, list[float]] = {s: [] for s in SCENARIOS}
    counts: dict[str, list[int]] = {s: [] for s in SCENARIOS}
    try:
        for r in range(args.rounds):
            order = SCENARIOS if r % 2 == 0 else SCENARIOS[::-1]
            for scenario in order:
                infos = run_once(scenario, args, base / scenario.replace("+", "-"))
                durations[scenario].extend(c.duration for c in infos)
                counts[scenario].append(len(infos))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"{args.duration:g} s runs, a quiet record every {args.gap:g} s, interval "
          f"{args.interval:g} s, parallelism {args.parallelism}, {args.rounds} rounds")
    print(f"{'scenario':<11} {'checkpoints/run':>15} {'p50 (s)':>8} {'p90 (s)':>8}")
    for s in SCENARIOS:
        d = durations[s]
        per_run = sum(counts[s]) / len(counts[s])
        print(f"{s:<11} {per_run:>15.1f} {pct(d, 0.5):>8.3f} {pct(d, 0.9):>8.3f}")
    mixed, alone = pct(durations["quiet+busy"], 0.9), pct(durations["busy"], 0.9)
    print(f"quiet+busy p90 / busy p90 = {mixed / alone:.2f}; checkpoints/run "
          f"quiet+busy / busy = {sum(counts['quiet+busy']) / max(1, sum(counts['busy'])):.2f}")
    met = mixed <= GOAL_P90
    print(f"quiet+busy p90 = {mixed:.3f} s (goal <= {GOAL_P90:g} s): "
          f"{'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
