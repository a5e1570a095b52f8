"""A job with every two-input operator, whose committed output is the same
set of records however it fails and restarts: ``test_two_inputs.py`` runs
it in process (restarts, a crash restored at another parallelism) and
``test_sigkill_two_inputs.py`` kills it in a child process.

Three sources (parallelism 1 each, event time with bounded disorder):
``left`` and ``right`` records ``[key, ts, seq]``, and ``rules`` records
``[rule, ts]`` (rule ``j`` at ``10 j - 0.25``). Operators:

* ``co``: a ``KeyedCoProcessFunction`` over ``left``/``right`` keyed by key:
  per-side counts and a shared total in keyed state; each record yields
  ``["co", side, key, seq, count of its side so far]`` (deterministic: a
  side's records of a key come in order from one source), a side output
  ``["co-side", seq]`` for every seventh, and an event-time timer per record
  at ``ts + 5`` that yields ``["timer", key, t]`` (once per key and time);
* ``ij``: the interval join of ``left`` and ``right`` with
  ``between(-2.0, 1.0)``: ``["ij", left seq, right seq]``;
* ``wj``: their window join (tumbling 5 s, sliding 6/3 s or sessions with a
  1.25 s gap): ``["wj", left seq, right seq]``;
* ``bc``: ``left`` keyed, connected to ``rules.broadcast("rules")``
  (``KeyedBroadcastProcessFunction``): a broadcast record stores its rule;
  each element registers an event-time timer at its timestamp, and
  ``on_timer`` yields ``["bc", key, t, rule int(t // 10)]`` read from the
  broadcast state: that rule's timestamp is before ``t``, so by the time the
  watermark reaches ``t`` every subtask holds it, whatever the timing.

No record is late (each source's disorder stays within the watermark's
delay), so every run commits the same set. ``EF_TWO_*`` variables set the
records and windows when it runs as a job file (``build(env)``);
``build_job`` takes them as arguments.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

from sigkill_settings import setting, state_backend  # a job file imports its neighbours

import eddyflow as ef

DELAY = 2.0
SIDE = ef.OutputTag("co-side")


def records(n: int, keys: int, seed: int) -> list[list[Any]]:
    """``[key, ts, seq]`` with timestamps rising 0.5 s a record, each up to
    ``DELAY`` behind the largest so far."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ts = max(0.0, i * 0.5 - rng.choice([0.0, 0.0, 0.5, 1.0, DELAY]))
        out.append([f"k{rng.randrange(keys)}", ts, i])
    return out


def rules(n: int) -> list[list[Any]]:
    """Rule ``j`` (value ``j * 100``) at ``10 j - 0.25``, in order."""
    return [[j, max(0.0, 10 * j - 0.25)] for j in range(n)]


def ts_of(r: list[Any]) -> float:
    return float(r[1])


def key_of(r: list[Any]) -> Any:
    return r[0]


