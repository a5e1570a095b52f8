"""No silent duplicates when a restore goes back past committed output.

A sink commits a checkpoint's output once the checkpoint completes; if that
checkpoint is then damaged (state file, ``_metadata`` truncated or deleted)
or an earlier one is restored on purpose, the restored job produces that
output again. The documented rule (runtime/recovery/supersede.py): the output
committed after the restored checkpoint is taken back first — ``FileSink``
moves its files to ``_superseded/chk-<n>/``, ``ListSink`` moves its records
to ``superseded`` — with a warning naming where; a sink that cannot take
output back gets the restore refused. Each test compares the committed
output with the failure-free one: every record exactly once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace, read_parts

import eddyflow as ef

N = 1200
KEYS = 12
RECORDS = [(f"k{i % KEYS}", i) for i in range(N)]
EXPECTED = Counter((f"k{k}", c) for k in range(KEYS) for c in range(1, N // KEYS + 1))


def job(env: ef.StreamEnvironment, sink: ef.Sink, *, fail_after: int | None = None) -> None:
    ds = env.from_collection(RECORDS).name("src")
    ds = ds.map(Pace(every=2, seconds=0.002)).name("pace").set_parallelism(1)
    if fail_after is not None:
        ds = ds.map(ef.testing.FailingMap(after=fail_after)).name("failing").set_parallelism(1)
    ds.key_by(lambda r: r[0]).count().name("count").sink_to(sink).name("sink")


def make_env(chk: Path, attempts: int = 0) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.enable_checkpointing(0.01, chk, retained=3)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=attempts, delay=0))
    return env


def run(env: ef.StreamEnvironment, restore: str | None = None) -> ef.JobResult:
    async def go() -> ef.JobResult:
        return await asyncio.wait_for(env.execute_async("fallback", restore=restore), 120)
    return asyncio.run(go())


def committed(folder: Path) -> Counter[tuple[Any, ...]]:
    return Counter(read_parts(folder))


def assert_exact(got: Counter[tuple[Any, ...]]) -> None:
    lost, dup = EXPECTED - got, got - EXPECTED
    assert not lost and not dup, (f"{sum(lost.values())} lost, {sum(dup.values())} "
                                  f"duplicated (e.g. {sorted(dup)[:3]})")


def latest(chk: Path) -> int:
    return max(c.id for c in ef.list_checkpoints(chk))


def damage(chk: Path, n: int, how: str) -> None:
    folder = chk / f"chk-{n}"
    meta = folder / "_metadata"
    if how == "state-file":
        files = [chk / h["path"] for h in json.loads(meta.read_text())["files"]
                 if h["size"] > 0]
        with open(files[0], "r+b") as f:
            f.write(b"\xff" * 8)
    elif how == "truncated-metadata":
        meta.write_bytes(meta.read_bytes()[:-40])
    elif how == "deleted-metadata":
        meta.unlink()
    else:
        raise AssertionError(how)


def crash(chk: Path, sink: ef.Sink) -> int:
    env = make_env(chk)
    job(env, sink, fail_after=900)
    with pytest.raises(ef.JobFailed):
        run(env)
    assert len(ef.list_checkpoints(chk)) >= 2
    return latest(chk)


@pytest.mark.parametrize("how", ["state-file", "truncated-metadata", "deleted-metadata"])
def test_file_sink_crashed_run_broken_latest(tmp_path: Path, how: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    chk, out = tmp_path / "chk", tmp_path / "out"
    broken = crash(chk, ef.FileSink(out))
    damage(chk, broken, how)
    env = make_env(chk)
    job(env, ef.FileSink(out))
    with caplog.at_level(logging.WARNING, logger="eddyflow.checkpoint.listing"):
        result = run(env, restore="latest")
    assert_exact(committed(out))
    aside = out / "_superseded" / f"chk-{broken}"
    assert any(n.startswith("part-") for n in os.listdir(aside))
    text = " ".join(r.getMessage() for r in caplog.records)
    assert f"later checkpoint {broken}" in text and str(aside) in text
    if how == "deleted-metadata":
        assert f"checkpoint {broken} had completed" in text
    # Its id is never used again, even where its folder is gone.
    assert min(result.completed_checkpoints) > broken


@pytest.mark.parametrize("how", ["state-file", "truncated-metadata"])
def test_file_sink_finished_run_broken_final_checkpoint(tmp_path: Path, how: str) -> None:
    chk, out = tmp_path / "chk", tmp_path / "out"
    env = make_env(chk)
    job(env, ef.FileSink(out))
    run(env)
    assert_exact(committed(out))
    damage(chk, latest(chk), how)
    env = make_env(chk)
    job(env, ef.FileSink(out))
    run(env, restore="latest")
    assert_exact(committed(out))


@pytest.mark.parametrize("how", ["state-file", "truncated-metadata", "deleted-metadata"])
def test_list_sink_broken_latest(tmp_path: Path, how: str) -> None:
    chk = tmp_path / "chk"
    sink = ef.ListSink()
    broken = crash(chk, sink)
    damage(chk, broken, how)
    env = make_env(chk)
    job(env, sink)
    run(env, restore="latest")
    assert_exact(Counter(sink.results))
    assert sink.superseded  # the broken checkpoint's output, taken back


def test_restart_falls_back_past_a_broken_checkpoint(tmp_path: Path) -> None:
    # Within one execution: the latest completed checkpoint is damaged just
    # before the failure, so the restart resumes from an earlier one.
    chk = tmp_path / "chk"
    sink = ef.ListSink()
    seen = {"n": 0, "damaged": False}

    def damage_then_fail(r: Any) -> Any:
        seen["n"] += 1
        if seen["n"] == 900 and not seen["damaged"]:
            seen["damaged"] = True
            done = sorted(c.id for c in ef.list_checkpoints(chk))
            for n in done[-2:]:
                damage(chk, n, "truncated-metadata")
            raise RuntimeError("injected after damaging the latest checkpoints")
        return r

    env = make_env(chk, attempts=2)
    ds = env.from_collection(RECORDS).name("src")
    ds = ds.map(Pace(every=2, seconds=0.002)).name("pace").set_parallelism(1)
    ds = ds.map(damage_then_fail).name("damage").set_parallelism(1)
    ds.key_by(lambda r: r[0]).count().name("count").sink_to(sink).name("sink")
    result = run(env)
    assert result.restarts == 1
    assert_exact(Counter(sink.results))


def test_deliberate_restore_of_an_earlier_checkpoint(tmp_path: Path) -> None:
    chk, out = tmp_path / "chk", tmp_path / "out"
    crash(chk, ef.FileSink(out))
    earliest = min(c.id for c in ef.list_checkpoints(chk))
    env = make_env(chk)
    job(env, ef.FileSink(out))
    run(env, restore=str(chk / f"chk-{earliest}"))
    assert_exact(committed(out))


class _PlainSink(ef.Sink):
    """A transactional sink that cannot take output back."""

    def __init__(self) -> None:
        self.inner = ef.ListSink()

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        return self.inner.create_writer(subtask, parallelism)

    def commit(self, committables: list[Any]) -> None:
        self.inner.commit(committables)


def test_sink_that_cannot_take_output_back_refuses_the_restore(tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    sink = _PlainSink()
    broken = crash(chk, sink)
    damage(chk, broken, "state-file")
    before = list(sink.inner.results)
    env = make_env(chk)
    job(env, sink)
    with pytest.raises(ef.RestoreRefused, match=rf"sink 'sink'.*checkpoint {broken}"):
        run(env, restore="latest")
    assert sink.inner.results == before
    assert (chk / "_commits" / f"chk-{broken}.json").exists()  # nothing taken back


def test_fresh_start_of_another_lineage_leaves_earlier_output(tmp_path: Path) -> None:
    # restore=None is a deliberate fresh start: a new lineage, whose own
    # fallbacks never touch what the earlier run committed.
    chk, out = tmp_path / "chk", tmp_path / "out"
    env = make_env(chk)
    job(env, ef.FileSink(out))
    run(env)
    first = committed(out)
    crash(chk, ef.FileSink(out))
    damage(chk, latest(chk), "state-file")
    env = make_env(chk)
    job(env, ef.FileSink(out))
    run(env, restore="latest")
    assert committed(out) == first + EXPECTED


def test_restore_into_another_folder_twice(tmp_path: Path) -> None:
    # Ids restart in every folder: B's chk-1 and chk-2 are not "before" A's
    # chk-2. Output B committed after restoring A/chk-k is taken back when
    # A/chk-k is restored again.
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    crash(a, ef.FileSink(out))
    start = a / f"chk-{min(c.id for c in ef.list_checkpoints(a))}"
    for _ in range(2):
        env = make_env(b)
        job(env, ef.FileSink(out), fail_after=300)
        with pytest.raises(ef.JobFailed):
            run(env, restore=str(start))
    env = make_env(b)
    job(env, ef.FileSink(out))
    run(env, restore=str(start))
    assert_exact(committed(out))


def test_latest_after_a_deliberate_earlier_restore_skips_what_was_taken_back(
        tmp_path: Path) -> None:
    chk, out = tmp_path / "chk", tmp_path / "out"
    crash(chk, ef.FileSink(out))
    done = sorted(c.id for c in ef.list_checkpoints(chk))
    env = make_env(chk)
    job(env, ef.FileSink(out), fail_after=1)  # fails before its first checkpoint
    with pytest.raises(ef.JobFailed):
        run(env, restore=str(chk / f"chk-{done[0]}"))
    # The later checkpoints' output was taken back: they are no longer restorable.
    assert [c.id for c in ef.list_checkpoints(chk)] == done[:1]
    env = make_env(chk)
    job(env, ef.FileSink(out))
    run(env, restore="latest")
    assert_exact(committed(out))


def test_deleted_metadata_without_committed_output_is_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A sink that committed nothing leaves no commit record: the folder
    # without _metadata is still reported, not removed in silence.
    chk = tmp_path / "chk"
    env = make_env(chk)
    ds = env.from_collection(RECORDS).name("src").map(Pace(every=2, seconds=0.002)).name("p")
    ds = ds.set_parallelism(1).map(ef.testing.FailingMap(after=900)).name("f")
    ds.key_by(lambda r: r[0]).count().name("count").filter(lambda r: False).print()
    with pytest.raises(ef.JobFailed):
        run(env)
    broken = latest(chk)
    damage(chk, broken, "deleted-metadata")
    env = make_env(chk)
    ds = env.from_collection(RECORDS).name("src").map(Pace(every=2, seconds=0.002)).name("p")
    ds = ds.set_parallelism(1).map(ef.testing.FailingMap(after=10**9)).name("f")
    ds.key_by(lambda r: r[0]).count().name("count").filter(lambda r: False).print()
    with caplog.at_level(logging.WARNING, logger="eddyflow"):
        run(env, restore="latest")
    assert any(f"chk-{broken} has no _metadata" in r.getMessage()
               for r in caplog.records)
