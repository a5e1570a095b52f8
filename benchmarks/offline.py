"""Offline benchmark: eddyflow's readers and validation on ``local[2]`` and on
a standalone cluster, each against plain PySpark doing comparable work in the
same run, on the same session.

Input: a text of W words over K distinct words (benchmarks/validate.py's
generator), counted by examples/wordcount.py at parallelism 2; its final
checkpoint holds K keys. Rows, each timed on a started session:

* ``read_state`` of the K-key checkpoint (``count()`` of the DataFrame: every
  state file read, verified and decoded by a Python executor, every row
  handed to Spark). Baselines: the same rows (key, value) read from Parquet,
  once by the JVM alone (``sum(length(key))``) and once through Python
  executors (``.rdd.map(...)``), which is what eddyflow's Python decoding
  competes with.
* ``validate`` of the word count's checkpoint. Baseline: a plain PySpark word
  count of the same file (``textFile -> flatMap -> reduceByKey -> count``).

Cases of a few seconds run each side once untimed first (``warmup``); the
first call of a session ships eddyflow to it either way, once. Each on
``local[2]`` and on a standalone master with two one-core workers
(``eddyflow.offline.standalone``; its executors run a Python without eddyflow,
which ships itself). Both sessions are built as a Spark user would
(``SparkSession.builder``), one after the other in this process.

More rows (``read_changes``, ``bootstrap``) are added to ``CASES``: a case is
a name, a function of ``(spark, inputs)`` timed, and its baseline's.

    python benchmarks/offline.py            # 10M words over 1M keys (read_state of 1M, validate)
    python benchmarks/offline.py --quick    # 1M words over 100k keys
    python benchmarks/offline.py --keys 10000000 --words 20000000   # read_state of 10M keys
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "..", "examples", "wordcount.py")
sys.path.insert(0, HERE)

from validate import plain_spark_wordcount, write_text  # noqa: E402


@dataclass
class Inputs:
    text: str
    checkpoint: str
    keys: int
    words: int
    #: The checkpoint's (key, value) rows as Parquet, for the baselines.
    parquet: str


@dataclass
class Case:
    name: str
    run: Callable[[Any, Inputs], Any]
    baseline_name: str
    baseline: Callable[[Any, Inputs], Any]
    #: Another baseline, reported beside the first (None: none).
    baseline2_name: str | None = None
    baseline2: Callable[[Any, Inputs], Any] | None = None
    #: Run each side once untimed first: for cases of a few seconds, where a
    #: session's first query of a kind (class loading, code generation, the
    #: first Python workers, eddyflow's shipping) would be most of the time.
    warmup: bool = False


def _read_state(spark: Any, inp: Inputs) -> int:
    from eddyflow.offline import read_state

    n = int(read_state(spark, inp.checkpoint, operator="count").count())
    assert n == inp.keys, (n, inp.keys)
    return n


def _parquet_jvm(spark: Any, inp: Inputs) -> int:
    from pyspark.sql import functions as F

    row = spark.read.parquet(inp.parquet).agg(F.count("*"), F.sum(F.length("key")),
                                              F.sum(F.length("value"))).collect()[0]
    assert row[0] == inp.keys
    return int(row[0])


def _parquet_python(spark: Any, inp: Inputs) -> int:
    n = int(spark.read.parquet(inp.parquet).rdd.map(lambda r: (r[0], r[1])).count())
    assert n == inp.keys
    return n


def _validate(spark: Any, inp: Inputs) -> Any:
    from eddyflow.offline import validate

    report = validate(spark, inp.checkpoint, job=JOB)
    assert report.ok and report.compared == inp.keys, (report.ok, report.compared)
    return report


def _wordcount(spark: Any, inp: Inputs) -> int:
    n = plain_spark_wordcount(spark, inp.text)
    assert n == inp.keys
    return n


CASES = [
    Case("read_state", _read_state, "Parquet, JVM", _parquet_jvm,
         "Parquet via Python", _parquet_python, warmup=True),
    Case("validate", _validate, "plain word count", _wordcount),
]


def _timed(f: Callable[[], Any]) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def session(master: str, conf: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(master).appName("eddyflow offline bench")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.memory", "2g").config("spark.sql.shuffle.partitions", "8"))
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def prepare(tmp: str, words: int, keys: int) -> Inputs:
    text = os.path.join(tmp, "input.txt")
    t = time.perf_counter()
    write_text(text, words, keys)
    print(f"input: {words:,} words, {keys:,} keys, {os.path.getsize(text) / 1e6:.0f} MB "
          f"({time.perf_counter() - t:.1f} s)", flush=True)
    os.environ.update(WORDCOUNT_INPUT=text, WORDCOUNT_OUTPUT=os.path.join(tmp, "out"),
                      WORDCOUNT_CHECKPOINTS=os.path.join(tmp, "chk"))
    import eddyflow as ef
    from eddyflow.jobfile import build_environment

    env, _ = build_environment(JOB, parallelism=2)
    t = time.perf_counter()
    result = env.execute("wordcount")
    counts = result.state("count")
    # Words are drawn at random: nearly, not exactly, every key occurs.
    distinct = len(counts)
    assert distinct > 0.9 * keys, (distinct, keys)
    chk = ef.list_checkpoints(os.path.join(tmp, "chk"))[-1]
    print(f"streaming word count: {time.perf_counter() - t:.1f} s, {distinct:,} keys, "
          f"checkpoint {chk.id}, {chk.full_size / 1e6:.0f} MB of state", flush=True)
    parquet = os.path.join(tmp, "state.parquet")  # written by the first session
    del result, env, counts
    return Inputs(text, chk.path, distinct, words, parquet)


def run_on(label: str, spark: Any, inp: Inputs, rows: list[tuple[str, ...]]) -> None:
    spark.sparkContext.parallelize([1], 2).count()  # executors up
    if not os.path.exists(inp.parquet):
        from eddyflow.offline import read_state

        # The baselines' rows: the checkpoint's, as Parquet (not timed).
        read_state(spark, inp.checkpoint, operator="count").select("key", "value") \
            .write.parquet(inp.parquet)
    for case in CASES:
        if case.warmup:
            for f in (case.run, case.baseline, case.baseline2):
                if f is not None:
                    f(spark, inp)
        base = _timed(functools.partial(case.baseline, spark, inp))
        ours = _timed(functools.partial(case.run, spark, inp))
        rows.append((label, case.name, f"{ours:.1f}", case.baseline_name, f"{base:.1f}",
                     f"{ours / base:.2f}x"))
        if case.baseline2 is not None and case.baseline2_name is not None:
            b2 = _timed(functools.partial(case.baseline2, spark, inp))
            rows.append((label, case.name, f"{ours:.1f}", case.baseline2_name, f"{b2:.1f}",
                         f"{ours / b2:.2f}x"))
        print(f"  {label} {case.name}: {ours:.1f} s (baseline {base:.1f} s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--words", type=int, default=None)
    parser.add_argument("--keys", type=int, default=None)
    parser.add_argument("--no-cluster", action="store_true", help="local[2] only")
    args = parser.parse_args()
    words = args.words or (1_000_000 if args.quick else 10_000_000)
    keys = args.keys or (100_000 if args.quick else 1_000_000)
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")

    tmp = tempfile.mkdtemp(prefix="ef-offline-")
    rows: list[tuple[str, ...]] = []
    try:
        inp = prepare(tmp, words, keys)
        # local[2]: executors run the driver's Python (what spark_session
        # does); the cluster's run its own bare one.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        spark = session("local[2]", {})
        run_on("local[2]", spark, inp, rows)
        spark.stop()
        del os.environ["PYSPARK_PYTHON"]
        if not args.no_cluster:
            from eddyflow.offline.standalone import start_cluster

            t = time.perf_counter()
            with start_cluster(workers=2, cores_per_worker=1, worker_memory="2g",
                               executor_memory="1g") as cluster:
                print(f"standalone cluster up in {time.perf_counter() - t:.1f} s "
                      f"({cluster.master_url}, executors' Python {cluster.python})",
                      flush=True)
                os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
                spark = session(cluster.master_url, cluster.session_conf())
                run_on("standalone 2x1", spark, inp, rows)
                spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print()
    header = ("master", "case", "eddyflow s", "baseline", "baseline s", "ratio")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
