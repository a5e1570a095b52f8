"""``validate`` on unaligned checkpoints: the snapshot side runs the keyed
state forward with the checkpoint's channel state (the records in flight at
the barrier), so a checkpoint that holds some validates, and one whose
channel state was altered fails naming the keys it changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import run_with_failures
from tamper import rewrite_channel_state

import eddyflow as ef
from eddyflow.offline import read_channel_state, validate
from eddyflow.offline.readers import channel_state_exchanges

JOB = Path(__file__).parent / "jobs" / "backpressured_sums.py"
UNION = Path(__file__).parent / "jobs" / "backpressured_union.py"


def in_flight(info: ef.CheckpointInfo) -> int:
    return info.meta.channel_state_records


def unaligned_checkpoints(folder: Path, job: Path = JOB) -> list[ef.CheckpointInfo]:
    run_with_failures(job, folder, interval=0.02, retained=50, mode="unaligned",
                      faults=(("snapshot.async_write", 3),))
    return [i for i in ef.list_checkpoints(folder) if in_flight(i) > 0]


def test_unaligned_checkpoints_with_channel_state_validate(spark: Any, tmp_path: Path) -> None:
    held = unaligned_checkpoints(tmp_path / "chk")
    assert held, "no checkpoint held records in flight"
    for info in held[:3]:
        report = validate(spark, info.path, job=JOB)
        assert report.ok, (f"checkpoint {info.id}: {report.first_mismatches(5)}; "
                           f"unreplayed {report.unreplayed}")
        assert {"running-sum", "count"} <= set(report.operators)
    rows = read_channel_state(spark, held[0].path).collect()
    assert len(rows) == in_flight(held[0])
    assert {r["side"] for r in rows} <= {"input", "output"}
    assert {r["exchange"] for r in rows} <= {"events->running-sum", "running-sum->slow"}


def test_altered_channel_state_fails_naming_the_keys(spark: Any, tmp_path: Path) -> None:
    held = unaligned_checkpoints(tmp_path / "chk")
    assert held, "no checkpoint held records in flight"
    # read_channel_state types the record column only where the records in
    # flight share one shape, and reads it as text otherwise (a fresh-clone
    # run drew such a checkpoint first): take the first that reads typed.
    typed = ((info, rows) for info in held
             if not isinstance((rows := read_channel_state(spark, info.path).collect())[0]
                               ["record"], str))
    found = next(typed, None)
    assert found is not None, "no checkpoint's channel state read back typed"
    info, rows = found
    sensor = rows[0]["record"]["_1"]  # a record in flight: ("sensor-..", n), a struct
    assert read_channel_state(spark, info.path, as_text=True).collect()[0]["record"] == repr(
        tuple(rows[0]["record"]))

    def drop_victims(records: list[Any]) -> list[Any]:
        return [r for r in records if r[0] != sensor]

    assert rewrite_channel_state(info.path, drop_victims) >= 1
    report = validate(spark, info.path, job=JOB)
    assert not report.ok
    keys = {(r[0], r[2]) for r in report.mismatches.collect()}
    assert keys and {k for _, k in keys} == {sensor}, keys


def test_channel_state_of_two_exchanges_into_one_operator_validates(
        spark: Any, tmp_path: Path) -> None:
    """A union: the running sums' records in flight come over two exchanges,
    and the snapshot side must run both forward."""
    both = {"left->running-sum", "right->running-sum"}
    held = [i for i in unaligned_checkpoints(tmp_path / "chk", UNION)
            if both <= channel_state_exchanges(i.path)]
    assert held, "no checkpoint held records in flight on both exchanges"
    report = validate(spark, held[0].path, job=UNION)
    assert report.ok, report.first_mismatches(5)
