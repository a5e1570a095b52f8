"""Finding eddyflow's own error inside Spark's wrappers
(``eddyflow.offline.errors``), without Spark: the wrappers are recognised by
their class name and read as text, which is all the driver gets of an
executor's exception."""

from __future__ import annotations

import pytest

from eddyflow.checkpoint.storage import CheckpointCorrupted
from eddyflow.offline.errors import SparkTaskFailed, original_error, spark_errors
from eddyflow.offline.replay import ReplayError

WORKER = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/spark/python/pyspark/worker.py", line 4327, in invoke_udf
    run_process()
  File "/src/eddyflow/state/storage.py", line 150, in _check
    raise CheckpointCorrupted(f"{path}: checksum mismatch")
{raised}
"""

JAVA = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 8 in stage 1.0 failed
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/spark/python/pyspark/worker.py", line 4327, in invoke_udf
    run_process()
{raised}
 SQLSTATE: 38000
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(x.scala:1)
\tat java.base/java.lang.Thread.run(Thread.java:840)
"""


class PythonException(Exception):  # named as pyspark's
    pass


class Py4JJavaError(Exception):  # named as py4j's
    pass


@pytest.mark.parametrize("wrapper, text", [(PythonException, WORKER), (Py4JJavaError, JAVA)])
def test_eddyflows_errors_come_out_as_themselves(wrapper: type[Exception], text: str) -> None:
    raised = ("eddyflow.checkpoint.storage.CheckpointCorrupted: /chk/shared/op-0-1.full: "
              "checksum mismatch")
    got = original_error(wrapper(text.replace("{raised}", raised)))
    assert type(got) is CheckpointCorrupted
    assert str(got) == "/chk/shared/op-0-1.full: checksum mismatch"
    got = original_error(wrapper(text.replace(
        "{raised}", "eddyflow.offline.replay.ReplayError: source 'src' is not replayable")))
    assert type(got) is ReplayError and str(got) == "source 'src' is not replayable"


def test_another_error_is_one_line_of_its_class_and_message() -> None:
    got = original_error(PythonException(WORKER.replace("{raised}", "KeyError: 'sensor-7'")))
    assert type(got) is SparkTaskFailed and str(got) == "KeyError: 'sensor-7'"


def test_the_last_traceback_is_the_one_raised() -> None:
    chained = WORKER.replace("{raised}", "ValueError: inner\n\nDuring handling of the above "
                             "exception, another exception occurred:\n\n" + WORKER.replace(
                                 "An exception was thrown from the Python worker:\n", "")
                             .replace("{raised}", "eddyflow.offline.replay.ReplayError: outer"))
    got = original_error(PythonException(chained))
    assert type(got) is ReplayError and str(got) == "outer"


def test_other_exceptions_are_left_alone() -> None:
    assert original_error(ValueError(WORKER)) is None  # not a Spark wrapper
    assert original_error(PythonException("no traceback here")) is None
    with pytest.raises(KeyError), spark_errors():
        raise KeyError("x")
    with pytest.raises(CheckpointCorrupted, match="checksum mismatch") as info, spark_errors():
        raise PythonException(WORKER.replace(
            "{raised}", "eddyflow.checkpoint.storage.CheckpointCorrupted: f: checksum mismatch"))
    assert isinstance(info.value.__cause__, PythonException)
