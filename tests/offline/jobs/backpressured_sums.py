"""A job back-pressured from its first second, for unaligned checkpoints:
running sums per sensor (keyed, parallelism 2), then a slow map (0.3 ms a
record, parallelism 1) in front of a keyed count per sensor, with small
channels, so that an unaligned barrier always overtakes records — on the
exchange into the sums and on the one into the slow map — and the
checkpoint's channel state matters to both keyed states."""

from __future__ import annotations

import time
from typing import Any

import eddyflow as ef

SENSORS = 30
EVENTS = 6_000


def events() -> list[tuple[str, int]]:
    return [(f"sensor-{(i * 7) % SENSORS:02d}", i % 100) for i in range(EVENTS)]


def add_reading(event: tuple[str, int], total: int | None) -> tuple[tuple[str, int, int], int]:
    sensor, reading = event
    new_total = (total or 0) + reading
    return (sensor, reading, new_total), new_total


def count(event: tuple[str, int, int], n: int | None) -> tuple[tuple[str, int], int]:
    return (event[0], (n or 0) + 1), (n or 0) + 1


def slow(event: Any) -> Any:
    time.sleep(0.0003)
    return event


def build(env: ef.StreamEnvironment) -> None:
    env.batch_size = 16
    env.channel_capacity = 2
    # Small channels by count: debloating would size them, and the batches,
    # by rates measured on a machine that may be loaded, which changes
    # which exchanges hold records at a barrier.
    env.buffer_debloat_target = None
    (
        env.from_collection(events()).name("events")
        .key_by(0)
        .map_with_state(add_reading).name("running-sum")
        .map(slow).name("slow").set_parallelism(1)
        .key_by(0)
        .map_with_state(count).name("count").set_parallelism(1)
        .sink_to(ef.ListSink()).name("sink").set_parallelism(1)
    )
