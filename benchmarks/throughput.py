"""Throughput benchmark: a stateful word count, eddyflow against a plain loop and Bytewax.

The job is ``flat_map(str.split) -> key_by(word) -> count -> ListSink`` over
deterministically generated lines (seeded random, about ten words a line,
words drawn from a Zipf-like vocabulary). One run measures, in words per
second of wall-clock time:

* a plain Python loop doing the same work (split each line, count each word
  in a dict, append ``(word, running count)`` to a list): the floor any
  framework pays on top of;
* Bytewax 0.21 running the same dataflow (``TestingSource`` -> ``flat_map`` ->
  ``key_on`` -> ``stateful_map`` -> ``TestingSink``, via ``run_main``), its
  source batched like eddyflow's (``--batch-size``; Bytewax's own default of
  one item per batch is slower still);
* eddyflow at parallelism 1 (the goal case) and, for information, at
  parallelism 2 and with operator chaining disabled.

Every framework run is timed end to end (building the dataflow plus
executing it). After an untimed warm-up round, repetitions are interleaved
(plain, eddyflow, Bytewax, plain, ...) and the median of ``--repeat`` runs is
reported, with ``gc.collect()`` before every run (and the input frozen out of
the collector's way), to resist noise on a shared machine. Every run's output is
checked: each key's counts must run 1, 2, 3, ... in order, the final counts
must equal an independent ``collections.Counter``, and where the order is
defined (one subtask end to end) the whole stream must equal the plain loop's.

The goals, for eddyflow at parallelism 1: at least 4x Bytewax's throughput
and at least 0.5x the plain loop's. The exit code is 0 whatever the timings
(this is a report), and 1 when any run's output is wrong.

    python benchmarks/throughput.py                # ~1M words, 5 repetitions
    python benchmarks/throughput.py --quick        # ~100k words
    python benchmarks/throughput.py --profile      # also profile one eddyflow p=1 run
    python benchmarks/throughput.py --json benchmarks/results/throughput.json
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
import statistics
import string
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import eddyflow as ef

try:
    import bytewax.operators as bw_op
    from bytewax.dataflow import Dataflow
    from bytewax.testing import TestingSink, TestingSource, run_main
except ImportError:  # the benchmark still runs, without the Bytewax row
    HAVE_BYTEWAX = False
else:
    HAVE_BYTEWAX = True

Record = tuple[str, int]
Runner = Callable[[list[str]], list[Record]]

GOAL_VS_BYTEWAX = 4.0
GOAL_VS_PLAIN = 0.5
DEFAULT_WORDS = 1_000_000
QUICK_WORDS = 100_000


# -- data ------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    lines: list[str]
    words: int
    vocabulary: int
    distinct: int
    seed: int
    zipf_s: float


def make_vocabulary(rng: random.Random, size: int) -> list[str]:
    """``size`` distinct lowercase pseudo-words of 2 to 12 letters."""
    seen: set[str] = set()
    vocab: list[str] = []
    letters = string.ascii_lowercase
    while len(vocab) < size:
        w = "".join(rng.choices(letters, k=rng.randint(2, 12)))
        if w not in seen:
            seen.add(w)
            vocab.append(w)
    return vocab


def make_dataset(words: int, keys: int, seed: int, zipf_s: float) -> Dataset:
    """Lines of 5 to 15 (mean 10) words; word of rank r has weight 1 / r**s."""
    rng = random.Random(seed)
    vocab = make_vocabulary(rng, keys)
    cum_weights = list(itertools.accumulate(1.0 / (r**zipf_s) for r in range(1, keys + 1)))
    drawn = rng.choices(vocab, cum_weights=cum_weights, k=words)
    lines: list[str] = []
    i = 0
    while i < words:
        n = rng.randint(5, 15)
        lines.append(" ".join(drawn[i : i + n]))
        i += n
    return Dataset(lines, words, keys, len(set(drawn)), seed, zipf_s)


# -- the contenders ----------------------------------------------------------------


def word(w: str) -> str:
    """The key of a word is the word itself."""
    return w


def run_plain(lines: list[str]) -> list[Record]:
    """The same work without a framework: the baseline."""
    counts: dict[str, int] = {}
    out: list[Record] = []
    get = counts.get
    append = out.append
    for line in lines:
        for w in line.split():
            c = get(w, 0) + 1
            counts[w] = c
            append((w, c))
    return out


def make_eddyflow(parallelism: int, chaining: bool, batch_size: int) -> Runner:
    def run_eddyflow(lines: list[str]) -> list[Record]:
        env = ef.StreamEnvironment(
            parallelism=parallelism, chaining=chaining, batch_size=batch_size
        )
        sink = ef.ListSink()
        env.from_collection(lines).flat_map(str.split).key_by(word).count().sink_to(sink)
        env.execute("throughput-wordcount")
        return sink.results

    return run_eddyflow


def bytewax_count(state: int | None, _value: str) -> tuple[int, int]:
    """``stateful_map`` mapper: (new state, emitted value) = running count."""
    c = (state or 0) + 1
    return c, c


def make_bytewax(batch_size: int) -> Runner:
    def run_bytewax(lines: list[str]) -> list[Record]:
        out: list[Record] = []
        flow = Dataflow("throughput_wordcount")
        inp = bw_op.input("lines", flow, TestingSource(lines, batch_size=batch_size))
        words = bw_op.flat_map("split", inp, str.split)
        keyed = bw_op.key_on("key", words, word)
        counts = bw_op.stateful_map("count", keyed, bytewax_count)  # emits (word, count)
        bw_op.output("out", counts, TestingSink(out))
        run_main(flow)  # type: ignore[no-untyped-call]
        return out

    return run_bytewax


@dataclass
class Case:
    key: str
    label: str
    run: Runner
    #: One subtask end to end: the output order is the plain loop's.
    ordered: bool
    informative: bool = False
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(self.seconds)

    def rate(self, words: int) -> float:
        return words / self.median()

    def spread(self) -> float:
        """Half the min-max range of the run times, relative to the median."""
        return (max(self.seconds) - min(self.seconds)) / 2 / self.median()


def make_cases(args: argparse.Namespace) -> list[Case]:
    cases = [
        Case("plain", "plain Python loop", run_plain, ordered=True),
        Case("eddyflow_p1", "eddyflow p=1 (goal case)",
             make_eddyflow(1, True, args.batch_size), ordered=True),
    ]
    if HAVE_BYTEWAX and not args.no_bytewax:
        version = importlib.metadata.version("bytewax")
        cases.append(Case("bytewax", f"Bytewax {version} (1 worker)",
                          make_bytewax(args.batch_size), ordered=False))
    if not args.no_extra:
        cases.append(Case("eddyflow_p2", "eddyflow p=2",
                          make_eddyflow(2, True, args.batch_size), ordered=False,
                          informative=True))
        cases.append(Case("eddyflow_unchained", "eddyflow p=1, chaining off",
                          make_eddyflow(1, False, args.batch_size), ordered=True,
                          informative=True))
    return cases


# -- checking results --------------------------------------------------------------


class Mismatch(Exception):
    """A run's output is not the word count of the input."""


