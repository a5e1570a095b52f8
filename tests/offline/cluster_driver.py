"""A Spark driver program as a user would write one, for the cluster tests:
its own ``SparkSession.builder.master(...).getOrCreate()``, no
``PYSPARK_PYTHON``, eddyflow's offline readers and ``validate`` called on
it. Run in a child process (one SparkContext per process, and its
environment is the test's to choose); prints what it saw as JSON.

    python cluster_driver.py SPEC.json   (SPEC: master, conf, src, paths; optional:
                                          changes, pairs of checkpoints for
                                          read_changes; bootstrap, a text and
                                          the folders to bootstrap into)
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from typing import Any


def executor_view(_: Any) -> tuple[str, str | None, str | None]:
    """An executor's Python, and where it would import eddyflow and anyio
    from (``None``: it cannot)."""
    def where(name: str) -> str | None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        return None if spec is None else str(spec.origin)
    return os.path.realpath(sys.executable), where("eddyflow"), where("anyio")


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _text(x: Any) -> str:
    """A typed column's value as text, whatever type the reader chose."""
    return str(x.asDict(recursive=True) if hasattr(x, "asDict") else x)


def changes(spark: Any, pair: dict[str, Any]) -> dict[str, Any]:
    """``read_changes`` between two checkpoints (as given and ``exact``),
    and ``read_state`` of both, all as text rows."""
    from eddyflow.offline import read_changes, read_state

    d, a, b = pair["dir"], pair["start"], pair["end"]
    out: dict[str, Any] = {}
    for exact in (False, True):
        rows = read_changes(spark, d, start=a, end=b, exact=exact).collect()
        out[f"exact={exact}"] = sorted(
            [r["checkpoint"], r["change"], r["operator"], r["key_group"], _text(r["key"]),
             r["state"], _text(r["value"])] for r in rows)
    for name, n in (("start", a), ("end", b)):
        rows = read_state(spark, os.path.join(d, f"chk-{n}")).collect()
        out[name] = sorted([r["operator"], r["state"], _text(r["key"]), _text(r["value"])]
                           for r in rows)
    return out


def bootstrapped(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Word counts of a text by a Spark batch job, bootstrapped into the
    word count's ``count`` operator in each backend's format; each
    checkpoint validated."""
    from pyspark.sql import functions as F

    from eddyflow.offline import bootstrap, validate

    # The job as it will run: its sources' positions at the start are
    # positions in the input it will read.
    os.environ.update(spec.get("env", {}))
    words = spark.read.text(spec["text"]).select(
        F.explode(F.split("value", " ")).alias("word"))
    counts = words.where(F.col("word") != "").groupBy("word").agg(F.count("*").alias("n"))
    out: dict[str, Any] = {}
    for backend, directory in spec["dirs"].items():
        path = bootstrap(spark, counts, job=spec["job"], operator="count", key="word",
                         state="count", value="n", directory=directory, parallelism=2,
                         backend=backend)
        report = validate(spark, path, job=spec["job"])
        out[backend] = {"path": path, "ok": report.ok, "compared": report.compared,
                        "mismatches": report.mismatch_count}
    return out


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    # eddyflow from the tree under test, put on this process's path only:
    # not in PYTHONPATH, which local-mode executors would inherit.
    if spec.get("src"):
        sys.path.insert(0, spec["src"])
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(spec["master"]).appName("eddyflow cluster test")
    for k, v in spec.get("conf", {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sc = spark.sparkContext
    out: dict[str, Any] = {"pythonpath": os.environ.get("PYTHONPATH"),
                           "pyspark_python": os.environ.get("PYSPARK_PYTHON")}
    try:
        out["before"] = sorted(set(sc.parallelize(range(4), 4).map(executor_view).collect()))

        collect = Collect()
        log = logging.getLogger("eddyflow.offline")
        log.addHandler(collect)
        log.setLevel(logging.INFO)
        from eddyflow.offline import read_positions, read_state, validate
        from eddyflow.offline.errors import spark_errors
        from eddyflow.offline.shipping import import_on_executor, ship_to_executors, shipped

        state = read_state(spark, spec["memory"], operator="count")
        out["state"] = sorted([str(r["key"]), str(r["value"]), r["key_group"]]
                              for r in state.collect())
        out["first_logs"] = list(collect.messages)
        out["after"] = sorted(set(sc.parallelize(range(4), 4).map(executor_view).collect()))
        collect.messages.clear()
        ship_to_executors(spark)
        out["second_logs"] = list(collect.messages)

        out["positions"] = sorted([r["operator"], r["subtask"], r["position"]]
                                  for r in read_positions(spark, spec["memory"]).collect())
        for name in ("job", "packaged_job"):
            report = validate(spark, spec["memory"], job=spec[name])
            out[f"validate_{name}"] = {"ok": report.ok, "compared": report.compared,
                                       "mismatches": report.mismatch_count,
                                       "replayed": report.records_replayed,
                                       "unreplayed": report.unreplayed}
        if spec.get("rocksdb"):
            rocks = read_state(spark, spec["rocksdb"], operator="count")
            out["rocksdb_state"] = sorted([str(r["key"]), str(r["value"]), r["key_group"]]
                                          for r in rocks.collect())
        out["shipped"] = sorted(shipped(spark))
        out["logs"] = list(collect.messages)
        for name, pair in spec.get("changes", {}).items():
            out[f"changes_{name}"] = changes(spark, pair)
        if spec.get("bootstrap"):
            out["bootstrap"] = bootstrapped(spark, spec["bootstrap"])

        try:
            with spark_errors():
                sc.parallelize([0], 1).map(
                    lambda _: import_on_executor("eddyflow_absent_module")).collect()
        except Exception as exc:
            out["missing"] = [type(exc).__name__, str(exc)]
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
