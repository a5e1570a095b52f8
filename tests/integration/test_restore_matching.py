"""Restoring a changed job is never silently wrong (issue 13).

Strict state matching, as Flink does by default: every operator with state
in the restored checkpoint (a source's positions, keyed state, a loop
head's back-edge log, a sink's pending transactions) must match an operator
of the job by uid and by kind, or the restore is refused before anything
runs with one ``ef.IncompatibleCheckpoint`` (a ``ValueError``) naming every
unmatched operator. ``allow_non_restored_state=True`` drops that state
deliberately, with a warning on ``eddyflow.checkpoint.listing`` naming it, also
when the job restarts after a failure within the same ``execute``.

Each test crashes a paced keyed count (a ``FailingMap``, no restarts) so
that it leaves completed checkpoints mid-way, then restores ``"latest"``
into a changed job: a renamed source, an unnamed source replaced by
another, a keyed operator changed from ``count`` to ``sum`` under the same
name, a renamed keyed operator (all refused); operators added that are
unrelated to the stateful ones (exact: the unnamed operators keep their
generated uids, and the restored run's keyed state and the committed
output of both runs equal a failure-free run's); a process function that
declares a checkpointed state as another kind (refused as its task
starts). ``eddyflow run --allow-non-restored-state`` passes the flag on.
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from job_support import Pace, read_parts

import eddyflow as ef
from eddyflow.cli.main import main

N = 2000
KEYS = 20
RECORDS = [(f"k{i % KEYS}", i) for i in range(N)]
FINAL_COUNTS = dict(Counter(k for k, _ in RECORDS))
#: Every (key, running count) a failure-free run emits, once each.
EXPECTED = Counter((k, c) for k, n in FINAL_COUNTS.items() for c in range(1, n + 1))


def identity(r: Any) -> Any:
    return r


def one(r: Any) -> int:
    return 1


#: What a test varies between the crashed run and the restored one: the
#: source, the keyed operator, extra operators. Each takes the environment,
#: returns the stream or adds operators.
Build = Callable[[ef.StreamEnvironment], Any]


def named_source(name: str) -> Build:
    return lambda env: env.from_collection(RECORDS).name(name)


def unnamed_source(env: ef.StreamEnvironment) -> ef.DataStream:
    return env.from_collection(RECORDS)


def keyed_job(env: ef.StreamEnvironment, sink: ef.Sink, *,
              source: Build = unnamed_source, failing: Any = identity,
              aggregate: Callable[[ef.KeyedStream], ef.DataStream] | None = None,
              before: Build | None = None, after: Callable[[Any], None] | None = None
              ) -> ef.DataStream:
    """source -> a paced map -> ``failing`` -> key_by(0) -> ``aggregate``
    (an unnamed count by default) -> ``sink``, with ``before`` declared ahead
    of it and ``after(source stream)`` after it; returns the keyed stream's
    output (its ``operator_name`` is the keyed operator's uid)."""
    if before is not None:
        before(env)
    src = source(env)
    ds = src.map(Pace(8)).map(failing)
    keyed = ds.key_by(0)
    out = aggregate(keyed) if aggregate is not None else keyed.count()
    out.sink_to(sink)
    if after is not None:
        after(src)
    return out


def make_env(directory: Path, *, attempts: int = 0, interval: float = 0.01
             ) -> ef.StreamEnvironment:
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.enable_checkpointing(interval, directory)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=attempts, delay=0))
    return env


def run(env: ef.StreamEnvironment, restore: str | None = None, *,
        allow_non_restored_state: bool = False, timeout: float = 60.0) -> ef.JobResult:
    async def go() -> ef.JobResult:
        return await asyncio.wait_for(env.execute_async(
            "matching", restore=restore, allow_non_restored_state=allow_non_restored_state),
            timeout)
    return asyncio.run(go())


def crash(directory: Path, sink: ef.Sink | None = None, **job: Any) -> ef.CheckpointInfo:
    """Run ``keyed_job(**job)`` until a FailingMap fails it (no restarts);
    return the latest completed checkpoint it left, taken mid-way."""
    env = make_env(directory)
    keyed_job(env, sink if sink is not None else ef.ListSink(),
              failing=ef.testing.FailingMap(after=1500), **job)
    with pytest.raises(ef.JobFailed):
        run(env)
    infos = ef.list_checkpoints(directory)
    assert len(infos) >= 2, f"the crashed run left too few checkpoints: {infos}"
    assert not infos[-1].final
    return infos[-1]


def source_position(info: ef.CheckpointInfo, uid: str) -> int:
    # from_collection is a split source: its one subtask records its one
    # slice's position by split id.
    return int(info.operators[uid]["subtasks"]["0"]["source"]["slice-0"])



