"""Plain-Python references of Nexmark q0-q8: each takes the generated
events (a list) and returns the query's output as a ``Counter`` of rows
(a multiset: the engine's output order across parallel subtasks is free).
They work in whole milliseconds and share nothing with ``queries.py`` but
the definitions (``model.py``), so an engine result equal to a reference
is a result of the definition, not of a shared helper.

The definitions are those of the Nexmark suite as Flink's nexmark repo and
Beam's queries state them (see ``queries.py`` for each query's text and
which variant is followed where they differ).
"""

from __future__ import annotations

import collections
from collections import Counter
from collections.abc import Iterable
from typing import Any

from nexmark_suite.model import Auction, Bid, Event, Person

Rows = Counter[tuple[Any, ...]]

#: Window sizes and slides (ms) of the queries, as Flink's nexmark repo has them.
Q5_SIZE_MS, Q5_SLIDE_MS = 10_000, 2_000
Q4_SIZE_MS, Q4_SLIDE_MS = 10_000, 5_000
Q7_SIZE_MS = 10_000
Q8_SIZE_MS = 10_000
Q2_MODULUS = 123
Q3_STATES = frozenset({"OR", "ID", "CA"})
Q3_CATEGORY = 10
Q6_LAST = 10


def bids(events: Iterable[Event]) -> list[Bid]:
    return [e for e in events if type(e) is Bid]


def q0(events: list[Event]) -> Rows:
    """Pass-through: every bid."""
    return Counter(tuple(b) for b in bids(events))


def q1(events: list[Event]) -> Rows:
    """Currency conversion: each bid with its price in euros (0.908 per dollar)."""
    return Counter((b.auction, b.bidder, b.price * 908 / 1000, b.date_time, b.extra)
                   for b in bids(events))


def q2(events: list[Event]) -> Rows:
    """Selection: (auction, price) of the bids on every 123rd auction."""
    return Counter((b.auction, b.price) for b in bids(events) if b.auction % Q2_MODULUS == 0)


def q3(events: list[Event]) -> Rows:
    """Local item suggestion: (name, city, state, auction id) for every
    auction in category 10 whose seller lives in OR, ID or CA."""
    people = {e.id: e for e in events if type(e) is Person and e.state in Q3_STATES}
    return Counter((p.name, p.city, p.state, a.id)
                   for a in events if type(a) is Auction and a.category == Q3_CATEGORY
                   and (p := people.get(a.seller)) is not None)


def sliding_starts(t: int, size: int, slide: int) -> range:
    """Starts (ms) of the sliding windows ``[s, s + size)`` that hold ``t``."""
    last = t - t % slide
    return range(last, t - size, -slide)


def q5(events: list[Event]) -> Rows:
    """Hot items: for each 10 s window sliding by 2 s, the auctions with
    the most bids in it, as (window start, window end, auction, bids)."""
    counts: dict[int, Counter[int]] = collections.defaultdict(Counter)
    for b in bids(events):
        for s in sliding_starts(b.date_time, Q5_SIZE_MS, Q5_SLIDE_MS):
            counts[s][b.auction] += 1
    out: Rows = Counter()
    for s, per_auction in counts.items():
        top = max(per_auction.values())
        out.update((s, s + Q5_SIZE_MS, a, n) for a, n in per_auction.items() if n == top)
    return out


def q7(events: list[Event]) -> Rows:
    """Highest bid: for each 10 s tumbling window, the bids of the highest
    price in it, as (window start, window end, auction, bidder, price, time)."""
    best: dict[int, list[Bid]] = {}
    for b in bids(events):
        s = b.date_time - b.date_time % Q7_SIZE_MS
        top = best.get(s)
        if top is None or b.price > top[0].price:
            best[s] = [b]
        elif b.price == top[0].price:
            top.append(b)
    return Counter((s, s + Q7_SIZE_MS, b.auction, b.bidder, b.price, b.date_time)
                   for s, top in best.items() for b in top)


def q8(events: list[Event]) -> Rows:
    """Monitor new users: (person id, name, window start) for each person
    who registered and opened an auction in the same 10 s tumbling window."""
    sellers = {(a.seller, a.date_time - a.date_time % Q8_SIZE_MS)
               for a in events if type(a) is Auction}
    return Counter((p.id, p.name, s) for p in events if type(p) is Person
                   and (p.id, s := p.date_time - p.date_time % Q8_SIZE_MS) in sellers)


def winning_bids(events: list[Event]) -> list[tuple[Auction, Bid]]:
    """Each auction's winning bid: the highest price at or above the reserve
    among its bids in ``[date_time, expires)``, the earliest of equal prices
    (then the lowest bidder id), as Beam's ``WinningBids``; auctions without
    such a bid have none. Sorted by closing time, then auction id."""
    auctions = {e.id: e for e in events if type(e) is Auction}
    best: dict[int, Bid] = {}
    for b in bids(events):
        a = auctions.get(b.auction)
        if a is None or not a.date_time <= b.date_time < a.expires or b.price < a.reserve:
            continue
        top = best.get(a.id)
        if top is None or ((b.price, -b.date_time, -b.bidder)
                           > (top.price, -top.date_time, -top.bidder)):
            best[a.id] = b
    pairs = [(auctions[i], b) for i, b in best.items()]
    pairs.sort(key=lambda p: (p[0].expires, p[0].id))
    return pairs


def q4(events: list[Event]) -> Rows:
    """Average price for a category: the mean winning price of the auctions
    of each category that closed in each 10 s window sliding by 5 s (an
    auction closes at ``expires``), as (category, window start, end, mean)."""
    sums: dict[tuple[int, int], list[int]] = collections.defaultdict(lambda: [0, 0])
    for a, b in winning_bids(events):
        for s in sliding_starts(a.expires, Q4_SIZE_MS, Q4_SLIDE_MS):
            acc = sums[(a.category, s)]
            acc[0] += b.price
            acc[1] += 1
    return Counter((c, s, s + Q4_SIZE_MS, total / n) for (c, s), (total, n) in sums.items())


def q6(events: list[Event]) -> Rows:
    """Average selling price by seller: at each auction's close, the mean
    winning price of the seller's last 10 closed auctions (closing order:
    ``expires``, then auction id), as (seller, auction, closing time, mean)."""
    last: dict[int, collections.deque[int]] = collections.defaultdict(
        lambda: collections.deque(maxlen=Q6_LAST))
    out: Rows = Counter()
    for a, b in winning_bids(events):
        prices = last[a.seller]
        prices.append(b.price)
        out[(a.seller, a.id, a.expires, sum(prices) / len(prices))] += 1
    return out


REFERENCES = {"q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q6": q6,
              "q7": q7, "q8": q8}
