"""Offline benchmark: eddyflow's readers, change feed, bootstrap and
validation on ``local[2]`` and on a standalone cluster, each against plain
PySpark doing comparable work in the same run, on the same session.

Inputs, made once before any session (not timed):

* a text of W words over K distinct words (benchmarks/validate.py's
  generator), counted by examples/wordcount.py at parallelism 2; its final
  checkpoint holds K keys;
* the phased job of the offline tests (tests/offline/jobs/phased_state.py):
  K keys (a dict value each) in the memory backend at parallelism 2,
  checkpoint a; then 1% of the keys changed, 1% cleared, 1% rewritten with
  their old value, 1% created and cleared again, checkpoint b. b's chain of
  files is a's plus two small deltas per subtask;
* with ``--big``: a checkpoint of 10M keys of the word count's ``count``
  operator, written by ``bootstrap`` from ``spark.range`` (memory format,
  parallelism 2), because a streaming run counting 20M+ words into 10M keys
  takes longer on two cores than the rest of this benchmark. The read path
  is the same (the backend's own snapshot files, read, verified and decoded
  by a Python executor, row by row); only the wordcount's chain of deltas is
  one full file per subtask here.

Rows, each timed on a started session (``count()`` where a DataFrame):

* ``read_state`` of the K-key (and 10M-key) checkpoint. Baselines: the same
  (key, value) rows read from Parquet, by the JVM alone
  (``sum(length(key))``) and through Python executors (``.rdd.map(...)``),
  which is what eddyflow's Python decoding competes with.
* ``read_changes(a, b)`` (the delta files only; bytes read printed) and
  ``read_changes(a, b, exact=True)`` (joined with a's state). Baseline: a's
  and b's states saved as Parquet beforehand, read and full-outer joined on
  (operator, state, key) keeping the rows whose value differs.
* ``bootstrap`` of K (word, n) rows of a cached DataFrame into the word
  count's ``count`` operator, memory and RocksDB format. Baselines: the same
  rows written as Parquet after ``repartition(2, word)`` (all JVM) and the
  rows merely handed to Python workers and counted there, the floor of any
  per-row Python work without Arrow.
* ``validate`` of the word count's checkpoint. Baseline: a plain PySpark word
  count of the same file (``textFile -> flatMap -> reduceByKey -> count``).

Cases of a few seconds run each side once untimed first (``warmup``); the
first call of a session ships eddyflow to it either way, once. Each on
``local[2]`` and on a standalone master with two one-core workers
(``eddyflow.offline.standalone``; its executors run a Python without eddyflow,
which ships itself). Both sessions are built as a Spark user would
(``SparkSession.builder``), one after the other in this process.

A case is a name, a function of ``(spark, inputs)`` timed, and its baselines'.

    python benchmarks/offline.py            # 10M words over 1M keys, 1M-key change feed, bootstrap
    python benchmarks/offline.py --quick    # 1M words over 100k keys
    python benchmarks/offline.py --big      # and read_state of 10M keys
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "..", "examples", "wordcount.py")
PHASED_JOB = os.path.join(HERE, "..", "tests", "offline", "jobs", "phased_state.py")
sys.path.insert(0, HERE)

from validate import plain_spark_wordcount, write_text  # noqa: E402


@dataclass
class State:
    """A checkpoint of the word count and its (key, value) rows as Parquet."""

    checkpoint: str
    keys: int
    #: Written by the first session (not timed), read by the baselines.
    parquet: str


@dataclass
class Changes:
    """The phased job's checkpoints a and b, and their states as Parquet."""

    directory: str
    start: int
    end: int
    keys: int
    #: The rows of the difference (changed, deleted, created): the exact feed.
    differing: int
    #: The bytes read_changes reads, and b's whole state.
    bytes_read: int
    full_bytes: int
    parquet_start: str
    parquet_end: str


@dataclass
class Inputs:
    text: str
    words: int
    work: str
    states: dict[str, State]
    changes: Changes
    #: Rows of the bootstrap's DataFrame.
    bootstrap_keys: int
    #: Per session: the bootstrap's cached DataFrame.
    frames: dict[str, Any] = field(default_factory=dict)
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def fresh(self, name: str) -> str:
        """A new path under the work directory, for a case's output."""
        return os.path.join(self.work, f"{name}-{next(self.counter)}")