@dataclass(frozen=True)
class Expected:
    words: int
    final: dict[str, int]
    fingerprint: int  # hash of the plain loop's whole output, in order


def running_counts(out: Sequence[Record]) -> dict[str, int]:
    """Final count per key; raises unless every key's counts run 1, 2, 3, ..."""
    last: dict[str, int] = {}
    get = last.get
    for i, (w, c) in enumerate(out):
        if c != get(w, 0) + 1:
            raise Mismatch(f"record {i} is {(w, c)!r}; expected count {get(w, 0) + 1} for {w!r}")
        last[w] = c
    return last


def make_expected(lines: list[str]) -> Expected:
    final = collections.Counter(w for line in lines for w in line.split())
    reference = run_plain(lines)
    if running_counts(reference) != final:
        raise Mismatch("the plain loop disagrees with collections.Counter")
    return Expected(len(reference), dict(final), hash(tuple(reference)))


def check(case: Case, out: Sequence[Record], expected: Expected) -> None:
    if len(out) != expected.words:
        raise Mismatch(f"{len(out)} records out, expected {expected.words}")
    final = running_counts(out)
    if final != expected.final:
        wrong = sorted(k for k in final.keys() | expected.final.keys()
                       if final.get(k) != expected.final.get(k))
        raise Mismatch(f"final counts differ for {len(wrong)} keys, e.g. {wrong[:5]}")
    if case.ordered and hash(tuple(out)) != expected.fingerprint:
        raise Mismatch("same counts, but not in the order of the input")


