"""``SourceReader.notify_checkpoint_complete``: the source task tells its
reader when a checkpoint that recorded the reader's position completes; the
position it recorded is the one ``snapshot_position`` gave for that id.

A reader of a system that keeps a consumer's progress on its side (a
PostgreSQL replication slot, a consumer group's offset) acknowledges a
position only then: the checkpoint's metadata, with that position in it, is
durable by the time the hook runs, and ids arrive in increasing order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import eddyflow as ef
from eddyflow.checkpoint.metadata import CheckpointMetadata
from eddyflow.checkpoint.storage import CheckpointStorage


class Counting(ef.Source):
    """Integers ``0 .. n-1``, a small batch at a time; its readers record
    each completion they are told of with the position the checkpoint holds
    for them, read back from the checkpoint's metadata at that moment."""

    def __init__(self, n: int, chk: Path) -> None:
        self.n = n
        self.chk = chk
        #: (subtask, checkpoint id, recorded position, position when told)
        self.notified: list[tuple[int, int, Any, int]] = []

    @property
    def name(self) -> str:
        return "counting"

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return _CountingReader(self, subtask, parallelism)


class _CountingReader(ef.SourceReader):
    def __init__(self, source: Counting, subtask: int, parallelism: int) -> None:
        self.source = source
        self.subtask = subtask
        self.pos = subtask
        self.step = parallelism
        self.snapshots: dict[int, int] = {}

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.pos >= self.source.n:
            # The end waits for three completions (quiet meanwhile: the
            # task reads again after the rest of the job had its turn).
            told = sum(1 for s, *_ in self.source.notified if s == self.subtask)
            return None if told >= 3 else []
        out = list(range(self.pos, min(self.pos + 5 * self.step, self.source.n), self.step))
        self.pos += len(out) * self.step
        return out

    def position(self) -> int:
        return self.pos

    def seek(self, position: Any) -> None:
        self.pos = int(position)

    def snapshot_position(self, checkpoint_id: int) -> int:
        self.snapshots[checkpoint_id] = self.pos
        return self.pos

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        # The metadata of the checkpoint is durable already: read it back.
        storage = CheckpointStorage(self.source.chk)
        meta = CheckpointMetadata.from_json(storage.read_metadata(checkpoint_id))
        recorded = meta.operators["counting"].subtasks[self.subtask].position
        # A running reader's checkpoint holds what it said for that id (a
        # finished one's, its final position: no barrier reached it).
        assert recorded == self.snapshots.get(checkpoint_id, self.pos)
        self.source.notified.append((self.subtask, checkpoint_id, recorded, self.pos))


def test_readers_are_told_of_each_completed_checkpoint(tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    source = Counting(3_000, chk)
    env = ef.StreamEnvironment(parallelism=2, batch_size=5)
    env.enable_checkpointing(0.01, chk, retained=100_000)
    sink = ef.ListSink()
    env.from_source(source).name("counting").map(lambda x: x + 1).sink_to(sink)
    env.execute("notify")
    assert sorted(sink.results) == list(range(1, 3_001))
    completed = [c.id for c in ef.list_checkpoints(chk)]
    assert len(completed) >= 4  # three while running, and the final one
    for subtask in (0, 1):
        told = [(n, rec, now) for s, n, rec, now in source.notified if s == subtask]
        ids = [n for n, _, _ in told]
        # Every completed checkpoint, in order, once.
        assert ids == completed
        for n, recorded, now in told:
            # The position acknowledged is one this reader had reached.
            assert isinstance(recorded, int) and recorded % 2 == subtask
            assert recorded <= now, (n, recorded, now)
