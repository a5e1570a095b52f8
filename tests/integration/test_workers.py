"""Jobs over worker processes (``StreamEnvironment(workers=N)``).

Each job here is compared with the same job in one process: the committed
``ListSink`` records (a per-key running count, so the multiset is the same
whatever the interleaving) and the final keyed state. Failures are real: a
``FailingMap`` raising in a worker, and SIGKILL of a worker process at
random moments while the job runs. After every test no child process of
this one is left (the fixture asserts it).

Each scenario runs in a fresh process (``in_clean_process``), whose
workers are forked; a process that has run RocksDB state itself cannot
fork them (``fork_hazard``) and spawns them instead (``spawn.py``): the
scenarios marked ``start="spawn"`` run a RocksDB job in the calling process
first to get there, as a program that runs both kinds of job does.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sigkill_support import (
    SRC,
    WorkerKiller,
    children_of,
    in_clean_process,
    latest_checkpoint,
    no_process_left_behind,  # noqa: F401 - the autouse fixture
    seed,
    wait_for_exit,
)

import eddyflow as ef

KEYS = 13




def count(record: Any, state: int | None) -> tuple[Any, int]:
    n = (state or 0) + 1
    return (record % KEYS, n), n


def busy(record: int) -> int:
    until = time.perf_counter() + 5e-6
    while time.perf_counter() < until:
        pass
    return record


def run(records: int, *, workers: int, directory: Path | None = None,
        backend: ef.StateBackend | None = None, failing: Any = None,
        restarts: int = 0, restore: str | None = None, slow: bool = False,
        sink: ef.ListSink | None = None) -> tuple[list[Any], dict[Any, Any], ef.JobResult]:
    env = ef.StreamEnvironment(parallelism=2, workers=workers)
    if directory is not None:
        env.enable_checkpointing(interval=0.05, directory=str(directory))
    if backend is not None:
        env.set_state_backend(backend)
    if restarts:
        env.set_restart_strategy(ef.FixedDelayRestart(attempts=restarts, delay=0.05))
    sink = sink if sink is not None else ef.ListSink()
    stream = env.from_collection(list(range(records))).rebalance().map(lambda x: x * 3)
    if slow:
        stream = stream.map(busy)
    if failing is not None:
        stream = stream.map(failing)
    stream.key_by(lambda x: x % KEYS).map_with_state(count).name("count").sink_to(sink)
    result = env.execute("workers", restore=restore)
    return sorted(sink.results), dict(result.state("count")), result


def expected(records: int) -> tuple[list[Any], dict[Any, Any]]:
    out, state = [], {}
    for x in range(records):
        k = (x * 3) % KEYS
        state[k] = state.get(k, 0) + 1
        out.append((k, state[k]))
    return sorted(out), state


def same_as_one_process(tmp_path: Path, workers: int) -> None:
    out, state, result = run(50_000, workers=workers, directory=tmp_path / "chk")
    assert (out, state) == expected(50_000)
    assert result.records_in["count"] == 50_000
    assert result.completed_checkpoints  # the final one at least
    assert not wait_for_exit(children_of(os.getpid()))


@pytest.mark.parametrize("workers", [2, 3])
def test_a_job_over_workers_gives_what_one_process_gives(tmp_path: Path, workers: int) -> None:
    in_clean_process(same_as_one_process, tmp_path, workers)


def restarts_every_worker(tmp_path: Path, backend: str) -> None:
    from job_support import StateBackendFactory

    failing = ef.testing.FailingMap(after=40_000, times=2)
    out, state, result = run(150_000, workers=2, directory=tmp_path / "chk", failing=failing,
                             backend=StateBackendFactory(backend).make(tmp_path), restarts=3)
    assert failing.failures == 2  # counted across the workers and their restarts
    assert result.restarts == 2
    assert (out, state) == expected(150_000)


def test_a_failure_in_a_worker_restarts_every_worker_exactly_once(
        tmp_path: Path, state_backend: Any) -> None:
    in_clean_process(restarts_every_worker, tmp_path, state_backend.name)


def fails_naming_the_operator() -> None:
    with pytest.raises(ef.JobFailed, match="InjectedFailure") as info:
        run(20_000, workers=2, failing=ef.testing.FailingMap(after=5_000))
    assert info.value.operator is not None
    assert isinstance(info.value.__cause__, ef.testing.InjectedFailure)


def test_a_failure_without_restarts_fails_the_job_naming_the_operator() -> None:
    in_clean_process(fails_naming_the_operator)


def run_rocksdb_here(tmp_path: Path) -> None:
    """Run a RocksDB job in this process (workers=1): from now on it cannot
    fork workers, and spawns them."""
    from eddyflow.runtime.workers.process import fork_hazard

    out, state, _ = run(1_000, workers=1, backend=ef.RocksDBStateBackend(
        str(tmp_path / "here")))
    assert (out, state) == expected(1_000)
    assert fork_hazard() is not None


def runs_after_rocksdb_in_process(tmp_path: Path) -> None:
    run_rocksdb_here(tmp_path)
    for n, backend in enumerate([ef.RocksDBStateBackend(str(tmp_path / "db"), incremental=True),
                                 ef.MemoryStateBackend()]):
        out, state, result = run(20_000, workers=2, directory=tmp_path / f"chk{n}",
                                 backend=backend)
        assert (out, state) == expected(20_000)
        assert result.records_in["count"] == 20_000
        assert not wait_for_exit(children_of(os.getpid()))


def test_a_process_that_ran_rocksdb_itself_spawns_its_workers(tmp_path: Path) -> None:
    in_clean_process(runs_after_rocksdb_in_process, tmp_path)


@pytest.mark.parametrize(("backend", "start"), [("memory", "fork"), ("rocksdb", "fork"),
                                                ("rocksdb", "spawn")])
def test_sigkill_of_a_worker_at_random_moments_fails_over_exactly_once(
        tmp_path: Path, backend: str, start: str) -> None:
    in_clean_process(killed_twice, tmp_path, backend, start)


def killed_twice(tmp_path: Path, backend: str = "memory", start: str = "fork") -> None:
    """A worker is killed twice (kill -9), each time a random moment after a
    checkpoint of its generation of workers: the job restarts them all from
    its latest checkpoint, and the committed output is the failure-free one.
    With RocksDB, its checkpoints are incremental: a restored worker reads
    files of checkpoints before the latest."""
    if start == "spawn":
        run_rocksdb_here(tmp_path)
    state_backend = (ef.RocksDBStateBackend(str(tmp_path / "db"), incremental=True)
                     if backend == "rocksdb" else None)
    rng = random.Random(seed(29))
    chk = tmp_path / "chk"
    with WorkerKiller(chk, rng) as kills:
        out, state, result = run(300_000, workers=2, directory=chk, restarts=5, slow=True,
                                 backend=state_backend)
    assert len(kills) == 2, f"the job ended after {kills}"
    assert result.restarts == 2, kills
    assert (out, state) == expected(300_000), kills


def test_a_checkpoint_of_two_workers_restores_with_one_and_with_three(
        tmp_path: Path, state_backend: Any) -> None:
    in_clean_process(restores_with_one_and_three, tmp_path, state_backend.name)


def restores_with_one_and_three(tmp_path: Path, backend: str = "memory") -> None:
    """With RocksDB (incremental), the run with one process opens RocksDB
    here, so the run with three spawns its workers."""
    from job_support import StateBackendFactory

    from eddyflow.runtime.workers.process import fork_hazard

    factory = StateBackendFactory(backend)
    chk = tmp_path / "chk"
    first = ef.ListSink()  # what the failed run committed
    with pytest.raises(ef.JobFailed):
        run(200_000, workers=2, directory=chk, slow=True, sink=first,
            failing=ef.testing.FailingMap(after=150_000),
            backend=factory.make(tmp_path / "first", incremental=True))
    assert latest_checkpoint(chk) > 0
    want_out, want_state = expected(200_000)
    for workers in (1, 3):
        if workers == 3 and factory.rocksdb:  # (the run with one process opened RocksDB)
            assert fork_hazard() is not None  # so these three are spawned
        copy = tmp_path / f"chk-{workers}"
        shutil.copytree(chk, copy)
        out, state, _ = run(200_000, workers=workers, directory=copy, restore="latest",
                            backend=factory.make(tmp_path / f"run-{workers}",
                                                 incremental=True))
        assert state == want_state
        # The failed run committed the output up to the restored checkpoint.
        assert sorted(first.results + out) == want_out


@pytest.mark.parametrize("bad", [0, -1, "many", 1.5, True])
def test_workers_must_be_a_positive_count_or_auto(bad: Any) -> None:
    with pytest.raises(ValueError, match="workers"):
        ef.StreamEnvironment(workers=bad)
    assert ef.StreamEnvironment(workers="auto").workers == (os.cpu_count() or 1)


def metrics_from_workers() -> None:
    env = ef.StreamEnvironment(parallelism=2, workers=2)
    samples: list[Any] = []
    env.on_metrics(samples.append, every=0.05)
    # Long enough (about a second of busy work per worker) for reports of
    # the workers to come while it runs.
    env.from_collection(list(range(400_000))).rebalance().map(busy).key_by(
        lambda x: x % KEYS).map_with_state(count).name("count").sink_to(ef.ListSink())
    result = env.execute("metrics")

    def counted(m: Any) -> int:
        return sum(o.records_in for o in m.operators if o.operator == "count")

    assert result.metrics is not None and counted(result.metrics) == 400_000
    assert {o.subtask for o in result.metrics.operators if o.operator == "count"} == {0, 1}
    # While it ran, the callbacks saw the workers' counters grow.
    assert any(0 < counted(m) < 400_000 for m in samples), [counted(m) for m in samples]


def test_metrics_callbacks_see_the_counters_of_the_workers() -> None:
    in_clean_process(metrics_from_workers)


def cancelled_from_the_caller(tmp_path: Path, start: str = "fork") -> None:
    import anyio

    if start == "spawn":
        run_rocksdb_here(tmp_path)

    async def main() -> None:
        env = ef.StreamEnvironment(parallelism=2, workers=2)
        env.from_collection(list(range(2_000_000))).rebalance().map(busy).key_by(
            lambda x: x % KEYS).map_with_state(count).sink_to(ef.ListSink())
        with anyio.move_on_after(1.0) as scope:
            await env.execute_async("cancelled")
        assert scope.cancelled_caught  # it was still running: cancelled, not finished

    anyio.run(main)
    assert not wait_for_exit(children_of(os.getpid()), 1.0)  # no worker outlives it


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_cancelling_execute_async_stops_the_workers(tmp_path: Path, start: str) -> None:
    in_clean_process(cancelled_from_the_caller, tmp_path, start)


def names_what_does_not_pickle(tmp_path: Path) -> None:
    run_rocksdb_here(tmp_path)
    lock = threading.Lock()

    def guarded(x: int) -> int:
        with lock:
            return x

    env = ef.StreamEnvironment(parallelism=2, workers=2)
    env.from_collection([1, 2, 3]).map(guarded).name("guarded").sink_to(ef.ListSink())
    with pytest.raises(ef.JobFailed) as info:
        env.execute("unpicklable")
    message = str(info.value)
    assert "\n" not in message
    assert "operator 'guarded' cannot be sent to a worker process" in message, message
    assert "closure variable 'lock'" in message and "_thread.lock" in message, message
    assert ef.errors.is_retryable(info.value) is False


def test_what_a_spawned_worker_cannot_get_is_named_in_one_line(tmp_path: Path) -> None:
    in_clean_process(names_what_does_not_pickle, tmp_path)


JOB_FILE = '''
import eddyflow as ef
from job_helpers import KEYS, Scale  # a module beside the job file

def build(env):
    env.from_collection(list(range(5_000))).rebalance().map(Scale(3)).key_by(
        lambda x: x % KEYS).map_with_state(
        lambda r, s: ((r % KEYS, (s or 0) + 1), (s or 0) + 1)).name("count").sink_to(SINK)

SINK = ef.ListSink()
'''
HELPERS = '''
KEYS = 13

class Scale:
    def __init__(self, by):
        self.by = by

    def __call__(self, x):
        return x * self.by
'''


def runs_a_job_file_in_spawned_workers(tmp_path: Path) -> None:
    from eddyflow.jobfile import build_environment

    run_rocksdb_here(tmp_path)
    folder = tmp_path / "jobs"
    folder.mkdir()
    (folder / "scaled.py").write_text(JOB_FILE)
    (folder / "job_helpers.py").write_text(HELPERS)
    # As `eddyflow run jobs/scaled.py --workers 2` loads it: by path, under a
    # module name no other interpreter can import.
    env, module = build_environment(folder / "scaled.py", parallelism=2, workers=2)
    result = env.execute("job-file")
    assert (sorted(module.SINK.results), dict(result.state("count"))) == expected(5_000)


def test_a_job_file_loaded_by_path_runs_in_spawned_workers(tmp_path: Path) -> None:
    in_clean_process(runs_a_job_file_in_spawned_workers, tmp_path)


SCRIPT = '''
import sys
import tempfile
import eddyflow as ef

print("module code ran", flush=True)  # once: a spawned worker does not run __main__

class Triple:
    def __call__(self, x):
        return x * 3

folder = tempfile.mkdtemp(dir=sys.argv[1])
first = ef.StreamEnvironment()
first.set_state_backend(ef.RocksDBStateBackend(folder + "/here"))
first.from_collection([1, 2]).key_by(lambda x: x).count().sink_to(ef.ListSink())
first.execute("rocksdb-here")

env = ef.StreamEnvironment(parallelism=2, workers=2)
env.set_state_backend(ef.RocksDBStateBackend(folder + "/db"))
sink = ef.ListSink()
env.from_collection(list(range(1_000))).rebalance().map(Triple()).key_by(
    lambda x: x % 13).map_with_state(
    lambda r, s: ((r % 13, (s or 0) + 1), (s or 0) + 1)).name("count").sink_to(sink)
result = env.execute("script")
print(len(sink.results), sum(dict(result.state("count")).values()))
'''


def test_a_script_without_a_main_guard_runs_in_spawned_workers(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [
        os.environ.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    assert proc.stdout.decode().split("\n") == ["module code ran", "1000 1000", ""]


LONG_SCRIPT = '''
import sys
import time
import eddyflow as ef

def busy(x):
    until = time.perf_counter() + 5e-6
    while time.perf_counter() < until:
        pass
    return x

first = ef.StreamEnvironment()
first.set_state_backend(ef.RocksDBStateBackend(sys.argv[1] + "/here"))
first.from_collection([1, 2]).key_by(lambda x: x).count().sink_to(ef.ListSink())
first.execute("rocksdb-here")
env = ef.StreamEnvironment(parallelism=2, workers=2)
env.from_collection(list(range(5_000_000))).rebalance().map(busy).key_by(
    lambda x: x % 13).count().sink_to(ef.ListSink())
env.execute("long")
'''


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # gone meanwhile


def test_spawned_workers_die_with_their_caller(tmp_path: Path) -> None:
    """kill -9 of a caller whose workers were spawned: they leave too."""
    script = tmp_path / "long.py"
    script.write_text(LONG_SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [
        os.environ.get("PYTHONPATH")])])
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        workers: list[int] = []
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            workers = [p for p in children_of(proc.pid) if b"worker_main" in cmdline(p)]
            time.sleep(0.05)
        assert len(workers) == 2, (workers, proc.poll())
        time.sleep(0.5)  # (running the job by now)
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]
    assert not wait_for_exit(workers), "spawned workers outlived their caller"


def same_salt_in_every_worker(tmp_path: Path) -> None:
    run_rocksdb_here(tmp_path)
    env = ef.StreamEnvironment(parallelism=2, workers=2)
    sink = ef.ListSink()
    # The keys spread over both subtasks, one in each worker: each reports
    # its process's hash of the same string.
    env.from_collection(list(range(100))).key_by(lambda x: x).map(
        lambda _: (os.getpid(), hash("eddyflow"))).sink_to(sink)
    env.execute("salt")
    pids = {pid for pid, _ in sink.results}
    assert len(pids) == 2 and os.getpid() not in pids, pids
    assert len({h for _, h in sink.results}) == 1, set(sink.results)


def test_spawned_workers_hash_strings_alike(tmp_path: Path) -> None:
    in_clean_process(same_salt_in_every_worker, tmp_path)
