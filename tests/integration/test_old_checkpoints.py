"""Checkpoints written by an earlier eddyflow restore on this one.

The folders under ``tests/fixtures/old_checkpoints`` were written by main
before issue 27 moved the code into its present layout (see
``make_fixtures.py`` there): a moved module or a renamed class must not
change what a checkpoint on disk means. Each is restored at its own
parallelism and at another (its source too: the fixtures record a position
per source subtask, which a split source maps to its slices), and the job
then runs to the end of its input: the final keyed state must be that of a
run over the whole input, and every window fired after the restore must
hold every record of its window, those before the checkpoint included."""

from __future__ import annotations

import shutil
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import eddyflow as ef

FIXTURES = Path(__file__).parents[1] / "fixtures" / "old_checkpoints"
sys.path.insert(0, str(FIXTURES))

import old_job  # noqa: E402


def reference(total: int) -> dict[str, dict[object, object]]:
    """Each state of the job after ``total`` records, computed in plain Python."""
    seen: dict[object, object] = defaultdict(int)
    top: dict[int, list[int]] = defaultdict(list)
    residues: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    totals: dict[object, object] = defaultdict(int)
    for n in range(total):
        key = n % old_job.KEYS
        seen[key] += 1  # type: ignore[operator]
        top[key] = sorted([*top[key], n])[-3:]
        residues[key][n % 3] += 1
        totals[key] += n  # type: ignore[operator]
    return {"seen": dict(seen), "top": dict(top),
            "residues": {k: dict(v) for k, v in residues.items()},
            "total": dict(totals)}


def window_sums(total: int) -> dict[tuple[int, float], int]:
    """Each (key, window start)'s sum of numbers."""
    sums: dict[tuple[int, float], int] = defaultdict(int)
    for n in range(total):
        _, key, ts = old_job.record(n)
        start = (ts // old_job.WINDOW) * old_job.WINDOW
        sums[(key, start)] += n
    return dict(sums)


@pytest.mark.parametrize(("parallelism", "source_parallelism"), [(2, 1), (3, 1), (3, 2)])
@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_an_old_checkpoint_restores(tmp_path: Path, kind: str, parallelism: int,
                                    source_parallelism: int) -> None:
    chk = tmp_path / "chk"
    shutil.copytree(FIXTURES / kind, chk)
    (restored,) = [p for p in chk.iterdir() if p.name.startswith("chk-")]
    env = ef.StreamEnvironment(parallelism=parallelism, max_parallelism=128)
    env.enable_checkpointing(interval=60.0, directory=str(chk))
    env.set_state_backend(old_job.backends(tmp_path)[kind])
    windows, profiles = ef.ListSink(), ef.ListSink()
    # The source, a split source now, restores at another parallelism too:
    # its position per subtask becomes a slice's.
    old_job.build(env, old_job.TOTAL, profiles=profiles, windows=windows,
                  source_parallelism=source_parallelism)
    result = env.execute(f"old-{kind}", restore=str(restored))

    expected = reference(old_job.TOTAL)
    for name in ("seen", "top", "residues", "total"):
        got = {k: (dict(v) if name == "residues" else v)
               for k, v in result.state("profile", name).items()}
        assert got == expected[name], name
    assert dict(result.state("count")) == expected["seen"]

    sums = window_sums(old_job.TOTAL)
    fired = {(w.key, w.start): w.value for w in windows.results}
    assert fired, "no window fired after the restore"
    for (key, start), value in fired.items():
        assert value == sums[(key, start)], (key, start)
    # What fired after the restore is, per key, every window from the first
    # one it fired to the last: none lost at the restored watermark.
    for key in range(old_job.KEYS):
        starts = sorted(s for k, s in fired if k == key)
        assert starts, key
        assert starts == sorted(s for k, s in sums if k == key and s >= starts[0]), key
    # The job went on from the checkpoint's positions, not from the start:
    # only the records after them reached the process function, and each
    # key's running count went on from its restored value.
    assert 0 < len(profiles.results) < old_job.TOTAL
    resumed: dict[int, list[int]] = defaultdict(list)
    for key, count in profiles.results:
        resumed[key].append(count)
    for key, counts in resumed.items():
        final = expected["seen"][key]
        assert sorted(counts) == list(range(min(counts), final + 1)), key  # type: ignore[operator]
    assert sum(min(c) - 1 for c in resumed.values()) == old_job.TOTAL - len(profiles.results)
