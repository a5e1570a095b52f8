"""Spark replay agrees with every retained checkpoint of the examples — runs
with injected failures and restarts — and names exactly the keys of a
checkpoint whose state was altered, or whose input changed before the
checkpoint's position (issue 5, DESIGN.md §9)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, env_for, run_with_failures
from tamper import change_one_drop_one, rewrite_state

import eddyflow as ef
from eddyflow.offline import validate
from eddyflow.offline.checkpoint import keyed_files, open_checkpoint, read_keyed_file
from eddyflow.offline.readers import as_text

WORDCOUNT = EXAMPLES / "wordcount.py"
RUNNING_SUM = EXAMPLES / "running_sum.py"
CC = EXAMPLES / "connected_components.py"

FAULTS = (("snapshot.async_write", 2), ("task.aligning", 3))


def _letters(i: int) -> str:
    """``w`` and five letters: words the example's tokenizer keeps whole."""
    out = ""
    for _ in range(5):
        i, r = divmod(i, 26)
        out = chr(ord("a") + r) + out
    return "w" + out


def write_text(path: Path, words: int, vocabulary: int, seed: int = 5) -> None:
    rng = random.Random(seed)
    vocab = [_letters(i) for i in range(vocabulary)]
    with open(path, "w") as f:
        for _ in range(0, words, 12):
            f.write(" ".join(rng.choice(vocab) for _ in range(12)) + "\n")


