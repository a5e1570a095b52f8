"""A keyed running sum, the example of Flink's "stateful stream processing"
write-up: (sensor, reading) events, keyed by sensor; ``map_with_state`` keeps
each sensor's running total and emits (sensor, reading, total).

    python examples/running_sum.py
    eddyflow run examples/running_sum.py -p 3
"""

from __future__ import annotations

import os
import random

import eddyflow as ef

SENSORS = 50
EVENTS = int(os.environ.get("RUNNING_SUM_EVENTS", "20000"))


def events() -> list[tuple[str, int]]:
    rng = random.Random(42)  # deterministic, so runs and replays agree
    return [(f"sensor-{rng.randrange(SENSORS):02d}", rng.randrange(100)) for _ in range(EVENTS)]


def add_reading(event: tuple[str, int], total: int | None) -> tuple[tuple[str, int, int], int]:
    sensor, reading = event
    new_total = (total or 0) + reading
    return (sensor, reading, new_total), new_total


def build(env: ef.StreamEnvironment) -> None:
    env.enable_checkpointing(interval=0.5, directory="checkpoints/running-sum")
    (
        env.from_collection(events()).name("events")
        .key_by(0)
        .map_with_state(add_reading).name("running-sum")
        .filter(lambda out: out[2] > 20_000).name("over-20k")
        .sink_to(ef.ListSink())
    )


if __name__ == "__main__":
    env = ef.StreamEnvironment(parallelism=2)
    build(env)
    result = env.execute("running-sum")
    totals = result.state("running-sum")
    print(f"{result.records_in['running-sum']:,} readings from {len(totals)} sensors "
          f"in {result.duration * 1000:.0f} ms; {result.records_out['over-20k']:,} "
          "updates passed 20k")
    for sensor, total in sorted(totals.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {sensor}  {total:8,}")
