"""Nexmark q0-q8 written with eddyflow's DataStream API.

Each query is a function ``qN(events) -> DataStream``: ``events`` is the
generator's stream with timestamps and watermarks assigned (``source``),
and the result is a stream of plain tuples, the rows ``reference.py``
computes for the same events. The definitions are those of the Nexmark
suite as Flink's nexmark repo (SQL) and Beam's queries (Java) state them;
where they differ, the docstring says which is followed. Window sizes are
Flink's (10 s windows, q5 sliding by 2 s, q4 by 5 s).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import eddyflow as ef
from nexmark_suite.generator import GeneratorConfig
from nexmark_suite.model import Auction, Bid, Event, Person, event_time
from nexmark_suite.reference import (
    Q2_MODULUS,
    Q5_SIZE_MS,
    Q5_SLIDE_MS,
    Q7_SIZE_MS,
)

Query = Callable[[ef.DataStream], ef.DataStream]


def source(env: ef.StreamEnvironment, events: list[Event], config: GeneratorConfig
           ) -> ef.DataStream:
    """The events as one replayable source, with event time and a watermark
    that lags by the generator's disorder bound: no event is late, so every
    window holds all its events and the results are the reference's."""
    strategy = ef.WatermarkStrategy.bounded_out_of_orderness(config.max_disorder(), event_time)
    return (env.from_collection(events).name("nexmark-source")
            .assign_timestamps_and_watermarks(strategy).name("nexmark-timestamps"))


def ms(seconds: float) -> int:
    """A window bound in milliseconds (bounds are whole seconds, exact floats)."""
    return round(seconds * 1000)


def is_bid(e: Event) -> bool:
    return type(e) is Bid


def is_auction(e: Event) -> bool:
    return type(e) is Auction


def is_person(e: Event) -> bool:
    return type(e) is Person


def bids(events: ef.DataStream) -> ef.DataStream:
    return events.filter(is_bid).name("bids")


# -- q0-q2: stateless --------------------------------------------------------------


def q0(events: ef.DataStream) -> ef.DataStream:
    """Pass-through (Flink's q0: every bid, all its fields): the cost of
    reading, timestamping and writing the stream."""
    return bids(events)


def to_euros(b: Bid) -> tuple[Any, ...]:
    # 0.908 * price exactly (Flink: DECIMAL), to the nearest float.
    return (b.auction, b.bidder, b.price * 908 / 1000, b.date_time, b.extra)


def q1(events: ef.DataStream) -> ef.DataStream:
    """Currency conversion: each bid with its price in euros."""
    return bids(events).map(to_euros).name("q1-euros")


def selected(b: Bid) -> bool:
    return b.auction % Q2_MODULUS == 0


def auction_price(b: Bid) -> tuple[int, int]:
    return (b.auction, b.price)


def q2(events: ef.DataStream) -> ef.DataStream:
    """Selection: (auction, price) of the bids on every 123rd auction
    (Flink's variant; the original's five fixed ids find too few)."""
    return bids(events).filter(selected).name("q2-filter").map(auction_price).name("q2-project")


# -- q5, q7: windows over one input ------------------------------------------------


def bid_auction(b: Bid) -> int:
    return b.auction


class MaxCount(ef.AggregateFunction):
    """The keys with the largest count among a window's per-key counts:
    accumulator ``[top count, [keys with it]]``."""

    def create_accumulator(self) -> list[Any]:
        return [0, []]

    def add(self, value: ef.WindowResult, accumulator: list[Any]) -> list[Any]:
        if value.value > accumulator[0]:
            accumulator[0] = value.value
            accumulator[1] = [value.key]
        elif value.value == accumulator[0]:
            accumulator[1].append(value.key)
        return accumulator

    def get_result(self, accumulator: list[Any]) -> list[Any]:
        return accumulator

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return [a[0], a[1] + b[1]]


def window_start(r: ef.WindowResult) -> float:
    return r.start


def hot_rows(r: ef.WindowResult) -> Iterator[tuple[int, int, int, int]]:
    # r.key is the counted windows' start; this window of `slide` ends where they end.
    top, auctions = r.value
    start, end = ms(r.key), ms(r.end)
    for a in auctions:
        yield (start, end, a, top)


def q5(events: ef.DataStream) -> ef.DataStream:
    """Hot items: for each 10 s window sliding by 2 s, the auctions with the
    most bids (all of them on a tie, as Flink's ``num >= maxn``), as (window
    start, window end, auction, bids). Bids are counted per auction and
    window; the counts of a window (each stamped just before its end) then
    meet in a window of one slide, keyed by the counted window's start."""
    size, slide = Q5_SIZE_MS / 1000, Q5_SLIDE_MS / 1000
    counts = (bids(events).key_by(bid_auction)
              .window(ef.SlidingEventTimeWindows(size, slide)).count().name("q5-counts"))
    return (counts.key_by(window_start).window(ef.TumblingEventTimeWindows(slide))
            .aggregate(MaxCount()).name("q5-max").flat_map(hot_rows).name("q5-rows"))


class HighestBids(ef.AggregateFunction):
    """A window's bids of the highest price: accumulator ``[price, [bids]]``."""

    def create_accumulator(self) -> list[Any]:
        return [-1, []]

    def add(self, value: Bid, accumulator: list[Any]) -> list[Any]:
        if value.price > accumulator[0]:
            accumulator[0] = value.price
            accumulator[1] = [value]
        elif value.price == accumulator[0]:
            accumulator[1].append(value)
        return accumulator

    def get_result(self, accumulator: list[Any]) -> list[Bid]:
        return accumulator[1]  # type: ignore[no-any-return]

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return [a[0], a[1] + b[1]]


def everything(_: Any) -> int:
    return 0


def highest_rows(r: ef.WindowResult) -> Iterator[tuple[int, ...]]:
    start, end = ms(r.start), ms(r.end)
    for b in r.value:
        yield (start, end, b.auction, b.bidder, b.price, b.date_time)


def q7(events: ef.DataStream) -> ef.DataStream:
    """Highest bid: for each 10 s tumbling window, the bids of the highest
    price in it (Beam's variant: bids in ``[start, end)``; Flink's SQL
    also takes a bid at exactly ``end``), as (window start, window end,
    auction, bidder, price, time). A window of the whole stream, as
    Flink's ``GROUP BY window_start, window_end``: one key."""
    size = Q7_SIZE_MS / 1000
    return (bids(events).key_by(everything).window(ef.TumblingEventTimeWindows(size))
            .aggregate(HighestBids()).name("q7-max").flat_map(highest_rows).name("q7-rows"))


QUERIES: dict[str, Query] = {"q0": q0, "q1": q1, "q2": q2, "q5": q5, "q7": q7}
#: Queries without state: the benchmark runs a plain-Python loop beside them.
STATELESS = ("q0", "q1", "q2")
