"""Channel state: the records in flight on channels at a checkpoint.

Two kinds of checkpoint record records that are in no operator's state yet
(docs/concepts/cycles.md, unaligned.md): a loop head logs what comes back on its back-edges between
its snapshot and the barrier's return round the loop, and an *unaligned*
checkpoint records what its barrier overtook — on a task's inputs, what it
consumed between its snapshot and the barrier's arrival on each of them; on
its outputs, what the barrier jumped ahead of in its writers' buffers and
queues. Both are one mechanism here: a :class:`ChannelStateLog` logs batches
per input channel until each channel's barrier (or its end) arrives, and
output captures are added beside it.

Every batch is pickled the moment it is captured: the consumer's code may
change its records in place afterwards, and channel state must hold them as
they were at the barrier.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage, FileHandle
from eddyflow.errors import StateSerializationError
from eddyflow.runtime.checkpointing.backedge_log import (
    Logged,
    decode_logged_channels,
    encode_batch,
    encode_logged_channels,
)
from eddyflow.state.serialization import find_unpicklable, reason_of, record_text

__all__ = ["ChannelStateLog", "channel_key", "decode_channel_state", "encode_batches",
           "read_channel_state", "split_channel_key", "write_channel_state"]


def channel_key(exchange: str, upstream: int, downstream: int) -> str:
    """How channel state names a channel: ``source->target/up/down``
    (``exchange`` is ``source->target``, by operator uid)."""
    return f"{exchange}/{upstream}/{downstream}"


def split_channel_key(key: str) -> tuple[str, int, int]:
    """``(exchange, upstream, downstream)`` of a :func:`channel_key`."""
    exchange, up, down = key.rsplit("/", 2)
    return exchange, int(up), int(down)


def _encode(batch: list[Any], operator: str, checkpoint_id: int, what: str) -> bytes:
    try:
        return encode_batch(list(batch), getattr(batch, "timestamps", None))
    except Exception as exc:
        found = find_unpicklable((r, r) for r in batch)
        if found is None:
            raise
        record, why = found
        raise StateSerializationError(
            reason_of(why), subject=f"{what} {record_text(record)}",
            operator=operator, checkpoint=checkpoint_id) from exc


def encode_batches(batches: Iterable[list[Any]], operator: str, checkpoint_id: int
                   ) -> list[bytes]:
    """``batches`` as channel state stores them (pickled now)."""
    return [_encode(b, operator, checkpoint_id, "in-flight record") for b in batches if b]


@dataclass
class ChannelStateLog:
    """One task's log for checkpoint ``checkpoint_id``: the batches that
    arrive on the input channels in ``waiting`` after its snapshot, each
    until that channel's barrier (or end of input) arrives. ``write`` runs
    once every channel has."""

    checkpoint_id: int
    waiting: set[int]
    write: Callable[[ChannelStateLog], Awaitable[None]]
    head: str = ""  # the operator the log belongs to, for errors
    back_edges: frozenset[int] = frozenset()  # which of the channels are a loop's back-edges
    records: dict[int, list[bytes]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)

    def log(self, channel: int, batch: list[Any]) -> None:
        """Log ``batch`` as it is now (serialised at capture)."""
        data = _encode(batch, self.head, self.checkpoint_id,
                       "back-edge record" if channel in self.back_edges else "in-flight record")
        self.records.setdefault(channel, []).append(data)
        self.counts[channel] = self.counts.get(channel, 0) + len(batch)

    def add(self, channel: int, batches: Iterable[list[Any]]) -> None:
        for b in batches:
            if b:
                self.log(channel, b)

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def arrived(self, channel: int) -> bool:
        """The barrier (or the end) arrived on ``channel``; whether that was
        the last one awaited."""
        self.waiting.discard(channel)
        return not self.waiting


def write_channel_state(storage: CheckpointStorage, relpath: str,
                        inputs: Mapping[str, list[bytes]],
                        outputs: Mapping[str, list[bytes]]) -> Coroutine[Any, Any, FileHandle]:
    """Write a task's channel state to ``relpath``; the request goes to the
    writer process before this returns (``CheckpointStorage.start_write_file``):
    await the result for the file's handle."""
    channels = {f"in/{k}": v for k, v in inputs.items()}
    channels.update({f"out/{k}": v for k, v in outputs.items()})
    return storage.start_write_file(relpath, [encode_logged_channels(channels)])


def read_channel_state(root: str, handle: FileHandle
                       ) -> tuple[dict[str, list[Logged]], dict[str, list[Logged]]]:
    """A channel-state file's input and output parts, per channel key."""
    path = os.path.join(root, handle.path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise CheckpointCorrupted(f"{path}: unreadable channel state: {exc}") from exc
    return decode_channel_state(data, path)


def decode_channel_state(data: bytes, path: str
                         ) -> tuple[dict[str, list[Logged]], dict[str, list[Logged]]]:
    """A channel-state file's content (``path`` for errors), as
    :func:`read_channel_state` returns it."""
    channels = decode_logged_channels(data, path, "channel state")
    inputs: dict[str, list[Logged]] = {}
    outputs: dict[str, list[Logged]] = {}
    for name, batches in channels.items():
        side, _, key = name.partition("/")
        if side == "in":
            inputs[key] = batches
        elif side == "out":
            outputs[key] = batches
        else:
            raise CheckpointCorrupted(f"{path}: unreadable channel state: channel {name!r}")
    return inputs, outputs
