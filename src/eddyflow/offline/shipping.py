"""eddyflow ships itself to Spark executors: any session, any master.

The offline jobs run eddyflow's code on the executors (reading state files,
replaying sources, the runtime's operators), so the executors' Python must
import eddyflow and what eddyflow imports, and the job's modules. A Spark
user does not install a pure-Python library on every node: it travels with
the job (``SparkContext.addPyFile``). :func:`ship_to_executors` does that,
once per SparkContext (by its application id), and every offline entry
point calls it, so ``read_state``, ``validate`` … work with a session the
user built on any master, executors without eddyflow:

* **eddyflow** — the driver's own copy, as a zip, with the pure-Python
  packages its executor-side imports pull in (found by importing
  ``eddyflow`` and ``eddyflow.offline`` in a child interpreter and taking
  what is neither the standard library nor pyspark: today ``anyio``,
  ``aiofiles``, ``typing_extensions``). Shipped files come first on the
  executors' ``sys.path``, so executors run the driver's eddyflow even
  where another version is installed.
* **The job's modules** (``job=``) — the modules the job file imported from
  its folder (helpers beside it, packages under it), as a zip. The job file
  itself travels by value with its functions (cloudpickle: it and the
  modules beside it are registered by value), so executors never run its
  top-level code. Third-party packages the job imports are
  not shipped: they must be installed on the executors.
* **rocksdict** (binary; only for a checkpoint with RocksDB state: the
  compiled modules a state backend's registration names,
  ``state/registry.py``) — a zip
  of the driver's installed package, given with ``addFile`` (Python cannot
  import a compiled module from a zip): an executor that cannot import
  ``rocksdict`` unpacks it into its Spark files folder and imports it from
  there, if it was built for the executor's platform and Python (its
  ``EXT_SUFFIX``, e.g. ``.cpython-311-x86_64-linux-gnu.so``; Spark already
  requires the executors' Python to be the driver's minor version).
  Elsewhere install it on the executors (``pip install 'rocksdict>=0.3.29'``);
  an executor that has neither raises :class:`ExecutorDependencyMissing`,
  naming the module and the executor's Python.

Zips are built once per driver process, in a temporary folder removed at
exit, and named by a hash of their content; each shipment is logged at
INFO on the ``eddyflow.offline`` logger. Nothing here imports Spark at
module level: the executor side (:func:`import_on_executor`) runs there.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import hashlib
import importlib
import importlib.machinery
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from eddyflow.errors import EddyflowError
from eddyflow.state.registry import kind_named, kinds

if TYPE_CHECKING:
    from eddyflow.offline.checkpoint import CheckpointRef

__all__ = ["ExecutorDependencyMissing", "import_on_executor", "ship_to_executors",
           "shipped"]

log = logging.getLogger("eddyflow.offline")

#: What a ``rocksdict`` install needs on executors, for messages.
ROCKSDICT_REQUIREMENT = "rocksdict>=0.3.29"

#: Top-level modules Spark itself provides on executors.
_SPARK_PROVIDED = frozenset({"pyspark", "py4j"})

_lock = threading.Lock()
#: Application id -> what was shipped to its executors ("eddyflow",
#: "job:<zip name>", "native:rocksdict").
_shipped: dict[str, set[str]] = {}


class ExecutorDependencyMissing(EddyflowError):
    """An executor's Python cannot import a module eddyflow needs there and
    could not ship (see the module docstring); the message names the module,
    what needs it, the executor's Python and how to install it."""


def shipped(spark: Any) -> frozenset[str]:
    """What was shipped to the executors of ``spark`` (a session or
    context) so far."""
    sc = getattr(spark, "sparkContext", spark)
    with _lock:
        return frozenset(_shipped.get(sc.applicationId, ()))


