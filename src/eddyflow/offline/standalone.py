"""A local Spark standalone cluster from the pyspark package: for tests,
benchmarks and trying a cluster on a laptop.

``start_cluster()`` runs a standalone master and workers
(``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``
from the pyspark package's own Spark), bound to 127.0.0.1 on free ports,
each in its own process group, and ``stop()`` kills those groups and waits
for them: no JVM is left behind.

Its executors run a Python of their own, as a real cluster's would: by
default ``bare_python()``, a virtual environment of the base interpreter
with nothing installed (not eddyflow, not its dependencies, not pyspark),
made once and cached per Python version. It is first on the workers'
``PATH``, so it is the ``python3`` a Spark session runs its executors with
when neither ``PYSPARK_PYTHON`` nor ``spark.pyspark.python`` says otherwise;
pyspark's own worker code reaches it as on any cluster, through the
``python/lib/pyspark.zip`` Spark puts on executors' ``PYTHONPATH``. The
daemons start from an environment without the caller's ``PYTHONPATH`` and
``PYSPARK_*`` variables, so nothing of the driver's Python leaks into the
executors: what they can import, they were shipped (``shipping.py``).

Command line: ``python -m eddyflow.offline.standalone`` starts one and
prints its master URL until interrupted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["StandaloneCluster", "bare_python", "can_import", "cluster", "start_cluster"]

log = logging.getLogger("eddyflow.offline")

#: What the daemons must not inherit from the caller: it would decide the
#: executors' Python and what it imports.
_SCRUBBED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYSPARK_PYTHON",
             "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "SPARK_HOME", "SPARK_CONF_DIR",
             "SPARK_MASTER_HOST", "SPARK_MASTER_PORT", "SPARK_WORKER_CORES",
             "SPARK_WORKER_MEMORY", "SPARK_WORKER_INSTANCES", "SPARK_LOCAL_IP",
             "SPARK_PUBLIC_DNS", "_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS")


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "eddyflow"


def bare_python(cache_dir: str | os.PathLike[str] | None = None) -> str:
    """A Python of this interpreter's version with nothing installed: a
    ``venv`` of the base interpreter without pip or system site-packages,
    made once under ``cache_dir`` (default ``~/.cache/eddyflow``) and
    reused. Returns its ``bin/python``."""
    root = Path(cache_dir) if cache_dir is not None else _cache_dir()
    version = ".".join(map(str, sys.version_info[:3]))
    home = root / f"bare-python-{version}"
    python = home / "bin" / "python"
    if python.exists():
        return str(python)
    root.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    # Made beside its final place and renamed into it: a venv half made by
    # an interrupted run is never taken for a whole one. (Without pip, a
    # venv is found by its pyvenv.cfg wherever it is: it may be moved.)
    staging = Path(tempfile.mkdtemp(prefix=home.name + ".", dir=root))
    try:
        subprocess.run([base, "-m", "venv", "--without-pip", str(staging)], check=True,
                       capture_output=True, timeout=120)
        with contextlib.suppress(OSError):  # another process made it first
            os.rename(staging, home)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"cannot make a bare venv of {base}: "
                           f"{exc.stderr.decode(errors='replace').strip()}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(python)


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env.update(extra or {})
    return env


def can_import(python: str, module: str) -> bool:
    """Whether ``python``, started with none of this process's Python
    variables, can import ``module``."""
    done = subprocess.run([python, "-c", f"import {module}"], env=_clean_env(),
                          capture_output=True, timeout=60)
    return done.returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    home: str = _find_spark_home()
    return home


@dataclass
class StandaloneCluster:
    """A running master and its workers (see the module docstring)."""

    master_url: str
    master_ui_url: str
    #: The Python executors run as ``python3``.
    python: str
    workers: int
    cores_per_worker: int
    executor_memory: str
    #: Where the daemons log and the workers keep their applications' files.
    work_dir: Path
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    _owned_dir: bool = field(default=False, repr=False)
    #: Process groups ever started (one per daemon, with what it forked).
    _groups: list[int] = field(default_factory=list, repr=False)

    def session_conf(self) -> dict[str, str]:
        """Settings a session needs to fit this cluster (executor size; the
        cluster's python3 is left to apply)."""
        return {"spark.executor.memory": self.executor_memory,
                "spark.executor.cores": str(self.cores_per_worker),
                "spark.cores.max": str(self.workers * self.cores_per_worker),
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1"}

    @property
    def python_bin(self) -> Path:
        """The folder first on the workers' PATH: ``python3`` there is
        :attr:`python`."""
        return self.work_dir / "python-bin"

    def spawn(self, command: list[str], env: dict[str, str],
              log: Path) -> subprocess.Popen[bytes]:
        """Start ``command`` (a daemon) in a session of its own, in
        :attr:`work_dir`, its output into ``log``: :meth:`stop` kills its
        process group."""
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, env=env, cwd=self.work_dir, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self._procs.append(proc)
        self._groups.append(proc.pid)  # start_new_session: its pid is its group
        return proc

    def pids(self) -> list[int]:
        """The daemons' process ids."""
        return [p.pid for p in self._procs]

    def leftover(self) -> list[int]:
        """Process groups of this cluster with a process still alive
        (none once :meth:`stop` returned)."""
        return [g for g in self._groups if _group_alive(g)]

    def driver_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment for a driver process (``spark-submit``, the
        ``eddyflow`` CLI) of this cluster: ``base`` (default this
        process's) with Spark bound to 127.0.0.1, as the daemons are."""
        env = dict(os.environ if base is None else base)
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        return env

    def alive(self) -> bool:
        """Whether a daemon is still running."""
        return any(p.poll() is None for p in self._procs)

    def stop(self, timeout: float = 30.0) -> None:
        """Kill every process group the cluster started (the daemons and
        the executors they forked) and wait for them."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in reversed(self._procs):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)
            deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 10.0)
            for p in self._procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.1, deadline - time.monotonic()))
            if not any(_group_alive(p.pid) for p in self._procs):
                break
        self._procs.clear()
        if self._owned_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> StandaloneCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is running. Zombies do not count:
    spark-class leaves its launcher subshell unreaped, and where the
    container's init does not reap orphans it stays a zombie for good."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and ")".
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], what: str,
              timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = path.read_text(errors="replace")[-3000:] if path.exists() else ""
    state = "exited" if proc.poll() is not None else f"not ready after {timeout:.0f} s"
    raise RuntimeError(f"Spark {what} {state}; its log ({path}) ends:\n{tail}")


def start_cluster(workers: int = 2, cores_per_worker: int = 1, *,
                  worker_memory: str = "1g", executor_memory: str = "512m",
                  daemon_memory: str = "256m", python: str | None = None,
                  work_dir: str | os.PathLike[str] | None = None,
                  timeout: float = 120.0) -> StandaloneCluster:
    """Start a master and ``workers`` workers on 127.0.0.1 (see the module
    docstring); executors run ``python`` (default :func:`bare_python`) as
    ``python3``. On failure everything started is stopped and the error
    carries the daemon's log."""
    spark_home = _spark_home()
    python = python or bare_python()
    owned = work_dir is None
    root = Path(tempfile.mkdtemp(prefix="eddyflow-standalone-") if work_dir is None
                else work_dir)
    root.mkdir(parents=True, exist_ok=True)
    # The workers' python3 is the executors' Python: a folder holding only
    # that link goes first on their PATH.
    pybin = root / "python-bin"
    pybin.mkdir(exist_ok=True)
    for name in ("python3", "python"):
        link = pybin / name
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(python)
    env = _clean_env({
        "SPARK_HOME": spark_home,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": daemon_memory,
        "SPARK_LOG_DIR": str(root / "logs"),
        "SPARK_LOCAL_DIRS": str(root / "local"),
        "SPARK_CONF_DIR": str(root / "conf"),  # empty: no spark-env.sh of the machine's
        "PATH": f"{pybin}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    for d in ("logs", "local", "conf", "work"):
        (root / d).mkdir(exist_ok=True)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    port, ui = _free_port(), _free_port()
    cluster = StandaloneCluster(master_url=f"spark://127.0.0.1:{port}",
                                master_ui_url=f"http://127.0.0.1:{ui}", python=python,
                                workers=workers, cores_per_worker=cores_per_worker,
                                executor_memory=executor_memory, work_dir=root,
                                _owned_dir=owned)

    def launch(args: list[str], logname: str) -> tuple[subprocess.Popen[bytes], Path]:
        path = root / "logs" / logname
        return cluster.spawn([spark_class, *args], env, path), path

    try:
        proc, path = launch(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                             "--port", str(port), "--webui-port", str(ui)], "master.log")
        _wait_for(path, "I have been elected leader", proc, "master", timeout)
        started = []
        for i in range(workers):
            started.append(launch([
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--port", str(_free_port()), "--webui-port", str(_free_port()),
                "--cores", str(cores_per_worker), "--memory", worker_memory,
                "--work-dir", str(root / "work" / f"worker-{i}"), cluster.master_url,
            ], f"worker-{i}.log"))
        for i, (proc, path) in enumerate(started):
            _wait_for(path, "Successfully registered with master", proc, f"worker {i}", timeout)
    except BaseException:
        cluster.stop()
        raise
    log.info("Spark standalone cluster at %s: %d workers of %d cores, executors' Python %s",
             cluster.master_url, workers, cores_per_worker, python)
    return cluster


@contextlib.contextmanager
def cluster(**options: object) -> Iterator[StandaloneCluster]:
    """:func:`start_cluster` as a context manager."""
    c = start_cluster(**options)  # type: ignore[arg-type]
    try:
        yield c
    finally:
        c.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """``python -m eddyflow.offline.standalone``: see the module docstring."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # The daemons are in sessions of their own: however this process is
    # told to stop (Ctrl-C, kill, a closed terminal; SIGINT is ignored when
    # started in the background by a shell), it stops them first.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    with cluster() as c:
        print(f"master: {c.master_url}  (web UI {c.master_ui_url}); Ctrl-C stops it",
              flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while c.alive():
                time.sleep(1)


if __name__ == "__main__":
    main()
