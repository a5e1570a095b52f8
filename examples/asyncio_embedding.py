"""Embedding a job in an existing asyncio program.

The program already has an async stream of orders (here an async generator
that sleeps between orders, standing in for a websocket or a message queue).
It runs a job on that stream with ``await env.execute_async()`` and, while
the job runs, consumes the job's output from an ``asyncio.Queue`` that a
small custom sink feeds. Both run on the same event loop.

    python examples/asyncio_embedding.py
    eddyflow run examples/asyncio_embedding.py
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import eddyflow as ef

ORDERS = 200


async def order_stream(n: int = ORDERS, delay: float = 0.001) -> AsyncIterator[dict[str, Any]]:
    rng = random.Random(7)
    for i in range(n):
        await asyncio.sleep(delay)  # orders trickle in
        yield {"id": i, "customer": f"c{rng.randrange(10)}", "amount": rng.randrange(1, 500)}


class QueueSink(ef.Sink):
    """Hands each record to an asyncio.Queue as soon as it arrives (like
    print(): not transactional)."""

    def __init__(self, queue: asyncio.Queue[Any]) -> None:
        self.queue = queue

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        return _QueueWriter(self.queue)


class _QueueWriter(ef.SinkWriter):
    def __init__(self, queue: asyncio.Queue[Any]) -> None:
        self.queue = queue

    def write(self, records: list[Any]) -> None:
        for r in records:
            self.queue.put_nowait(r)


def build(env: ef.StreamEnvironment, queue: asyncio.Queue[Any] | None = None) -> None:
    orders = env.from_async_iterable(order_stream()).name("orders")
    totals = (
        orders.key_by("customer")
        .sum(lambda order: order["amount"]).name("spend-per-customer")
    )
    if queue is None:
        totals.print()
    else:
        totals.sink_to(QueueSink(queue))


async def main() -> None:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    env = ef.StreamEnvironment(parallelism=2)
    build(env, queue)
    job = asyncio.create_task(env.execute_async("orders"))

    # The rest of the program keeps going while the job runs: here it
    # watches for big spenders as their running totals arrive.
    flagged: set[str] = set()
    seen = 0
    while not (job.done() and queue.empty()):
        try:
            customer, total = await asyncio.wait_for(queue.get(), timeout=0.1)
        except TimeoutError:
            continue
        seen += 1
        if total > 4_000 and customer not in flagged:
            flagged.add(customer)
            print(f"after {seen:3d} updates: {customer} passed 4,000 (now {total:,})")
    result = await job
    print(f"job done in {result.duration:.2f} s: {seen} updates, "
          f"{len(result.state('spend-per-customer'))} customers")


if __name__ == "__main__":
    asyncio.run(main())