@dataclass
class Case:
    #: Formatted with the inputs as ``i``.
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
    #: Whether the inputs have what the case needs (the 10M keys: ``--big``).
    available: Callable[[Inputs], bool] = lambda inp: True
    #: Untimed set-up in each session before the case (None: none).
    prepare: Callable[[Any, Inputs], None] | None = None


# -- read_state ---------------------------------------------------------------

def _read_state(spark: Any, inp: Inputs, which: str) -> int:
    from eddyflow.offline import read_state

    st = inp.states[which]
    n = int(read_state(spark, st.checkpoint, operator="count").count())
    assert n == st.keys, (n, st.keys)
    return n


def _parquet_jvm(spark: Any, inp: Inputs, which: str) -> int:
    from pyspark.sql import functions as F

    st = inp.states[which]
    row = spark.read.parquet(st.parquet).agg(F.count("*"), F.sum(F.length("key")),
                                             F.sum(F.length("value"))).collect()[0]
    assert row[0] == st.keys
    return int(row[0])


def _parquet_python(spark: Any, inp: Inputs, which: str) -> int:
    st = inp.states[which]
    n = int(spark.read.parquet(st.parquet).rdd.map(lambda r: (r[0], r[1])).count())
    assert n == st.keys
    return n


def _state_parquet(spark: Any, inp: Inputs) -> None:
    """The baselines' rows: the checkpoint's, as Parquet (once, not timed)."""
    from eddyflow.offline import read_state

    st = inp.states["wordcount"]
    if not os.path.exists(st.parquet):
        read_state(spark, st.checkpoint, operator="count").select("key", "value") \
            .write.parquet(st.parquet)


def _big_state(spark: Any, inp: Inputs) -> None:
    """The 10M-key checkpoint, bootstrapped, and its rows as Parquet, written
    by the first session (not timed, reported)."""
    from pyspark.sql import functions as F

    from eddyflow.offline import bootstrap

    st = inp.states["big"]
    if os.path.exists(st.parquet):
        return
    df = word_counts(spark, st.keys)
    t = time.perf_counter()
    st.checkpoint = bootstrap(spark, df, job=JOB, operator="count", key="word", state="count",
                              value="n", directory=os.path.join(inp.work, "big"),
                              parallelism=2, backend="memory")
    took = time.perf_counter() - t
    df.select(F.col("word").alias("key"), F.col("n").alias("value")).write.parquet(st.parquet)
    df.unpersist()
    print(f"  {st.keys:,}-key checkpoint bootstrapped in {took:.1f} s (not timed)", flush=True)


# -- read_changes -------------------------------------------------------------

