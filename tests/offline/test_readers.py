"""A checkpoint as DataFrames: metadata, positions, keyed state and back-edge
logs agree with what the runtime wrote and reports; a damaged state file is
refused with its path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, run_with_failures
from test_validate import backedge_records, setup_cc

import eddyflow as ef
from eddyflow.offline import read_backedge_log, read_metadata, read_positions, read_state


def test_state_positions_and_metadata_of_a_running_sum(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNNING_SUM_EVENTS", "100000")
    result = run_with_failures(EXAMPLES / "running_sum.py", in_tmp / "chk", interval=0.02)
    infos = ef.list_checkpoints(in_tmp / "chk")
    final = infos[-1]

    state = read_state(spark, final.path, operator="running-sum")
    assert state.columns == ["operator", "subtask", "key_group", "key", "state", "value"]
    rows = {r["key"]: int(r["value"]) for r in state.collect()}
    assert rows == result.state("running-sum")
    assert {r["operator"] for r in state.collect()} == {"running-sum"}
    assert all(r["state"] == "state" for r in state.collect())

    positions = {r["subtask"]: json.loads(r["position"])
                 for r in read_positions(spark, final.path).collect()}
    assert positions == {int(s): p["source"]
                         for s, p in final.operators["events"]["subtasks"].items()}

    meta = read_metadata(spark, in_tmp / "chk")
    assert meta.count() == len(infos) * len(final.operators)
    entries = {r["checkpoint_id"]: r["state_entries"]
               for r in meta.filter(meta.operator == "running-sum").collect()}
    assert entries[final.id] == len(rows)


def test_backedge_log_rows_are_the_logged_records(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_cc(in_tmp, monkeypatch)
    logged: list[ef.CheckpointInfo] = []
    for attempt in range(5):
        run_with_failures(EXAMPLES / "connected_components.py", in_tmp / f"c{attempt}",
                          interval=0.005, retained=50)
        logged = [i for i in ef.list_checkpoints(in_tmp / f"c{attempt}")
                  if backedge_records(i)]
        if logged:
            break
    assert logged, "no checkpoint caught records round the loop"
    df = read_backedge_log(spark, logged[0].path)
    assert df.count() == backedge_records(logged[0])
    assert {r["operator"] for r in df.collect()} <= set(logged[0].operators)
    assert all(r["record"].startswith("('label'") for r in df.collect())


def test_a_damaged_state_file_is_refused_naming_it(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNNING_SUM_EVENTS", "20000")
    run_with_failures(EXAMPLES / "running_sum.py", in_tmp / "chk", interval=1.0)
    final = ef.list_checkpoints(in_tmp / "chk")[-1]
    part = final.operators["running-sum"]["subtasks"]["0"]["keyed"]["files"][-1]["path"]
    path = in_tmp / "chk" / part
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(Exception, match="checksum mismatch") as info:
        read_state(spark, final.path).collect()
    assert part in str(info.value)
