"""A/B of throughput.py's word count between this working tree and a git
revision: did a change cost throughput?

Each run is a fresh process whose ``PYTHONPATH`` names one of the two source
trees (``src/`` here, or the revision's ``src/`` checked out into a
temporary folder with ``git archive``), so each imports its own eddyflow.
A run builds ``throughput.py``'s dataset (seeded: the same words for both),
warms up on a slice, then times ``make_eddyflow(1, True, batch)`` on it once
(with ``--interval``: checkpointing on, every that many seconds, into a
temporary folder) and checks the output against ``collections.Counter``.
Runs alternate A, B, B, A, ... and the figure is the median over rounds of
the per-round ratio of the two throughputs (drift on a shared machine hits
both sides of a round alike).

    python benchmarks/ab_throughput.py --base HEAD~3            # 1M words, 7 rounds
    python benchmarks/ab_throughput.py --base 035c31b --interval 1.0
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def child(words: int, batch: int, interval: float | None) -> None:
    """One timed run with whichever eddyflow the path gives; prints JSON."""
    sys.path.insert(0, str(HERE))
    import throughput  # the benchmark's own data and job

    import eddyflow as ef

    data = throughput.make_dataset(words, 50_000, 42, 1.1)
    expected = collections.Counter(w for line in data.lines for w in line.split())
    with tempfile.TemporaryDirectory() as tmp:
        def run(lines: list[str]) -> list[tuple[str, int]]:
            env = ef.StreamEnvironment(parallelism=1, batch_size=batch)
            if interval is not None:
                env.enable_checkpointing(interval, os.path.join(tmp, f"chk-{time.time_ns()}"))
            sink = ef.ListSink()
            (env.from_collection(lines).flat_map(str.split).key_by(throughput.word).count()
             .sink_to(sink))
            env.execute("ab-wordcount")
            return list(sink.results)

        run(data.lines[:500])
        t0 = time.perf_counter()
        out = run(data.lines)
        seconds = time.perf_counter() - t0
    final = throughput.running_counts(out)
    ok = final == expected and len(out) == data.words
    print(json.dumps({"seconds": seconds, "ok": ok, "words": data.words,
                      "eddyflow": os.path.dirname(ef.__file__)}))


def checkout(rev: str, into: str) -> str:
    """``rev``'s ``src/`` under ``into``; returns that src folder."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "src")


def one(src: str, args: argparse.Namespace) -> dict[str, object]:
    cmd = [sys.executable, __file__, "--child", "--words", str(args.words),
           "--batch-size", str(args.batch_size)]
    if args.interval is not None:
        cmd += ["--interval", str(args.interval)]
    env = dict(os.environ, PYTHONPATH=src)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="HEAD", help="the revision to compare with (default HEAD)")
    p.add_argument("--words", type=int, default=1_000_000)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=7, help="rounds (default 7)")
    p.add_argument("--interval", type=float, default=None,
                   help="checkpoint every this many seconds (default: no checkpointing)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.words, args.batch_size, args.interval)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"base": checkout(args.base, tmp), "tree": str(ROOT / "src")}
        times: dict[str, list[float]] = {"base": [], "tree": []}
        wrong = []
        for r in range(args.repeat):
            order = ["base", "tree"] if r % 2 == 0 else ["tree", "base"]
            for side in order:
                res = one(sides[side], args)
                if not res["ok"]:
                    wrong.append(f"round {r + 1}, {side}: output differs from the expected counts")
                times[side].append(float(str(res["seconds"])))
            print(f"  round {r + 1}/{args.repeat}: base {times['base'][-1]:.3f}s, "
                  f"tree {times['tree'][-1]:.3f}s", file=sys.stderr, flush=True)
    ratios = [b / t for b, t in zip(times["base"], times["tree"], strict=True)]
    what = ("no checkpointing" if args.interval is None
            else f"checkpoints every {args.interval} s")
    print(f"word count, {args.words:,} words, eddyflow p=1, {what}; {args.repeat} rounds")
    print("| side | words/s (median) |")
    print("|---|---:|")
    for side, label in (("base", f"{args.base}"), ("tree", "working tree")):
        print(f"| {label} | {args.words / statistics.median(times[side]):,.0f} |")
    print(f"working tree vs {args.base}: {statistics.median(ratios):.3f}x "
          f"(median of per-round ratios; min {min(ratios):.3f}, max {max(ratios):.3f})")
    for w in wrong:
        print(f"WRONG: {w}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