class Co(ef.KeyedCoProcessFunction):
    """Per-side counts, a shared total, a side output and timers."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.left = ctx.value_state("left", default=0)
        self.right = ctx.value_state("right", default=0)
        self.total = ctx.value_state("total", default=0)

    def _one(self, side: str, state: Any, r: list[Any], ctx: ef.RuntimeContext) -> Any:
        state.value += 1
        self.total.value += 1
        ctx.timer_service.register_event_time_timer(r[1] + 5.0)
        if r[2] % 7 == 0:
            ctx.output(SIDE, ["co-side", side, r[2]])
        yield ["co", side, r[0], r[2], state.value]

    def process1(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        return self._one("L", self.left, value, ctx)

    def process2(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        return self._one("R", self.right, value, ctx)

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Any:
        yield ["timer", ctx.current_key, timestamp]


class Rules(ef.KeyedBroadcastProcessFunction):
    """Rules in broadcast state, read when an element's timer fires."""

    def process_element(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        ctx.timer_service.register_event_time_timer(value[1])
        return None

    def process_broadcast_element(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        ctx.broadcast_state[value[0]] = value[0] * 100
        return None

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Any:
        yield ["bc", ctx.current_key, timestamp, ctx.broadcast_state.get(int(timestamp // 10))]


def window_assigner(kind: str) -> Any:
    if kind == "tumbling":
        return ef.TumblingEventTimeWindows(5.0)
    if kind == "sliding":
        return ef.SlidingEventTimeWindows(6.0, 3.0)
    return ef.EventTimeSessionWindows(1.25)


def pair(tag: str) -> Callable[[Any, Any], Any]:
    def make(a: list[Any], b: list[Any]) -> list[Any]:
        return [tag, a[2], b[2]]
    return make


def build_job(env: ef.StreamEnvironment, sink: ef.Sink, *, n: int = 600, keys: int = 7,
          windows: str = "tumbling", extra: tuple[Callable[[Any], Any], ...] = (),
          parallelism: int | None = None) -> None:
    """The job (see the module docstring); ``extra`` maps go on ``left``
    before every operator (a pace, a ``FailingMap``)."""
    p = parallelism or env.parallelism
    strategy = ef.WatermarkStrategy.bounded_out_of_orderness(DELAY, ts_of)
    left = (env.from_collection(records(n, keys, 1)).name("left").set_parallelism(1)
            .assign_timestamps_and_watermarks(strategy).name("left-ts").set_parallelism(1))
    for i, fn in enumerate(extra):
        left = left.map(fn).name(f"extra-{i}").set_parallelism(1)
    right = (env.from_collection(records(n, keys, 2)).name("right").set_parallelism(1)
             .assign_timestamps_and_watermarks(strategy).name("right-ts").set_parallelism(1))
    rule_stream = (env.from_collection(rules(n // 20 + 2)).name("rules").set_parallelism(1)
                   .assign_timestamps_and_watermarks(strategy).name("rules-ts")
                   .set_parallelism(1))
    co = (left.key_by(key_of).connect(right.key_by(key_of)).process(Co())
          .name("co").set_parallelism(p))
    ij = (left.key_by(key_of).interval_join(right.key_by(key_of)).between(-2.0, 1.0)
          .apply(pair("ij")).name("ij").set_parallelism(p))
    wj = (left.join(right).where(key_of).equal_to(key_of).window(window_assigner(windows))
          .apply(pair("wj")).name("wj").set_parallelism(p))
    bc = (left.key_by(key_of).connect(rule_stream.broadcast("rules")).process(Rules())
          .name("bc").set_parallelism(p))
    (co.union(co.get_side_output(SIDE), ij, wj, bc).map(json.dumps).name("canon")
     .sink_to(sink).name("sink"))


def build(env: ef.StreamEnvironment) -> None:
    """The job file's entry point (``eddyflow run``, offline validation):
    settings from ``EF_SIGKILL_*`` (``sigkill_settings.py``) and ``EF_TWO_*``."""
    env.set_state_backend(state_backend("two_input_job"))
    env.enable_checkpointing(
        interval=float(os.environ.get("EF_SIGKILL_INTERVAL", "0.05")),
        directory=setting("EF_SIGKILL_CHK", "two_input_job"),
        mode=os.environ.get("EF_SIGKILL_MODE", "exactly_once"))
    slow = float(os.environ.get("EF_SIGKILL_SLOW", "0"))
    build_job(env, ef.FileSink(setting("EF_SIGKILL_OUT", "two_input_job")),
              n=int(os.environ.get("EF_TWO_RECORDS", "600")),
              windows=os.environ.get("EF_TWO_WINDOWS", "tumbling"),
              extra=(Slow(slow),) if slow else ())


class Slow:
    """Identity with ``seconds`` of busy work per 1,000 records."""

    def __init__(self, seconds: float) -> None:
        self.per_record = seconds / 1000.0

    def __call__(self, r: Any) -> Any:
        until = time.perf_counter() + self.per_record
        while time.perf_counter() < until:
            pass
        return r


if __name__ == "__main__":
    environment = ef.StreamEnvironment()
    build(environment)
    print(environment.execute("two-inputs", restore="latest"))
