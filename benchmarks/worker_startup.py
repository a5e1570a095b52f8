"""How long a two-worker job of a few records takes end to end, with its
workers forked and with them spawned (docs/concepts/workers.md).

A process forks its workers while a fork is safe, and spawns them (new
interpreters that load the job, pickled with cloudpickle) once it has run
RocksDB state itself (``runtime/workers/process.py``, ``fork_hazard``).
This runs the same job of ``--records`` records (parallelism 2, a keyed
count, a ListSink) ``--repeat`` times each way, in that order (a process
cannot go back to forking), and prints the best, median and worst end to
end time (building the plan, starting the workers, running, shutting
down). The issue's bound: under 1 s.

    python benchmarks/worker_startup.py
    python benchmarks/worker_startup.py --repeat 20 --workers 4
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import eddyflow as ef
from eddyflow.runtime.workers.process import fork_hazard

KEYS = 7


def once(records: int, workers: int) -> float:
    env = ef.StreamEnvironment(parallelism=2, workers=workers)
    sink = ef.ListSink()
    env.from_collection(list(range(records))).rebalance().map(lambda x: x * 3).key_by(
        lambda x: x % KEYS).count().sink_to(sink)
    started = time.perf_counter()
    env.execute("startup")
    elapsed = time.perf_counter() - started
    assert len(sink.results) == records, sink.results
    return elapsed


def run_rocksdb_here(folder: str) -> None:
    """A RocksDB job in this process: from now on, workers are spawned."""
    env = ef.StreamEnvironment()
    env.set_state_backend(ef.RocksDBStateBackend(os.path.join(folder, "db")))
    env.from_collection([1, 2, 3]).key_by(lambda x: x).count().sink_to(ef.ListSink())
    env.execute("rocksdb-here")


def report(label: str, times: list[float]) -> None:
    print(f"{label}: best {min(times) * 1e3:.0f} ms, median "
          f"{statistics.median(times) * 1e3:.0f} ms, worst {max(times) * 1e3:.0f} ms "
          f"({len(times)} runs)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=10, help="records of the job (default 10)")
    p.add_argument("--repeat", type=int, default=10, help="runs each way (default 10)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    args = p.parse_args()
    if fork_hazard() is not None:
        raise SystemExit("this process cannot fork workers already")
    print(f"{os.cpu_count()} CPUs, load average "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    once(args.records, args.workers)  # (imports and first calls, untimed)
    report(f"forked, {args.workers} workers",
           [once(args.records, args.workers) for _ in range(args.repeat)])
    folder = tempfile.mkdtemp(prefix="ef-startup-")
    try:
        run_rocksdb_here(folder)
        assert fork_hazard() is not None
        report(f"spawned, {args.workers} workers",
               [once(args.records, args.workers) for _ in range(args.repeat)])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
