"""``read_changes``: the rows between two checkpoints are the difference of
their ``read_state`` results (computed here independently, as plain dicts),
read from the delta files alone where the memory backend's chain allows,
by a diff otherwise (RocksDB, a chain cut by a restart, a rescaled pair);
with deletions; a damaged delta file is refused naming it; and with 1% of
many keys changed only the changed files are read."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, env_for
from job_support import BACKENDS
from test_validate import FAULTS, write_text

import eddyflow as ef
from eddyflow.jobfile import build_environment
from eddyflow.offline import plan_changes, read_changes, read_state
from eddyflow.testing import arm, disarm_all

WORDCOUNT = EXAMPLES / "wordcount.py"
PHASED = Path(__file__).parent / "jobs" / "phased_state.py"

Key = tuple[str, str, Any]  # operator, state, key


def run(job: Path, checkpoints: Path, backend: str, *, parallelism: int = 2,
        interval: float = 0.01, faults: tuple[tuple[str, int], ...] = (),
        restore: str | None = None) -> ef.JobResult:
    """Run ``job`` with checkpoints every ``interval`` (all retained) on
    ``backend``, the fault points armed and restarts allowed."""
    env, _ = build_environment(job, parallelism=parallelism)
    if backend == "rocksdb":
        env.set_state_backend(ef.RocksDBStateBackend(checkpoints.parent / "rocks"))
    env.enable_checkpointing(interval=interval, directory=checkpoints, retained=1000)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=10, delay=0.0))
    try:
        for point, after in faults:
            arm(point, after=after)
        return env.execute(job.stem, restore=restore)
    finally:
        disarm_all()


def setup_wordcount(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A text long enough for checkpoints and restarts between them."""
    write_text(tmp / "input.txt", words=800_000, vocabulary=20_000)
    env_for(monkeypatch, WORDCOUNT_INPUT=str(tmp / "input.txt"),
            WORDCOUNT_OUTPUT=str(tmp / "out"), WORDCOUNT_CHECKPOINTS=str(tmp / "unused"))


def _plain(x: Any) -> Any:
    """A typed column's value as plain Python (a struct Row as a tuple)."""
    if isinstance(x, tuple):
        return tuple(map(_plain, x))
    if isinstance(x, list):
        return [_plain(e) for e in x]
    if isinstance(x, dict):
        return {_plain(k): _plain(v) for k, v in x.items()}
    return x


def state_of(spark: Any, directory: Path, checkpoint: int, **kw: Any) -> dict[Key, Any]:
    rows = read_state(spark, directory / f"chk-{checkpoint}", **kw).collect()
    return {(r["operator"], r["state"], _plain(r["key"])): _plain(r["value"]) for r in rows}


def difference(a: dict[Key, Any], b: dict[Key, Any]) -> dict[Key, tuple[str, Any]]:
    """What changed from ``a`` to ``b``, as plain dicts."""
    out: dict[Key, tuple[str, Any]] = {k: ("upsert", v) for k, v in b.items()
                                       if k not in a or a[k] != v}
    out.update({k: ("delete", None) for k in a if k not in b})
    return out


def changes_of(spark: Any, directory: Path, start: int, end: int, **kw: Any
               ) -> dict[Key, tuple[str, Any]]:
    df = read_changes(spark, directory, start=start, end=end, **kw)
    assert df.columns == ["checkpoint", "change", "operator", "key_group", "key", "state",
                          "value"]
    rows = df.collect()
    assert {r["checkpoint"] for r in rows} <= {end}
    out = {(r["operator"], r["state"], _plain(r["key"])): (r["change"], _plain(r["value"]))
           for r in rows}
    assert len(out) == len(rows), "one row per (operator, state, key)"
    return out


def apply(state: dict[Key, Any], changes: dict[Key, tuple[str, Any]]) -> dict[Key, Any]:
    out = dict(state)
    for k, (change, value) in changes.items():
        if change == "upsert":
            out[k] = value
        else:
            out.pop(k, None)
    return out


