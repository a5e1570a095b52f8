"""Session windows per user over out-of-order click events, with late data.

A site's clicks (``{"id", "user", "ts", "page"}``, ``ts`` in event-time
seconds) go into an ``ef.Log`` with two partitions, every user's clicks in
one partition (as a Kafka producer keyed by user would put them). The job
cuts each user's clicks into sessions, a session ending after 30 s without a
click (``EventTimeSessionWindows(gap=30)``), and writes one row per session
firing, ``{"user", "start", "end", "clicks", "pages"}`` (``pages``: distinct
pages), to a FileSink; clicks too late for their session go to a second
FileSink through the late-data side output.

The clicks come from phones, so they arrive out of order:

* most arrive within ``MAX_DELAY`` (5 s) of when they happened: the
  watermark (``bounded_out_of_orderness(5)``) waits for them;
* about 3 % straggle in 40-110 s late, within ``ALLOWED_LATENESS`` (120 s):
  a straggler joins, extends or bridges its user's sessions, and a session
  that had fired already fires again with the updated counts;
* a few come from phones that were offline for 7-10 minutes, far beyond the
  allowed lateness: the watermark has long passed them, and they go to the
  late output.

The log is generated (deterministically) the first time the job runs, in
``logs/clicks``; the session rows go to ``out/sessions``, the late clicks to
``out/sessions-late`` and checkpoints to ``checkpoints/sessions`` (all
relative to the working folder; ``SESSIONS_LOG``, ``SESSIONS_OUTPUT``,
``SESSIONS_LATE_OUTPUT``, ``SESSIONS_CHECKPOINTS`` override them,
``SESSIONS_MINUTES`` the minutes of clicks, ``SESSIONS_CHECKPOINT_INTERVAL``
the seconds between checkpoints, and ``SESSIONS_ROCKSDB=FOLDER`` keeps the
windows' state in RocksDB under FOLDER instead of in memory).

    python examples/sessions.py                        # a fresh run; prints a summary
    eddyflow run examples/sessions.py -p 2 [--restore latest]

Which results are deterministic (the tests rely on this; see
``tests/integration/test_examples_event_time.py`` and ``test_sigkill_sessions.py``)
------------------------------------------------------------------------------

When a window fires depends on when watermarks arrive, which depends on how
the parallel source subtasks are scheduled (and, after a crash, on where the
restored checkpoint was). So which *intermediate* firings a run emits varies
from run to run. What does not vary, by the design of the data:

1. The source runs at parallelism ``PARTITIONS``, one subtask per partition,
   so a watermark is per partition. The watermark the window operator holds
   when a click arrives is then at most ``M - MAX_DELAY``, with ``M`` the
   largest timestamp of the clicks before it in *its own* partition (the
   window operator takes the minimum over the partitions; a restored
   watermark was such a value for an earlier position). That bound does not
   depend on timing.
2. A click less than ``ALLOWED_LATENESS + MAX_DELAY`` behind that ``M`` (every
   on-time click and every straggler, whose delay is below 110 s) is
   therefore never dropped, and neither is any session it touches (those end
   after its timestamp, so their cleanup time ``end + ALLOWED_LATENESS`` is
   still ahead of the watermark). Such clicks build the same sessions in every run, and
   each of those sessions fires last with its complete counts.
3. Whether a click far beyond the allowed lateness is dropped needs a lower
   bound on the watermark, which nothing gives: a partition's source subtask
   that lags holds the watermark back. So the generator makes each of those
   clicks isolated (no other click of its user within ``GAP``): if a lagging
   watermark lets one in, it is a one-click session of its own and changes
   no other session. Each such click ends up exactly once, either in the late
   output (in practice, always: it is 7-10 minutes late, while the watermark
   lags a partition by about one batch of its clicks, some 40 s) or as a
   one-click session.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from typing import Any

import eddyflow as ef

LOG = os.environ.get("SESSIONS_LOG", os.path.join("logs", "clicks"))
OUTPUT = os.environ.get("SESSIONS_OUTPUT", os.path.join("out", "sessions"))
LATE_OUTPUT = os.environ.get("SESSIONS_LATE_OUTPUT", os.path.join("out", "sessions-late"))
CHECKPOINTS = os.environ.get("SESSIONS_CHECKPOINTS", os.path.join("checkpoints", "sessions"))
CHECKPOINT_INTERVAL = float(os.environ.get("SESSIONS_CHECKPOINT_INTERVAL", "0.5"))
MINUTES = float(os.environ.get("SESSIONS_MINUTES", "12"))
ROCKSDB = os.environ.get("SESSIONS_ROCKSDB")  # a folder: keep the state in RocksDB there

PARTITIONS = 2
USERS = 1500  # user-0000 ... user-1499; user i lives in partition i % PARTITIONS
GAP = 30.0  # seconds without a click that end a session
MAX_DELAY = 5.0  # how far out of order on-time clicks arrive
ALLOWED_LATENESS = 120.0  # a fired session still takes clicks this long
STRAGGLERS = 0.03  # share of clicks that arrive 40-110 s late
STRAGGLER_DELAY = (40.0, 110.0)  # below ALLOWED_LATENESS: never dropped (point 2 above)
OFFLINE = 0.04  # share of users with one click that arrives 7-10 minutes late
OFFLINE_DELAY = (420.0, 600.0)
PAGES = ["/", "/search", "/product", "/product", "/product", "/cart", "/checkout",
         "/account", "/help", "/blog"]


# -- the clicks -------------------------------------------------------------------


def generate_clicks(minutes: float = MINUTES, seed: int = 14) -> list[list[dict[str, Any]]]:
    """Each partition's clicks in the order they arrive (log order).

    Every user alternates sessions (2-12 clicks, 1-20 s apart) and pauses
    (45-240 s). A click arrives ``delay`` seconds after it happened:
    ``[0, MAX_DELAY)`` for most, ``STRAGGLER_DELAY`` for stragglers; an
    offline user's extra click arrives ``OFFLINE_DELAY`` late and has no
    other click of the user within ``GAP`` of it. A partition's log order is
    by arrival time."""
    rng = random.Random(seed)
    span = minutes * 60.0
    arrivals: list[list[tuple[float, int, dict[str, Any]]]] = [[] for _ in range(PARTITIONS)]
    next_id = 0

    def add(partition: int, user: str, ts: float, delay: float) -> None:
        nonlocal next_id
        ts = round(ts, 3)  # millisecond timestamps: exact sums and comparisons below
        click = {"id": next_id, "user": user, "ts": ts, "page": rng.choice(PAGES)}
        arrivals[partition].append((ts + delay, next_id, click))
        next_id += 1

    for u in range(USERS):
        user, partition = f"user-{u:04d}", u % PARTITIONS
        times: list[float] = []
        t = rng.uniform(0.0, 240.0)
        while t < span:
            for _ in range(rng.randint(2, 12)):
                if t >= span:
                    break
                times.append(t)
                t += rng.uniform(1.0, 20.0)
            t += rng.uniform(45.0, 240.0)
        for ts in times:
            if rng.random() < STRAGGLERS:
                delay = rng.uniform(*STRAGGLER_DELAY)
            else:
                delay = rng.random() * MAX_DELAY * 0.999  # strictly below MAX_DELAY
            add(partition, user, ts, delay)
        if rng.random() < OFFLINE and span > OFFLINE_DELAY[1]:
            delay = rng.uniform(*OFFLINE_DELAY)
            for _ in range(20):  # a moment with no other click of the user near it
                ts = round(rng.uniform(0.0, span - delay), 3)
                if all(abs(ts - other) > GAP + 1.0 for other in times):
                    add(partition, user, ts, delay)
                    break
    return [[click for _, _, click in sorted(part)] for part in arrivals]


def make_log(path: str = LOG, minutes: float = MINUTES) -> None:
    """Write the clicks into a new ``ef.Log`` at ``path`` unless it exists.
    Written beside it and renamed into place, so that a run killed while
    writing it leaves no half-written log behind."""
    if os.path.exists(path):
        return
    partial = f"{path}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with ef.Log(partial, partitions=PARTITIONS) as log:
        for partition, clicks in enumerate(generate_clicks(minutes)):
            for click in clicks:
                log.append(click, partition=partition)
    os.replace(partial, path)


# -- the job ----------------------------------------------------------------------


class SessionStats(ef.AggregateFunction):
    """Clicks and distinct pages of a session; ``merge`` joins two sessions
    that a click bridged."""

    def create_accumulator(self) -> tuple[int, frozenset[str]]:
        return 0, frozenset()

    def add(self, click: dict[str, Any], acc: tuple[int, frozenset[str]]
            ) -> tuple[int, frozenset[str]]:
        return acc[0] + 1, acc[1] | {click["page"]}

    def get_result(self, acc: tuple[int, frozenset[str]]) -> dict[str, int]:
        return {"clicks": acc[0], "pages": len(acc[1])}

    def merge(self, a: tuple[int, frozenset[str]], b: tuple[int, frozenset[str]]
              ) -> tuple[int, frozenset[str]]:
        return a[0] + b[0], a[1] | b[1]


def click_time(click: dict[str, Any]) -> float:
    return float(click["ts"])


def user_of(click: dict[str, Any]) -> str:
    return str(click["user"])


def session_row(result: ef.WindowResult) -> dict[str, Any]:
    return {"user": result.key, "start": result.start, "end": result.end, **result.value}


def build(env: ef.StreamEnvironment) -> None:
    make_log(LOG, MINUTES)
    if ROCKSDB:
        env.set_state_backend(ef.RocksDBStateBackend(ROCKSDB))
    env.enable_checkpointing(interval=CHECKPOINT_INTERVAL, directory=CHECKPOINTS)
    # A watermark after every batch rather than every 0.2 s: event time keeps
    # up with the records however fast they are read.
    env.set_auto_watermark_interval(0)
    late = ef.OutputTag("late-clicks")
    sessions = (
        # One source subtask per partition: a watermark per partition (see
        # the module docstring, point 1), whatever the job's parallelism.
        env.from_log(LOG).name("clicks").set_parallelism(PARTITIONS)
        .assign_timestamps_and_watermarks(
            ef.WatermarkStrategy.bounded_out_of_orderness(MAX_DELAY, timestamp=click_time))
        .name("click-time").set_parallelism(PARTITIONS)
        .key_by(user_of)
        .window(ef.EventTimeSessionWindows(gap=GAP))
        .allowed_lateness(ALLOWED_LATENESS)
        .side_output_late_data(late)
        .aggregate(SessionStats()).name("sessions")
    )
    sessions.map(session_row).name("session-rows").sink_to(ef.FileSink(OUTPUT)).name("sessions-out")
    sessions.get_side_output(late).sink_to(ef.FileSink(LATE_OUTPUT)).name("late-clicks-out")


# -- running it directly ------------------------------------------------------------


def read_committed(folder: str) -> list[Any]:
    """The records a FileSink committed (its ``part-*`` files)."""
    out: list[Any] = []
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.startswith("part-"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    out.extend(json.loads(line) for line in f)
    return out


def final_sessions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last word on each session: of the rows of one window, the one
    with the most clicks; and no window that a larger window of the same
    user contains (a session that a late click merged into another)."""
    best: dict[tuple[str, float, float], dict[str, Any]] = {}
    for r in rows:
        k = (r["user"], r["start"], r["end"])
        if k not in best or r["clicks"] > best[k]["clicks"]:
            best[k] = r
    by_user: dict[str, list[tuple[float, float]]] = {}
    for user, start, end in best:
        by_user.setdefault(user, []).append((start, end))
    return [r for (user, start, end), r in best.items()
            if not any(s <= start and end <= e and (s, e) != (start, end)
                       for s, e in by_user[user])]


def main(argv: list[str]) -> None:
    # A fresh run: the sinks' folders start empty (a FileSink adds files).
    for folder in (OUTPUT, LATE_OUTPUT):
        shutil.rmtree(folder, ignore_errors=True)
    env = ef.StreamEnvironment(parallelism=2)
    build(env)
    result = env.execute("sessions")
    rows = read_committed(OUTPUT)
    late = read_committed(LATE_OUTPUT)
    final = final_sessions(rows)
    print(f"{result.records_in['sessions']:,} clicks, {len(final):,} sessions; "
          f"{len(rows) - len(final):,} more rows were earlier firings of sessions that "
          f"late clicks then changed; {len(late)} clicks too late; {result.duration:.2f} s")
    print(f"session rows in {OUTPUT}/, late clicks in {LATE_OUTPUT}/")
    for r in sorted(final, key=lambda r: (-r["clicks"], r["user"], r["start"]))[:5]:
        print(f"  {r['user']}  {r['start']:8.3f} - {r['end']:8.3f}  "
              f"{r['clicks']:3d} clicks on {r['pages']} pages")

if __name__ == "__main__":
    main(sys.argv)
