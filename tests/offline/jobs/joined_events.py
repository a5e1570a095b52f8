"""A two-input job for the offline tests: orders and payments (JSON lines,
``EF_JOINED_INPUT`` + ``.orders`` / ``.payments``) with bounded disorder,
and rules (``.rules``); a keyed co-process function (per-side counts and a
shared total), an interval join, a window join and a keyed broadcast
function whose timers read the broadcast state. Paced, so that a run takes
several checkpoints. Rule ``j`` is stamped ``10 j - 0.25``, before every
order that reads it, so the broadcast function's state does not depend on
when the rules arrived."""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import eddyflow as ef


def write_inputs(prefix: str, n: int = 3000, keys: int = 12, seed: int = 5) -> None:
    for name, s in (("orders", seed), ("payments", seed + 1)):
        rng = random.Random(s)
        with open(f"{prefix}.{name}", "w") as f:
            for i in range(n):
                ts = max(0.0, i * 0.5 - rng.choice([0.0, 0.5, 1.0, 2.0]))
                f.write(json.dumps({"k": f"c{rng.randrange(keys):02d}", "ts": ts, "n": i}) + "\n")
    with open(f"{prefix}.rules", "w") as f:
        for j in range(n // 20 + 2):
            f.write(json.dumps({"rule": j, "ts": max(0.0, 10 * j - 0.25)}) + "\n")


def _read(name: str) -> list[dict[str, Any]]:
    with open(f"{os.environ['EF_JOINED_INPUT']}.{name}") as f:
        return [json.loads(line) for line in f]


class Pace:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, r: Any) -> Any:
        self.n += 1
        if self.n % 20 == 0:
            time.sleep(0.001)
        return r


def _ts(r: dict[str, Any]) -> float:
    return float(r["ts"])


def _key(r: dict[str, Any]) -> str:
    return str(r["k"])


class Counts(ef.KeyedCoProcessFunction):
    def open(self, ctx: ef.RuntimeContext) -> None:
        self.orders = ctx.value_state("orders", default=0)
        self.payments = ctx.value_state("payments", default=0)
        self.total = ctx.value_state("total", default=0)

    def process1(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        self.orders.value += 1
        self.total.value += value["n"]
        return None

    def process2(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        self.payments.value += 1
        self.total.value += value["n"]
        return None


class Rated(ef.KeyedBroadcastProcessFunction):
    def open(self, ctx: ef.RuntimeContext) -> None:
        self.rated = ctx.value_state("rated", default=0)

    def process_element(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        ctx.timer_service.register_event_time_timer(value["ts"])
        return None

    def process_broadcast_element(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        ctx.broadcast_state[value["rule"]] = value["rule"] * 100
        return None

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Any:
        self.rated.value += ctx.broadcast_state[int(timestamp // 10)]
        return None


def _pair(a: dict[str, Any], b: dict[str, Any]) -> tuple[int, int]:
    return a["n"], b["n"]


def build(env: ef.StreamEnvironment) -> None:
    strategy = ef.WatermarkStrategy.bounded_out_of_orderness(2.0, _ts)

    def stream(name: str) -> ef.DataStream:
        return (env.from_collection(_read(name)).name(name).set_parallelism(1)
                .map(Pace()).name(f"pace-{name}").set_parallelism(1)
                .assign_timestamps_and_watermarks(strategy).name(f"ts-{name}")
                .set_parallelism(1))

    orders, payments, rules = stream("orders"), stream("payments"), stream("rules")
    (orders.key_by(_key).connect(payments.key_by(_key)).process(Counts()).name("co")
        .sink_to(ef.ListSink()).name("co-out"))
    (orders.key_by(_key).interval_join(payments.key_by(_key)).between(-2.0, 1.0)
        .apply(_pair).name("ij").sink_to(ef.ListSink()).name("ij-out"))
    (orders.join(payments).where(_key).equal_to(_key)
        .window(ef.TumblingEventTimeWindows(5.0)).apply(_pair).name("wj")
        .sink_to(ef.ListSink()).name("wj-out"))
    (orders.key_by(_key).connect(rules.broadcast("rules")).process(Rated()).name("bc")
        .sink_to(ef.ListSink()).name("bc-out"))