def dropped_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "eddyflow.checkpoint.listing" and r.levelno == logging.WARNING
            and "allow_non_restored_state" in r.getMessage()]


def refused(directory: Path, env: ef.StreamEnvironment, sink: ef.ListSink
            ) -> ef.IncompatibleCheckpoint:
    """Restoring ``"latest"`` into ``env``'s job (writing to ``sink``)
    raises ``IncompatibleCheckpoint`` before anything ran: no new
    checkpoint, no record through."""
    before = [c.id for c in ef.list_checkpoints(directory)]
    with pytest.raises(ef.IncompatibleCheckpoint) as info:
        run(env, "latest")
    assert isinstance(info.value, ValueError)
    assert [c.id for c in ef.list_checkpoints(directory)] == before
    assert sink.results == []
    assert "allow_non_restored_state=True" in str(info.value)
    return info.value


# -- sources ------------------------------------------------------------------------------


def log_source(folder: Path) -> Build:
    """The same records from an ``ef.Log`` instead of a collection."""
    log = ef.Log(folder, partitions=1)
    for r in RECORDS:
        log.append(r)
    return lambda env: env.from_log(folder)


@pytest.mark.parametrize("change", ["renamed", "replaced-unnamed"])
def test_changed_source_is_refused_and_dropped_only_when_allowed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, change: str) -> None:
    """Today's trap: the new source starts again from offset 0 while the
    counts are restored, so every count ends above the truth. Refused; with
    the flag, the old source's positions are dropped with a warning (and
    the new source does read from the start: that is what was asked)."""
    directory = tmp_path / "chk"
    old, new = ((named_source("a"), named_source("b")) if change == "renamed"
                else (unnamed_source, log_source(tmp_path / "log")))

    def count(keyed: ef.KeyedStream) -> ef.DataStream:
        # Named: it keeps its identity whatever its upstream chain (an
        # unnamed one would change with the source, and be refused too).
        return keyed.count().name("count")

    info = crash(directory, source=old, aggregate=count)
    old_uid = next(uid for uid, op in info.operators.items() if op["kind"] == "source")

    env, sink = make_env(directory), ef.ListSink()
    keyed_job(env, sink, source=new, aggregate=count)
    error = refused(directory, env, sink)
    assert (f"it holds state of operators the job does not match (by name and kind): "
            f"'{old_uid}' (source): the source positions of 1 subtask, but the job has no "
            f"operator '{old_uid}'") in str(error), str(error)
    assert error.unmatched == (old_uid,)
    assert error.checkpoint_id == info.id

    env = make_env(directory)
    out = keyed_job(env, ef.ListSink(), source=new, aggregate=count)
    with caplog.at_level(logging.WARNING, logger="eddyflow.checkpoint.listing"):
        result = run(env, "latest", allow_non_restored_state=True)
    warnings = dropped_warnings(caplog)
    assert len(warnings) == 1 and f"'{old_uid}'" in warnings[0], warnings
    new_uid = next(u for u in result.records_out if u != old_uid and u.startswith(
        "b" if change == "renamed" else "source-"))
    assert result.records_out[new_uid] == N  # from the start, as dropping its position says
    counts = result.state(out.operator_name)
    assert all(counts[k] > FINAL_COUNTS[k] for k in FINAL_COUNTS)


# -- keyed operators ----------------------------------------------------------------------


def test_count_changed_to_sum_under_the_same_name_is_refused_and_dropped_when_allowed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "chk"
    info = crash(directory, source=named_source("src"),
                 aggregate=lambda keyed: keyed.count().name("agg"))
    position = source_position(info, "src")

    def as_sum(keyed: ef.KeyedStream) -> ef.DataStream:
        return keyed.sum(one).name("agg")

    env, sink = make_env(directory), ef.ListSink()
    keyed_job(env, sink, source=named_source("src"), aggregate=as_sum)
    error = refused(directory, env, sink)
    assert ("'agg' (count): keyed state 'count' (value) of 20 entries, but in the job "
            "'agg' is a sum operator") in str(error), str(error)
    assert error.unmatched == ("agg",)

    env = make_env(directory)
    keyed_job(env, ef.ListSink(), source=named_source("src"), aggregate=as_sum)
    with caplog.at_level(logging.WARNING, logger="eddyflow.checkpoint.listing"):
        result = run(env, "latest", allow_non_restored_state=True)
    assert any("'agg'" in w for w in dropped_warnings(caplog))
    # The count's state is gone, not lingering beside the sum's (state()
    # would need a name); the sum starts empty at the restored position.
    after = Counter(k for k, _ in RECORDS[position:])
    assert result.state("agg") == dict(after)
    assert result.records_out["src"] == N - position


