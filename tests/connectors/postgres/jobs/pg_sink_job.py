"""The job that ``tests/connectors/postgres/test_sink_sigkill.py`` kills and
restores: orders -> append sink ``changes`` (every order) and
key_by(customer) -> running total -> upsert sink ``totals`` (a negative
total deletes the customer's row). Settings come from the environment:
``EF_PG_DSN``, ``EF_PG_CHK`` (checkpoint folder), ``EF_PG_ORDERS`` (how
many), ``EF_PG_PACE`` (records between 1 ms sleeps: the job lasts long
enough to be killed after checkpoints)."""

from __future__ import annotations

import os
import time
from typing import Any

import eddyflow as ef
from eddyflow.connectors.postgres import PostgresSink

CUSTOMERS = 53


def orders(n: int) -> list[dict[str, Any]]:
    """The job's input, the same in every run."""
    return [{"id": i, "customer": f"c{(i * 7919) % CUSTOMERS}", "amount": i % 13 - 4}
            for i in range(n)]


def total(order: dict[str, Any], state: Any) -> tuple[Any, Any]:
    """The running total of the order's customer, as a row or its deletion."""
    running = (state or 0) + order["amount"]
    if running < 0:
        return {"__op": "d", "customer": order["customer"]}, running
    return {"customer": order["customer"], "total": running}, running


class Pace:
    """Identity, sleeping a millisecond every ``every`` records."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.seen = 0

    def __call__(self, record: Any) -> Any:
        self.seen += 1
        if self.seen % self.every == 0:
            time.sleep(0.001)
        return record


def customer(order: dict[str, Any]) -> str:
    """The key of an order."""
    return str(order["customer"])


def build(env: ef.StreamEnvironment) -> None:
    dsn = os.environ["EF_PG_DSN"]
    env.enable_checkpointing(0.05, os.environ["EF_PG_CHK"])
    source = env.from_collection(orders(int(os.environ["EF_PG_ORDERS"]))).name("orders")
    paced = source.map(Pace(int(os.environ.get("EF_PG_PACE", "20")))).name("pace")
    paced.sink_to(PostgresSink(dsn, "changes", mode="append")).name("changes-out")
    (paced.key_by(customer).map_with_state(total).name("totals")
     .sink_to(PostgresSink(dsn, "totals", key=["customer"])).name("totals-out"))
