"""Unaligned checkpoints and the aligned timeout, under back-pressure.

The job: a source of mutable dict records, a keyed running count that changes
each record in place (not idempotently: a record captured by reference
instead of as it was would come back changed twice), a deliberately slow map
before the sink, and small channels, so that the job is back-pressured
from the first second and an aligned barrier waits behind full channels.

With ``exactly_once`` and a short ``timeout`` checkpoints time out; with
``unaligned`` they complete and hold channel state; with ``aligned_timeout``
they complete and are recorded as switched. A failure after such checkpoints
restores exactly once, the records in flight at the barrier included, also
at another parallelism.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace, watched

import eddyflow as ef
from eddyflow.errors import RestoreFailed

N = 1200
KEYS = 40


def records() -> list[dict[str, Any]]:
    return [{"k": f"k{i % KEYS}", "v": i} for i in range(N)]


EXPECTED = Counter(
    (f"k{i % KEYS}", i // KEYS + 1, i + 1_000_000) for i in range(N))


def running_count(r: dict[str, Any], state: int | None) -> tuple[Any, int]:
    r["v"] += 1_000_000  # in place: a record restored as changed would show it twice
    n = (state or 0) + 1
    return (r["k"], n, r["v"]), n


def build(env: ef.StreamEnvironment, sink: ef.Sink, *, failing: Any = None,
          slow: float = 0.002, parallelism: int = 2) -> None:
    ds = env.from_collection(records()).name("src")
    if failing is not None:
        ds = ds.map(failing).name("failing").set_parallelism(1)
    counted = ds.key_by(lambda r: r["k"]).map_with_state(running_count).name("count")
    counted = counted.set_parallelism(parallelism)
    # The bottleneck before the sink: it sleeps ``slow`` seconds a record.
    out = counted.map(Pace(1, slow)).name("slow").set_parallelism(1)
    out.sink_to(sink).name("sink").set_parallelism(1)


def make_env(directory: Path, *, mode: str = "exactly_once", timeout: float = 60.0,
             aligned_timeout: float | None = None, parallelism: int = 2,
             attempts: int = 3, interval: float = 0.05) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=16, channel_capacity=4)
    env.enable_checkpointing(interval, directory, mode=mode, timeout=timeout,
                             aligned_timeout=aligned_timeout, retained=100)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=attempts, delay=0))
    return env


def run(env: ef.StreamEnvironment, restore: str | None = None,
        timeout: float = 120.0) -> ef.JobResult:
    return watched(env.execute_async("unaligned", restore=restore), timeout)


def metadata(directory: Path, n: int) -> dict[str, Any]:
    with open(directory / f"chk-{n}" / "_metadata", encoding="utf-8") as f:
        return dict(json.load(f))


def periodic(result: ef.JobResult, directory: Path) -> list[dict[str, Any]]:
    """The metadata of the run's periodic (not final) checkpoints still on disk."""
    metas = [metadata(directory, n) for n in result.completed_checkpoints
             if (directory / f"chk-{n}").is_dir()]
    return [m for m in metas if not m["final"]]


def assert_exactly_once(got: list[Any]) -> None:
    c = Counter(got)
    lost, dup = EXPECTED - c, c - EXPECTED
    assert not lost and not dup, (
        f"{sum(lost.values())} lost (e.g. {sorted(lost)[:5]}), "
        f"{sum(dup.values())} duplicated or unexpected (e.g. {sorted(dup)[:5]})")


def test_aligned_checkpoints_time_out_under_back_pressure(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="eddyflow.checkpoint.listing")
    sink = ef.ListSink()
    env = make_env(tmp_path / "chk", timeout=0.05, interval=0.02)
    # Channels bounded by count alone: with debloating an aligned barrier
    # crosses the slow map in about its target, and right at the start (no
    # rate measured yet, the channels small) in no time.
    env.buffer_debloat_target = None
    build(env, sink)
    result = run(env)
    assert_exactly_once(sink.results)
    assert periodic(result, tmp_path / "chk") == [], "an aligned checkpoint completed"
    assert any("not complete after" in r.getMessage() for r in caplog.records)


