"""An event-time job for the offline tests: click events from a JSON-lines
file (``EF_WINDOWED_INPUT``), out of order within a 2 s bound with a few
stragglers far behind; per-user tumbling counts with allowed lateness,
per-user sessions, and a process function with event-time timers (the
last click of a user, and a timeout 5 s later). Paced, so that a run takes
several checkpoints.

The stragglers go to the tumbling counts and the last clicks, not to the
sessions. A straggler reaches the operators behind their watermark, and how
far behind depends on when the watermark last went out (every 0.2 s of
processing time, after a source batch of up to 1024 records: up to ~200 s of
event time here). A session operator keeps such a record when its own
window ``[ts, ts + gap)`` still ends after the watermark, as a new session
if the session it meets has fired and gone already; the replay of
``validate``, which handles the input under the watermark ``-inf`` and then
advances it, merges it with that session instead. Which of the two a
checkpoint holds is decided by timing, not by the input and the watermark
it recorded: ``validate`` does not promise it (``offline/evaluate.py``,
``_keyed``; docs/architecture/event-time.md, "exact when no record reached
the operator behind its watermark"). The other two come out the same
either way."""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import eddyflow as ef

#: Every STRAGGLERS-th record (from the 8th) is a straggler, 60 s behind.
STRAGGLERS = 250


def is_straggler(r: dict[str, Any]) -> bool:
    return int(r["n"]) % STRAGGLERS == 7


def write_events(path: str, n: int = 12000, users: int = 40, seed: int = 3) -> None:
    rnd = random.Random(seed)
    t = 0.0
    with open(path, "w") as f:
        for i in range(n):
            t += rnd.choice([0.0, 0.1, 0.2, 0.5])
            behind = rnd.uniform(0, 2.0)
            if i % STRAGGLERS == 7:
                behind = 60.0  # a straggler: beyond the allowed lateness
            f.write(json.dumps({"user": f"u{rnd.randrange(users):02d}",
                                "ts": round(max(0.0, t - behind), 3), "n": i}) + "\n")


def events() -> list[dict[str, Any]]:
    with open(os.environ["EF_WINDOWED_INPUT"]) as f:
        return [json.loads(line) for line in f]


class Pace:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, r: Any) -> Any:
        self.n += 1
        if self.n % 20 == 0:
            time.sleep(0.001)
        return r


class LastClick(ef.KeyedProcessFunction):
    """Keeps a user's last click time; a timer 5 s after it emits a timeout.
    Its state does not depend on whether a timer fired before a later click
    or after it (a replay cannot know which: see offline/evaluate.py)."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.last = ctx.value_state("last")

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        ts = ctx.timestamp
        assert ts is not None
        last = self.last.value
        if last is None or ts > last:
            if last is not None:
                ctx.timer_service.delete_event_time_timer(last + 5.0)
            self.last.value = ts
            ctx.timer_service.register_event_time_timer(ts + 5.0)
        return None

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Any:
        yield (ctx.current_key, timestamp)


def _ts(r: dict[str, Any]) -> float:
    return float(r["ts"])


def _user(r: dict[str, Any]) -> str:
    return str(r["user"])


def in_bound(r: dict[str, Any]) -> bool:
    return not is_straggler(r)


def build(env: ef.StreamEnvironment) -> None:
    stream = (env.from_collection(events()).name("clicks").set_parallelism(1)
              .map(Pace()).name("pace").set_parallelism(1)
              .assign_timestamps_and_watermarks(
                  ef.WatermarkStrategy.bounded_out_of_orderness(2.0, _ts))
              .name("timestamps").set_parallelism(1))
    late = ef.OutputTag("late")
    counts = (stream.key_by(_user).window(ef.TumblingEventTimeWindows(10.0))
              .allowed_lateness(5.0).side_output_late_data(late).count().name("per-minute"))
    counts.sink_to(ef.ListSink()).name("counts-out")
    counts.get_side_output(late).sink_to(ef.ListSink()).name("late-out")
    # Within the 2 s bound only: see the module docstring.
    (stream.filter(in_bound).name("in-bound").set_parallelism(1).key_by(_user)
        .window(ef.EventTimeSessionWindows(3.7)).count().name("sessions")
        .sink_to(ef.ListSink()).name("sessions-out"))
    (stream.key_by(_user).process(LastClick()).name("last-click")
        .sink_to(ef.ListSink()).name("timeouts-out"))