def ship_to_executors(spark: Any, job: str | os.PathLike[str] | ModuleType | None = None, *,
                      checkpoint: CheckpointRef | None = None, modules: Iterable[str] = ()) -> None:
    """Make eddyflow, the modules of ``job`` (a job file's path or its
    loaded module) and the compiled modules the executors need available to
    the executors of ``spark`` (a SparkSession or SparkContext): those of
    the state backends whose state ``checkpoint`` holds (their
    registrations' ``executor_modules``, ``rocksdict`` for RocksDB), and
    ``modules`` (``bootstrap``: those of the backend the executors will
    write). Anything already shipped to this
    SparkContext is not shipped again."""
    sc = getattr(spark, "sparkContext", spark)
    with _lock:
        done = _shipped.setdefault(sc.applicationId, set())
        if "eddyflow" not in done:
            bundle = _eddyflow_bundle()
            sc.addPyFile(bundle.path)
            done.add("eddyflow")
            log.info("shipped eddyflow%s to the executors of %s (%s, %d kB)",
                     f" with {', '.join(bundle.extras)}" if bundle.extras else "",
                     sc.applicationId, os.path.basename(bundle.path), bundle.size // 1024)
        if job is not None:
            module = _job_module(job)
            _register_by_value(module)
            jobs = _job_bundle(module)
            if jobs is not None and f"job:{os.path.basename(jobs.path)}" not in done:
                sc.addPyFile(jobs.path)
                done.add(f"job:{os.path.basename(jobs.path)}")
                log.info("shipped the job's modules %s to the executors of %s (%s, %d kB)",
                         ", ".join(jobs.extras), sc.applicationId,
                         os.path.basename(jobs.path), jobs.size // 1024)
        wanted = set(modules)
        possible = {f"native:{m}" for kind in kinds() for m in kind.executor_modules}
        if checkpoint is not None and not possible <= done:
            wanted |= {m for name in checkpoint.backends
                       for m in kind_named(name).executor_modules}
        for name in sorted(wanted):
            if f"native:{name}" in done:
                continue
            native = _native_bundle(name)
            if native is None:
                log.warning("cannot ship %s (not installed on the driver): the executors of %s "
                            "must have it to read or write the state that needs it", name,
                            sc.applicationId)
            else:
                sc.addFile(native.path)
                log.info("shipped %s (binary, %s) to the executors of %s (%s, %d kB)", name,
                         _ext_suffix(), sc.applicationId, os.path.basename(native.path),
                         native.size // 1024)
            done.add(f"native:{name}")


def _register_by_value(module: ModuleType | None) -> None:
    """Have cloudpickle ship the job module, and the modules its folder
    holds, by value (in this process: every call, whatever was shipped)."""
    if module is None or not getattr(module, "__file__", None):
        return
    from pyspark import cloudpickle

    folder = os.path.dirname(os.path.abspath(module.__file__ or ""))
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if mod is module or (path and os.path.dirname(os.path.abspath(path)) == folder
                             and not name.startswith("eddyflow")):
            # A module not importable by name (a job run as __main__) is
            # pickled by value anyway.
            with contextlib.suppress(ValueError):
                cloudpickle.register_pickle_by_value(mod)  # type: ignore[no-untyped-call]


def _job_module(job: str | os.PathLike[str] | ModuleType) -> ModuleType | None:
    if isinstance(job, ModuleType):
        return job
    path = os.path.abspath(os.fspath(job))
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and os.path.abspath(f) == path:
            return mod
    return None


# --- building the zips (driver side) -------------------------------------------------


@dataclass(frozen=True)
class _Bundle:
    path: str
    size: int
    #: What it holds besides its main content (for the log).
    extras: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def _out_dir() -> str:
    d = tempfile.mkdtemp(prefix="eddyflow-ship-")
    atexit.register(shutil.rmtree, d, True)
    return d


def _files_of(top: str) -> list[tuple[str, str]]:
    """``(path on disk, name in the zip)`` of a top-level module or package
    folder, without bytecode caches."""
    if os.path.isfile(top):
        return [(top, os.path.basename(top))]
    base = os.path.dirname(top)
    out = []
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(folder, f)
            out.append((path, os.path.relpath(path, base)))
    return out


def _is_compiled(files: Iterable[tuple[str, str]]) -> bool:
    suffixes = (*importlib.machinery.EXTENSION_SUFFIXES, ".so", ".pyd", ".dylib")
    return any(name.endswith(suffixes) for _, name in files)


def _write_zip(stem: str, files: list[tuple[str, str]]) -> _Bundle:
    """A zip of ``files`` named ``<stem>-<hash of content>.zip``: the same
    content always has the same name, so Spark never sees one name with two
    contents."""
    buf = io.BytesIO()
    digest = hashlib.sha256()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, name in sorted(files, key=lambda f: f[1]):
            with open(path, "rb") as fh:
                data = fh.read()
            digest.update(name.encode() + b"\0" + data)
            # A fixed date: the hash, not the file times, tells contents apart.
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    path = os.path.join(_out_dir(), f"{stem}-{digest.hexdigest()[:16]}.zip")
    if not os.path.exists(path):
        tmp = path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(buf.getvalue())
        os.replace(tmp, path)
    return _Bundle(path, len(buf.getvalue()), ())


_PROBE = """
import json, sys
before = set(sys.modules)
import eddyflow, eddyflow.offline
out = {}
for name, mod in list(sys.modules.items()):
    top = name.partition(".")[0]
    # (``__mp_main__``: multiprocessing's alias of ``__main__``, not a package.)
    if name in before or "." in name or top in sys.stdlib_module_names or name.startswith("__"):
        continue
    path = getattr(mod, "__path__", None)
    out[name] = list(path) if path is not None else getattr(mod, "__file__", None)
print(json.dumps(out))
"""


def executor_imports() -> dict[str, list[str] | str | None]:
    """The top-level modules, not of the standard library, that importing
    eddyflow and its offline package loads (what an executor imports to run
    eddyflow's functions), with their locations: asked of a child
    interpreter of this Python, with this process's environment."""
    import eddyflow

    # This process's eddyflow, wherever it came from (an install, a
    # PYTHONPATH, a notebook's sys.path): first on the child's path.
    here = os.path.dirname(os.path.dirname(os.path.abspath(eddyflow.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"cannot list eddyflow's imports: {done.stderr.strip()[-2000:]}")
    found: dict[str, list[str] | str | None] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@functools.lru_cache(maxsize=1)
def _eddyflow_bundle() -> _Bundle:
    import eddyflow

    files = _files_of(os.path.dirname(os.path.abspath(eddyflow.__file__)))
    extras = []
    for name, where in sorted(executor_imports().items()):
        if name == "eddyflow" or name in _SPARK_PROVIDED or where is None:
            continue
        tops = where if isinstance(where, list) else [where]
        dep: list[tuple[str, str]] = []
        for top in tops:
            dep += _files_of(top)
        if _is_compiled(dep):
            # Cannot be imported from a zip: the executors need it installed
            # (an import error there is reported as ExecutorDependencyMissing).
            log.warning("eddyflow imports %s, which is compiled: the executors must have it "
                        "installed", name)
            continue
        files += dep
        extras.append(name)
    bundle = _write_zip(f"eddyflow-{_version()}", files)
    return _Bundle(bundle.path, bundle.size, tuple(extras))


def _version() -> str:
    import eddyflow

    return str(getattr(eddyflow, "__version__", "0"))


def _job_bundle(module: ModuleType | None) -> _Bundle | None:
    """The modules ``module`` (a job file's) imported from its folder."""
    if module is None or not getattr(module, "__file__", None):
        return None
    folder = os.path.dirname(os.path.abspath(module.__file__ or ""))
    tops: dict[str, str] = {}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if mod is module or not f or name.startswith("eddyflow"):
            continue
        f = os.path.abspath(f)
        if not f.startswith(folder + os.sep):
            continue
        top = name.partition(".")[0]
        first = os.path.relpath(f, folder).split(os.sep)[0]
        # Importable by its name from the folder: ``helpers`` is
        # helpers.py, ``lib.x`` is under lib/ (not a module the folder's
        # path reached another way, e.g. a venv inside it).
        if first in (top, top + ".py") or first.startswith(top + "."):
            tops[top] = os.path.join(folder, first)
    files = [f for top in sorted(tops) for f in _files_of(tops[top])]
    if not files:
        return None
    stem = "job-" + os.path.splitext(os.path.basename(module.__file__ or "job"))[0]
    bundle = _write_zip(stem, files)
    return _Bundle(bundle.path, bundle.size, tuple(sorted(tops)))


def _ext_suffix() -> str:
    return str(sysconfig.get_config_var("EXT_SUFFIX") or "")


def _native_name(module: str) -> str:
    """Names of shipped native packages: ``eddyflow-native-<module>-<ext
    suffix>-<hash>.zip`` — the suffix says which Python and platform its
    compiled files are for."""
    return f"eddyflow-native-{module}-{_ext_suffix().strip('.').replace('.', '-')}"


@functools.cache
def _native_bundle(module: str) -> _Bundle | None:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    paths = list(getattr(mod, "__path__", []))
    if not paths:
        return None
    files = [f for p in paths for f in _files_of(p)
             if not f[1].endswith(".pyi")]  # type stubs: 30 kB nobody reads there
    return _write_zip(_native_name(module), files)


# --- the executor side ---------------------------------------------------------------


_WHY = {"rocksdict": "reading a checkpoint with RocksDB state"}


def import_on_executor(module: str) -> ModuleType:
    """Import ``module`` here (an executor), from the executor's Python or
    else from the copy the driver shipped (see the module docstring);
    :class:`ExecutorDependencyMissing` if neither works."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = exc
    shipped_zip = _shipped_native(module)
    if shipped_zip is not None:
        target = os.path.abspath(shipped_zip[:-len(".zip")])  # the root may be "."
        if not os.path.isdir(target):
            # Unpacked once per executor, beside the shipped file, and
            # renamed into place: concurrent tasks never see half of it.
            staging = tempfile.mkdtemp(prefix=os.path.basename(target) + ".",
                                       dir=os.path.dirname(target))
            with zipfile.ZipFile(shipped_zip) as z:
                z.extractall(staging)
            try:
                os.rename(staging, target)
            except OSError:  # another task got there first
                shutil.rmtree(staging, ignore_errors=True)
        if target not in sys.path:
            sys.path.insert(1, target)
        importlib.invalidate_caches()
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            missing = exc
    others = _other_platform_native(module)
    shipped_note = (f"; the driver shipped one built for another Python or platform "
                    f"({', '.join(others)}), not for this one ({_ext_suffix()})" if others
                    else "")
    requirement = ROCKSDICT_REQUIREMENT if module == "rocksdict" else module
    raise ExecutorDependencyMissing(
        f"module {module!r}, which {_WHY.get(module, 'eddyflow')} needs on the executors, "
        f"cannot be imported by this executor's Python ({sys.executable}): {missing}"
        f"{shipped_note}; install it there (pip install '{requirement}')") from missing


def _spark_files_root() -> str | None:
    with contextlib.suppress(Exception):
        from pyspark import SparkFiles

        root: str = SparkFiles.getRootDirectory()
        return root
    return None


def _shipped_native(module: str) -> str | None:
    root = _spark_files_root()
    if root is None:
        return None
    found = sorted(glob.glob(os.path.join(glob.escape(root), _native_name(module) + "-*.zip")))
    return found[-1] if found else None


def _other_platform_native(module: str) -> list[str]:
    root = _spark_files_root()
    if root is None:
        return []
    prefix = f"eddyflow-native-{module}-"
    return sorted({os.path.basename(p)[len(prefix):].rsplit("-", 1)[0]
                   for p in glob.glob(os.path.join(glob.escape(root), prefix + "*.zip"))
                   if not os.path.basename(p).startswith(_native_name(module) + "-")})