def test_renamed_keyed_operator_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "chk"
    crash(directory, source=named_source("src"),
          aggregate=lambda keyed: keyed.count().name("count"))
    env, sink = make_env(directory), ef.ListSink()
    keyed_job(env, sink, source=named_source("src"),
              aggregate=lambda keyed: keyed.count().name("counts"))
    error = refused(directory, env, sink)
    assert "'count' (count): keyed state 'count' (value)" in str(error)
    assert "the job has no operator 'count'" in str(error)
    # The likely rename, named:
    assert "its count operators new to the checkpoint: 'counts'" in str(error)
    # Its unnamed sink reads from it: another upstream chain, another uid,
    # and its pending transactions are named too.
    assert error.unmatched[0] == "count" and len(error.unmatched) == 2
    assert "pending transaction" in str(error)


def test_every_unmatched_operator_is_named_in_one_error(tmp_path: Path) -> None:
    directory = tmp_path / "chk"
    crash(directory, source=named_source("a"),
          aggregate=lambda keyed: keyed.count().name("agg"))
    env, sink = make_env(directory), ef.ListSink()
    keyed_job(env, sink, source=named_source("b"),
              aggregate=lambda keyed: keyed.sum(one).name("agg"))
    error = refused(directory, env, sink)
    assert error.unmatched == ("a", "agg")
    assert "'a' (source)" in str(error) and "'agg' is a sum operator" in str(error)


# -- unrelated additions ------------------------------------------------------------------


def pipeline_before(folder: Path) -> Build:
    """An independent, unnamed pipeline declared ahead of the job, from
    another source (a log: equal sources are told apart by the order they
    are declared in, so one more collection ahead would shift the job's)."""
    log = ef.Log(folder, partitions=1)
    for i in range(10):
        log.append(("x", i))

    def build(env: ef.StreamEnvironment) -> None:
        env.from_log(folder).key_by(0).count().sink_to(ef.ListSink())
    return build


def test_unrelated_unnamed_operators_added_keep_the_restore_exact(tmp_path: Path) -> None:
    """The job's operators are all unnamed: its generated uids must not
    move when unrelated operators are added (before it and after it), so the
    restore resumes the same source position and keyed counts. The restored
    run's final counts equal a failure-free run's, and the committed output
    of both runs together is every (key, count) exactly once."""
    directory = tmp_path / "chk"
    out = tmp_path / "out"
    info = crash(directory, sink=ef.FileSink(out))
    src_uid = next(uid for uid, op in info.operators.items() if op["kind"] == "source")
    position = source_position(info, src_uid)
    assert 0 < position < N

    def after(src: ef.DataStream) -> None:
        src.map(repr).sink_to(ef.ListSink())  # a sibling of the job's first map
        src.filter(lambda r: r[1] % 2 == 0).key_by(0).count().sink_to(ef.ListSink())

    before = pipeline_before(tmp_path / "log")
    env = make_env(directory)
    counted = keyed_job(env, ef.FileSink(out), before=before, after=after)
    assert counted.operator_name in info.operators
    result = run(env, "latest")
    assert result.records_out[src_uid] == N - position
    assert result.state(counted.operator_name) == FINAL_COUNTS
    got = Counter(read_parts(out))
    assert got == EXPECTED, (f"lost {sum((EXPECTED - got).values())}, "
                             f"duplicated {sum((got - EXPECTED).values())}")

    # The failure-free run of the same changed job agrees.
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    clean = keyed_job(env, ef.ListSink(), before=before, after=after)
    assert env.execute().state(clean.operator_name) == result.state(counted.operator_name)


