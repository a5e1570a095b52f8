"""A Spark session for the offline jobs, configured for a laptop or a cluster.

On a ``local`` master the executors' Python defaults (``PYSPARK_PYTHON``)
to the driver's own, ``sys.executable``: the same version, with the job's
third-party imports. On a cluster Spark's default stands (the nodes'
``python3``, or ``PYSPARK_PYTHON`` if set): the driver's path may not exist
there, and executors need not have eddyflow, which ships itself to them
(``shipping.py``); they need the driver's Python minor version.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["spark_session"]


def spark_session(master: str | None = None, app_name: str = "eddyflow") -> Any:
    """The active Spark session, or a new one on ``master`` (default
    ``local[*]``; any Spark master URL works unchanged)."""
    if (master or "local[*]").startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name).master(master or "local[*]")
    spark = (builder
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", os.environ.get("EDDYFLOW_SPARK_DRIVER_MEMORY", "2g"))
             .config("spark.sql.shuffle.partitions", "8")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark
