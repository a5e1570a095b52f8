"""Loading job files: a Python file that defines ``build(env)``.

The same file runs directly (``python JOB.py``), under ``eddyflow run`` and,
later, under offline validation, so loading lives here rather than in the
CLI.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any

from eddyflow.environment import StreamEnvironment

__all__ = ["JobFileError", "build_environment", "load_job"]


class JobFileError(Exception):
    """The job file is missing, cannot be loaded (a syntax error, an
    exception while its module runs, an import that fails), does not
    define ``build(env)``, or its ``build(env)`` raised.

    The message is one line that says where and why (``jobs/bad.py:3:
    invalid syntax``); ``__cause__`` is the original exception.
    """


def load_job(path: str | os.PathLike[str]) -> ModuleType:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise JobFileError(f"job file {path!r} does not exist")
    name = "_eddyflow_job_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise JobFileError(f"job file {path!r} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    # Job files import their neighbours (helpers beside them) like scripts do.
    folder = os.path.dirname(os.path.abspath(path))
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except SyntaxError as exc:  # (in the job file, or in a module it imports)
        sys.modules.pop(name, None)
        raise JobFileError(_syntax_error(exc, path)) from exc
    except Exception as exc:
        sys.modules.pop(name, None)
        raise JobFileError(f"{_where(exc, path)}: {type(exc).__name__}: {exc}") from exc
    finally:
        if added:
            sys.path.remove(folder)
    build = getattr(module, "build", None)
    if not callable(build):
        raise JobFileError(f"job file {path!r} does not define build(env)")
    return module


def build_environment(
    path: str | os.PathLike[str], **env_options: Any
) -> tuple[StreamEnvironment, ModuleType]:
    """A new environment with the job of ``path`` declared in it.

    :class:`JobFileError` if the file cannot be loaded or its ``build(env)``
    raises; an error in ``env_options`` raises as ``StreamEnvironment`` does.
    """
    module = load_job(path)
    env = StreamEnvironment(**env_options)
    build: Callable[[StreamEnvironment], None] = module.build
    try:
        build(env)
    except Exception as exc:
        raise JobFileError(f"{_where(exc, os.fspath(path))}: build(env) raised "
                           f"{type(exc).__name__}: {exc}") from exc
    return env, module


def _syntax_error(exc: SyntaxError, path: str) -> str:
    """``file:line: message`` of a syntax error, named as the user named
    the job file when it is in that file."""
    where = exc.filename or path
    if os.path.abspath(where) == os.path.abspath(path):
        where = path
    line = f":{exc.lineno}" if exc.lineno else ""
    return f"{where}{line}: {exc.msg}"


def _where(exc: BaseException, path: str) -> str:
    """``path:line``: the job file's last line on ``exc``'s way up (the
    line of the job that raised it, or that called what raised it)."""
    target = os.path.abspath(path)
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.abspath(frame.filename) == target:
            line = frame.lineno
    return f"{path}:{line}" if line else path
