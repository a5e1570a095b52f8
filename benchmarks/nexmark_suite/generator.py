"""A seeded Nexmark event generator, after the generator of the Nexmark
benchmark as Beam and Flink ship it (``NexmarkGenerator``, ``GeneratorConfig``
and the person, auction and bid generators of github.com/nexmark/nexmark).

What it keeps of theirs, so that the queries see the data they were
designed for:

* Event ``n`` is a person, an auction or a bid by ``n % 50``: 1 in 50 a
  person, 3 an auction, 46 a bid (``person/auction/bid_proportion``).
* Ids are dense and derived from the event number: person ids and auction
  ids count from 1000 in the order they are created; a bid names an auction
  and a bidder that exist or are about to (a small lead, so a few bids
  precede their auction); categories are 10..14.
* Hot items: half the bids go to one "hot" auction of the last hundred
  (``hot_auction_ratio`` 2), three quarters of the auctions to a hot seller
  and of the bids to a hot bidder (ratios 4); the others pick among the
  ``num_active_people`` latest persons and the ``num_in_flight_auctions``
  latest auctions.
* Prices are ``round(10 ** U(0, 6) * 100)`` cents; an auction's reserve is
  its initial bid plus another such price; auctions last about as long as
  it takes to create ``num_in_flight_auctions`` more of them.
* Event time is rate-free: event ``n`` happens at ``base_time + n /
  first_event_rate`` (whole milliseconds), however fast the events are
  generated or read, so every run sees the same stream.
* Bounded disorder as Nexmark's ``outOfOrderGroupSize``: within each group
  of ``out_of_order_group_size`` consecutive events, events come in a
  pseudo-random order (event ``n`` of the stream is event ``(n // g) * g +
  (n * 953) % g`` of the ordered stream: ids, kinds and timestamps move
  together). An event is then at most ``max_disorder()`` seconds behind any
  event before it.

What differs: Java's random numbers are not Python's, so the values are
not Flink's; a seed makes them reproducible (the Java generator's
``new Random()`` is unseeded). Strings are cut from a seeded pool of
letters, which is as random as the queries need and much cheaper than a
draw per character.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from nexmark_suite.model import Auction, Bid, Event, Person

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
#: Bids and auctions may name persons and auctions this many ids ahead of the last one.
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
#: Hot sellers, bidders and auctions are the first (bidders: second) of each batch of 100.
HOT_BATCH = 100

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
             "Redmond", "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
#: 953 is prime: it permutes every group whose size it does not divide (as Nexmark).
DISORDER_MULTIPLIER = 953


@dataclass(frozen=True)
class GeneratorConfig:
    """What the generator makes; the defaults are Nexmark's."""

    events: int = 100_000
    seed: int = 42
    #: Events per second of event time (not of wall-clock time).
    first_event_rate: int = 10_000
    #: Event time of the first event, ms since the epoch (2023-11-14T22:13:20Z).
    base_time: int = 1_700_000_000_000
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    avg_person_byte_size: int = 200
    avg_auction_byte_size: int = 500
    avg_bid_byte_size: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_in_flight_auctions: int = 100
    num_active_people: int = 1000
    #: 1: in order; g: each group of g consecutive events comes shuffled.
    out_of_order_group_size: int = 1

    def __post_init__(self) -> None:
        for name in ("first_event_rate", "person_proportion", "auction_proportion",
                     "bid_proportion", "hot_auction_ratio", "hot_sellers_ratio",
                     "hot_bidders_ratio", "num_in_flight_auctions", "num_active_people",
                     "out_of_order_group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"GeneratorConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.events < 0:
            raise ValueError(f"GeneratorConfig.events must be >= 0, got {self.events}")
        if self.out_of_order_group_size % DISORDER_MULTIPLIER == 0:
            raise ValueError(f"GeneratorConfig.out_of_order_group_size must not be a multiple "
                             f"of {DISORDER_MULTIPLIER}, got {self.out_of_order_group_size}")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    @property
    def inter_event_delay_us(self) -> float:
        """Microseconds of event time between consecutive events."""
        return 1_000_000 / self.first_event_rate

    def timestamp(self, number: int) -> int:
        """Event time (ms) of event ``number`` of the ordered stream."""
        return self.base_time + int(number * self.inter_event_delay_us) // 1000

    def adjusted_number(self, n: int) -> int:
        """Which event of the ordered stream comes ``n``-th (the disorder)."""
        g = self.out_of_order_group_size
        return (n // g) * g + (n * DISORDER_MULTIPLIER) % g

    def max_disorder(self) -> float:
        """Seconds an event may lag behind the newest event before it: the
        watermark's ``max_delay`` under which no event is late."""
        g = self.out_of_order_group_size
        return (self.timestamp(g - 1) - self.timestamp(0) + 1) / 1000 if g > 1 else 0.0

    def last_person_id(self, event_id: int) -> int:
        """The newest person id (base 0) at ``event_id`` (its own if a person)."""
        epoch, offset = divmod(event_id, self.total_proportion)
        return epoch * self.person_proportion + min(offset, self.person_proportion - 1)

    def last_auction_id(self, event_id: int) -> int:
        """The newest auction id (base 0) at ``event_id`` (its own if an auction)."""
        epoch, offset = divmod(event_id, self.total_proportion)
        if offset < self.person_proportion:
            epoch -= 1
            offset = self.auction_proportion - 1
        elif offset >= self.person_proportion + self.auction_proportion:
            offset = self.auction_proportion - 1
        else:
            offset -= self.person_proportion
        return epoch * self.auction_proportion + offset


class _Strings:
    """Random lowercase strings cut from a seeded pool."""

    POOL = 1 << 16

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        letters = string.ascii_lowercase
        self.pool = "".join(rng.choices(letters, k=self.POOL))

    def of_length(self, n: int) -> str:
        at = self.rng.randrange(self.POOL - n)
        return self.pool[at:at + n]

    def up_to(self, max_length: int) -> str:
        """3 to ``max_length`` letters (Nexmark's ``nextString``)."""
        return self.of_length(self.rng.randint(3, max_length))

    def extra(self, current_size: int, average_size: int) -> str:
        """Padding that brings an event to ``average_size`` bytes on average,
        +-20% (Nexmark's ``nextExtra``)."""
        if current_size > average_size:
            return ""
        wanted = average_size - current_size
        delta = round(wanted * 0.2)
        return self.of_length(wanted - delta + self.rng.randint(0, 2 * delta))


class NexmarkGenerator:
    """Generates ``config.events`` events; ``event(n)`` is the ``n``-th of
    the stream. One ``random.Random(config.seed)`` draws every value in
    stream order, so a config always gives the same list."""

    def __init__(self, config: GeneratorConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.strings = _Strings(self.rng)
        c = config
        # How long an auction lasts: about the time it takes to create
        # num_in_flight_auctions more of them (Nexmark's nextAuctionLengthMs).
        self._auction_horizon_events = (c.num_in_flight_auctions * c.total_proportion
                                        // c.auction_proportion)

    def events(self) -> list[Event]:
        """The whole stream, in order of arrival."""
        return [self.event(n) for n in range(self.config.events)]

    def event(self, n: int) -> Event:
        """The ``n``-th event of the stream (call in order: the draws are sequential)."""
        c = self.config
        number = c.adjusted_number(n)
        timestamp = c.timestamp(number)
        rem = number % c.total_proportion
        if rem < c.person_proportion:
            return self._person(number, timestamp)
        if rem < c.person_proportion + c.auction_proportion:
            return self._auction(number, timestamp)
        return self._bid(number, timestamp)

    def _price(self) -> int:
        dollars: float = 10.0 ** (self.rng.random() * 6.0)  # 1 to 1,000,000
        return round(dollars * 100.0)

    def _next_person_id(self, event_id: int) -> int:
        """A random recent person (base 0), or one of a few about to come."""
        people = self.config.last_person_id(event_id) + 1
        active = min(people, self.config.num_active_people)
        return people - active + self.rng.randrange(active + PERSON_ID_LEAD)

    def _next_auction_id(self, event_id: int) -> int:
        """A random auction likely still open (base 0), or one about to come."""
        newest = self.config.last_auction_id(event_id)
        oldest = max(newest - self.config.num_in_flight_auctions, 0)
        return oldest + self.rng.randrange(newest - oldest + 1 + AUCTION_ID_LEAD)

    def _person(self, event_id: int, timestamp: int) -> Person:
        rng, s = self.rng, self.strings
        name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        email = f"{s.up_to(7)}@{s.up_to(5)}.com"
        card = " ".join(f"{rng.randrange(10_000):04d}" for _ in range(4))
        city = rng.choice(US_CITIES)
        state = rng.choice(US_STATES)
        size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
        extra = s.extra(size, self.config.avg_person_byte_size)
        return Person(self.config.last_person_id(event_id) + FIRST_PERSON_ID, name, email,
                      card, city, state, timestamp, extra)

    def _auction(self, event_id: int, timestamp: int) -> Auction:
        c, rng, s = self.config, self.rng, self.strings
        auction_id = c.last_auction_id(event_id) + FIRST_AUCTION_ID
        if rng.randrange(c.hot_sellers_ratio) > 0:
            seller = (c.last_person_id(event_id) // HOT_BATCH) * HOT_BATCH
        else:
            seller = self._next_person_id(event_id)
        category = FIRST_CATEGORY_ID + rng.randrange(NUM_CATEGORIES)
        initial_bid = self._price()
        horizon = c.timestamp(event_id + self._auction_horizon_events) - timestamp
        expires = timestamp + 1 + rng.randrange(max(horizon * 2, 1))
        name = s.up_to(20)
        description = s.up_to(100)
        reserve = initial_bid + self._price()
        extra = s.extra(8 + len(name) + len(description) + 40, c.avg_auction_byte_size)
        return Auction(auction_id, name, description, initial_bid, reserve, timestamp,
                       expires, seller + FIRST_PERSON_ID, category, extra)

    def _bid(self, event_id: int, timestamp: int) -> Bid:
        c, rng = self.config, self.rng
        if rng.randrange(c.hot_auction_ratio) > 0:
            auction = (c.last_auction_id(event_id) // HOT_BATCH) * HOT_BATCH
        else:
            auction = self._next_auction_id(event_id)
        if rng.randrange(c.hot_bidders_ratio) > 0:
            # The second of the batch: hot bidders and hot sellers differ.
            bidder = (c.last_person_id(event_id) // HOT_BATCH) * HOT_BATCH + 1
        else:
            bidder = self._next_person_id(event_id)
        price = self._price()
        extra = self.strings.extra(32, c.avg_bid_byte_size)
        return Bid(auction + FIRST_AUCTION_ID, bidder + FIRST_PERSON_ID, price, timestamp, extra)


def generate(config: GeneratorConfig) -> list[Event]:
    """The events of ``config``, in order of arrival."""
    return NexmarkGenerator(config).events()
