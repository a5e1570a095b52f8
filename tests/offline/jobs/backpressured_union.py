"""``backpressured_sums.py`` with its events read from two sources and
unioned: the running sums then have two input exchanges, each with records
in flight at an unaligned barrier."""

from __future__ import annotations

from backpressured_sums import add_reading, count, events, slow

import eddyflow as ef


def build(env: ef.StreamEnvironment) -> None:
    env.batch_size = 16
    env.channel_capacity = 2
    every = events()
    left = env.from_collection(every[0::2]).name("left")
    right = env.from_collection(every[1::2]).name("right")
    (
        left.union(right)
        .key_by(0)
        .map_with_state(add_reading).name("running-sum")
        .map(slow).name("slow").set_parallelism(1)
        .key_by(0)
        .map_with_state(count).name("count").set_parallelism(1)
        .sink_to(ef.ListSink()).name("sink").set_parallelism(1)
    )
