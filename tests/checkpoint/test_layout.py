"""``CheckpointLayout`` names every file of a checkpoint folder as every
checkpoint written so far names it: the names are the on-disk format
(tests/integration/test_old_checkpoints.py restores checkpoints of an earlier main)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyflow.checkpoint.layout import CheckpointLayout, temp_name


def test_the_names_on_disk(tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path)
    root = str(tmp_path)
    assert layout.root == root
    assert layout.checkpoint_dir(7) == f"{root}/chk-7"
    assert layout.metadata(7) == f"{root}/chk-7/_metadata"
    assert layout.superseded_metadata(7) == f"{root}/chk-7/_metadata.superseded"
    assert layout.shared_dir == f"{root}/shared"
    assert layout.commits_dir == f"{root}/_commits"
    assert layout.commit_record(7) == f"{root}/_commits/chk-7.json"
    assert layout.lock == f"{root}/_lock"
    assert layout.backedge_log_file(7, "head", 1) == "chk-7/head-1/backedge-log"
    assert layout.channel_state_file(7, "map", 0) == "chk-7/map-0/channel-state"
    assert layout.subtask_prefix(7, "count", 2) == "chk-7/count-2/"
    assert layout.shared_prefix(7, "count", 2, "run") == "shared/count-2-run-7"
    assert layout.bootstrap_input_file(7, "op", "st", 3, 0) == "chk-7/bootstrap/op-st-3-0"
    assert temp_name("/x/f").startswith("/x/f.tmp-")


def test_relative_paths_round_trip(tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path / "sub" / "..")
    rel = layout.channel_state_file(3, "op", 0)
    assert layout.relative(layout.path(rel)) == rel
    assert layout.is_shared_file(layout.relative(layout.shared_dir + "/f"))
    assert not layout.is_shared_file(rel)


@pytest.mark.parametrize("name, n", [("chk-1.json", 1), ("chk-10.json", 10),
                                     ("chk-01.json", None), ("chk-1.json.tmp-3", None),
                                     ("chk-1", None)])
def test_commit_record_names(name: str, n: int | None) -> None:
    assert CheckpointLayout.parse_commit_record(name) == n