# -- running -----------------------------------------------------------------------


def timed(run: Runner, lines: list[str]) -> tuple[list[Record], float, float]:
    gc.collect()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    out = run(lines)
    t1 = time.perf_counter()
    cpu1 = time.process_time()
    return out, t1 - t0, cpu1 - cpu0


def benchmark(cases: list[Case], data: Dataset, expected: Expected, repeat: int,
              warmup: int, verbose: bool) -> list[str]:
    """Interleaved repetitions; returns the mismatches found (empty when all is well)."""
    # Warm-up on a slice: imports, first-call initialisation, the Bytewax runtime.
    warm = data.lines[:500]
    for case in cases:
        case.run(warm)
    # Untimed full-size rounds: the first one grows the heap and pays its page faults.
    for _ in range(warmup):
        for case in cases:
            out, _seconds, _cpu = timed(case.run, data.lines)
            del out
    errors: list[str] = []
    for r in range(repeat):
        progress = []
        for case in cases:
            out, seconds, cpu = timed(case.run, data.lines)
            try:
                check(case, out, expected)
            except Mismatch as exc:
                errors.append(f"{case.label}, run {r + 1}: {exc}")
            del out
            case.seconds.append(seconds)
            case.cpu_seconds.append(cpu)
            progress.append(f"{case.key} {seconds:.3f}s")
        if verbose:
            print(f"  run {r + 1}/{repeat}: " + ", ".join(progress), file=sys.stderr, flush=True)
    return errors


# -- reporting ---------------------------------------------------------------------


def paired(ours: Case, other: Case) -> float:
    """Median over rounds of the throughput ratio within each round (drift-resistant)."""
    return statistics.median(o / s for s, o in zip(ours.seconds, other.seconds, strict=True))


@dataclass(frozen=True)
class Goal:
    label: str
    value: float | None  # ratio of the medians; None: not measured
    paired: float | None  # median of the per-round ratios
    target: float

    @property
    def status(self) -> str:
        if self.value is None:
            return "SKIP"
        return "PASS" if self.value >= self.target else "FAIL"


def goals(cases: dict[str, Case], words: int) -> list[Goal]:
    ours = cases["eddyflow_p1"]
    plain = cases["plain"]
    bw = cases.get("bytewax")
    return [
        Goal(f">= {GOAL_VS_BYTEWAX:g}x Bytewax",
             ours.rate(words) / bw.rate(words) if bw else None,
             paired(ours, bw) if bw else None, GOAL_VS_BYTEWAX),
        Goal(f">= {GOAL_VS_PLAIN:g}x the plain loop", ours.rate(words) / plain.rate(words),
             paired(ours, plain), GOAL_VS_PLAIN),
    ]


def environment_line() -> str:
    bw = importlib.metadata.version("bytewax") if HAVE_BYTEWAX else "not installed"
    return (f"Python {platform.python_version()} ({platform.python_implementation()}), "
            f"eddyflow {ef.__version__}, bytewax {bw}, {os.cpu_count()} CPUs, "
            f"{platform.system()} {platform.machine()}")


