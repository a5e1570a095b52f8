"""Unconfirmed card payments, with event-time timers.

A card payment is authorised first and confirmed later (say, by the
cardholder in a banking app). Events are ``{"card", "txn", "kind", "ts",
"amount"}`` with ``kind`` ``"auth"`` or ``"confirm"`` and ``ts`` in
event-time seconds, out of order by up to ``MAX_DELAY`` (5 s). Keyed by card,
a ``KeyedProcessFunction`` keeps the card's pending authorisations in value
state; an authorisation registers an event-time timer ``TIMEOUT`` (30 s)
after it, and a confirmation within that time removes it and deletes its
timer. A timer that fires finds an authorisation nobody confirmed in time
and emits an alert. A confirmation at or after the deadline does not count:
the alert stands.

Why the alerts do not depend on timing: the events come from one source
split whose timestamps are at most ``MAX_DELAY`` out of order, so when a
confirmation at ``t`` arrives the watermark is at most ``t``; a
confirmation before its deadline therefore always comes before the timer
fires, and one after it is ignored. An alert goes out exactly for the
payments without a confirmation before their deadline.

Alerts go to ``out/fraud-alerts`` (``FRAUD_OUTPUT``), checkpoints to
``checkpoints/fraud-timeout`` (``FRAUD_CHECKPOINTS``), both relative to the
working folder.

    python examples/fraud_timeout.py
    eddyflow run examples/fraud_timeout.py -p 2
"""

from __future__ import annotations

import json
import os
import random
import shutil
from typing import Any

import eddyflow as ef

OUTPUT = os.environ.get("FRAUD_OUTPUT", os.path.join("out", "fraud-alerts"))
CHECKPOINTS = os.environ.get("FRAUD_CHECKPOINTS", os.path.join("checkpoints", "fraud-timeout"))
PAYMENTS = int(os.environ.get("FRAUD_PAYMENTS", "5000"))

CARDS = 300
TIMEOUT = 30.0  # seconds of event time to confirm a payment
MAX_DELAY = 5.0  # how far out of order events arrive


def generate_events(payments: int = PAYMENTS, seed: int = 30) -> list[dict[str, Any]]:
    """Authorisations and confirmations in arrival order. A payment is
    confirmed 5-25 s after it (85 %), 30-90 s after it (too late, 7 %) or
    never (8 %); an event arrives less than ``MAX_DELAY`` after it happened.
    A confirmation is at least ``MAX_DELAY`` after its authorisation, so it
    arrives after it."""
    rng = random.Random(seed)
    arrivals: list[tuple[float, int, dict[str, Any]]] = []
    t = 0.0
    for txn in range(payments):
        t += rng.expovariate(2.0)  # two payments a second over all cards
        card = f"card-{rng.randrange(CARDS):03d}"
        auth = {"card": card, "txn": txn, "kind": "auth", "ts": round(t, 3),
                "amount": round(rng.lognormvariate(3.5, 1.0), 2)}
        arrivals.append((auth["ts"] + rng.random() * MAX_DELAY * 0.999, len(arrivals), auth))
        u = rng.random()
        if u < 0.92:
            after = rng.uniform(5.0, 25.0) if u < 0.85 else rng.uniform(TIMEOUT, 90.0)
            confirm = {"card": card, "txn": txn, "kind": "confirm",
                       "ts": round(t + after, 3), "amount": auth["amount"]}
            arrivals.append((confirm["ts"] + rng.random() * MAX_DELAY * 0.999, len(arrivals),
                             confirm))
    return [event for _, _, event in sorted(arrivals)]


class ConfirmationTimeout(ef.KeyedProcessFunction):
    """Per card: pending authorisations (``txn -> [amount, auth time]``) in
    value state, an event-time timer at each one's deadline."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.pending = ctx.value_state("pending", default=None)

    def process(self, event: dict[str, Any], ctx: ef.RuntimeContext) -> Any:
        pending = dict(self.pending.value or {})
        txn = str(event["txn"])  # (state is also read offline: plain keys)
        if event["kind"] == "auth":
            pending[txn] = [event["amount"], ctx.timestamp]
            ctx.timer_service.register_event_time_timer(ctx.timestamp + TIMEOUT)
        elif txn in pending:
            deadline = pending[txn][1] + TIMEOUT
            if ctx.timestamp < deadline:  # in time: no alert
                del pending[txn]
                if all(at + TIMEOUT != deadline for _, at in pending.values()):
                    ctx.timer_service.delete_event_time_timer(deadline)
        self.pending.value = pending or None
        return ()

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Any:
        pending = dict(self.pending.value or {})
        for txn, (amount, at) in sorted(pending.items()):
            if at + TIMEOUT <= timestamp:
                del pending[txn]
                yield {"card": ctx.current_key, "txn": int(txn), "amount": amount,
                       "authorised": at, "deadline": at + TIMEOUT}
        self.pending.value = pending or None


def event_time(event: dict[str, Any]) -> float:
    return float(event["ts"])


def card_of(event: dict[str, Any]) -> str:
    return str(event["card"])


def build(env: ef.StreamEnvironment) -> None:
    env.enable_checkpointing(interval=0.5, directory=CHECKPOINTS)
    (
        env.from_collection(generate_events()).name("payments")
        .assign_timestamps_and_watermarks(
            ef.WatermarkStrategy.bounded_out_of_orderness(MAX_DELAY, timestamp=event_time))
        .name("payment-time").set_parallelism(1)
        .key_by(card_of)
        .process(ConfirmationTimeout()).name("confirmation-timeout")
        .sink_to(ef.FileSink(OUTPUT)).name("alerts-out")
    )


def main() -> None:
    shutil.rmtree(OUTPUT, ignore_errors=True)  # a fresh run: the sink's folder starts empty
    env = ef.StreamEnvironment(parallelism=2)
    build(env)
    result = env.execute("fraud-timeout")
    alerts = []
    for name in sorted(os.listdir(OUTPUT)):
        if name.startswith("part-"):
            with open(os.path.join(OUTPUT, name), encoding="utf-8") as f:
                alerts.extend(json.loads(line) for line in f)
    print(f"{result.records_in['confirmation-timeout']:,} events, {len(alerts):,} payments "
          f"not confirmed within {TIMEOUT:.0f} s, in {result.duration:.2f} s; alerts in {OUTPUT}/")
    for a in sorted(alerts, key=lambda a: -a["amount"])[:5]:
        print(f"  {a['card']}  txn {a['txn']:5d}  {a['amount']:9.2f}  "
              f"authorised at {a['authorised']:8.3f}")


if __name__ == "__main__":
    main()
