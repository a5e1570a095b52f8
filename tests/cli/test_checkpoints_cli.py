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

from click.testing import CliRunner, Result

import eddyflow as ef
from eddyflow.cli.main import main

JOB = """\
import eddyflow as ef

def build(env):
    env.enable_checkpointing(interval=0.05, directory={chk!r})
    (env.from_collection([f"w{{i % 5}}" for i in range(500)]).name("words")
        .key_by(lambda w: w).count().name("count")
        .sink_to(ef.FileSink({out!r})).name("out"))
"""


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="eddyflow")


def _job(tmp_path: Path) -> Path:
    path = tmp_path / "words.py"
    path.write_text(JOB.format(chk=str(tmp_path / "chk"), out=str(tmp_path / "out")))
    return path


def _run_ok(job: Path) -> list[ef.CheckpointInfo]:
    result = _cli("run", str(job))
    assert result.exit_code == 0, result.stderr
    infos = ef.list_checkpoints(job.parent / "chk")
    assert infos
    return infos


def _corrupt(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 0xFF]))


def _state_file(info: ef.CheckpointInfo) -> str:
    keyed = info.meta.operators["count"].subtasks[0].keyed
    assert keyed is not None
    return os.path.join(os.path.dirname(info.path), keyed.file_handles()[-1].path)


def test_checkpoints_marks_a_checkpoint_whose_state_file_is_corrupt(tmp_path: Path) -> None:
    job = _job(tmp_path)
    infos = _run_ok(job)
    last = infos[-1]
    state = _state_file(last)
    _corrupt(state)
    rel = os.path.relpath(state, tmp_path / "chk")

    table = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["checkpoints",
                                                              str(tmp_path / "chk")])
    assert table.exit_code == 0, table.stderr
    rows = {line.split("│")[1].strip().rstrip("*"): line for line in table.stdout.splitlines()
            if line.startswith("│")}
    assert f"CORRUPT: {rel}: checksum mismatch" in rows[str(last.id)]
    for info in infos[:-1]:  # the others are fine (they do not share that file)
        if _state_file(info) != state:
            assert "│ ok" in rows[str(info.id)], rows[str(info.id)]

    listed = json.loads(_cli("checkpoints", str(tmp_path / "chk"), "--json").stdout)
    by_id = {c["id"]: c for c in listed}
    assert by_id[last.id]["verified"] is False
    assert by_id[last.id]["problem"] == f"{rel}: checksum mismatch"
    assert by_id[infos[0].id]["verified"] is (_state_file(infos[0]) != state)

    got = {c.id: c for c in ef.list_checkpoints(tmp_path / "chk", verify=True)}
    assert got[last.id].verified is False and got[last.id].problem == f"{rel}: checksum mismatch"
    # Without verify=True, as before: files not checked.
    assert all(c.verified is None for c in ef.list_checkpoints(tmp_path / "chk"))


def test_checkpoints_lists_one_whose_metadata_is_unreadable(tmp_path: Path) -> None:
    job = _job(tmp_path)
    first = _run_ok(job)[0]
    meta = Path(first.path) / "_metadata"
    meta.write_bytes(meta.read_bytes()[:40])  # truncated
    listed = json.loads(_cli("checkpoints", str(tmp_path / "chk"), "--json").stdout)
    broken = [c for c in listed if c["id"] == first.id]
    assert broken and broken[0]["verified"] is False
    assert broken[0]["problem"].startswith(f"chk-{first.id}/_metadata: unreadable")
    table = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["checkpoints",
                                                              str(tmp_path / "chk")])
    assert table.exit_code == 0
    assert f"CORRUPT: chk-{first.id}/_metadata: unreadable" in table.stdout
    shown = _cli("checkpoints", str(tmp_path / "chk"), "--show", str(first.id))
    assert shown.exit_code == 2
    assert shown.stderr.startswith(f"error: checkpoint {first.id} in {tmp_path / 'chk'} is "
                                   "damaged: ")
    assert len(shown.stderr.splitlines()) == 1
