"""Keyed records whose keys are whatever a test generates (text, ints,
tuples of both), read from the pickle file ``KEYED_RECORDS`` names: a
running count and a running sum per key, for validation on Spark."""

from __future__ import annotations

import os
import pickle
from typing import Any

import eddyflow as ef


def records() -> list[tuple[Any, int]]:
    with open(os.environ["KEYED_RECORDS"], "rb") as f:
        loaded: list[tuple[Any, int]] = pickle.load(f)
    return loaded


def build(env: ef.StreamEnvironment) -> None:
    keyed = env.from_collection(records()).name("records").key_by(lambda r: r[0])
    keyed.count().name("count").sink_to(ef.ListSink()).name("counts")
    keyed.sum(lambda r: r[1]).name("sum").sink_to(ef.ListSink()).name("sums")
