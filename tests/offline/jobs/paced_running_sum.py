"""The running-sum example, paced: a stateless map sleeps 2 ms every 100
events, so a run of 20,000 events lasts about 0.4 s and takes several
checkpoints at a 20 ms interval whatever the machine's speed (the example
itself may finish before its second checkpoint on a fast one)."""

from __future__ import annotations

import time
from typing import Any

import eddyflow as ef

SENSORS = 30
EVENTS = 20_000


def events() -> list[tuple[str, int]]:
    return [(f"sensor-{(i * 7) % SENSORS:02d}", i % 100) for i in range(EVENTS)]


class Pace:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, event: Any) -> Any:
        self.n += 1
        if self.n % 100 == 0:
            time.sleep(0.002)
        return event


def add_reading(event: tuple[str, int], total: int | None) -> tuple[tuple[str, int, int], int]:
    sensor, reading = event
    new_total = (total or 0) + reading
    return (sensor, reading, new_total), new_total


def build(env: ef.StreamEnvironment) -> None:
    (
        env.from_collection(events()).name("events")
        .map(Pace()).name("pace").set_parallelism(1)
        .key_by(0)
        .map_with_state(add_reading).name("running-sum")
        .sink_to(ef.ListSink()).name("sink")
    )
