"""Validation benchmark: Spark replay of a word count's checkpoint.

A text of 10M words over 1M distinct words (``w`` and five letters, drawn
uniformly, so nearly every word of the vocabulary occurs) is counted by
examples/wordcount.py at parallelism 2; its final checkpoint (1M keys) is
then validated with ``eddyflow.offline.validate`` on ``local[2]``: the text
replayed up to the recorded byte offsets, tokenized and counted in Spark, and
compared key by key with the checkpoint's state, read by the executors.

Timed: ``validate`` on a started session (the JVM's start-up is reported on
its own). Baseline, measured in the same run on the same session: a plain
PySpark word count of the same file (``textFile -> flatMap(tokenize) ->
reduceByKey -> count``), i.e. what Spark needs just to recompute the counts.

Goal: validation <= 60 s on local[2].

    python benchmarks/validate.py           # 10M words, 1M keys
    python benchmarks/validate.py --quick   # 1M words, 100k keys
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any

GOAL_SECONDS = 60.0
HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "..", "examples", "wordcount.py")


def word(i: int) -> str:
    out = ""
    for _ in range(5):
        i, r = divmod(i, 26)
        out = chr(97 + r) + out
    return "w" + out


def write_text(path: str, words: int, keys: int) -> None:
    rng = random.Random(1)
    vocab = [word(i) for i in range(keys)]
    pick = rng.choices
    with open(path, "w") as f:
        left = words
        while left:
            n = min(left, 100_000)
            chunk = pick(vocab, k=n)
            f.write("\n".join(" ".join(chunk[i:i + 10]) for i in range(0, n, 10)) + "\n")
            left -= n


def plain_spark_wordcount(spark: Any, path: str) -> int:
    import re

    pattern = re.compile(r"[a-z]+(?:'[a-z]+)?")
    return int(spark.sparkContext.textFile(path, 4)
               .flatMap(lambda line: pattern.findall(line.lower()))
               .map(lambda w: (w, 1)).reduceByKey(lambda a, b: a + b).count())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--words", type=int, default=None)
    parser.add_argument("--keys", type=int, default=None)
    args = parser.parse_args()
    words = args.words or (1_000_000 if args.quick else 10_000_000)
    keys = args.keys or (100_000 if args.quick else 1_000_000)

    tmp = tempfile.mkdtemp(prefix="ef-validate-")
    try:
        text = os.path.join(tmp, "input.txt")
        t = time.perf_counter()
        write_text(text, words, keys)
        print(f"input: {words:,} words, {keys:,} keys, {os.path.getsize(text) / 1e6:.0f} MB "
              f"(written in {time.perf_counter() - t:.1f} s)")
        os.environ.update(WORDCOUNT_INPUT=text, WORDCOUNT_OUTPUT=os.path.join(tmp, "out"),
                          WORDCOUNT_CHECKPOINTS=os.path.join(tmp, "chk"))
        import eddyflow as ef
        from eddyflow.jobfile import build_environment

        env, _ = build_environment(JOB, parallelism=2)
        t = time.perf_counter()
        result = env.execute("wordcount")
        stream_s = time.perf_counter() - t
        distinct = len(result.state("count"))
        chk = ef.list_checkpoints(os.path.join(tmp, "chk"))[-1]
        print(f"streaming run: {stream_s:.1f} s, {distinct:,} keys, checkpoint {chk.id} "
              f"({chk.full_size / 1e6:.0f} MB of state)")
        del result, env

        from eddyflow.offline import spark_session, validate

        t = time.perf_counter()
        spark = spark_session("local[2]", app_name="eddyflow-bench")
        spark.sparkContext.parallelize([1], 1).count()
        start_s = time.perf_counter() - t

        t = time.perf_counter()
        baseline_keys = plain_spark_wordcount(spark, text)
        baseline_s = time.perf_counter() - t

        t = time.perf_counter()
        report = validate(spark, chk.path, job=JOB)
        validate_s = time.perf_counter() - t
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    assert baseline_keys == distinct, (baseline_keys, distinct)
    ok = report.ok and report.compared == distinct
    print(f"Spark start-up: {start_s:.1f} s (not counted)")
    print(f"plain PySpark word count:  {baseline_s:6.1f} s")
    print(f"eddyflow validate:         {validate_s:6.1f} s  "
          f"({validate_s / baseline_s:.2f}x the plain word count; "
          f"{sum(report.records_replayed.values()):,} lines replayed, "
          f"{report.compared:,} keys compared, consistent: {report.ok})")
    met = validate_s <= GOAL_SECONDS
    print(f"goal: validate <= {GOAL_SECONDS:.0f} s: {'met' if met else 'NOT met'}")
    return 0 if ok and (met or args.quick) else 1


if __name__ == "__main__":
    sys.exit(main())