def test_unaligned_checkpoints_complete_under_back_pressure_with_channel_state(
        tmp_path: Path) -> None:
    sink = ef.ListSink()
    env = make_env(tmp_path / "chk", mode="unaligned", timeout=0.5, interval=0.02)
    build(env, sink)
    result = run(env)
    assert_exactly_once(sink.results)
    metas = periodic(result, tmp_path / "chk")
    assert len(metas) >= 3, f"only {len(metas)} unaligned checkpoints completed"
    assert all(m.get("unaligned") for m in metas)
    assert max(m["channel_state_records"] for m in metas) > 0


def test_aligned_timeout_switches_and_completes(tmp_path: Path) -> None:
    sink = ef.ListSink()
    env = make_env(tmp_path / "chk", timeout=1.0, aligned_timeout=0.02, interval=0.02)
    build(env, sink)
    result = run(env)
    assert_exactly_once(sink.results)
    metas = periodic(result, tmp_path / "chk")
    assert len(metas) >= 3, f"only {len(metas)} checkpoints completed"
    assert any(m.get("unaligned") for m in metas), "no checkpoint was switched"


@pytest.mark.parametrize("mode", ["unaligned", "aligned_timeout"])
@pytest.mark.parametrize("after", [300, 900])
def test_failure_after_unaligned_checkpoints_restores_exactly_once(
        tmp_path: Path, mode: str, after: int) -> None:
    sink = ef.ListSink()
    options: dict[str, Any] = (dict(mode="unaligned") if mode == "unaligned"
                               else dict(aligned_timeout=0.01))
    env = make_env(tmp_path / "chk", timeout=2.0, interval=0.02, **options)
    build(env, sink, failing=ef.testing.FailingMap(after=after))
    result = run(env)
    assert result.restarts == 1
    assert_exactly_once(sink.results)


@pytest.mark.parametrize("new_parallelism", [1, 3])
def test_restore_of_channel_state_at_another_parallelism(
        tmp_path: Path, new_parallelism: int) -> None:
    directory = tmp_path / "chk"
    first = ef.ListSink()
    env = make_env(directory, mode="unaligned", timeout=2.0, interval=0.02, attempts=0)
    build(env, first, failing=ef.testing.FailingMap(after=700))
    with pytest.raises(ef.JobFailed):
        run(env)
    held = [c for c in ef.list_checkpoints(directory)
            if metadata(directory, c.id).get("channel_state_records", 0) > 0]
    assert held, "no checkpoint held channel state"
    chk = held[-1]
    # The same sink: what the first run committed after the checkpoint is
    # taken back (superseded) by the restore.
    env = make_env(directory, mode="unaligned", timeout=2.0, interval=0.02,
                   parallelism=new_parallelism)
    if new_parallelism == 1:
        # Else count and slow chain: the exchange whose records were in
        # flight would not exist (that restore is refused, see below).
        env.disable_operator_chaining()
    # The same job (its records in flight are on failing->count), failing no more.
    build(env, first, parallelism=new_parallelism,
          failing=ef.testing.FailingMap(after=10**9))
    run(env, restore=chk.path)
    assert_exactly_once(first.results)


def test_restore_refuses_channel_state_of_an_exchange_now_chained(tmp_path: Path) -> None:
    directory = tmp_path / "chk"
    env = make_env(directory, mode="unaligned", timeout=2.0, interval=0.02, attempts=0)
    build(env, ef.ListSink(), failing=ef.testing.FailingMap(after=700))
    with pytest.raises(ef.JobFailed):
        run(env)
    held = [c for c in ef.list_checkpoints(directory)
            if any(k.startswith("count->slow/") for k in _channel_keys(directory, c.id))]
    if not held:
        pytest.skip("no checkpoint held records in flight between count and slow")
    env = make_env(directory, mode="unaligned", parallelism=1, attempts=0)
    build(env, ef.ListSink(), parallelism=1, failing=ef.testing.FailingMap(after=10**9))
    with pytest.raises((ef.JobFailed, RestoreFailed)) as info:
        run(env, restore=held[-1].path)
    failure: BaseException | None = info.value
    messages = []
    while failure is not None:
        messages.append(str(failure))
        failure = failure.__cause__
    assert any("count->slow" in m and "no such exchange" in m for m in messages), messages


def _channel_keys(directory: Path, n: int) -> set[str]:
    keys: set[str] = set()
    for op in metadata(directory, n)["operators"].values():
        for part in op["subtasks"].values():
            cs = part.get("channel_state")
            if cs:
                keys.update(cs["inputs"])
                keys.update(cs["outputs"])
    return keys
