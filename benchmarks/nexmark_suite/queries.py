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
    Q3_CATEGORY,
    Q3_STATES,
    Q4_SIZE_MS,
    Q4_SLIDE_MS,
    Q5_SIZE_MS,
    Q5_SLIDE_MS,
    Q6_LAST,
    Q7_SIZE_MS,
    Q8_SIZE_MS,
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


# -- q3: an incremental join (keyed connect) ---------------------------------------


def auction_seller(a: Auction) -> int:
    return a.seller


def person_id(p: Person) -> int:
    return p.id


def in_category(a: Auction) -> bool:
    return a.category == Q3_CATEGORY


#: What q3 keeps of a seller who lives elsewhere: their auctions are dropped.
ELSEWHERE = ()


class LocalItemSuggestion(ef.KeyedCoProcessFunction):
    """q3's join, per seller (``process1``: the seller's auctions in
    category 10; ``process2``: the person). The person's name, city and
    state are kept once seen, or ``ELSEWHERE`` if they live outside OR, ID
    and CA, so a seller's later auctions are matched or dropped at once;
    auctions that come before their seller (the generator names sellers a
    few ids ahead) wait in list state until the person arrives."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.seller = ctx.value_state("seller")
        self.waiting = ctx.list_state("waiting")

    def process1(self, value: Auction, ctx: ef.RuntimeContext) -> Iterator[tuple[Any, ...]]:
        seller = self.seller.value
        if seller is None:
            self.waiting.add(value.id)
        elif seller != ELSEWHERE:
            yield (*seller, value.id)

    def process2(self, value: Person, ctx: ef.RuntimeContext) -> Iterator[tuple[Any, ...]]:
        if value.state not in Q3_STATES:
            self.seller.value = ELSEWHERE
            self.waiting.clear()
            return
        seller = (value.name, value.city, value.state)
        self.seller.value = seller
        for auction_id in self.waiting.get():
            yield (*seller, auction_id)
        self.waiting.clear()


def q3(events: ef.DataStream) -> ef.DataStream:
    """Local item suggestion: (name, city, state, auction id) for every
    auction in category 10 whose seller lives in OR, ID or CA: an
    incremental join of auctions and persons on ``seller = id`` (Flink's
    regular join; Beam's keyed-state join), with keyed state and no window."""
    auctions = events.filter(is_auction).name("auctions").filter(in_category).name("q3-category")
    persons = events.filter(is_person).name("persons")
    return (auctions.key_by(auction_seller).connect(persons.key_by(person_id))
            .process(LocalItemSuggestion()).name("q3-join"))


# -- winning bids (q4, q6): auctions and bids joined until each auction closes ----------


def auction_id(a: Auction) -> int:
    return a.id


def beats(b: Bid, best: Bid | None) -> bool:
    """The higher price wins, then the earlier bid, then the lower bidder id
    (Beam's ``PRICE_THEN_DESCENDING_TIME``, made total)."""
    return best is None or ((b.price, -b.date_time, -b.bidder)
                            > (best.price, -best.date_time, -best.bidder))


def valid(a: Auction, b: Bid) -> bool:
    """A bid counts if made while the auction was open, at the reserve or above."""
    return a.date_time <= b.date_time < a.expires and b.price >= a.reserve


class WinningBid(ef.KeyedCoProcessFunction):
    """Per auction (``process1``: the auction; ``process2``: its bids): the
    best valid bid so far, and an event-time timer at ``expires`` that
    emits ``(auction, seller, category, expires, price, bidder, bid time)``
    when the watermark says every bid before the close has arrived (Beam's
    ``WinningBids``, with keyed state and a timer instead of merging
    windows). Bids that come before their auction (disorder, or the
    generator's auction-id lead) wait until the watermark passes them: an
    auction they could belong to is older, so it has arrived by then, or
    never will."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.auction = ctx.value_state("auction")
        self.best = ctx.value_state("best")
        self.early = ctx.list_state("early")

    def process1(self, value: Auction, ctx: ef.RuntimeContext) -> Iterator[Any]:
        best = None
        for b in self.early.get():
            if valid(value, b) and beats(b, best):
                best = b
        self.early.clear()
        self.auction.value = value
        if best is not None:
            self.best.value = best
        ctx.timer_service.register_event_time_timer(value.expires / 1000)
        yield from ()

    def process2(self, value: Bid, ctx: ef.RuntimeContext) -> Iterator[Any]:
        auction = self.auction.value
        if auction is None:
            self.early.add(value)
            ctx.timer_service.register_event_time_timer(value.date_time / 1000)
        elif valid(auction, value) and beats(value, self.best.value):
            self.best.value = value
        yield from ()

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Iterator[tuple[int, ...]]:
        auction = self.auction.value
        if auction is None:  # bids whose auction did not come in time: it never will
            self.early.update(b for b in self.early.get() if b.date_time / 1000 > timestamp)
            return
        if timestamp < auction.expires / 1000:
            return  # a waiting bid's timer, after its auction came
        best = self.best.value
        if best is not None:
            yield (auction.id, auction.seller, auction.category, auction.expires, best.price,
                   best.bidder, best.date_time)
        self.auction.clear()
        self.best.clear()


def winning_bids(events: ef.DataStream) -> ef.DataStream:
    """``(auction, seller, category, expires, price, bidder, bid time)`` per
    auction with a valid bid, stamped with the auction's close."""
    auctions = events.filter(is_auction).name("auctions")
    return (auctions.key_by(auction_id).connect(bids(events).key_by(bid_auction))
            .process(WinningBid()).name("winning-bids"))


class Mean(ef.AggregateFunction):
    """The mean of the winning prices: accumulator ``[sum, count]`` of ints,
    so any order of adding gives the same mean."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: tuple[int, ...], accumulator: list[int]) -> list[int]:
        accumulator[0] += value[4]
        accumulator[1] += 1
        return accumulator

    def get_result(self, accumulator: list[int]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]


def winner_category(w: tuple[int, ...]) -> int:
    return w[2]


def category_row(r: ef.WindowResult) -> tuple[Any, ...]:
    return (r.key, ms(r.start), ms(r.end), r.value)


def q4(events: ef.DataStream) -> ef.DataStream:
    """Average price for a category: the mean winning price of the
    auctions of each category that closed in each 10 s window sliding by
    5 s, as (category, window start, window end, mean) (Beam's variant,
    windowed; Flink's SQL keeps one running average per category)."""
    size, slide = Q4_SIZE_MS / 1000, Q4_SLIDE_MS / 1000
    return (winning_bids(events).key_by(winner_category)
            .window(ef.SlidingEventTimeWindows(size, slide)).aggregate(Mean()).name("q4-mean")
            .map(category_row).name("q4-rows"))


def winner_seller(w: tuple[int, ...]) -> int:
    return w[1]


def closing_order(w: tuple[int, ...]) -> tuple[int, int]:
    return (w[3], w[0])


class AverageSellingPrice(ef.KeyedProcessFunction):
    """Per seller, at each auction's close, the mean winning price of the
    seller's last 10 closed auctions. Closed auctions reach a seller from
    several winning-bid subtasks in any interleaving, so they wait for the
    watermark to pass their close and are then taken in closing order
    (``expires``, auction id): the averages do not depend on the timing."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.closed = ctx.list_state("closed")
        self.prices = ctx.value_state("prices", default=())

    def process(self, value: tuple[int, ...], ctx: ef.RuntimeContext) -> Iterator[Any]:
        self.closed.add(value)
        ctx.timer_service.register_event_time_timer(value[3] / 1000)
        yield from ()

    def on_timer(self, timestamp: float, ctx: ef.RuntimeContext) -> Iterator[tuple[Any, ...]]:
        due: list[tuple[int, ...]] = []
        later: list[tuple[int, ...]] = []
        for w in self.closed.get():
            (due if w[3] / 1000 <= timestamp else later).append(w)
        self.closed.update(later)
        prices = self.prices.value
        for w in sorted(due, key=closing_order):
            prices = (*prices, w[4])[-Q6_LAST:]
            yield (w[1], w[0], w[3], sum(prices) / len(prices))
        self.prices.value = prices


def q6(events: ef.DataStream) -> ef.DataStream:
    """Average selling price by seller: at each auction's close, the mean
    winning price of its seller's last 10 closed auctions, as (seller,
    auction, close, mean) (Beam's Query6; Flink's SQL cannot run it,
    FLINK-19059)."""
    return (winning_bids(events).key_by(winner_seller).process(AverageSellingPrice())
            .name("q6-average"))


# -- q8: a window join --------------------------------------------------------------


def window_key(r: ef.WindowResult) -> Any:
    return r.key


def new_user(p: Person, sellers: ef.WindowResult) -> tuple[int, str, int]:
    return (p.id, p.name, ms(sellers.start))


def q8(events: ef.DataStream) -> ef.DataStream:
    """Monitor new users: (person id, name, window start) for each person
    who registered and opened an auction in the same 10 s tumbling window:
    the window's sellers (one row each, Flink's ``GROUP BY seller``, counted
    in the window) joined with its new persons in the same window."""
    size = Q8_SIZE_MS / 1000
    sellers = (events.filter(is_auction).name("auctions").key_by(auction_seller)
               .window(ef.TumblingEventTimeWindows(size)).count().name("q8-sellers"))
    persons = events.filter(is_person).name("persons")
    return (persons.join(sellers).where(person_id).equal_to(window_key)
            .window(ef.TumblingEventTimeWindows(size)).apply(new_user).name("q8-join"))


QUERIES: dict[str, Query] = {"q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5,
                             "q6": q6, "q7": q7, "q8": q8}
#: Queries without state: the benchmark runs a plain-Python loop beside them.
STATELESS = ("q0", "q1", "q2")