def kinds(directory: Path, start: int, end: int) -> tuple[int, int]:
    plan = plan_changes(directory, start, end)
    return len(plan.deltas), len(plan.diffs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_word_count_changes_are_the_difference_of_read_state(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    setup_wordcount(in_tmp, monkeypatch)
    chk = in_tmp / "chk"
    result = run(WORDCOUNT, chk, backend, faults=FAULTS)
    assert result.restarts >= 1
    ids = [i.id for i in ef.list_checkpoints(chk)]
    assert len(ids) >= 2, ids
    # A word count writes most of its words between two checkpoints here:
    # the memory backend's snapshots are mostly full (so diffed), the delta
    # files are tested on jobs/phased_state.py below; a pair with deltas is
    # taken when there is one.
    consecutive = {(a, b): kinds(chk, a, b) for a, b in itertools.pairwise(ids)}
    pairs = [next(iter(consecutive))]
    pairs += [p for p, (d, _) in consecutive.items() if d][:1]
    pairs += [(ids[0], ids[-1]), (ids[len(ids) // 2], ids[-1])]
    pairs = sorted({(a, b) for a, b in pairs if a < b})
    if backend == "rocksdb":
        assert all(d == 0 for d, _ in consecutive.values()), consecutive
    states = {c: state_of(spark, chk, c) for pair in pairs for c in pair}
    assert states[ids[-1]] == {("count", "count", w): n
                               for w, n in result.state("count").items()}
    for a, b in pairs:
        want = difference(states[a], states[b])
        assert want, (a, b)
        # Counts only grow: every word written between a and b changed.
        assert changes_of(spark, chk, a, b) == want, (a, b, consecutive.get((a, b)))
        assert changes_of(spark, chk, a, b, exact=True) == want, (a, b)


def phased_run(tmp: Path, backend: str, monkeypatch: pytest.MonkeyPatch, keys: int,
               changed: int) -> tuple[Path, int, int]:
    """The phased job's checkpoints, and the last one at the end of phase
    one and the final one."""
    chk = tmp / "chk"
    env_for(monkeypatch, PHASED_KEYS=str(keys), PHASED_CHANGED=str(changed),
            PHASED_CHECKPOINTS=str(chk), PHASED_BACKEND=backend,
            PHASED_ROCKSDB=str(tmp / "rocks"))
    run(PHASED, chk, backend, interval=0.05)
    infos = ef.list_checkpoints(chk)
    at_gate = [i.id for i in infos if any(
        p.is_source and p.position == keys
        for op in i.meta.operators.values() for p in op.subtasks.values())]
    assert len(at_gate) >= 2 and infos[-1].final
    return chk, at_gate[-1], infos[-1].id


@pytest.mark.parametrize("backend", BACKENDS)
def test_deletions_rewrites_and_keys_created_and_deleted_in_between(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """Between the end of phase one and the end (jobs/phased_state.py): 50
    keys changed, 50 cleared, 50 rewritten with their old value, 50
    created and cleared again. ``exact=True`` gives the difference; the
    delta files also show the rewrites (as upserts of the same value) and
    the short-lived keys (as deletes), and the rows applied to the start
    give the end all the same."""
    m = 50
    chk, a, b = phased_run(tmp_path, backend, monkeypatch, keys=2_000, changed=m)
    deltas, diffs = kinds(chk, a, b)
    assert (deltas, diffs) == ((2, 0) if backend == "memory" else (0, 2))
    start, end = state_of(spark, chk, a), state_of(spark, chk, b)
    want = difference(start, end)
    assert sorted(c for c, _ in want.values()) == ["delete"] * m + ["upsert"] * m
    assert changes_of(spark, chk, a, b, exact=True) == want
    got = changes_of(spark, chk, a, b)
    assert apply(start, got) == end
    extra = {k: v for k, v in got.items() if k not in want}
    assert {k: v for k, v in got.items() if k in want} == want
    if backend == "memory":
        rewritten = {("keep", "last", f"k{i}") for i in range(2 * m, 3 * m)}
        short_lived = {("keep", "last", f"t{i}") for i in range(m)}
        assert set(extra) == rewritten | short_lived
        assert all(extra[k] == ("upsert", start[k]) for k in rewritten)
        assert all(extra[k] == ("delete", None) for k in short_lived)
    else:
        assert extra == {}  # a diff is exact
    # The text view: today's text columns.
    text = read_changes(spark, chk, start=a, end=b, exact=True, as_text=True)
    assert {f.dataType.simpleString() for f in text.schema.fields
            if f.name in ("key", "value")} == {"string"}
    assert {(r["key"], r["change"]) for r in text.collect()} == {
        (k[2], c) for k, (c, _) in want.items()}


def test_a_rescaled_pair_is_diffed(spark: Any, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The phased job restored at parallelism 3 from its checkpoint at the
    end of phase one (taken at 2), into the same directory: its end against
    that checkpoint is the first run's difference, and against the first
    run's end (the same state at another parallelism) nothing."""
    chk, a, b = phased_run(tmp_path, "memory", monkeypatch, keys=2_000, changed=50)
    run(PHASED, chk, "memory", parallelism=3, interval=0.05, restore=str(chk / f"chk-{a}"))
    c = ef.list_checkpoints(chk)[-1]
    assert c.id > b and c.meta.operators["keep"].parallelism == 3
    plan = plan_changes(chk, a, c.id, operator="keep")
    assert not plan.deltas and len(plan.diffs) == 3
    start, end = state_of(spark, chk, a), state_of(spark, chk, c.id)
    assert end == state_of(spark, chk, b)
    want = difference(start, end)
    assert len(want) == 100
    assert changes_of(spark, chk, a, c.id, operator="keep") == want
    assert changes_of(spark, chk, b, c.id) == {}


def test_a_damaged_delta_file_is_refused_naming_it(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chk, a, b = phased_run(tmp_path, "memory", monkeypatch, keys=1_000, changed=20)
    plan = plan_changes(chk, a, b)
    damaged = plan.deltas[0].files[-1].handle.path
    path = chk / damaged
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(Exception, match="checksum mismatch") as info:
        read_changes(spark, chk, start=a, end=b).collect()
    assert damaged in str(info.value)


def test_errors_name_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chk, a, b = phased_run(tmp_path, "memory", monkeypatch, keys=200, changed=5)
    with pytest.raises(ValueError, match="must come before"):
        plan_changes(chk, b, a)
    with pytest.raises(KeyError, match="'nope'"):
        plan_changes(chk, a, b, operator="nope")
    with pytest.raises(Exception, match=f"chk-{b + 1}"):
        plan_changes(chk, a, b + 1)


def only_changed_files_are_read(spark: Any, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch, keys: int) -> None:
    """1% of ``keys`` changed (and 1% deleted, rewritten, short-lived): the
    plan reads the delta files only, a small part of the state; the files
    it does not read are then destroyed, and the changes still read, as
    ``read_state`` of the end no longer does."""
    m = keys // 100
    chk, a, b = phased_run(tmp_path, "memory", monkeypatch, keys=keys, changed=m)
    plan = plan_changes(chk, a, b)
    assert plan.deltas and not plan.diffs
    print(f"\n{keys:,} keys, {m:,} changed: {plan.describe()}")
    assert plan.bytes_read * 10 < plan.full_bytes
    want = difference(state_of(spark, chk, a), state_of(spark, chk, b))
    read = set(plan.files_read)
    end_files = {h.path for kf in (u.end for u in plan.deltas) for h in kf.handle.file_handles()
                 if kf.handle is not None}
    unread = end_files - read
    assert unread
    for rel in unread:
        with open(chk / rel, "r+b") as f:
            f.write(b"\0" * os.path.getsize(chk / rel))
    got = changes_of(spark, chk, a, b)
    assert {k: v for k, v in got.items() if k in want} == want
    assert len(got) == len(want) + 2 * m  # the rewrites and the short-lived keys
    with pytest.raises(Exception, match="checksum mismatch"):
        read_state(spark, chk / f"chk-{b}").collect()


def test_with_1_percent_of_100k_keys_changed_only_the_changed_files_are_read(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    only_changed_files_are_read(spark, tmp_path, monkeypatch, 100_000)


@pytest.mark.slow
def test_with_1_percent_of_1m_keys_changed_only_the_changed_files_are_read(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    only_changed_files_are_read(spark, tmp_path, monkeypatch, 1_000_000)


def test_key_groups_left_uncovered() -> None:
    """The key groups of a start subtask that no end subtask holds (its
    operator's state gone) are diffed against nothing: all deleted."""
    from eddyflow.offline.changes import _minus

    assert _minus(range(0, 64), [range(0, 32), range(32, 64)]) == []
    assert _minus(range(0, 64), []) == [range(0, 64)]
    assert _minus(range(10, 50), [range(0, 20), range(30, 40)]) == [range(20, 30),
                                                                    range(40, 50)]
    assert _minus(range(10, 20), [range(20, 30)]) == [range(10, 20)]
