"""``eddyflow checkpoints DIR`` checks each checkpoint's files against its
metadata (size and SHA-256) and marks those that do not verify: ``CORRUPT:
<why>`` in the table, ``"verified": false, "problem": ...`` in ``--json``
(``ef.list_checkpoints(DIR, verify=True)`` underneath). A checkpoint whose
``_metadata`` cannot be read is listed as broken, not hidden. Such a
checkpoint does not exist for recovery, which skips it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cli_support import cli, corrupt, run_ok, state_file, word_job
from click.testing import CliRunner

import eddyflow as ef
from eddyflow.cli.main import main


def test_checkpoints_marks_a_checkpoint_whose_state_file_is_corrupt(tmp_path: Path) -> None:
    job = word_job(tmp_path)
    infos = run_ok(job)
    last = infos[-1]
    state = state_file(last)
    corrupt(state)
    rel = os.path.relpath(state, tmp_path / "chk")

    table = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["checkpoints",
                                                              str(tmp_path / "chk")])
    assert table.exit_code == 0, table.stderr
    rows = {line.split("│")[1].strip().rstrip("*"): line for line in table.stdout.splitlines()
            if line.startswith("│")}
    assert f"CORRUPT: {rel}: checksum mismatch" in rows[str(last.id)]
    for info in infos[:-1]:  # the others are fine (they do not share that file)
        if state_file(info) != state:
            assert "│ ok" in rows[str(info.id)], rows[str(info.id)]

    listed = json.loads(cli("checkpoints", str(tmp_path / "chk"), "--json").stdout)
    by_id = {c["id"]: c for c in listed}
    assert by_id[last.id]["verified"] is False
    assert by_id[last.id]["problem"] == f"{rel}: checksum mismatch"
    assert by_id[infos[0].id]["verified"] is (state_file(infos[0]) != state)

    got = {c.id: c for c in ef.list_checkpoints(tmp_path / "chk", verify=True)}
    assert got[last.id].verified is False and got[last.id].problem == f"{rel}: checksum mismatch"
    # Without verify=True, as before: files not checked.
    assert all(c.verified is None for c in ef.list_checkpoints(tmp_path / "chk"))


def test_checkpoints_lists_one_whose_metadata_is_unreadable(tmp_path: Path) -> None:
    job = word_job(tmp_path)
    first = run_ok(job)[0]
    meta = Path(first.path) / "_metadata"
    meta.write_bytes(meta.read_bytes()[:40])  # truncated
    listed = json.loads(cli("checkpoints", str(tmp_path / "chk"), "--json").stdout)
    broken = [c for c in listed if c["id"] == first.id]
    assert broken and broken[0]["verified"] is False
    assert broken[0]["problem"].startswith(f"chk-{first.id}/_metadata: unreadable")
    table = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["checkpoints",
                                                              str(tmp_path / "chk")])
    assert table.exit_code == 0
    assert f"CORRUPT: chk-{first.id}/_metadata: unreadable" in table.stdout
    shown = cli("checkpoints", str(tmp_path / "chk"), "--show", str(first.id))
    assert shown.exit_code == 2
    assert shown.stderr.startswith(f"error: checkpoint {first.id} in {tmp_path / 'chk'} is "
                                   "damaged: ")
    assert len(shown.stderr.splitlines()) == 1