def test_restart_after_a_restore_that_dropped_state_drops_it_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``allow_non_restored_state`` holds for the restarts of the same
    execute: a failure before the job's own first checkpoint restarts from
    the restored checkpoint again, still without the dropped state (here a
    keyed operator removed, and one changed from count to sum: its count
    table must not come back beside the sum's)."""
    directory = tmp_path / "chk"

    def extra(src: ef.DataStream) -> None:
        src.key_by(0).count().name("extra").sink_to(ef.ListSink()).name("extra-sink")

    info = crash(directory, source=named_source("src"), after=extra,
                 aggregate=lambda keyed: keyed.count().name("agg"))
    assert "extra" in info.operators
    position = source_position(info, "src")
    env = make_env(directory, attempts=2, interval=60.0)
    keyed_job(env, ef.ListSink(), source=named_source("src"),
              failing=ef.testing.FailingMap(after=100),
              aggregate=lambda keyed: keyed.sum(one).name("agg"))
    with caplog.at_level(logging.WARNING, logger="eddyflow.checkpoint.listing"):
        result = run(env, "latest", allow_non_restored_state=True)
    assert result.restarts == 1
    assert len(result.completed_checkpoints) == 1  # the final one: no own one to restart from
    warnings = dropped_warnings(caplog)
    assert len(warnings) == 1 and "'extra'" in warnings[0] and "'agg'" in warnings[0]
    assert result.records_out["src"] == N - position
    assert result.state("agg") == dict(Counter(k for k, _ in RECORDS[position:]))


# -- keyed state of another kind ------------------------------------------------------------


class Seen(ef.KeyedProcessFunction):
    """Counts a key's records in state 'seen', kept as ``kind`` state."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.state: Any = (ctx.value_state("seen") if self.kind == "value"
                           else ctx.list_state("seen"))

    def process(self, value: Any, ctx: Any) -> Iterator[Any]:
        if self.kind == "value":
            self.state.value = (self.state.value or 0) + 1
        else:
            self.state.add(value[1])
        yield value


def test_process_state_declared_as_another_kind_is_refused_by_name(tmp_path: Path) -> None:
    """A process function's states are declared only as it opens: the
    checkpointed 'seen' (value) read as list state fails its task at the
    start with an error that says so (not a confused one later on)."""
    directory = tmp_path / "chk"
    crash(directory, source=named_source("src"),
          aggregate=lambda keyed: keyed.process(Seen("value")).name("seen"))
    env = make_env(directory)
    keyed_job(env, ef.ListSink(), source=named_source("src"),
              aggregate=lambda keyed: keyed.process(Seen("list")).name("seen"))
    with pytest.raises(ef.JobFailed) as info:
        run(env, "latest")
    cause = info.value.__cause__
    assert isinstance(cause, ef.IncompatibleCheckpoint), repr(cause)
    assert ("cannot restore operator 'seen': the checkpoint holds its state 'seen' as value "
            "state, the job declares it as list state") in str(cause)


# -- the command line -----------------------------------------------------------------------


JOB = textwrap.dedent('''
    import os

    import eddyflow as ef


    def build(env):
        env.enable_checkpointing(interval=10.0, directory=os.environ["MATCHING_CHECKPOINTS"])
        (env.from_collection([("k%d" % (i % 5), i) for i in range(200)])
            .name(os.environ["MATCHING_SOURCE"])
            .key_by(0).count().name("count")
            .sink_to(ef.ListSink()).name("sink"))
''')


def test_cli_run_passes_allow_non_restored_state(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    monkeypatch.setenv("MATCHING_CHECKPOINTS", str(tmp_path / "chk"))
    monkeypatch.setenv("MATCHING_SOURCE", "a")
    runner = CliRunner()
    first = runner.invoke(main, ["run", str(job)])
    assert first.exit_code == 0, first.output
    monkeypatch.setenv("MATCHING_SOURCE", "b")
    refused = runner.invoke(main, ["run", str(job), "--restore", "latest"])
    assert refused.exit_code == 2, refused.output
    assert "'a' (source): the source positions" in refused.output
    assert "--allow-non-restored-state" in refused.output
    allowed = runner.invoke(main, ["run", str(job), "--restore", "latest",
                                   "--allow-non-restored-state"])
    assert allowed.exit_code == 0, allowed.output


def test_checkpoint_from_before_stable_ids_restores_its_unchanged_job(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A checkpoint written before lineages and stable ids named unnamed
    # operators "<kind>-<declaration index>": rewrite one that way, as the
    # earlier code wrote it, and restore the unchanged job from it.
    from eddyflow.checkpoint.storage import CheckpointStorage

    directory = tmp_path / "chk"
    info = crash(directory)
    env = make_env(directory)
    keyed_job(env, ef.ListSink())
    legacy = {n.uid: f"{n.kind}-{n.id}" for n in env._graph.nodes}
    storage = CheckpointStorage(directory)
    meta = storage.read_metadata(info.id)
    for key in ("checksum", "format_version", "checkpoint_id", "lineage", "base"):
        meta.pop(key, None)
    meta["operators"] = {legacy.get(u, u): op for u, op in meta["operators"].items()}
    asyncio.run(storage.write_metadata(info.id, meta))
    env = make_env(directory)
    keyed_job(env, ef.ListSink())
    with caplog.at_level(logging.WARNING, logger="eddyflow.checkpoint.listing"):
        result = run(env, restore="latest")
    assert any("predates stable operator ids" in r.getMessage() for r in caplog.records)
    (count,) = [n.uid for n in env._graph.nodes if n.kind == "count"]
    assert dict(result.state(count)) == dict(Counter(r[0] for r in RECORDS))
