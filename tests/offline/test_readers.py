"""A checkpoint as DataFrames: metadata, positions, keyed state and back-edge
logs agree with what the runtime wrote and reports; a damaged state file is
refused with its path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, run_with_failures
from job_support import BACKENDS
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
    # Records ("label", vertex, label) are a struct column; as text, their repr.
    assert all(r["record"]["_1"] == "label" and isinstance(r["record"]["_2"], int)
               for r in df.collect())
    text = read_backedge_log(spark, logged[0].path, as_text=True).collect()
    assert all(r["record"].startswith("('label'") for r in text)
    assert sorted(r["record"] for r in text) == sorted(
        repr(tuple(r["record"])) for r in df.collect())


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


class Remember(ef.KeyedProcessFunction):
    """Keeps, with a 10 s TTL, each key's last record, the times it was
    seen (map) and their list; the clock goes to each record's time."""

    def __init__(self, clock: ef.testing.ManualClock) -> None:
        self.clock = clock

    def open(self, ctx: ef.RuntimeContext) -> None:
        ttl = ef.StateTtl(10.0)
        self.last = ctx.value_state("last", ttl=ttl)
        self.seen = ctx.map_state("seen", ttl=ttl)
        self.times = ctx.list_state("times", ttl=ttl)

    def process(self, value: tuple[str, float], ctx: ef.RuntimeContext) -> Any:
        t = value[1]
        self.clock.set(t)
        self.last.update({"t": t})
        self.seen.put(f"at {t}", [t])
        self.times.add(t)
        yield value


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_with_a_ttl_reads_as_the_user_values(spark: Any, tmp_path: Path,
                                                   backend: str) -> None:
    """``read_state`` and ``state_rdd`` show a state with a TTL without the
    write times it is stored with (``raw=True``: with them), as
    ``JobResult.state`` does; what expired before the checkpoint's barrier
    is not in it."""
    from eddyflow.offline import state_rdd

    env = ef.StreamEnvironment(parallelism=2)
    if backend == "rocksdb":
        env.set_state_backend(ef.RocksDBStateBackend(tmp_path / "rocks"))
    env.enable_checkpointing(10.0, tmp_path / "chk")
    clock = ef.testing.ManualClock()
    env.set_clock(clock)
    records = [("a", 0.0), ("b", 0.0), ("a", 5.0), ("c", 9.0), ("a", 12.0)]
    (env.from_collection(records).key_by(lambda r: r[0]).process(Remember(clock))
        .set_parallelism(1).name("remember").sink_to(ef.ListSink()))
    result = env.execute("remember")
    want = {
        "last": {"a": {"t": 12.0}, "c": {"t": 9.0}},  # "b", written at 0, expired at 10
        "seen": {"a": {"at 5.0": [5.0], "at 12.0": [12.0]}, "c": {"at 9.0": [9.0]}},
        "times": {"a": [5.0, 12.0], "c": [9.0]},
    }
    assert {n: dict(result.state("remember", n).items()) for n in want} == want
    final = ef.list_checkpoints(tmp_path / "chk")[-1]
    rows = read_state(spark, final.path, operator="remember").collect()
    assert sorted((r["state"], r["key"], r["value"]) for r in rows) == sorted(
        (name, key, repr(value)) for name, table in want.items() for key, value in table.items())
    raw = state_rdd(spark.sparkContext, final.path, "remember", raw=True).collect()
    stored = {(t[2], t[4]): (t[3], t[5]) for _, t in raw}
    assert stored[("last", "a")] == ("value+ttl", (12.0, {"t": 12.0}))
    assert stored[("seen", "a")] == ("map+ttl", {"at 5.0": (5.0, [5.0]),
                                                 "at 12.0": (12.0, [12.0])})
    assert stored[("times", "a")] == ("list+ttl", [(5.0, 5.0), (12.0, 12.0)])
    assert len(stored) == 6
