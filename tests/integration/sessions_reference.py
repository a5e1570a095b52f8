"""What ``examples/sessions.py`` must output, computed in plain Python from
its log of clicks (this module imports nothing from eddyflow).

The example's docstring says which of its results are deterministic; this
module turns that into checks of committed output:

* Each partition is read in log order; a click's *lag* is the largest
  timestamp before it in its partition minus its own. The watermark the
  window operator holds when the click arrives is at most that largest
  timestamp minus ``max_delay``, whatever the timing; so a click with
  ``lag < lateness + max_delay`` ("sure") is never dropped, nor is any
  session it touches. The others ("maybe") are dropped or not depending on
  how far the watermark lags; each must be isolated (no other click of its
  user within ``gap``), so that if it gets in it is a one-click session.
* Sessions (``[first, last + gap)``, merging windows that overlap or touch,
  as the window operator does) of each user's sure clicks are the *final*
  sessions: every run must commit each of them, with its complete counts.
* A session row of any run is the state of one of its user's sessions after
  some prefix (in log order) of the user's sure clicks, or the one-click
  session of a maybe click: the window operator fires only such states.
  Since a session only grows, no two firings of one run are equal, so a row
  committed twice was committed twice (not exactly once).
* Each maybe click is either in the late output or a one-click session,
  exactly once; no sure click is ever in the late output.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Click = dict[str, Any]
Row = tuple[str, float, float, int, int]  # user, start, end, clicks, distinct pages


def sessions(clicks: Iterable[Click], gap: float) -> list[tuple[float, float, int, int]]:
    """``(start, end, clicks, distinct pages)`` of the sessions of one user's
    clicks, by start. Windows ``[t, t + gap)`` that overlap or touch merge."""
    out: list[tuple[float, float, int, int]] = []
    start = end = -math.inf
    n, pages = 0, set()
    for c in sorted(clicks, key=lambda c: c["ts"]):
        t = c["ts"]
        if n and t <= end:  # touches the session so far: [t, t + gap) meets [start, end)
            end = max(end, t + gap)
        else:
            if n:
                out.append((start, end, n, len(pages)))
            start, end, n, pages = t, t + gap, 0, set()
        n += 1
        pages.add(c["page"])
    if n:
        out.append((start, end, n, len(pages)))
    return out


@dataclass
class Expected:
    """What any correct run of the example over one log commits."""

    final: set[Row] = field(default_factory=set)  # every one committed, exactly once
    possible: set[Row] = field(default_factory=set)  # every committed row is one of these
    maybe: dict[int, Click] = field(default_factory=dict)  # click id -> click
    sure_ids: set[int] = field(default_factory=set)
    clicks: int = 0

    def singleton(self, click: Click, gap: float) -> Row:
        return (click["user"], click["ts"], click["ts"] + gap, 1, 1)


def expected(partitions: list[list[Click]], *, gap: float, max_delay: float,
             lateness: float) -> Expected:
    """``partitions``: each partition's clicks in log order."""
    exp = Expected()
    sure: dict[str, list[Click]] = {}  # user -> sure clicks in log order
    users_partition: dict[str, int] = {}
    every: dict[str, list[float]] = {}
    for p, clicks in enumerate(partitions):
        top = -math.inf
        for c in clicks:
            exp.clicks += 1
            user = c["user"]
            assert users_partition.setdefault(user, p) == p, f"{user} is in two partitions"
            every.setdefault(user, []).append(c["ts"])
            lag = top - c["ts"]
            if lag < lateness + max_delay:
                sure.setdefault(user, []).append(c)
                exp.sure_ids.add(c["id"])
            else:
                exp.maybe[c["id"]] = c
            top = max(top, c["ts"])
    for c in exp.maybe.values():
        near = [t for t in every[c["user"]] if t != c["ts"] and abs(t - c["ts"]) <= gap]
        assert not near, (f"click {c['id']} is far beyond the allowed lateness but not "
                          f"isolated: {c['user']} has clicks at {near}")
    for user, clicks in sure.items():
        exp.final.update((user, *s) for s in sessions(clicks, gap))
        for k in range(1, len(clicks) + 1):
            exp.possible.update((user, *s) for s in sessions(clicks[:k], gap))
    exp.possible.update(exp.singleton(c, gap) for c in exp.maybe.values())
    return exp


def read_committed(folder: str | os.PathLike[str]) -> list[Any]:
    """The records a FileSink committed: its ``part-*`` files, JSON Lines."""
    out: list[Any] = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("part-"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                out.extend(json.loads(line) for line in f)
    return out


def as_row(r: dict[str, Any]) -> Row:
    return (r["user"], r["start"], r["end"], r["clicks"], r["pages"])


def final_view(rows: Iterable[Row]) -> set[Row]:
    """The last word on each session in ``rows``: per window its row with
    the most clicks, without the windows that a larger window of the same
    user contains (sessions that later merged into another)."""
    best: dict[tuple[str, float, float], Row] = {}
    for r in rows:
        k = r[:3]
        if k not in best or r[3] > best[k][3]:
            best[k] = r
    by_user: dict[str, list[tuple[float, float]]] = {}
    for user, s, e in best:
        by_user.setdefault(user, []).append((s, e))
    return {r for (user, s, e), r in best.items()
            if not any(s2 <= s and e <= e2 and (s2, e2) != (s, e) for s2, e2 in by_user[user])}


@dataclass
class Outcome:
    """What a run did beyond the deterministic part (for non-vacuity)."""

    rows: int
    late: int
    refired: int  # rows that are not the last word on their session
    maybe_admitted: int  # maybe clicks that became one-click sessions


def check(exp: Expected, rows: list[dict[str, Any]], late: list[Click], *, gap: float,
          context: str = "") -> Outcome:
    """Assert that committed ``rows`` and ``late`` clicks are what a correct
    run (any timing, any crashes) commits; see the module docstring."""
    got = [as_row(r) for r in rows]
    counts = Counter(got)
    dup = sorted(r for r, n in counts.items() if n > 1)
    assert not dup, f"{len(dup)} session rows committed more than once, e.g. {dup[:3]} {context}"
    impossible = sorted(set(got) - exp.possible)
    assert not impossible, (f"{len(impossible)} session rows that no run can fire, e.g. "
                            f"{impossible[:3]} {context}")
    missing = sorted(exp.final - set(got))
    assert not missing, (f"{len(missing)} final sessions never committed, e.g. {missing[:3]} "
                         f"{context}")

    late_ids = Counter(c["id"] for c in late)
    dup_late = sorted(i for i, n in late_ids.items() if n > 1)
    assert not dup_late, f"late clicks committed more than once: {dup_late[:5]} {context}"
    wrong = sorted(set(late_ids) - set(exp.maybe))
    assert not wrong, (f"{len(wrong)} clicks within the allowed lateness went to the late "
                       f"output, e.g. {wrong[:5]} {context}")
    admitted = {i for i in exp.maybe if i not in late_ids}
    singles = {exp.singleton(exp.maybe[i], gap): i for i in exp.maybe}
    for row, i in singles.items():
        if i in admitted:
            assert row in counts, (f"click {i} is neither in the late output nor a session "
                                   f"{context}")
        else:
            assert row not in counts, f"click {i} is both late and a session {context}"
    want_final = exp.final | {exp.singleton(exp.maybe[i], gap) for i in admitted}
    assert final_view(got) == want_final, f"the sessions' last rows differ {context}"
    return Outcome(rows=len(got), late=len(late), refired=len(got) - len(want_final),
                   maybe_admitted=len(admitted))
