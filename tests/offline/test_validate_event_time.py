"""``validate`` on event-time jobs: tumbling windows with allowed lateness
and late records, sessions, and a process function with event-time timers.
Every retained checkpoint of a run with failures validates (the replay
handles the input up to the checkpoint's positions, then advances each
operator to the watermark the checkpoint recorded, firing what it had
fired); altering input before a checkpoint's position fails, naming the
keys it changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import env_for, run_with_failures

import eddyflow as ef
from eddyflow.offline import validate

JOB = Path(__file__).resolve().parent / "jobs" / "windowed_events.py"
OPERATORS = {"per-minute", "sessions", "last-click"}


def _run(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[ef.CheckpointInfo]:
    from importlib import util

    spec = util.spec_from_file_location("windowed_events", JOB)
    assert spec is not None and spec.loader is not None
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_events(str(tmp / "events.jsonl"))
    env_for(monkeypatch, EF_WINDOWED_INPUT=str(tmp / "events.jsonl"))
    # Checkpoint writes in-process: starting the writer's helper process
    # takes about a second on a loaded machine, as long as this run, and the
    # checkpoints taken mid-run are the point of the test.
    monkeypatch.setattr("eddyflow.checkpoint.writer.ENABLED", False)
    result = run_with_failures(JOB, tmp / "chk", interval=0.02, retained=4,
                               faults=(("snapshot.async_write", 2),))
    assert result.restarts >= 1
    infos = ef.list_checkpoints(tmp / "chk")
    assert any(not i.final for i in infos), [(i.id, i.final) for i in infos]
    return infos


def test_every_retained_checkpoint_of_an_event_time_job_validates(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for info in _run(in_tmp, monkeypatch):
        report = validate(spark, info.path, job=JOB)
        assert report.ok, (f"checkpoint {info.id}: {report.mismatch_count} mismatches, e.g. "
                           f"{report.first_mismatches(5)}; unreplayed {report.unreplayed}")
        assert set(report.operators) >= OPERATORS and report.compared > 0


def test_event_time_input_altered_before_the_position_fails_naming_the_keys(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    infos = _run(in_tmp, monkeypatch)
    mid = next(i for i in infos if not i.final)
    position = int(mid.operators["clicks"]["subtasks"]["0"]["source"]["slice-0"])
    assert position > 100
    path = in_tmp / "events.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[50])
    old_user = record["user"]
    record["user"] = "zz"  # a click moves to a user nobody else is
    lines[50] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")

    report = validate(spark, mid.path, job=JOB)
    assert not report.ok
    keys = {r[2] for r in report.mismatches.collect()}
    # The new user's state appears; the old user's changes (its last click
    # or its windows, if still open at the checkpoint's watermark).
    assert "zz" in keys
    assert keys <= {"zz", old_user}


def test_read_windows_and_read_timers_give_a_row_each(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eddyflow.offline import read_timers, read_windows

    mid = next(i for i in _run(in_tmp, monkeypatch) if not i.final)
    windows = read_windows(spark, mid.path, operator="per-minute").collect()
    timers = read_timers(spark, mid.path, operator="per-minute").collect()
    assert windows and timers
    for w in windows:
        assert w.window_end - w.window_start == 10.0 and w.window_start % 10.0 == 0
        assert int(w.value) >= 1 and w.state == "_windows"
    # Each open window has its fire time (its end) or its cleanup time (end
    # + 5 s of allowed lateness) ahead, as a timer of its key.
    times = {(t.key, t.timestamp) for t in timers}
    assert {t.domain for t in timers} == {"event"}
    for w in windows:
        assert (w.key, w.window_end) in times or (w.key, w.window_end + 5.0) in times


# -- why the job keeps its stragglers from the sessions (deterministic) --------


def _window_operator(windowed: Any) -> Any:
    """A one-subtask instance of the window operator ``windowed(keyed)``
    builds, on a memory backend, as the replay runs it."""
    from eddyflow.runtime.operators.base import OperatorContext
    from eddyflow.runtime.operators.windows import WindowSpec
    from eddyflow.state.memory import MemoryStateBackend

    env = ef.StreamEnvironment()
    stream = env.from_collection([{"user": "u", "ts": 0.0}]).assign_timestamps_and_watermarks(
        ef.WatermarkStrategy.bounded_out_of_orderness(2.0, _ts))
    windowed(stream.key_by(_user)).count().name("w").sink_to(ef.ListSink())
    (node,) = [n for n in env.plan().graph.nodes if isinstance(n.payload, WindowSpec)]
    op = node.payload.instantiate(OperatorContext("w", 0, 1, 128, MemoryStateBackend()))
    op.open()
    return op


def _ts(r: dict[str, Any]) -> float:
    return float(r["ts"])


def _user(r: dict[str, Any]) -> str:
    return str(r["user"])


def _state_after(windowed: Any, steps: list[Any]) -> dict[str, Any]:
    """The operator's state after ``steps``: records (dicts) and watermarks
    (floats), in the order the operator sees them."""
    op = _window_operator(windowed)
    for step in steps:
        if isinstance(step, dict):
            op.process_ts([step], [step["ts"]])
        elif step > op.watermark:
            op.watermark = step
            op.on_watermark(step)
    return {name: {k: dict(v) for k, v in table.items()}
            for name, table in op.backend.tables().items()}


def test_a_record_behind_the_watermark_leaves_a_session_state_that_depends_on_timing() -> None:
    """The same records and the same watermark, two orders of the watermark
    among the records: a session operator's state differs when a record
    reaches it behind its watermark and its own window still ends after it
    (the earlier session has fired and gone: a new session; the replay's
    order, the watermark last: one merged session). So no replay can tell
    the checkpoint's state from its input and watermark, and the job keeps
    its stragglers from its sessions."""
    def sessions(keyed: Any) -> Any:
        return keyed.window(ef.EventTimeSessionWindows(3.7))

    first, straggler = {"user": "u", "ts": 10.0}, {"user": "u", "ts": 12.0}
    stream = _state_after(sessions, [first, 14.0, straggler])
    replay = _state_after(sessions, [first, straggler, 14.0])
    assert stream["_windows"] == {"u": {(12.0, 15.7): 1}}
    assert replay["_windows"] == {"u": {(10.0, 15.7): 2}}


@pytest.mark.parametrize("watermark", [22.0, 26.0])
def test_a_record_behind_the_watermark_leaves_a_tumbling_state_that_does_not(
        watermark: float) -> None:
    """Tumbling windows with allowed lateness: a record behind the watermark
    joins its fired window again (22: within the lateness) or is dropped
    (26: the window is gone), and the replay's order arrives at the same
    state, timers included."""
    def per_minute(keyed: Any) -> Any:
        return keyed.window(ef.TumblingEventTimeWindows(10.0)).allowed_lateness(5.0)

    first, straggler = {"user": "u", "ts": 12.0}, {"user": "u", "ts": 11.0}
    assert (_state_after(per_minute, [first, watermark, straggler])
            == _state_after(per_minute, [first, straggler, watermark]))


def test_the_sessions_of_the_job_never_see_a_record_behind_the_watermark(
        tmp_path: Path) -> None:
    """What the sessions operator gets of the job's input never goes behind
    the most advanced watermark its generator could have sent before it (a
    watermark after every record), so none goes behind whichever one it
    was: the sessions' state is a function of the input and the watermark,
    whenever the watermarks went out. (The stragglers the job filters out
    do go behind it.)"""
    from importlib import util

    from eddyflow.windowing.watermarks import WatermarkStrategy

    spec = util.spec_from_file_location("windowed_events", JOB)
    assert spec is not None and spec.loader is not None
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_events(str(tmp_path / "events.jsonl"))
    records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    generator = WatermarkStrategy.bounded_out_of_orderness(2.0, _ts).create_generator()
    behind = []
    for r in records:
        if r["ts"] < generator.current_watermark():
            behind.append(r)
        generator.on_event(r["ts"])
    assert behind and not any(module.in_bound(r) for r in behind)
