"""In-flight data bounded by time, after Flink's buffer debloating (FLIP-183).

A channel bounded by a number of records holds, behind a slow consumer,
however many seconds of work that number amounts to, and an aligned barrier
waits behind all of it (and an unaligned one stores all of it as channel
state). So each consumer task measures, a batch at a time, how fast it takes
records off its inputs while it has input (the time it waits on an empty or
blocked gate left out) and how long its own processing of a batch takes,
smooths both (an exponentially weighted moving average, as Flink's
``ThroughputCalculator`` and ``BufferDebloater``; of the time per record
rather than the rate, so that one burst through an empty channel does not
pass for a fast consumer for long), and every ``PERIOD``
seconds sizes what feeds it, so that what can be queued ahead of a barrier
drains within ``target`` seconds, the checkpoint's other steps included:

* the capacity of each input channel: its share of ``rate x target x
  QUEUE_SHARE``, less
  the two batches a channel may hold beyond its bound (the one it accepts
  while under the bound, and the one a producer's waiting put holds);
* the batch its producers hand over on that channel: a ``batches + 2``-th of
  that share, and no more than the consumer works through in ``target /
  TURNS`` seconds. A batch is one turn of the consumer on the event loop,
  which every task and every snapshot's asynchronous write share: a write
  takes a few turns of every busy task, so long turns make long
  checkpoints even with nothing queued.

A source task sizes its reads the same way: a batch read goes through its
chain in one turn, and a barrier is injected only between two of them. Nor
does it read more at once than its writers hand on in one batch per channel
(what its consumers asked for): the barrier waits until all of a batch read
is handed on, and a big read all sent to one back-pressured channel of a
round-robin exchange would starve the others meanwhile.

The sizes never exceed the configured ones (``channel_capacity`` batches of
``batch_size`` records): where no consumer is slow they stay as configured,
and so does the throughput. They start small (a 64th of the configured
batch, 16 records at least) and grow at the first measurement, so that a
slow consumer does not take its first, configured-size batches in one turn
of seconds.
``benchmarks/backpressure.py --scenario debloat`` measures the effect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eddyflow.runtime.exchange.channel import Channel
    from eddyflow.runtime.exchange.writers import RecordWriter

__all__ = ["PERIOD", "QUEUE_SHARE", "TURNS", "Debloater", "Ewma", "InFlightBounds", "Sizes"]

#: Seconds between two sizings of one task's inputs (Flink: 200 ms).
PERIOD = 0.1
#: Turns of a consumer per ``target``: a batch takes it at most this
#: fraction of the target to process (see the module docstring).
TURNS = 100
#: The part of the target the records queued ahead of a barrier take to
#: drain; the rest is for what a checkpoint does besides: the source's
#: batch under way, the snapshots and their writes, the stages after.
QUEUE_SHARE = 0.75
#: Weight of a new sample in the moving averages (Flink derives its own from
#: 20 samples of 200 ms; jobs here are shorter, so the average is quicker).
SMOOTHING = 0.3


@dataclass(frozen=True, slots=True)
class InFlightBounds:
    """The configuration debloating works within: ``target`` seconds of
    in-flight data, and the configured sizes it never exceeds."""

    target: float
    batch_size: int
    batches: int  # channel capacity, in batches of batch_size

    @property
    def max_capacity(self) -> int:
        """The configured channel capacity, in records."""
        return self.batches * self.batch_size

    @property
    def initial_batch(self) -> int:
        """The batch before anything is measured (see the module docstring)."""
        return min(self.batch_size, max(16, self.batch_size // 64))

    def initial(self) -> Sizes:
        """Sizes before anything is measured: small (see the module docstring)."""
        b = self.initial_batch
        return Sizes(min(self.max_capacity, 2 * b), b)

    def turn(self, own_rate: float) -> int:
        """Records a consumer that processes ``own_rate`` records a second
        of its own time takes in one turn."""
        return _clamp(own_rate * self.target / TURNS, 1, self.batch_size)

    def input_sizes(self, rate: float, own_rate: float, channels: int) -> Sizes:
        """The sizes of each of ``channels`` inputs of a consumer that
        takes ``rate`` records a second off them all while it has input."""
        share = rate * self.target * QUEUE_SHARE / max(1, channels)
        batch = min(self.turn(own_rate), _clamp(share / (self.batches + 2), 1, self.batch_size))
        # Never below the initial sizes' capacity: a stage slowed by what
        # does not grow with its input (stalls per checkpoint, per batch)
        # would otherwise get smaller batches, and so take still longer per
        # record, down to one record at a time.
        floor = min(self.max_capacity, 2 * self.initial_batch)
        return Sizes(_clamp(share - 2 * batch, floor, self.max_capacity), batch)


@dataclass(frozen=True, slots=True)
class Sizes:
    """A channel's bound (``capacity``, records) and the ``batch`` its
    producer hands over at once (records)."""

    capacity: int
    batch: int


def _clamp(value: float, low: int, high: int) -> int:
    return max(low, min(high, int(value)))


class Ewma:
    """An exponentially weighted moving average. Until it has ``1 / weight``
    samples it is their plain mean, so that it settles within a few samples
    rather than carrying its first one for long."""

    __slots__ = ("samples", "value", "weight")

    def __init__(self, weight: float = SMOOTHING) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"EWMA weight must be in (0, 1], got {weight}")
        self.weight = weight
        self.samples = 0
        self.value = 0.0

    def add(self, sample: float) -> float:
        """Take ``sample`` into the average; returns the new average."""
        self.samples = n = self.samples + 1
        v = self.value
        v += max(self.weight, 1 / n) * (sample - v)
        self.value = v
        return v


class Debloater:
    """Measures one task's consumption and sizes what feeds it.

    ``inputs``: the task's bounded input channels, each with the writer
    that feeds it and its index among that writer's channels (none for a
    source task, which sizes its reads, :attr:`read_size`, also by its
    ``outputs``). The task calls :meth:`worked` for each batch its
    operators take and :meth:`idle` after waiting for input; both are a few
    additions, the sizing itself runs once a ``PERIOD`` (times from
    ``time.perf_counter``).
    """

    __slots__ = ("_busy_from", "_idle", "_own", "_records", "bounds", "cost", "inputs",
                 "next_at", "outputs", "own_cost", "read_size", "sizes")

    def __init__(self, bounds: InFlightBounds,
                 inputs: Sequence[tuple[Channel, RecordWriter, int]] = (),
                 outputs: Sequence[RecordWriter] = ()) -> None:
        self.bounds = bounds
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        #: Seconds per record taken off the inputs, while there are any.
        self.cost = Ewma()
        #: Seconds per record of the task's own processing time.
        self.own_cost = Ewma()
        self.sizes = bounds.initial()
        #: Records a source task reads at once.
        self.read_size = self.sizes.batch
        self._records = 0
        self._own = 0.0
        self._idle = 0.0
        self._busy_from: float | None = None
        self.next_at = 0.0  # the first batch measures at once
        self._apply()

    def idle(self, seconds: float) -> None:
        """The task waited ``seconds`` for input."""
        self._idle += seconds

    def worked(self, records: int, began: float, now: float) -> None:
        """The task's operators took a batch of ``records`` from ``began`` to
        ``now``."""
        self._records += records
        self._own += now - began
        if now >= self.next_at:
            self.measure(now)

    def measure(self, now: float) -> None:
        """Take a sample of what was counted since the last one and resize."""
        records, own_time = self._records, max(self._own, 1e-9)
        if not records:
            self.next_at = now + PERIOD
            return
        own = 1 / self.own_cost.add(own_time / records)
        b = self.bounds
        read = b.turn(own)
        for w in self.outputs:
            # A batch for each channel (a broadcast's records go to all).
            read = min(read, max(1, w.batch_size * len(w.channels) // w.copies))
        self.read_size = read
        start, idle = self._busy_from, self._idle
        self._records = 0
        self._own = self._idle = 0.0
        self._busy_from = now
        if start is None:
            # The first batch: it sizes the batches. Its own time is no
            # measure of the rate (other tasks take turns too): until a
            # first sample, soon, a channel holds two such batches.
            self.next_at = now + PERIOD / 4
            if self.inputs:
                batch = b.turn(own)
                self.sizes = Sizes(min(b.max_capacity, max(self.sizes.capacity, 2 * batch)),
                                   batch)
                self._apply()
            return
        # Busy: not waiting for input, whether processing, waiting for
        # output space or letting other tasks run.
        rate = 1 / self.cost.add(max(now - start - idle, own_time) / records)
        self.next_at = now + PERIOD
        if self.inputs:
            self.sizes = b.input_sizes(rate, own, len(self.inputs))
            self._apply()

    def _apply(self) -> None:
        capacity, batch = self.sizes.capacity, self.sizes.batch
        for channel, writer, index in self.inputs:
            # A put waiting on the old bound keeps it for its one batch.
            channel.capacity = capacity
            writer.limit_batch(index, batch)