def _read_changes(spark: Any, inp: Inputs) -> int:
    from eddyflow.offline import read_changes

    c = inp.changes
    n = int(read_changes(spark, c.directory, start=c.start, end=c.end).count())
    # The difference plus the rewrites to the same value and the keys
    # created and deleted in between, which the delta files hold too.
    assert n == c.differing + 2 * (c.keys // 100), (n, c.differing)
    return n


def _read_changes_exact(spark: Any, inp: Inputs) -> int:
    from eddyflow.offline import read_changes

    c = inp.changes
    n = int(read_changes(spark, c.directory, start=c.start, end=c.end, exact=True).count())
    assert n == c.differing, (n, c.differing)
    return n


def _parquet_diff(spark: Any, inp: Inputs) -> int:
    from pyspark.sql import functions as F

    c = inp.changes
    left = spark.read.parquet(c.parquet_start).select("operator", "state", "key",
                                                      F.col("value").alias("va"))
    right = spark.read.parquet(c.parquet_end).select("operator", "state", "key",
                                                     F.col("value").alias("vb"))
    joined = left.join(right, ["operator", "state", "key"], "full_outer")
    n = int(joined.filter(~F.col("va").eqNullSafe(F.col("vb"))).count())
    assert n == c.differing, (n, c.differing)
    return n


def _changes_parquet(spark: Any, inp: Inputs) -> None:
    """Both states as Parquet for the diff (once, not timed); values as text
    (dicts), as the diff compares them."""
    from eddyflow.offline import read_state

    c = inp.changes
    for chk, path in ((c.start, c.parquet_start), (c.end, c.parquet_end)):
        if not os.path.exists(path):
            read_state(spark, os.path.join(c.directory, f"chk-{chk}"), as_text=True) \
                .write.parquet(path)


# -- bootstrap ----------------------------------------------------------------

def word_counts(spark: Any, keys: int) -> Any:
    """``keys`` distinct (word, n) rows, cached: "w" and five letters from the
    row number, as benchmarks/validate.py's words."""
    from pyspark.sql import functions as F

    letters = [F.chr(F.lit(97) + (F.floor(F.col("id") / (26 ** k)) % 26)) for k in range(5)]
    df = spark.range(keys).select(
        F.concat(F.lit("w"), *reversed(letters)).alias("word"),
        (F.col("id") % 1000 + 1).alias("n")).cache()
    assert df.count() == keys
    return df


def _bootstrap_frame(spark: Any, inp: Inputs) -> None:
    inp.frames["bootstrap"] = word_counts(spark, inp.bootstrap_keys)


def _bootstrap(spark: Any, inp: Inputs, backend: str) -> str:
    from eddyflow.offline import bootstrap

    return str(bootstrap(spark, inp.frames["bootstrap"], job=JOB, operator="count", key="word",
                         state="count", value="n", directory=inp.fresh(f"backfill-{backend}"),
                         parallelism=2, backend=backend))


def _write_parquet(spark: Any, inp: Inputs) -> None:
    inp.frames["bootstrap"].repartition(2, "word").write.parquet(inp.fresh("plain.parquet"))


def _rows_in_python(spark: Any, inp: Inputs) -> int:
    n = int(inp.frames["bootstrap"].rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).sum())
    assert n == inp.bootstrap_keys
    return n


# -- validate -----------------------------------------------------------------

def _validate(spark: Any, inp: Inputs) -> Any:
    from eddyflow.offline import validate

    st = inp.states["wordcount"]
    report = validate(spark, st.checkpoint, job=JOB)
    assert report.ok and report.compared == st.keys, (report.ok, report.compared)
    return report


def _wordcount(spark: Any, inp: Inputs) -> int:
    n = plain_spark_wordcount(spark, inp.text)
    assert n == inp.states["wordcount"].keys
    return n


