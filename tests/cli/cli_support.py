"""What the CLI tests share: a small checkpointed word-count job file, the
click runner, and ways to damage a checkpoint's state file."""

from __future__ import annotations

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


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="eddyflow")


def word_job(tmp_path: Path) -> Path:
    """JOB written to ``tmp_path/words.py``, checkpointing into
    ``tmp_path/chk`` and writing ``tmp_path/out``."""
    path = tmp_path / "words.py"
    path.write_text(JOB.format(chk=str(tmp_path / "chk"), out=str(tmp_path / "out")))
    return path


def run_ok(job: Path) -> list[ef.CheckpointInfo]:
    result = cli("run", str(job))
    assert result.exit_code == 0, result.stderr
    infos = ef.list_checkpoints(job.parent / "chk")
    assert infos
    return infos


def corrupt(path: str) -> None:
    """Flip the bits of one byte of ``path``."""
    with open(path, "r+b") as f:
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 0xFF]))


def state_file(info: ef.CheckpointInfo) -> str:
    """The path of the last state file of the count's subtask 0."""
    keyed = info.meta.operators["count"].subtasks[0].keyed
    assert keyed is not None
    return os.path.join(os.path.dirname(info.path), keyed.file_handles()[-1].path)
