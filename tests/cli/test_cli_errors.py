"""Errors a person can read (issue 13): every ``eddyflow`` command reports
an error as ONE line on stderr, ``error: <what, where, why>``, with no
traceback, and exits 2 for usage and input errors (bad options; a job file
that is missing, does not compile or import, or whose build(env) raises; a
checkpoint that does not exist or does not verify; a restore that does not
fit) and 1 for a job that fails while it runs. ``--debug``, before or after
the command's name, shows the traceback.

``validate`` is in ``tests/offline/test_validate_cli.py``.

In-process through click's runner (stderr kept apart from stdout), and once
through the installed console script in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_support import cli, corrupt, run_ok, state_file, word_job
from click.testing import Result


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path



def _one_error_line(result: Result, code: int) -> str:
    """The single line of stderr, after checking the exit code and that it
    is all there is (and no traceback)."""
    assert result.exit_code == code, (result.exit_code, result.stderr, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]



# -- eddyflow run: the job file ---------------------------------------------------


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    job = _write(tmp_path, "bad.py", """\
        import eddyflow as ef

        def build(env) -> None
            pass
        """)
    line = _one_error_line(cli("run", str(job)), 2)
    assert line == f"error: {job}:3: expected ':'"


def test_import_error_names_file_line_and_module(tmp_path: Path) -> None:
    job = _write(tmp_path, "imports.py", """\
        import eddyflow as ef
        import no_such_module_for_eddyflow_tests

        def build(env):
            pass
        """)
    line = _one_error_line(cli("run", str(job)), 2)
    assert line == (f"error: {job}:2: ModuleNotFoundError: No module named "
                    "'no_such_module_for_eddyflow_tests'")


def test_build_that_raises_names_the_line_of_the_job(tmp_path: Path) -> None:
    job = _write(tmp_path, "raising.py", """\
        import eddyflow as ef

        def build(env):
            env.enable_checkpointing(mode="sometimes")
        """)
    line = _one_error_line(cli("run", str(job)), 2)
    assert line.startswith(f"error: {job}:4: build(env) raised ValueError: checkpoint mode "
                           "must be one of"), line


def test_missing_job_file_and_missing_build(tmp_path: Path) -> None:
    line = _one_error_line(cli("run", str(tmp_path / "nope.py")), 2)
    assert line == f"error: job file '{tmp_path / 'nope.py'}' does not exist"
    job = _write(tmp_path, "empty.py", "x = 1\n")
    line = _one_error_line(cli("run", str(job)), 2)
    assert line == f"error: job file '{job}' does not define build(env)"


@pytest.mark.parametrize("args, message", [
    (["run", "--bogus", "x.py"], "error: No such option '--bogus' (see 'eddyflow run --help')"),
    (["run"], "error: Missing argument 'JOB' (see 'eddyflow run --help')"),
    (["run", "x.py", "-p", "0"], "error: Invalid value for '--parallelism' / '-p'"),
    (["run", "x.py", "--workers", "0"],
     "error: --workers must be a positive integer or 'auto', got '0'"),
    (["--bogus"], "error: No such option '--bogus' (see 'eddyflow --help')"),
    (["nosuchcommand"], "error: No such command 'nosuchcommand'"),
])
def test_bad_options_are_one_line_usage_errors(args: list[str], message: str) -> None:
    assert _one_error_line(cli(*args), 2).startswith(message)


# -- eddyflow run: the job ------------------------------------------------------------


def test_a_job_that_fails_while_running_exits_1(tmp_path: Path) -> None:
    job = _write(tmp_path, "divide.py", """\
        import eddyflow as ef

        def build(env):
            (env.from_collection([1, 2, 0, 4]).name("numbers")
                .map(lambda x: 10 // x).name("divide")
                .sink_to(ef.ListSink()))
        """)
    line = _one_error_line(cli("run", str(job)), 1)
    assert line == ("error: job 'divide' failed: operator 'divide' (subtask 1 of 1) raised "
                    "ZeroDivisionError: integer division or modulo by zero; on record 0; read "
                    "from source 'numbers' (subtask 1 of 1) at split 'slice-0', index 2")


def test_a_multi_line_exception_message_stays_on_one_line(tmp_path: Path) -> None:
    job = _write(tmp_path, "lines.py", """\
        import eddyflow as ef

        def fail(x):
            raise ValueError("first line\\nsecond line")

        def build(env):
            env.from_collection([1]).map(fail).name("fail").sink_to(ef.ListSink())
        """)
    line = _one_error_line(cli("run", str(job)), 1)
    assert "raised ValueError: first line | second line" in line


def test_restore_from_a_checkpoint_that_does_not_exist(tmp_path: Path) -> None:
    job = word_job(tmp_path)
    line = _one_error_line(cli("run", str(job), "--restore", str(tmp_path / "chk" / "chk-9")),
                           2)
    assert line == (f"error: cannot run job 'words': cannot restore from "
                    f"{tmp_path / 'chk' / 'chk-9'}: {tmp_path / 'chk' / 'chk-9'}: no such "
                    f"checkpoint")
    line = _one_error_line(cli("run", str(job), "--restore", str(tmp_path)), 2)
    assert "expected 'latest' or a chk-<n> folder" in line





def test_restore_from_a_corrupt_checkpoint(tmp_path: Path) -> None:
    job = word_job(tmp_path)
    last = run_ok(job)[-1]
    state = state_file(last)
    corrupt(state)
    line = _one_error_line(cli("run", str(job), "--restore", last.path), 2)
    assert line == f"error: cannot run job 'words': cannot restore from {last.path}: " \
                   f"{state}: checksum mismatch"


def test_restore_when_a_committed_sink_file_is_gone(tmp_path: Path) -> None:
    job = word_job(tmp_path)
    last = run_ok(job)[-1]
    for name in os.listdir(tmp_path / "out"):
        os.unlink(tmp_path / "out" / name)
    line = _one_error_line(cli("run", str(job), "--restore", last.path), 2)
    assert line.startswith(f"error: cannot run job 'words': cannot restore sink 'out' from "
                           f"{last.path}: FileNotFoundError: FileSink "), line
    assert "is missing and was never committed" in line


# -- --debug --------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(tmp_path: Path, where: str) -> None:
    job = _write(tmp_path, "raising.py", """\
        def build(env):
            raise RuntimeError("no input configured")
        """)
    args = ["--debug", "run", str(job)] if where == "before" else ["run", str(job), "--debug"]
    result = cli(*args)
    assert result.exit_code == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert 'raise RuntimeError("no input configured")' in result.stderr
    assert result.stderr.splitlines()[-1] == (f"error: {job}:2: build(env) raised RuntimeError: "
                                              "no input configured")


def test_the_console_script_prints_one_line(tmp_path: Path) -> None:
    # The real thing: a child process, its stderr and exit code as a shell
    # sees them (no runner in between).
    job = _write(tmp_path, "bad.py", "def build(env)\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "eddyflow.cli.main", "run", str(job)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 2
    assert proc.stderr == f"error: {job}:1: expected ':'\n"


# -- eddyflow checkpoints ---------------------------------------------------------------


def test_checkpoints_usage_errors(tmp_path: Path) -> None:
    line = _one_error_line(cli("checkpoints", str(tmp_path / "none")), 2)
    assert line == f"error: '{tmp_path / 'none'}' is not a directory"
    line = _one_error_line(cli("checkpoints", str(tmp_path), "--show", "3"), 2)
    assert line == f"error: no completed checkpoint 3 in {tmp_path} (completed: none)"


def test_checkpoint_folder_of_a_live_job_is_refused(tmp_path: Path) -> None:
    from eddyflow.checkpoint.lock import FolderLock

    with FolderLock(tmp_path / "chk", "other"):
        line = _one_error_line(cli("run", str(word_job(tmp_path))), 2)
    assert f"in use by process {os.getpid()} (job 'other')" in line
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_restore_refused_when_no_checkpoint_verifies(tmp_path: Path) -> None:
    job = word_job(tmp_path)
    assert cli("run", str(job)).exit_code == 0
    for meta in (tmp_path / "chk").glob("chk-*/_metadata"):
        meta.write_bytes(meta.read_bytes()[:-10])
    line = _one_error_line(cli("run", str(job), "--restore", "latest"), 2)
    assert "no checkpoint in" in line and "restore=None" in line
