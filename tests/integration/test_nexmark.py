"""Nexmark q0-q8 (``benchmarks/nexmark_suite``) equal their plain-Python
references, without failures, with failures and restarts in process
(``ef.testing.FailingMap``, both state backends), and across SIGKILLs of a
real process restored from its latest checkpoint.

The input is small and slow in event time (100 events a second, shuffled
in groups of 50) so that a few thousand events span several windows and
every query has rows; each reference is checked to be non-empty, so no
comparison passes on nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace, StateBackendFactory, watched
from sigkill_support import (
    RUN_TIMEOUT,
    JobProcess,
    latest_checkpoint,
    wait_for_checkpoint_after,
    wait_for_writer_helpers_to_exit,
)

import eddyflow as ef

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from nexmark_suite import queries, reference  # noqa: E402
from nexmark_suite.generator import GeneratorConfig, generate  # noqa: E402
from nexmark_suite.model import Auction, Bid, Person  # noqa: E402

JOB = Path(__file__).resolve().parent / "jobs" / "nexmark_job.py"
CONFIG = GeneratorConfig(events=4_000, seed=30, first_event_rate=100,
                         out_of_order_group_size=50)
EVENTS = generate(CONFIG)
EXPECTED = {name: ref(EVENTS) for name, ref in reference.REFERENCES.items()}


def rows(records: list[Any]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r) for r in records)


def differences(name: str, got: Counter[tuple[Any, ...]]) -> str:
    want = EXPECTED[name]
    return (f"{name}: lost {sum((want - got).values())} rows, e.g. {list(want - got)[:2]}; "
            f"{sum((got - want).values())} extra, e.g. {list(got - want)[:2]}")


def run_query(name: str, folder: Path, backend: StateBackendFactory | None = None,
              failures: int = 0) -> tuple[ef.JobResult, Counter[tuple[Any, ...]]]:
    """``name`` at parallelism 2 with checkpoints every 10 ms; with
    ``failures``, a FailingMap after the source fails the job that many
    times, spread over the input, and the job restarts from its latest
    checkpoint."""
    env = ef.StreamEnvironment(parallelism=2, batch_size=64)
    if backend is not None:
        backend.use(env, folder / "db")
    env.enable_checkpointing(0.01, folder / "chk")
    events = queries.source(env, EVENTS, CONFIG)
    if failures:
        env.set_restart_strategy(ef.FixedDelayRestart(attempts=failures, delay=0))
        events = (events.map(Pace(10)).name("pace")
                  .map(ef.testing.FailingMap(after=len(EVENTS) // (failures + 1),
                                             times=failures)).name("failing"))
    sink = ef.ListSink()
    queries.QUERIES[name](events).sink_to(sink).name("sink")
    result = watched(env.execute_async(f"nexmark-{name}"), 120)
    return result, rows(sink.results)


def test_generator_is_nexmark_shaped() -> None:
    kinds = Counter(type(e) for e in EVENTS)
    assert kinds == {Person: 80, Auction: 240, Bid: 3680}  # 1:3:46
    assert generate(CONFIG) == EVENTS  # seeded
    assert len({e.id for e in EVENTS if type(e) is Person}) == 80
    assert len({e.id for e in EVENTS if type(e) is Auction}) == 240
    assert {e.category for e in EVENTS if type(e) is Auction} == set(range(10, 15))
    # Disorder is real and bounded by what the watermark allows.
    newest, worst = 0, 0
    for e in EVENTS:
        newest = max(newest, e.date_time)
        worst = max(worst, newest - e.date_time)
    assert 0 < worst / 1000 <= CONFIG.max_disorder()
    # Half the bids go to hot auctions: most bids name an auction that exists.
    auctions = {e.id for e in EVENTS if type(e) is Auction}
    bids = [e for e in EVENTS if type(e) is Bid]
    assert sum(b.auction in auctions for b in bids) > len(bids) * 0.9


@pytest.mark.parametrize("name", list(queries.QUERIES))
def test_reference_has_rows(name: str) -> None:
    assert EXPECTED[name], f"{name}'s reference is empty: the comparisons would say nothing"


@pytest.mark.parametrize("name", list(queries.QUERIES))
def test_query_equals_reference(name: str, tmp_path: Path) -> None:
    result, got = run_query(name, tmp_path)
    assert got == EXPECTED[name], differences(name, got)
    assert result.restarts == 0


@pytest.mark.parametrize("name", list(queries.QUERIES))
def test_query_equals_reference_with_failures(name: str, tmp_path: Path,
                                              state_backend: StateBackendFactory) -> None:
    result, got = run_query(name, tmp_path, state_backend, failures=2)
    assert result.restarts == 2
    assert result.completed_checkpoints, "no checkpoint completed: the restarts restored nothing"
    assert got == EXPECTED[name], differences(name, got)


@pytest.mark.parametrize("name", ["q3", "q4", "q5", "q6", "q7", "q8"])
def test_query_equals_reference_restored_at_another_parallelism(name: str,
                                                                tmp_path: Path) -> None:
    """A run at parallelism 2 fails (no restarts) after checkpoints; the job
    restored from its latest checkpoint at parallelism 3 commits the rest:
    together, the reference's rows (keyed, timer and join state moved to
    other subtasks by key group)."""
    out, chk = tmp_path / "out", tmp_path / "chk"
    env = ef.StreamEnvironment(parallelism=2, batch_size=64)
    env.enable_checkpointing(0.01, chk)
    events = (queries.source(env, EVENTS, CONFIG).map(Pace(10)).name("pace")
              .map(ef.testing.FailingMap(after=len(EVENTS) // 2)).name("failing"))
    queries.QUERIES[name](events).sink_to(ef.FileSink(str(out))).name("sink")
    with pytest.raises(ef.JobFailed):
        watched(env.execute_async(f"nexmark-{name}"), 120)
    assert latest_checkpoint(chk) > 0, "no checkpoint before the failure: nothing to restore"
    env = ef.StreamEnvironment(parallelism=3, batch_size=64)
    env.enable_checkpointing(0.01, chk)
    events = (queries.source(env, EVENTS, CONFIG).map(Pace(10)).name("pace")
              .map(ef.testing.FailingMap(after=len(EVENTS) * 2)).name("failing"))
    queries.QUERIES[name](events).sink_to(ef.FileSink(str(out))).name("sink")
    watched(env.execute_async(f"nexmark-{name}", restore="latest"), 120)
    got = read_committed(out)
    assert got == EXPECTED[name], differences(name, got)


def read_committed(folder: Path) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(json.loads(line)) for part in sorted(folder.glob("part-*"))
                   for line in part.read_text().splitlines())


# q4 (keyed connect and timers, then a window) and q8 (a window join) in the
# fast suite; the others' kills in `make test-all`.
@pytest.mark.parametrize("name", ["q4", "q8", *(pytest.param(q, marks=pytest.mark.slow)
                                               for q in ("q3", "q5", "q6", "q7"))])
def test_query_equals_reference_across_sigkills(name: str, tmp_path: Path) -> None:
    """The job in a child process (``eddyflow run -p 2 --restore latest``),
    killed with SIGKILL twice after it completed a checkpoint of its own,
    then run to the end: its committed rows are the reference's."""
    out, chk = tmp_path / "out", tmp_path / "chk"
    job = JobProcess(JOB, tmp_path, tmp_path / "unused", out, chk, slow=0.05)
    job.env.update(NEXMARK_QUERY=name, NEXMARK_EVENTS=str(CONFIG.events))
    job.env["PYTHONPATH"] = os.pathsep.join([job.env["PYTHONPATH"], str(JOB.parent)])
    effective = 0
    for _ in range(6):  # two kills after a checkpoint of their run, at most six tries
        before = latest_checkpoint(chk)
        proc, stderr = job.start()
        if wait_for_checkpoint_after(proc, chk, before):
            time.sleep(0.1)
        if proc.poll() is not None:
            assert proc.wait() == 0, stderr.read_text(errors="replace")
            if effective:
                break
            # The run finished before any kill after a checkpoint (a loaded
            # machine's timing): start over from nothing.
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(chk, ignore_errors=True)
            continue
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait() in (-signal.SIGKILL, 0), stderr.read_text(errors="replace")
        assert not wait_for_writer_helpers_to_exit(proc.pid)
        effective += latest_checkpoint(chk) > before
        if effective == 2:
            break
    proc, stderr = job.start()
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the last run did not finish in {RUN_TIMEOUT} s")
    assert rc == 0, stderr.read_text(errors="replace")
    assert effective >= 1, "no kill came after a checkpoint of its run: nothing was restored"
    got = read_committed(out)
    assert got == EXPECTED[name], differences(name, got)


def test_benchmark_exits_non_zero_when_a_query_differs(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import nexmark  # benchmarks/nexmark.py

    args = ["--events", "3000", "--rate", "100", "--disorder-group", "50", "--queries", "q2,q8"]
    assert nexmark.main(args) == 0
    assert "every query's output equals its plain-Python reference" in capsys.readouterr().out
    # A reference that wants one more row than the query gives: the run says so and fails.
    right = reference.REFERENCES["q2"]
    monkeypatch.setitem(reference.REFERENCES, "q2",
                        lambda events: right(events) + Counter({(0, 0): 1}))
    assert nexmark.main(args) == 1
    out = capsys.readouterr().out
    assert "RESULTS MISMATCH" in out and "q2: 1 rows missing" in out