CASES = [
    Case("read_state, {i.states[wordcount].keys:,} keys",
         functools.partial(_read_state, which="wordcount"),
         "Parquet, JVM", functools.partial(_parquet_jvm, which="wordcount"),
         "Parquet via Python", functools.partial(_parquet_python, which="wordcount"),
         warmup=True, prepare=_state_parquet),
    Case("read_state, {i.states[big].keys:,} keys",
         functools.partial(_read_state, which="big"),
         "Parquet, JVM", functools.partial(_parquet_jvm, which="big"),
         "Parquet via Python", functools.partial(_parquet_python, which="big"),
         available=lambda inp: "big" in inp.states, prepare=_big_state),
    Case("read_changes, 1% of {i.changes.keys:,} keys", _read_changes,
         "Parquet diff", _parquet_diff, warmup=True, prepare=_changes_parquet),
    Case("read_changes exact, 1% of {i.changes.keys:,}", _read_changes_exact,
         "Parquet diff", _parquet_diff),
    Case("bootstrap memory, {i.bootstrap_keys:,} keys",
         functools.partial(_bootstrap, backend="memory"),
         "Parquet write", _write_parquet, "rows into Python", _rows_in_python,
         warmup=True, prepare=_bootstrap_frame),
    Case("bootstrap RocksDB, {i.bootstrap_keys:,} keys",
         functools.partial(_bootstrap, backend="rocksdb"),
         "Parquet write", _write_parquet, "rows into Python", _rows_in_python, warmup=True),
    Case("validate, {i.words:,} words", _validate, "plain word count", _wordcount),
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


def _wordcount_state(tmp: str, words: int, keys: int) -> tuple[str, State]:
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
    # Words are drawn at random: nearly, not exactly, every key occurs.
    distinct = len(result.state("count"))
    assert distinct > 0.9 * keys, (distinct, keys)
    chk = ef.list_checkpoints(os.path.join(tmp, "chk"))[-1]
    print(f"streaming word count: {time.perf_counter() - t:.1f} s, {distinct:,} keys, "
          f"checkpoint {chk.id}, {chk.full_size / 1e6:.0f} MB of state", flush=True)
    return text, State(chk.path, distinct, os.path.join(tmp, "state.parquet"))


def _phased_changes(tmp: str, keys: int) -> Changes:
    changed = keys // 100
    chk = os.path.join(tmp, "phased")
    os.environ.update(PHASED_KEYS=str(keys), PHASED_CHANGED=str(changed),
                      PHASED_CHECKPOINTS=chk, PHASED_BACKEND="memory")
    import eddyflow as ef
    from eddyflow.jobfile import build_environment
    from eddyflow.offline import plan_changes

    env, _ = build_environment(PHASED_JOB, parallelism=2)
    env.enable_checkpointing(interval=0.1, directory=chk, retained=1000)
    t = time.perf_counter()
    env.execute("phased")
    infos = ef.list_checkpoints(chk)
    # a: the last checkpoint with the source at the end of phase 1.
    a = [i.id for i in infos if any(
        p.is_source and p.position == keys
        for op in i.meta.operators.values() for p in op.subtasks.values())][-1]
    b = infos[-1].id
    plan = plan_changes(chk, a, b)
    print(f"phased run: {time.perf_counter() - t:.1f} s, {keys:,} keys, {changed:,} changed; "
          f"{plan.describe()}", flush=True)
    # Changed, deleted, created (phased_state.py's phase 2; phase 3 undoes the rest).
    return Changes(chk, a, b, keys, 2 * changed, plan.bytes_read, plan.full_bytes,
                   os.path.join(tmp, "changes-a.parquet"), os.path.join(tmp, "changes-b.parquet"))


def run_on(label: str, spark: Any, inp: Inputs, rows: list[tuple[str, ...]]) -> None:
    spark.sparkContext.parallelize([1], 2).count()  # executors up
    inp.frames.clear()
    for case in CASES:
        if not case.available(inp):
            continue
        if case.prepare is not None:
            case.prepare(spark, inp)
        name = case.name.format(i=inp)
        if case.warmup:
            for f in (case.run, case.baseline, case.baseline2):
                if f is not None:
                    f(spark, inp)
        base = _timed(functools.partial(case.baseline, spark, inp))
        ours = _timed(functools.partial(case.run, spark, inp))
        rows.append((label, name, f"{ours:.1f}", case.baseline_name, f"{base:.1f}",
                     f"{ours / base:.2f}x"))
        if case.baseline2 is not None and case.baseline2_name is not None:
            b2 = _timed(functools.partial(case.baseline2, spark, inp))
            rows.append((label, name, f"{ours:.1f}", case.baseline2_name, f"{b2:.1f}",
                         f"{ours / b2:.2f}x"))
        print(f"  {label} {name}: {ours:.1f} s (baseline {base:.1f} s)", flush=True)
    for df in inp.frames.values():
        df.unpersist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k keys, 1M words")
    parser.add_argument("--words", type=int, default=None)
    parser.add_argument("--keys", type=int, default=None,
                        help="keys of the word count, the change feed and the bootstrap")
    parser.add_argument("--big", action="store_true",
                        help="also read_state of a bootstrapped 10M-key checkpoint")
    parser.add_argument("--big-keys", type=int, default=10_000_000)
    parser.add_argument("--no-cluster", action="store_true", help="local[2] only")
    args = parser.parse_args()
    words = args.words or (1_000_000 if args.quick else 10_000_000)
    keys = args.keys or (100_000 if args.quick else 1_000_000)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} cores)", flush=True)

    tmp = tempfile.mkdtemp(prefix="ef-offline-")
    rows: list[tuple[str, ...]] = []
    try:
        text, wordcount = _wordcount_state(tmp, words, keys)
        states = {"wordcount": wordcount}
        if args.big:
            # Its checkpoint is written by the first session (_big_state).
            states["big"] = State("", args.big_keys, os.path.join(tmp, "big.parquet"))
        inp = Inputs(text, words, tmp, states, _phased_changes(tmp, keys), keys)
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
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    header = ("master", "case", "eddyflow s", "baseline", "baseline s", "ratio")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    c = inp.changes
    print(f"\nread_changes reads {c.bytes_read:,} bytes of the end checkpoint's "
          f"{c.full_bytes:,} ({c.bytes_read / c.full_bytes:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
