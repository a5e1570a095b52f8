"""The event-time examples against plain-Python computations of their results.

``examples/sessions.py`` (session windows per user with late data): its
committed session rows and late clicks are checked with
``sessions_reference.py`` (which imports nothing from eddyflow) against the
clicks of the log the job wrote: every final session exactly once with its
complete counts, every other row a state some prefix of the user's clicks
gives, the clicks far beyond the allowed lateness in the late output (or,
if a watermark lagged, one-click sessions) and no other click there. Which
intermediate firings a run emits depends on when watermarks arrive, so
those are checked for being possible, not against a fixed list.

``examples/fraud_timeout.py`` (a KeyedProcessFunction with event-time
timers): its alerts are exactly the payments without a confirmation before
their deadline, each once.

Each example runs in-process (``build(env)``, as ``python examples/X.py``
does) and under the command line (``python -m eddyflow.cli.main run``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sessions_reference as ref

import eddyflow as ef
from eddyflow.jobfile import load_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SRC = Path(ef.__file__).resolve().parents[1]  # the eddyflow under test, for the CLI runs


def run_cli(example: str, cwd: Path, parallelism: int, **env_vars: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(env_vars)
    proc = subprocess.run(
        [sys.executable, "-m", "eddyflow.cli.main", "run", str(EXAMPLES / f"{example}.py"),
         "-p", str(parallelism)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"job '{example}' finished" in proc.stderr
    return proc.stderr


# -- sessions -------------------------------------------------------------------------


def sessions_expected(module: ModuleType, log: Path) -> ref.Expected:
    clicks = ef.Log(log, partitions=module.PARTITIONS)
    partitions = [list(clicks.read(p)) for p in range(module.PARTITIONS)]
    return ref.expected(partitions, gap=module.GAP, max_delay=module.MAX_DELAY,
                        lateness=module.ALLOWED_LATENESS)


def check_sessions(module: ModuleType, cwd: Path, context: str) -> ref.Outcome:
    exp = sessions_expected(module, cwd / "logs" / "clicks")
    outcome = ref.check(exp, ref.read_committed(cwd / "out" / "sessions"),
                        ref.read_committed(cwd / "out" / "sessions-late"), gap=module.GAP,
                        context=context)
    # Not vacuous: the log has both kinds of late clicks, and this run had
    # sessions fire again and clicks go to the late output. (What the
    # watermark lets in depends on timing, but the stragglers are 40-110 s
    # late and the offline clicks 7-10 minutes, against a watermark that
    # lags its partitions by about one batch: about 40 s of clicks.)
    assert len(exp.maybe) >= 10, exp.maybe
    assert len(exp.sure_ids) + len(exp.maybe) == exp.clicks > 20_000
    assert outcome.refired > 0, f"no session fired again for a late click {context}"
    assert outcome.late > 0, f"no click went to the late output {context}"
    return outcome


def test_sessions_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the example's folders are relative to the working folder
    module = load_job(EXAMPLES / "sessions.py")
    env = ef.StreamEnvironment(parallelism=2)
    module.build(env)
    result = env.execute("sessions")
    check_sessions(module, tmp_path, "(in-process, parallelism 2)")
    assert result.records_in["sessions"] == sum(map(len, module.generate_clicks()))
    infos = ef.list_checkpoints(tmp_path / "checkpoints" / "sessions")
    assert infos and infos[-1].final


def test_sessions_example_generates_its_log_once(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = load_job(EXAMPLES / "sessions.py")
    module.make_log("clicks", minutes=11)
    written = {p.name: p.read_bytes() for p in (tmp_path / "clicks").iterdir()}
    module.make_log("clicks", minutes=11)  # exists: left alone
    assert {p.name: p.read_bytes() for p in (tmp_path / "clicks").iterdir()} == written
    assert not (tmp_path / "clicks.partial").exists()
    per_partition = [list(ef.Log(tmp_path / "clicks", partitions=2).read(p)) for p in (0, 1)]
    assert per_partition == module.generate_clicks(11)
    # Every user's clicks are in one partition; ids are unique.
    users = [{c["user"] for c in part} for part in per_partition]
    assert not users[0] & users[1]
    ids = [c["id"] for part in per_partition for c in part]
    assert len(ids) == len(set(ids))


def test_sessions_example_under_the_cli(tmp_path: Path) -> None:
    stderr = run_cli("sessions", tmp_path, parallelism=3)
    assert "sessions-out" in stderr and "late-clicks-out" in stderr
    check_sessions(load_job(EXAMPLES / "sessions.py"), tmp_path, "(CLI, parallelism 3)")


# -- fraud timeout --------------------------------------------------------------------


def expected_alerts(events: list[dict[str, Any]], timeout: float) -> list[tuple[Any, ...]]:
    """``(card, txn, amount, authorised, deadline)`` of every payment with no
    confirmation before its deadline."""
    auths = {e["txn"]: e for e in events if e["kind"] == "auth"}
    confirmed = {e["txn"] for e in events
                 if e["kind"] == "confirm" and e["ts"] < auths[e["txn"]]["ts"] + timeout}
    return sorted((a["card"], txn, a["amount"], a["ts"], a["ts"] + timeout)
                  for txn, a in auths.items() if txn not in confirmed)


def alerts_of(folder: Path) -> list[tuple[Any, ...]]:
    return sorted((a["card"], a["txn"], a["amount"], a["authorised"], a["deadline"])
                  for a in ref.read_committed(folder))


def check_alerts(module: ModuleType, folder: Path) -> None:
    events = module.generate_events()
    want = expected_alerts(events, module.TIMEOUT)
    got = alerts_of(folder)
    assert got == want  # sorted lists: also no alert twice
    # Not vacuous: unconfirmed payments and confirmations that came too late.
    late_confirmations = [e for e in events if e["kind"] == "confirm"
                          and (e["card"], e["txn"]) in {(a[0], a[1]) for a in want}]
    assert len(want) > 100 and len(late_confirmations) > 50


@pytest.mark.parametrize("parallelism", [1, 3])
def test_fraud_timeout_example(parallelism: int, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = load_job(EXAMPLES / "fraud_timeout.py")
    env = ef.StreamEnvironment(parallelism=parallelism)
    module.build(env)
    result = env.execute("fraud-timeout")
    check_alerts(module, tmp_path / "out" / "fraud-alerts")
    assert result.records_in["confirmation-timeout"] == len(module.generate_events())
    # No payment is left pending once event time has ended.
    assert all(v is None for v in result.state("confirmation-timeout", "pending").values())


def test_fraud_timeout_example_under_the_cli(tmp_path: Path) -> None:
    stderr = run_cli("fraud_timeout", tmp_path, parallelism=2)
    assert "alerts-out" in stderr
    check_alerts(load_job(EXAMPLES / "fraud_timeout.py"), tmp_path / "out" / "fraud-alerts")
