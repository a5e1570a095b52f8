"""The split source machinery (connectors/splits.py) on its own: who owns a
split, how a subtask's reader goes through its splits (in turn, past idle
ones, closing finished ones), what it reports as its position, how a
checkpoint's splits come back (also from the per-subtask positions of
checkpoints written before the built-in sources were split sources), and
discovery while running."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

import eddyflow as ef
from eddyflow.checkpoint.metadata import OperatorState, SplitInfo, SubtaskState
from eddyflow.connectors import CollectionSource, LogSource, TextFileSource
from eddyflow.connectors.splits import (
    RestoredSplit,
    SourceSplit,
    SplitAt,
    SplitPositions,
    SplitsReader,
    checkpointed_splits,
    split_owner,
)


def test_a_split_goes_to_its_index_modulo_the_parallelism_or_to_its_ids_hash() -> None:
    assert [split_owner(SourceSplit(f"p{i}", None, i), 3) for i in range(7)] == [
        0, 1, 2, 0, 1, 2, 0]
    # Without an index: a CRC-32 of the id, the same in every process.
    assert split_owner(SourceSplit("a.txt:0"), 4) == zlib.crc32(b"a.txt:0") % 4


class Scripted(ef.SplitSource):
    """Splits whose readers hand out scripted batches: ``None`` ends the
    split, ``[]`` is nothing now (until the script is extended)."""

    def __init__(self, scripts: dict[str, list[list[int] | None]]) -> None:
        self.scripts = scripts
        self.created: list[str] = []
        self.readers: dict[str, ScriptedReader] = {}

    def discover_splits(self, known: Sequence[ef.SourceSplit], parallelism: int
                        ) -> list[ef.SourceSplit]:
        have = {s.split_id for s in known}
        return [ef.SourceSplit(sid, None, 0) for sid in sorted(self.scripts) if sid not in have]

    def create_split_reader(self, split: ef.SourceSplit) -> ef.SourceReader:
        self.created.append(split.split_id)
        reader = self.readers[split.split_id] = ScriptedReader(self.scripts[split.split_id])
        return reader


class ScriptedReader(ef.SourceReader):
    def __init__(self, script: list[list[int] | None]) -> None:
        self.script = script
        self.at = 0  # batches handed out
        self.pos = 0  # records handed out
        self.closed = False
        self.ready: asyncio.Future[None] | None = None
        self.notified: list[int] = []

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.at >= len(self.script):
            return []
        batch = self.script[self.at]
        if batch is None:
            return None
        self.at += 1
        self.pos += len(batch)
        return batch

    def available(self) -> asyncio.Future[None] | None:
        if self.at < len(self.script):
            return None
        if self.ready is None or self.ready.done():
            self.ready = asyncio.get_running_loop().create_future()
        return self.ready

    def more(self, batch: list[int] | None) -> None:
        self.script.append(batch)
        if self.ready is not None and not self.ready.done():
            self.ready.set_result(None)

    def position(self) -> int:
        return self.pos

    def seek(self, position: Any) -> None:
        # Position = records handed out; batches are skipped whole here.
        n, self.at, self.pos = 0, 0, 0
        while n < position:
            batch = self.script[self.at]
            assert batch is not None
            n += len(batch)
            self.at += 1
        self.pos = position

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.notified.append(checkpoint_id)

    async def close(self) -> None:
        self.closed = True


async def test_a_subtask_reads_its_splits_in_turn_past_idle_and_finished_ones() -> None:
    source = Scripted({"a": [[1, 2], [3], None], "b": [], "c": [None]})
    reader = SplitsReader(source, 0, 1, [RestoredSplit(s) for s in
                                         source.discover_splits([], 1)])
    # "b" is quiet, "c" ends at once: "a" alone flows, batch by batch.
    assert await reader.read_batch(10) == [1, 2]
    assert await reader.read_batch(10) == [3]  # past "b" (nothing) and "c" (ended)
    assert source.readers["c"].closed
    # "a" ends too: only the quiet "b" is left, and the reader says so.
    assert await reader.read_batch(10) == []
    assert source.readers["a"].closed and not source.readers["b"].closed
    ready = reader.available()
    assert ready is not None and not ready.done()
    source.readers["b"].more([7])
    await asyncio.wait_for(ready, 5)
    assert await reader.read_batch(10) == [7]
    assert reader.last_span == ("b", 0, 1)
    source.readers["b"].more(None)
    assert await reader.read_batch(10) is None
    position = reader.position()
    assert isinstance(position, SplitPositions)
    assert position.positions == {"a": 3, "b": 1, "c": 0}
    assert {sid: info.finished for sid, info in position.splits.items()} == {
        "a": True, "b": True, "c": True}
    await reader.close()


async def test_a_restored_subtask_seeks_its_splits_and_leaves_finished_ones_closed() -> None:
    source = Scripted({"a": [[1, 2], [3, 4], None], "b": [[5], None]})
    restored = [RestoredSplit(SourceSplit("a", None, 0), 2),
                RestoredSplit(SourceSplit("b", None, 0), 1, finished=True)]
    reader = SplitsReader(source, 0, 1, restored)
    assert source.created == ["a"]  # a finished split is not opened again
    assert reader.position().positions == {"a": 2, "b": 1}
    assert await reader.read_batch(10) == [3, 4]
    assert await reader.read_batch(10) is None
    assert reader.position().positions == {"a": 4, "b": 1}
    await reader.close()


async def test_a_subtask_keeps_only_the_splits_it_owns() -> None:
    splits = [RestoredSplit(SourceSplit(str(i), None, i), i) for i in range(5)]
    source = Scripted({str(i): [None] for i in range(5)})
    readers = [SplitsReader(source, s, 2, splits) for s in range(2)]
    assert [sorted(r.position().positions) for r in readers] == [["0", "2", "4"], ["1", "3"]]


async def test_positions_snapshots_and_completions_reach_the_split_readers() -> None:
    source = Scripted({"a": [[1], [2]], "b": [[3]]})
    reader = SplitsReader(source, 0, 1, [RestoredSplit(s) for s in
                                         source.discover_splits([], 1)])
    assert await reader.read_batch(1) == [1]
    snap = reader.snapshot_position(7)
    assert snap.positions == {"a": 1, "b": 0}
    assert snap.splits == {"a": SplitInfo(None, 0), "b": SplitInfo(None, 0)}
    reader.notify_checkpoint_complete(7)
    assert source.readers["a"].notified == [7] and source.readers["b"].notified == [7]
    assert reader.position_of(0) is None  # the scripted reader cannot tell
    assert "split 'a'" in reader.describe_position(SplitAt("a", 1))


async def test_discovery_while_running_adds_the_splits_a_subtask_owns(tmp_path: Path) -> None:
    class Growing(Scripted):
        discovery_interval = 0.01

        def discover_splits(self, known: Sequence[ef.SourceSplit], parallelism: int
                            ) -> list[ef.SourceSplit]:
            have = {s.split_id for s in known}
            return [ef.SourceSplit(sid, None, int(sid)) for sid in sorted(self.scripts)
                    if sid not in have]

    source = Growing({"0": [[1], None], "1": [[2], None]})
    reader = SplitsReader(source, 0, 2, [RestoredSplit(s) for s in
                                         source.discover_splits([], 2)])
    got: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader.fetch)
        assert await reader.read_batch(10) == [1]
        assert await reader.read_batch(10) == []  # discovering: it never ends
        source.scripts["2"] = [[3, 4], None]  # subtask 0's (2 % 2)
        source.scripts["3"] = [[5], None]  # subtask 1's
        for _ in range(500):
            ready = reader.available()
            if ready is not None:
                await asyncio.wait_for(ready, 5)
            got += await reader.read_batch(10) or []
            if got:
                break
        tg.cancel_scope.cancel()
    assert got == [3, 4]
    assert sorted(reader.position().positions) == ["0", "2"]
    await reader.close()


async def test_a_discovery_that_fails_fails_the_next_read() -> None:
    class Broken(Scripted):
        discovery_interval = 0.01

        def discover_splits(self, known: Sequence[ef.SourceSplit], parallelism: int
                            ) -> list[ef.SourceSplit]:
            if known:
                raise OSError("cannot list the input")
            return super().discover_splits(known, parallelism)

    source = Broken({"a": []})
    reader = SplitsReader(source, 0, 1, [RestoredSplit(s) for s in
                                         source.discover_splits([], 1)])
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader.fetch)
        with pytest.raises(OSError, match="cannot list the input"):
            for _ in range(500):
                ready = reader.available()
                if ready is not None:
                    await asyncio.wait_for(ready, 5)
                await reader.read_batch(10)
        tg.cancel_scope.cancel()


# -- checkpoints of the per-subtask form (before split sources) -------------------------


def _old(parallelism: int, positions: dict[int, Any]) -> OperatorState:
    return OperatorState("source", parallelism, {
        s: SubtaskState(is_source=True, position=p) for s, p in positions.items()})


def test_old_collection_positions_become_slices() -> None:
    source = CollectionSource(range(10))
    got = checkpointed_splits(source, "src", _old(2, {0: 3, 1: 7}))
    assert [(r.split.split_id, r.split.data, r.position) for r in got] == [
        ("slice-0", [0, 5], 3), ("slice-1", [5, 10], 7)]


def test_old_text_file_positions_become_byte_ranges(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    source = TextFileSource(path)
    got = checkpointed_splits(source, "src", _old(2, {0: 14, 1: None}))
    # The same ranges a reader of subtask s of 2 read before, at its position.
    assert [r.position for r in got] == [14, None]
    for s, r in enumerate(got):
        old = source.create_reader(s, 2)  # the fresh split of a fresh start at 2
        assert old.position() == r.split.data["start"]


def test_old_log_positions_become_partitions(tmp_path: Path) -> None:
    with ef.Log(tmp_path / "log", partitions=5) as log:
        for i in range(50):
            log.append(i)
    got = checkpointed_splits(LogSource(tmp_path / "log"), "src",
                              _old(2, {0: {"0": 4, "2": 1}, 1: {"1": 3}}))
    assert {r.split.split_id: r.position for r in got} == {
        "0": 4, "1": 3, "2": 1, "3": 0, "4": 0}


def test_an_old_position_a_source_cannot_map_is_refused_naming_the_source() -> None:
    with pytest.raises(ValueError, match=r"source 'src': subtask 0 of 1: .*byte offset"):
        checkpointed_splits(TextFileSource(__file__), "src", _old(1, {0: "nonsense"}))
