"""Change-feed benchmark: ``read_changes`` between two checkpoints with 1% of
the keys changed, against a full read and a plain PySpark diff.

The phased job of the offline tests (tests/offline/jobs/phased_state.py)
writes n keys (a dict value each), waits for a checkpoint (a), then changes
1% of the keys, clears 1%, rewrites 1% with their old value and creates and
clears 1% more (the final checkpoint, b); memory backend, parallelism 2, so
b's chain of files is a's plus two small deltas per subtask.

Timed on ``local[2]`` in one session (the JVM's start-up not counted), each
a ``count()``:

* ``read_changes(a, b)``: the delta files only (bytes read printed, against
  the whole state of b);
* ``read_changes(a, b, exact=True)``: those joined with a's state;
* ``read_state(b)``: the whole state, typed and as text;
* baseline, plain PySpark, same run: the two states saved as Parquet
  beforehand (not timed), then read and full-outer joined on
  (operator, state, key) keeping the rows whose value differs — the diff a
  Spark user would write over snapshots of the state.

    python benchmarks/changes.py            # 1M keys
    python benchmarks/changes.py --quick    # 100k keys
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "..", "tests", "offline", "jobs", "phased_state.py")


def timed(f: Callable[[], int]) -> tuple[float, int]:
    t = time.perf_counter()
    n = f()
    return time.perf_counter() - t, n


def plain_diff(spark: Any, a: str, b: str) -> int:
    from pyspark.sql import functions as F

    left = spark.read.parquet(a).select("operator", "state", "key", F.col("value").alias("va"))
    right = spark.read.parquet(b).select("operator", "state", "key", F.col("value").alias("vb"))
    joined = left.join(right, ["operator", "state", "key"], "full_outer")
    return int(joined.filter(~F.col("va").eqNullSafe(F.col("vb"))).count())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keys", type=int, default=None)
    args = parser.parse_args()
    keys = args.keys or (100_000 if args.quick else 1_000_000)
    changed = keys // 100
    tmp = tempfile.mkdtemp(prefix="ef-changes-")
    try:
        chk = os.path.join(tmp, "chk")
        os.environ.update(PHASED_KEYS=str(keys), PHASED_CHANGED=str(changed),
                          PHASED_CHECKPOINTS=chk, PHASED_BACKEND="memory")
        import eddyflow as ef
        from eddyflow.jobfile import build_environment

        env, _ = build_environment(JOB, parallelism=2)
        env.enable_checkpointing(interval=0.1, directory=chk, retained=1000)
        t = time.perf_counter()
        env.execute("phased")
        print(f"streaming run: {time.perf_counter() - t:.1f} s, {keys:,} keys, "
              f"{changed:,} changed")
        infos = ef.list_checkpoints(chk)
        a = [i.id for i in infos if any(
            p.is_source and p.position == keys
            for op in i.meta.operators.values() for p in op.subtasks.values())][-1]
        b = infos[-1].id

        from eddyflow.offline import plan_changes, read_changes, read_state, spark_session

        plan = plan_changes(chk, a, b)
        spark = spark_session("local[2]", app_name="eddyflow-bench")
        spark.sparkContext.parallelize([1], 1).count()
        for c in (a, b):
            read_state(spark, os.path.join(chk, f"chk-{c}"), as_text=True).write.parquet(
                os.path.join(tmp, f"state-{c}"))
        base_s, base_n = timed(lambda: plain_diff(spark, os.path.join(tmp, f"state-{a}"),
                                                  os.path.join(tmp, f"state-{b}")))
        runs = {
            "read_changes": lambda: int(read_changes(spark, chk, start=a, end=b).count()),
            "read_changes exact": lambda: int(
                read_changes(spark, chk, start=a, end=b, exact=True).count()),
            "read_state (typed)": lambda: int(
                read_state(spark, os.path.join(chk, f"chk-{b}")).count()),
            "read_state (as_text)": lambda: int(
                read_state(spark, os.path.join(chk, f"chk-{b}"), as_text=True).count()),
        }
        results = {name: timed(f) for name, f in runs.items()}
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"load average: {os.getloadavg()[0]:.1f} (2 cores)")
    print(plan.describe())
    print(f"bytes read: {plan.bytes_read:,} of {plan.full_bytes:,} "
          f"({plan.bytes_read / plan.full_bytes:.1%})")
    print(f"{'plain PySpark Parquet diff':28s} {base_s:7.2f} s  {base_n:>9,} rows  1.00x")
    for name, (s, n) in results.items():
        print(f"{name:28s} {s:7.2f} s  {n:>9,} rows  {s / base_s:.2f}x")
    exact_n = results["read_changes exact"][1]
    return 0 if exact_n == base_n else 1


if __name__ == "__main__":
    sys.exit(main())
