"""``eddyflow run``'s live display: in a pseudo-terminal a table redrawn in
place, elsewhere one plain line per update, nothing with ``--quiet``. The
terminal's size is set explicitly, so nothing depends on the one the tests
run in."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

JOB = """\
import time
import eddyflow as ef

def pace(r):
    if r % 50 == 0:
        time.sleep(0.01)
    return r

def build(env):
    env.enable_checkpointing(interval=0.05, directory={chk!r})
    (env.from_collection(list(range(4000))).name("numbers")
        .map(pace).name("paced")
        .key_by(lambda r: r % 7).count().name("count")
        .sink_to(ef.ListSink()).name("out"))
"""

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "paced.py"
    path.write_text(JOB.format(chk=str(tmp_path / "chk")))
    return path


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    env.update(COLUMNS="120", LINES="40", TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    env.pop("FORCE_COLOR", None)
    return env


def run_in_pty(args: list[str], timeout: float = 120.0) -> tuple[int, str]:
    """Run ``eddyflow`` with stdout and stderr on a pseudo-terminal; its
    exit code and everything it wrote there."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "eddyflow.cli.main", *args],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=child_env(), close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return rc, b"".join(chunks).decode(errors="replace")


def test_live_display_in_a_terminal(tmp_path: Path) -> None:
    rc, out = run_in_pty(["run", str(job_file(tmp_path)), "--every", "0.1"])
    assert rc == 0, out
    text = ANSI.sub("", out)
    assert "\x1b[" in out, "a terminal gets a redrawn display"
    assert "in rec/s" in text and "back-pressure" in text
    for operator in ("numbers", "paced", "count", "out"):
        assert operator in text
    assert re.search(r"checkpoints \d+( \(\d+ aborted\))?, last #\d+ in \d+\.\d{3} s", text), (
        text[-2000:])
    assert "restarts 0" in text
    assert "finished in" in text  # the final table follows


def test_plain_lines_when_not_a_terminal(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "eddyflow.cli.main", "run", str(job_file(tmp_path)),
         "--every", "0.1"], capture_output=True, text=True, env=child_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[")]
    assert len(lines) >= 2, proc.stderr
    assert all("in/s" in ln and "restarts" in ln for ln in lines)
    assert "\x1b[" not in proc.stderr
    assert "paced:" in lines[-1] and "count:" in lines[-1]


def test_quiet_shows_only_the_result(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "eddyflow.cli.main", "run", str(job_file(tmp_path)), "--quiet",
         "--every", "0.1"], capture_output=True, text=True, env=child_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not [ln for ln in proc.stderr.splitlines() if ln.startswith("[")]
    assert "finished in" in proc.stderr
