"""eddyflow's own errors out of Spark's wrappers.

An exception raised by eddyflow code on a Spark executor (a state file that
does not verify, a source that cannot be replayed) reaches the driver as
pyspark's ``PythonException`` or Py4J's ``Py4JJavaError``, whose text is the
Java stack trace with the Python worker's traceback inside: a hundred lines
in which eddyflow's one-line message is hard to find. :func:`spark_errors`
finds the original exception's class and message in that text (the last
traceback's last line: the exception the worker raised) and raises it as
itself when it is one of eddyflow's, or as :class:`SparkTaskFailed` (its
class and message, one line) when it is not. No Spark import here: the
wrappers are recognised by the name of their class.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from eddyflow.checkpoint.storage import CheckpointCorrupted
from eddyflow.errors import EddyflowError
from eddyflow.jobfile import JobFileError
from eddyflow.offline.replay import ReplayError
from eddyflow.offline.shipping import ExecutorDependencyMissing

__all__ = ["BootstrapError", "SparkTaskFailed", "original_error", "spark_errors"]

#: eddyflow's errors raised on executors, by the name a traceback gives
#: them; each takes its message as its only argument.
_OURS: dict[str, type[Exception]] = {
    "eddyflow.checkpoint.storage.CheckpointCorrupted": CheckpointCorrupted,
    "eddyflow.offline.replay.ReplayError": ReplayError,
    "eddyflow.jobfile.JobFileError": JobFileError,
    "eddyflow.offline.shipping.ExecutorDependencyMissing": ExecutorDependencyMissing,
}
_WRAPPERS = frozenset({"PythonException", "Py4JJavaError", "CapturedException"})
_TRACEBACK = "Traceback (most recent call last):"
# The line a traceback ends with: "module.Class: message" (or "Class").
_RAISED = re.compile(r"(?P<cls>[A-Za-z_][\w.]*)(?:: (?P<msg>.*))?")


class BootstrapError(EddyflowError, ValueError):
    """``bootstrap`` cannot write the checkpoint asked for: an operator,
    state or column that does not exist, a key given twice, a value the
    state cannot hold (raised on the driver, or on an executor and raised
    again as itself by :func:`spark_errors`)."""


_OURS["eddyflow.offline.errors.BootstrapError"] = BootstrapError


class SparkTaskFailed(EddyflowError):
    """A Spark task raised an exception that is not one of eddyflow's: its
    class and message, on one line (``__cause__``: Spark's exception)."""


def _is_wrapper(exc: BaseException) -> bool:
    return any(c.__name__ in _WRAPPERS for c in type(exc).__mro__)


def original_error(exc: BaseException) -> Exception | None:
    """The exception a Python worker raised, found in the text of Spark's
    ``exc``: eddyflow's own error as itself, another as
    :class:`SparkTaskFailed`; ``None`` if ``exc`` holds no Python traceback."""
    if not _is_wrapper(exc):
        return None
    text = str(exc)
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None
    # After the frames (indented lines), the first line that is not
    # indented names the exception; its message may go on over more lines,
    # up to the end of the Python text (Spark appends " SQLSTATE: ..." or a
    # Java frame "\tat ...").
    lines = text[start + len(_TRACEBACK):].splitlines()
    for i, line in enumerate(lines):
        if not line or line[0] in " \t":
            continue
        m = _RAISED.fullmatch(line.strip())
        if m is None:
            return None
        message = m.group("msg") or ""
        for more in lines[i + 1:]:
            if not more.strip() or more.startswith(("\tat ", " SQLSTATE", "\t")):
                break
            message += " " + more.strip()
        cls_name = m.group("cls")
        if cls_name == "ModuleNotFoundError":
            # An executor without a module the functions it was sent import:
            # not one eddyflow ships (shipping.py), or a third-party one of
            # the job's.
            return ExecutorDependencyMissing(
                f"an executor's Python cannot import a module the job needs there: {message}; "
                "eddyflow ships itself, its pure-Python dependencies and the modules in the "
                "job file's folder (eddyflow.offline.shipping): install the others on the "
                "executors")
        known = _OURS.get(cls_name)
        if known is not None:
            return known(message)
        return SparkTaskFailed(f"{cls_name.rsplit('.', 1)[-1]}: {message}" if message
                               else cls_name)
    return None


@contextmanager
def spark_errors() -> Iterator[None]:
    """Raise the original error of a Spark task that fails inside the block
    (see the module docstring), from Spark's."""
    try:
        yield
    except Exception as exc:
        original = original_error(exc)
        if original is None:
            raise
        raise original from exc