def render(cases: list[Case], data: Dataset, args: argparse.Namespace,
           errors: list[str]) -> str:
    words = data.words
    by_key = {c.key: c for c in cases}
    plain = by_key["plain"].rate(words)
    bw_case = by_key.get("bytewax")
    bw = bw_case.rate(words) if bw_case else None
    lines = [
        "eddyflow throughput: stateful word count",
        "  flat_map(str.split) -> key_by(word) -> count -> ListSink",
        f"data:  {words:,} words in {len(data.lines):,} lines, {data.distinct:,} distinct keys "
        f"(vocabulary {data.vocabulary:,}, Zipf s={data.zipf_s:g}, seed {data.seed})",
        f"runs:  median of {args.repeat} interleaved repetitions after {args.warmup} warm-up "
        f"round(s), gc.collect() before each; batch size {args.batch_size}",
        f"env:   {environment_line()}",
        "",
    ]
    header = (f"{'case':<30} {'words/s':>12} {'spread':>8} {'median s':>9} "
              f"{'vs plain loop':>14} {'vs Bytewax':>11}")
    lines += [header, "-" * len(header)]
    for c in cases:
        rate = c.rate(words)
        vs_bw = f"{rate / bw:.2f}x" if bw else "n/a"
        lines.append(f"{c.label:<30} {rate:>12,.0f} {'±' + format(c.spread(), '.1%'):>8} "
                     f"{c.median():>9.3f} {rate / plain:>13.2f}x {vs_bw:>11}")
    lines += ["", "goals for eddyflow p=1:"]
    for g in goals(by_key, words):
        if g.value is None:
            value = "(Bytewax not run)"
        else:
            value = f"measured {g.value:.2f}x (per-round pairs: median {g.paired:.2f}x)"
        lines.append(f"  {g.status}  {g.label:<24} {value}")
    lines.append("")
    if errors:
        lines.append(f"RESULTS MISMATCH ({len(errors)}):")
        lines += [f"  {e}" for e in errors]
    else:
        lines.append(f"results: OK, all {len(cases)} cases, every run: final counts equal, "
                     "per-key running counts in order,")
        lines.append("         stream identical to the plain loop's where the order is defined "
                     "(p=1)")
    return "\n".join(lines)


