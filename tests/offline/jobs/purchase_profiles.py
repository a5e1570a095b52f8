"""A profile per customer, kept by a process function in a value state
``profile`` of mutable values (a dict holding a total and a list of the
items bought, changed in place), beside a count of purchases in state
``purchases``. Lines of ``PROFILES_INPUT`` are ``customer amount item``;
checkpoints go to ``PROFILES_CHECKPOINTS``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import eddyflow as ef


def parse(line: str) -> tuple[str, int, str]:
    customer, amount, item = line.split()
    return customer, int(amount), item


class Profiles(ef.KeyedProcessFunction):
    def open(self, ctx: ef.RuntimeContext) -> None:
        self.profile = ctx.value_state("profile")
        self.purchases = ctx.value_state("purchases", default=0)

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Iterable[Any]:
        _, amount, item = value
        profile = self.profile.value
        if profile is None:
            profile = {"total": 0, "items": []}
        profile["total"] += amount
        profile["items"].append(item)
        self.profile.update(profile)
        self.purchases.update(self.purchases.value + 1)
        return [(ctx.current_key, profile["total"])]


def build(env: ef.StreamEnvironment) -> None:
    env.enable_checkpointing(interval=60.0, directory=os.environ["PROFILES_CHECKPOINTS"])
    (
        env.read_text_file(os.environ["PROFILES_INPUT"]).name("lines")
        .map(parse).name("parse")
        .key_by(lambda p: p[0])
        .process(Profiles()).name("profiles")
        .sink_to(ef.ListSink()).name("totals")
    )
