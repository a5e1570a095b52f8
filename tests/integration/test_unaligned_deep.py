"""Unaligned checkpoints when the tasks in front of a slow stage are blocked
on their output (FLIP-76's priority barriers).

The job has three exchanges with the slow stage in the middle::

    src (from_collection) -> key_by -> parse (each record three times)
      -> key_by -> slow (parallelism 1, blocks the event loop 0.5 ms a record)
      -> key_by -> count (running count, changes its input in place) -> sink

Channels hold one batch of 16, and 'parse' triples what it reads: 'parse'
waits for space in front of 'slow' and the source waits for space in front
of 'parse' nearly all the time. An unaligned barrier must be taken by such a
task while its put waits, go ahead of the records it has queued on every
output channel, and those records must become channel state that a restore
puts back in front of anything new. Each key's records take one path
through the job, so the output is deterministic and a failure-free run's
output is computed here.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_support import watched

import eddyflow as ef

N = 1500
KEYS = 12
COPIES = 3


def records() -> list[dict[str, Any]]:
    return [{"k": f"k{i % KEYS}", "v": i} for i in range(N)]


def parse(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"k": r["k"], "v": r["v"], "copy": j} for j in range(COPIES)]


class Slow:
    """Identity that blocks the event loop half a millisecond a record."""

    def __call__(self, r: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.0005)
        return r


def running_count(r: dict[str, Any], state: int | None) -> tuple[Any, int]:
    r["v"] += 1_000_000  # in place: a record restored as changed would show it twice
    n = (state or 0) + 1
    return (r["k"], n, r["v"], r["copy"]), n


def expected() -> Counter[tuple[str, int, int, int]]:
    counts: Counter[str] = Counter()
    out: Counter[tuple[str, int, int, int]] = Counter()
    for r in records():
        for j in range(COPIES):
            counts[r["k"]] += 1
            out[(r["k"], counts[r["k"]], r["v"] + 1_000_000, j)] += 1
    return out


def build(env: ef.StreamEnvironment, sink: ef.Sink, failing: Any = None) -> None:
    src = env.from_collection(records()).name("src")
    parsed = src.key_by(lambda r: r["k"]).flat_map(parse).name("parse")
    # At parallelism 1 behind two 'parse' subtasks: the tasks share one event
    # loop and take turns, a batch a turn, so 'slow' falls behind by a batch
    # a turn (at the same parallelism it would keep up, however slow).
    slow = parsed.key_by(lambda r: r["k"]).map(Slow()).name("slow").set_parallelism(1)
    counted = slow.key_by(lambda r: r["k"]).map_with_state(running_count).name("count")
    if failing is not None:
        counted = counted.map(failing).name("failing")
    counted.sink_to(sink).name("sink")


def make_env(directory: Path, options: dict[str, Any], attempts: int = 3
             ) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment(parallelism=2, batch_size=16, channel_capacity=1)
    env.enable_checkpointing(0.02, directory, timeout=5.0, retained=100, **options)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=attempts, delay=0))
    return env


MODES = {"unaligned": {"mode": "unaligned"},
         "aligned_timeout": {"mode": "exactly_once", "aligned_timeout": 0.005}}


def captured_outputs(metas: list[dict[str, Any]]) -> dict[str, int]:
    """Per operator, the records unaligned barriers overtook on its outputs
    in the checkpoints ``metas``."""
    got: Counter[str] = Counter()
    for meta in metas:
        for uid, op in meta["operators"].items():
            for part in op["subtasks"].values():
                cs = part.get("channel_state")
                if cs:
                    got[uid] += sum(cs["outputs"].values())
    return dict(got)


def assert_exactly_once(got: list[Any]) -> None:
    want, have = expected(), Counter(got)
    lost, dup = want - have, have - want
    assert not lost and not dup, (
        f"{sum(lost.values())} lost (e.g. {sorted(lost)[:5]}), "
        f"{sum(dup.values())} duplicated or unexpected (e.g. {sorted(dup)[:5]})")


def periodic_metadata(directory: Path, result: ef.JobResult) -> list[dict[str, Any]]:
    """The metadata of the run's periodic checkpoints still on disk."""
    metas = []
    for n in result.completed_checkpoints:
        path = directory / f"chk-{n}" / "_metadata"
        if path.exists():
            meta = json.loads(path.read_text(encoding="utf-8"))
            if not meta["final"]:
                metas.append(meta)
    return metas


def test_tasks_blocked_on_output_take_the_barrier_and_their_output_is_channel_state(
        tmp_path: Path) -> None:
    sink = ef.ListSink()
    env = make_env(tmp_path / "chk", MODES["unaligned"])
    build(env, sink)
    result = watched(env.execute_async("deep"), 120.0)
    assert_exactly_once(sink.results)
    metas = periodic_metadata(tmp_path / "chk", result)
    assert len(metas) >= 3, f"only {len(metas)} checkpoints completed"
    outputs = captured_outputs(metas)
    # 'parse' waits for space in front of 'slow', the source in front of
    # 'parse': their barriers overtook what they had queued.
    assert outputs.get("parse", 0) > 0, outputs
    assert outputs.get("src", 0) > 0, outputs


def test_aligned_checkpoints_of_a_deep_pipeline_switch_and_complete(tmp_path: Path) -> None:
    """Past the aligned timeout the barrier still held up is taken at once
    (by a task blocked on output too); whether records are still in flight
    then depends on how far the aligned barrier got, so only the switch and
    the completions are certain."""
    sink = ef.ListSink()
    env = make_env(tmp_path / "chk", MODES["aligned_timeout"])
    build(env, sink)
    result = watched(env.execute_async("deep"), 120.0)
    assert_exactly_once(sink.results)
    metas = periodic_metadata(tmp_path / "chk", result)
    assert len(metas) >= 3, f"only {len(metas)} checkpoints completed"
    assert any(m.get("unaligned") for m in metas), "no checkpoint was switched"


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("after", [400, 1200])
def test_failure_after_checkpoints_of_a_deep_pipeline_restores_exactly_once(
        tmp_path: Path, mode: str, after: int) -> None:
    sink = ef.ListSink()
    env = make_env(tmp_path / "chk", MODES[mode])
    build(env, sink, failing=ef.testing.FailingMap(after=after))
    result = watched(env.execute_async("deep"), 120.0)
    assert result.restarts == 1
    assert_exactly_once(sink.results)


def test_restore_puts_overtaken_output_back_before_new_input(tmp_path: Path) -> None:
    """A run fails after checkpoints whose channel state holds the output
    'parse' had queued; a new run restores the latest such checkpoint into
    the same sink, and the output is still exactly once and in each key's
    order (the running count would show a record delivered out of turn)."""
    directory = tmp_path / "chk"
    sink = ef.ListSink()
    env = make_env(directory, MODES["unaligned"], attempts=0)
    build(env, sink, failing=ef.testing.FailingMap(after=1200))
    with pytest.raises(ef.JobFailed):
        watched(env.execute_async("deep"), 120.0)
    held = []
    for c in ef.list_checkpoints(directory):
        meta = json.loads((directory / f"chk-{c.id}" / "_metadata").read_text(encoding="utf-8"))
        parts = meta["operators"].get("parse", {}).get("subtasks", {}).values()
        if any((p.get("channel_state") or {}).get("outputs") for p in parts):
            held.append(c)
    assert held, "no checkpoint held records 'parse' had queued"
    env = make_env(directory, MODES["unaligned"])
    build(env, sink, failing=ef.testing.FailingMap(after=10**9))
    watched(env.execute_async("deep", restore=held[-1].path), 120.0)
    assert_exactly_once(sink.results)
