"""Numbers enriched by a ``map_async``, then counted per key: validation on
Spark does not replay the calls and says so by the operator's name."""

from __future__ import annotations

import asyncio

import eddyflow as ef


async def enrich(x: int) -> tuple[int, int]:
    """The number's key, as a service might look it up."""
    await asyncio.sleep(0.001)
    return x % 7, x


def build(env: ef.StreamEnvironment) -> None:
    (env.from_collection(list(range(2000))).name("numbers")
        .map_async(enrich, capacity=20).name("enrich")
        .key_by(lambda r: r[0]).count().name("count")
        .sink_to(ef.ListSink()).name("counts"))