def write_json(path: Path, cases: list[Case], data: Dataset, args: argparse.Namespace,
               errors: list[str]) -> None:
    by_key = {c.key: c for c in cases}
    plain = by_key["plain"].rate(data.words)
    bw = by_key["bytewax"].rate(data.words) if "bytewax" in by_key else None
    report: dict[str, Any] = {
        "benchmark": "wordcount flat_map(str.split) -> key_by(word) -> count -> ListSink",
        "environment": {
            "python": platform.python_version(),
            "eddyflow": ef.__version__,
            "bytewax": importlib.metadata.version("bytewax") if HAVE_BYTEWAX else None,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "data": {
            "words": data.words, "lines": len(data.lines), "distinct_keys": data.distinct,
            "vocabulary": data.vocabulary, "zipf_s": data.zipf_s, "seed": data.seed,
        },
        "repeat": args.repeat,
        "warmup": args.warmup,
        "batch_size": args.batch_size,
        "cases": {
            c.key: {
                "label": c.label,
                "informative": c.informative,
                "seconds": c.seconds,
                "cpu_seconds": c.cpu_seconds,
                "median_seconds": c.median(),
                "words_per_second": c.rate(data.words),
                "vs_plain": c.rate(data.words) / plain,
                "vs_bytewax": c.rate(data.words) / bw if bw else None,
            }
            for c in cases
        },
        "goals": [{"goal": g.label, "value": g.value, "paired_value": g.paired,
                   "target": g.target, "status": g.status}
                  for g in goals(by_key, data.words)],
        "mismatches": errors,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def profile_eddyflow(lines: list[str], batch_size: int, interval: float) -> str:
    """One eddyflow p=1 run under pyinstrument (cProfile if it is not installed)."""
    run = make_eddyflow(1, True, batch_size)
    gc.collect()
    try:
        from pyinstrument import Profiler
    except ImportError:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.runcall(run, lines)
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        return "pyinstrument is not installed; cProfile, top 25 by own time:\n" + buf.getvalue()
    # async_mode="disabled": sample the whole thread, whichever coroutine runs.
    profiler = Profiler(interval=interval, async_mode="disabled")
    profiler.start()
    run(lines)
    profiler.stop()
    # show_all: the library frames matter here (asyncio.run's teardown is part of the
    # job's cost); frames under 1% of the run are dropped to keep it readable.
    return profiler.output_text(unicode=True, color=False, show_all=True,
                                processor_options={"filter_threshold": 0.01})


# -- main --------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Stateful word-count throughput: eddyflow vs a plain loop vs Bytewax.")
    p.add_argument("--words", type=int, default=None,
                   help=f"total words (default {DEFAULT_WORDS:,}; {QUICK_WORDS:,} with --quick)")
    p.add_argument("--keys", type=int, default=50_000, help="vocabulary size (default 50,000)")
    p.add_argument("--repeat", type=int, default=5,
                   help="timed runs per case; the median is reported (default 5)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed full-size rounds before the timed ones (default 1)")
    p.add_argument("--seed", type=int, default=42, help="data seed (default 42)")
    p.add_argument("--zipf", type=float, default=1.0,
                   help="Zipf exponent of word frequencies (default 1.0)")
    p.add_argument("--batch-size", type=int, default=1024,
                   help="eddyflow batch_size and Bytewax TestingSource batch_size (default 1024, "
                        "eddyflow's default)")
    p.add_argument("--quick", action="store_true", help=f"~{QUICK_WORDS:,} words")
    p.add_argument("--no-bytewax", action="store_true", help="skip the Bytewax case")
    p.add_argument("--no-extra", action="store_true",
                   help="skip the informative eddyflow rows (p=2, chaining off)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    p.add_argument("--profile", action="store_true",
                   help="after the benchmark, profile one eddyflow p=1 run and print it")
    p.add_argument("--profile-interval", type=float, default=0.001,
                   help="pyinstrument sampling interval in seconds (default 0.001)")
    p.add_argument("--quiet", action="store_true", help="no per-run progress on stderr")
    args = p.parse_args(argv)
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.words is None:
        args.words = QUICK_WORDS if args.quick else DEFAULT_WORDS
    for name in ("words", "keys", "repeat", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    verbose = not args.quiet
    if verbose:
        print(f"generating {args.words:,} words over {args.keys:,} keys ...",
              file=sys.stderr, flush=True)
    data = make_dataset(args.words, args.keys, args.seed, args.zipf)
    expected = make_expected(data.lines)
    # The input and the expected counts live through every run: keep the
    # collector from re-scanning them, so no case pays for the harness's heap.
    gc.collect()
    gc.freeze()
    cases = make_cases(args)
    if not HAVE_BYTEWAX and not args.no_bytewax:
        print("bytewax is not installed: skipping it (pip install -e '.[bench]')",
              file=sys.stderr)
    if verbose:
        print(f"running {len(cases)} cases x {args.repeat} repetitions ...",
              file=sys.stderr, flush=True)
    errors = benchmark(cases, data, expected, args.repeat, args.warmup, verbose)
    print(render(cases, data, args, errors))
    if args.json:
        write_json(args.json, cases, data, args, errors)
        print(f"\nwrote {args.json}")
    if args.profile:
        print("\nprofile of one eddyflow p=1 run (pyinstrument; sampling overhead inflates "
              "time in C calls such as dict.get):")
        print(profile_eddyflow(data.lines, args.batch_size, args.profile_interval))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
