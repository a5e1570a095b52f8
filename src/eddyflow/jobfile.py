"""Loading job files: a Python file that defines ``build(env)``.

The same file runs directly (``python JOB.py``), under ``eddyflow run`` and,
later, under offline validation, so loading lives here rather than in the
CLI.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from eddyflow.environment import StreamEnvironment

__all__ = ["JobFileError", "build_environment", "load_job"]


class JobFileError(Exception):
    """The job file is missing or does not define ``build(env)``."""


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
    """A new environment with the job of ``path`` declared in it."""
    module = load_job(path)
    env = StreamEnvironment(**env_options)
    build: Callable[[StreamEnvironment], None] = module.build
    build(env)
    return env, module
