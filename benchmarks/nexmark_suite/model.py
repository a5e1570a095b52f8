"""The three Nexmark event types, as the Nexmark benchmark defines them
(persons who register, auctions they open, bids on auctions).

They are ``NamedTuple`` classes: tuples to the runtime (cheap to batch, to
pickle into checkpoints and to compare), fields by name to the queries.
Times are whole milliseconds since the epoch, as in Nexmark; the queries
give eddyflow float seconds (``event_time``).
"""

from __future__ import annotations

from typing import NamedTuple


class Person(NamedTuple):
    """A new person: may sell in auctions and bid."""

    id: int
    name: str
    email_address: str
    credit_card: str
    city: str
    state: str
    date_time: int
    extra: str


class Auction(NamedTuple):
    """A new auction of ``seller``'s item, open from ``date_time`` until
    ``expires`` (milliseconds); ``reserve`` is the lowest price it sells at."""

    id: int
    item_name: str
    description: str
    initial_bid: int
    reserve: int
    date_time: int
    expires: int
    seller: int
    category: int
    extra: str


class Bid(NamedTuple):
    """A bid of ``bidder`` on ``auction``, ``price`` in cents."""

    auction: int
    bidder: int
    price: int
    date_time: int
    extra: str


Event = Person | Auction | Bid


def event_time(event: Event) -> float:
    """The event's timestamp in eddyflow's unit, float seconds. (Whole
    milliseconds divided by 1000 round monotonically and window bounds that
    are whole seconds are exact floats, so a float window holds exactly the
    events an integer-millisecond reference puts there.)"""
    return event.date_time / 1000