def setup_wordcount(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_text(tmp / "input.txt", words=300_000, vocabulary=4_000)
    env_for(monkeypatch, WORDCOUNT_INPUT=str(tmp / "input.txt"),
            WORDCOUNT_OUTPUT=str(tmp / "out"), WORDCOUNT_CHECKPOINTS=str(tmp / "unused"))


def setup_running_sum(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_for(monkeypatch, RUNNING_SUM_EVENTS="300000")


def setup_cc(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import util

    spec = util.spec_from_file_location("cc_example", CC)
    assert spec is not None and spec.loader is not None
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make_graph(str(tmp / "edges.txt"), vertices=6_000, edges=7_500, seed=11)
    env_for(monkeypatch, CC_EDGES=str(tmp / "edges.txt"))


CASES: dict[str, tuple[Path, Any, str, str]] = {
    # job, set-up, keyed operator, state to tamper with
    "wordcount": (WORDCOUNT, setup_wordcount, "count", "count"),
    "running-sum": (RUNNING_SUM, setup_running_sum, "running-sum", "state"),
    "connected-components": (CC, setup_cc, "propagate", "label"),
}


def checkpoints_of_run(name: str, tmp: Path, monkeypatch: pytest.MonkeyPatch
                       ) -> tuple[ef.JobResult, list[ef.CheckpointInfo]]:
    job, setup, _, _ = CASES[name]
    setup(tmp, monkeypatch)
    result = run_with_failures(job, tmp / "chk", interval=0.01, faults=FAULTS)
    return result, ef.list_checkpoints(tmp / "chk")


def backedge_records(info: ef.CheckpointInfo) -> int:
    return sum(p["backedge"]["records"] for op in info.operators.values()
               for p in op["subtasks"].values() if "backedge" in p)


@pytest.mark.parametrize("name", list(CASES))
def test_every_retained_checkpoint_of_a_run_with_failures_validates(
        name: str, spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job, _, operator, _ = CASES[name]
    result, infos = checkpoints_of_run(name, in_tmp, monkeypatch)
    assert result.restarts >= 1, "the fault points must have failed the run"
    assert len(infos) >= 2 and any(not i.final for i in infos), (
        f"want checkpoints taken mid-run, got {[(i.id, i.final) for i in infos]}")
    for info in infos:
        report = validate(spark, info.path, job=job)
        assert report.ok, (f"checkpoint {info.id} of {name}: {report.mismatch_count} "
                           f"mismatches, e.g. {report.first_mismatches(5)}; "
                           f"unreplayed {report.unreplayed}")
        assert operator in report.operators and report.compared > 0
        assert report.unreplayed == {}
        assert sum(report.records_replayed.values()) > 0
    final = infos[-1]
    assert final.final
    # The last checkpoint's state is the job's final state, key for key.
    entries = sum(p["keyed"]["entries"] for p in final.operators[operator]["subtasks"].values())
    assert entries == sum(len(result.state(operator, s)) for s in _state_names(final, operator))


def _state_names(info: ef.CheckpointInfo, operator: str) -> set[str]:
    ref = open_checkpoint(info.path)
    return {name for kf in keyed_files(ref, operator) for _, name, _, _ in read_keyed_file(kf)}


def test_a_loop_checkpoint_with_records_in_flight_validates(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot side runs the back-edge log forward: without it, a
    checkpoint taken while records were round the loop would not match."""
    setup_cc(in_tmp, monkeypatch)
    logged: list[ef.CheckpointInfo] = []
    for attempt in range(5):  # a checkpoint must catch records round the loop
        folder = in_tmp / f"chk{attempt}"
        run_with_failures(CC, folder, interval=0.005, retained=50)
        logged = [i for i in ef.list_checkpoints(folder) if backedge_records(i)]
        if logged:
            break
    assert logged, "no checkpoint caught records in flight round the loop"
    report = validate(spark, logged[0].path, job=CC)
    assert report.ok, report.first_mismatches(5)


def mismatch_keys(report: Any) -> set[tuple[str, str, str]]:
    return {(r[0], r[1], r[2]) for r in report.mismatches.collect()}


@pytest.mark.parametrize("name", list(CASES))
def test_altered_state_fails_naming_exactly_the_altered_keys(
        name: str, spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job, _, operator, state = CASES[name]
    _, infos = checkpoints_of_run(name, in_tmp, monkeypatch)
    final = infos[-1]
    ref = open_checkpoint(final.path)
    keys = sorted((key for kf in keyed_files(ref, operator)
                   for _, s, key, _ in read_keyed_file(kf) if s == state), key=repr)
    changed, dropped = keys[len(keys) // 3], keys[2 * len(keys) // 3]
    rewrite_state(final.path, operator, change_one_drop_one(state, changed, dropped))

    report = validate(spark, final.path, job=job)
    assert not report.ok
    assert mismatch_keys(report) == {(operator, state, as_text(changed)),
                                     (operator, state, as_text(dropped))}
    rows = {r[2]: r for r in report.mismatches.collect()}
    assert rows[as_text(dropped)][4] is None  # missing from the snapshot
    assert rows[as_text(changed)][3] != rows[as_text(changed)][4]


def test_wordcount_input_altered_before_the_position_fails_naming_both_words(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, infos = checkpoints_of_run("wordcount", in_tmp, monkeypatch)
    mid = next(i for i in infos if not i.final)
    position = min(int(at) for p in mid.operators["lines"]["subtasks"].values()
                   for at in p["source"].values())  # each byte range's position
    text = (in_tmp / "input.txt").read_text()
    # A word early in the file becomes a word nobody else uses; same length,
    # so every recorded byte offset still falls on the same line start.
    at = text.index(" ", 100) + 1
    old = text[at:at + 6]
    assert at + 6 < position and old.startswith("w")
    (in_tmp / "input.txt").write_text(text[:at] + "zzzzzz" + text[at + 6:])

    report = validate(spark, mid.path, job=WORDCOUNT)
    assert not report.ok
    assert mismatch_keys(report) == {("count", "count", old), ("count", "count", "zzzzzz")}


def test_cyclic_input_altered_fails_naming_exactly_the_keys_it_changes(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which vertices an altered edge affects is found by the runtime itself:
    a failure-free run on the altered graph, compared with the original's
    final state."""
    _, infos = checkpoints_of_run("connected-components", in_tmp, monkeypatch)
    final = infos[-1]
    before = _final_state(in_tmp / "chk")
    lines = (in_tmp / "edges.txt").read_text().splitlines()
    u, v = lines[10].split()
    w = next(str(x) for x in range(int(v) + 1, 10**6) if len(str(x)) == len(v))
    lines[10] = f"{u} {w}"  # one edge moved to another vertex
    (in_tmp / "edges.txt").write_text("\n".join(lines) + "\n")
    run_with_failures(CC, in_tmp / "chk-altered", interval=1.0)
    after = _final_state(in_tmp / "chk-altered")
    differ = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert differ, "the altered edge changes nothing: choose another"

    report = validate(spark, final.path, job=CC)
    assert not report.ok
    assert mismatch_keys(report) == {("propagate", state, as_text(key)) for state, key in differ}


def _final_state(folder: Path) -> dict[tuple[str, Any], Any]:
    ref = open_checkpoint(folder)
    assert ref.meta.final
    out = {}
    for kf in keyed_files(ref, "propagate"):
        for _, state, key, value in read_keyed_file(kf):
            out[(state, key)] = sorted(value) if isinstance(value, list) else value
    return out
