"""Before a restored job's tasks start: its sinks recover their transactions,
and the records a checkpoint holds in flight (back-edge logs of loops, the
channel state of an unaligned checkpoint) go back into the channels they
were on (docs/concepts/cycles.md, step 4; docs/concepts/unaligned.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from eddyflow.connectors.sink import Sink, awaited
from eddyflow.errors import RestoreFailed
from eddyflow.graph.logical import Partitioning
from eddyflow.graph.plan import ExchangeSpec, ExecutionPlan
from eddyflow.runtime.checkpointing.backedge_log import Logged
from eddyflow.runtime.checkpointing.channel_state import split_channel_key
from eddyflow.runtime.exchange.channel import Channel
from eddyflow.runtime.exchange.events import RecordBatch
from eddyflow.runtime.exchange.loops import LoopTracker
from eddyflow.runtime.exchange.writers import RecordWriter
from eddyflow.runtime.recovery.restore import RestoredCheckpoint

if TYPE_CHECKING:
    from eddyflow.runtime.task import Task

__all__ = ["ExchangeChannels", "recover_sinks", "reinject_backedge_logs",
           "reinject_channel_state"]

#: Per exchange of a job: its spec, its name (``source->target``) and its
#: channels by (upstream subtask, downstream subtask).
ExchangeChannels = Sequence[tuple[ExchangeSpec, str, Mapping[tuple[int, int], Channel]]]


async def recover_sinks(sinks: Mapping[str, Sink], restored: RestoredCheckpoint | None) -> None:
    """Commit what the restored checkpoint recorded (again: commits are
    idempotent) and discard every other pending transaction."""
    for uid, sink in sinks.items():
        committed = restored.committables(uid) if restored is not None else []
        try:
            await awaited(sink.recover(committed))
        except Exception as exc:
            if restored is None:
                raise
            folder = restored.storage.layout.checkpoint_dir(restored.checkpoint_id)
            raise RestoreFailed(f"cannot restore sink '{uid}' from {folder}: "
                                f"{type(exc).__name__}: {exc}") from exc


def reinject_channel_state(restored: RestoredCheckpoint, plan: ExecutionPlan,
                           exchanges: ExchangeChannels, loops: Sequence[LoopTracker],
                           make_writer: Callable[[ExchangeSpec, list[Channel], int],
                                                 RecordWriter],
                           produces_here: Callable[[ExchangeSpec, int], bool] | None = None
                           ) -> None:
    """Restore of an unaligned checkpoint: the records that were in
    flight on each channel go back into it, in order, before anything
    new (the upstream subtask resumes after them). At another
    parallelism the exchange's own writer (``make_writer``) routes them, as
    it would send them now: by key group into keyed operators, never
    round-robin. ``produces_here(exchange, upstream)``: whether this
    process runs that upstream subtask (a worker process puts back only
    what its own producers send; ``None``: every one runs here)."""
    state = restored.channel_state()
    if not state:
        return
    held: dict[str, list[tuple[int, int, list[Logged]]]] = {}
    for key, batches in state.items():
        exchange, up, down = split_channel_key(key)
        held.setdefault(exchange, []).append((up, down, batches))
    for x, name, chans in exchanges:
        mine = None if x.back_edge else held.pop(name, None)
        if mine is None:
            continue
        nodes = plan.graph.nodes
        old_down = restored.parallelism_of(nodes[x.target_node].uid)
        same = (restored.parallelism_of(nodes[x.source_node].uid)
                == plan.parallelism[x.source_node]
                and old_down == plan.parallelism[x.target_node])
        if not same and x.partitioning is Partitioning.BROADCAST:
            # Each downstream subtask had consumed its copies up to its
            # own point: no new subtask's share can be told apart.
            raise RestoreFailed(
                f"cannot restore the channel state of broadcast exchange {name} at "
                f"another parallelism (it was {old_down}); restore at the same "
                "parallelism, or from an aligned checkpoint")
        tracker = loops[x.loop] if x.loop is not None else None
        ups = sorted({u for u, _ in chans})
        writers: dict[int, RecordWriter] = {}
        for old_up, old_down_subtask, batches in mine:
            up = old_up if same else ups[old_up % len(ups)]
            if produces_here is not None and not produces_here(x, up):
                continue
            for records, stamps in batches:
                if same:
                    chans[(old_up, old_down_subtask)].append(
                        RecordBatch(records, None, stamps))
                else:
                    w = writers.get(up)
                    if w is None:
                        w = writers[up] = make_writer(
                            x, [ch for (u, _), ch in sorted(chans.items()) if u == up], up)
                    w.add(records, None, stamps)
                    w.hand_over()
                if tracker is not None:
                    tracker.in_flight += len(records)
    lost = sorted(name for name, mine in held.items() if any(b for _, _, b in mine))
    if lost:
        # Its records would be lost without a word: the two operators
        # are chained now (same parallelism), or the edge is gone.
        folder = restored.storage.layout.checkpoint_dir(restored.checkpoint_id)
        raise RestoreFailed(
            f"cannot restore {folder}: it holds records in flight on "
            f"{', '.join(lost)}, and this job has no such exchange (the operators are "
            "chained at this parallelism, or the edge is gone); restore at a "
            "parallelism that keeps the exchange, disable chaining, or restore "
            "from an aligned checkpoint")


async def reinject_backedge_logs(restored: RestoredCheckpoint, tasks: Sequence[Task]) -> None:
    """Restore (docs/concepts/cycles.md, step 4): the records logged on the
    back-edges go back into each loop head's back-edge input before
    anything else."""
    for t in tasks:
        if t.gate is None or t.head_of is None:
            continue
        head_uid = t.operators[0].uid
        batches = restored.backedge_batches(head_uid, t.subtask, t.parallelism)
        if not batches:
            continue
        channel = t.gate.channels[next(i for i, r in enumerate(t.regular) if not r)]
        t.head_of.in_flight += sum(len(records) for records, _ in batches)
        # In batches, as the records were sent (and with their
        # timestamps): a log holds everything in flight round the loop
        # (tens of thousands of records), and one batch of it would be
        # one long turn of the head and one huge output batch
        # downstream. The feedback channel is unbounded, so this never
        # waits for the head.
        size = t.batch_size
        for records, stamps in batches:
            for start in range(0, len(records), size):
                await channel.put(RecordBatch(
                    records[start:start + size], None,
                    None if stamps is None else stamps[start:start + size]))
