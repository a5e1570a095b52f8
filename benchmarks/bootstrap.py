"""Bootstrap benchmark: a checkpoint of 1M keys written from a DataFrame.

A DataFrame of 1M (word, count) rows (``w`` and five letters, counts drawn
uniformly), made in Spark and cached, is bootstrapped into
examples/wordcount.py's ``count`` operator at parallelism 2 on ``local[2]``,
in either backend's format: converted and recorded on the executors,
shuffled by key group, each subtask's state written by the backend's own
snapshot, the metadata written last.

Baselines, in the same run on the same session and cached DataFrame: plain
PySpark writing the same rows as Parquet after the same kind of shuffle
(``repartition(2, word).write.parquet``), i.e. Spark's own cost of
partitioning 1M rows and writing them to files, all in the JVM; and the rows
merely handed to Python workers and counted there (``df.rdd.mapPartitions``),
the floor of anything that runs Python code per row without Arrow (pyarrow
is not a dependency).

    python benchmarks/bootstrap.py            # 1M keys
    python benchmarks/bootstrap.py --keys 100000
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "..", "examples", "wordcount.py")


def counts(spark: Any, keys: int) -> Any:
    from pyspark.sql import functions as F

    # "w" and five letters from the row number, as benchmarks/validate.py's words.
    letters = [F.chr(F.lit(97) + (F.floor(F.col("id") / (26 ** k)) % 26)) for k in range(5)]
    df = spark.range(keys).select(
        F.concat(F.lit("w"), *reversed(letters)).alias("word"),
        (F.col("id") % 1000 + 1).alias("n"))
    return df.cache()


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    from eddyflow.offline import bootstrap, open_checkpoint, spark_session

    t0 = time.perf_counter()
    spark = spark_session(args.master, app_name="eddyflow-bootstrap-bench")
    startup = time.perf_counter() - t0
    df = counts(spark, args.keys)
    assert df.count() == args.keys
    work = tempfile.mkdtemp(prefix="eddyflow-bootstrap-bench-")
    os.environ["WORDCOUNT_INPUT"] = os.path.join(work, "rest.txt")
    with open(os.environ["WORDCOUNT_INPUT"], "w") as f:
        f.write("a b c\n")
    try:
        plain, _ = timed(lambda: df.repartition(2, "word").write.parquet(
            os.path.join(work, "plain.parquet")))
        rows_in_python, _ = timed(lambda: df.rdd.mapPartitions(
            lambda it: [sum(1 for _ in it)]).sum())
        rows = []
        for backend in ("memory", "rocksdb"):
            seconds, path = timed(lambda b=backend: bootstrap(
                spark, df, job=JOB, operator="count", key="word", state="count", value="n",
                directory=os.path.join(work, f"backfill-{b}"), parallelism=2, backend=b))
            meta = open_checkpoint(path).meta
            rows.append((backend, seconds, meta.full_size))
        print(f"bootstrap of {args.keys:,} keys on {args.master} (Spark start-up "
              f"{startup:.1f} s, not counted)")
        print(f"| case | seconds | vs plain PySpark |\n|---|---|---|\n"
              f"| plain PySpark: repartition + write Parquet | {plain:.1f} | 1.00x |\n"
              f"| plain PySpark: the rows into Python workers, counted | {rows_in_python:.1f} | "
              f"{rows_in_python / plain:.2f}x |")
        for backend, seconds, size in rows:
            print(f"| eddyflow bootstrap, {backend} ({size / 2**20:.0f} MiB written) | "
                  f"{seconds:.1f} | {seconds / plain:.2f}x |")
        print(f"load average: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
