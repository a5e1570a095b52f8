"""Replaying a source split up to a recorded position gives exactly the
records a streaming reader had read by then, for every built-in replayable
source and any batch sizes — for a log, in each partition's order (no Spark
needed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eddyflow as ef
from eddyflow.connectors.collection import CollectionSource
from eddyflow.connectors.log import LogSource
from eddyflow.connectors.source import Source
from eddyflow.connectors.textfile import TextFileSource
from eddyflow.offline.replay import ReplayError, replay_split


def read_some(source: Source, subtask: int, parallelism: int, sizes: list[int]
              ) -> tuple[list[Any], Any]:
    """What a streaming reader reads in batches of ``sizes``, and its position."""
    async def go() -> tuple[list[Any], Any]:
        reader = source.create_reader(subtask, parallelism)
        got: list[Any] = []
        for n in sizes:
            batch = await reader.read_batch(n)
            if batch is None:
                break
            got.extend(batch)
        position = reader.position()
        await reader.close()
        return got, position
    return asyncio.run(go())


def replayed(source: Source, subtask: int, parallelism: int, position: Any) -> list[Any]:
    return [r for batch in replay_split(source, "src", subtask, parallelism, position)
            for r in batch]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Source]:
    tmp = tmp_path_factory.mktemp("replay")
    text = tmp / "lines.txt"
    text.write_text("".join(f"line {i} {'x' * (i % 7)}\n" for i in range(1500)))
    with ef.Log(tmp / "log", 3) as log:
        for i in range(1500):
            log.append({"i": i}, partition=(i * 7) % 3)
    return {
        "collection": CollectionSource(list(range(1500))),
        "text": TextFileSource(str(text)),
        "log": LogSource(tmp / "log"),
    }


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(["collection", "text", "log"]),
       parallelism=st.integers(1, 3), data=st.data())
def test_replay_stops_exactly_at_the_recorded_position(
        sources: dict[str, Source], kind: str, parallelism: int, data: st.DataObject) -> None:
    source = sources[kind]
    subtask = data.draw(st.integers(0, parallelism - 1))
    sizes = data.draw(st.lists(st.integers(1, 700), max_size=8))
    read, position = read_some(source, subtask, parallelism, sizes)
    again = replayed(source, subtask, parallelism, position)
    if kind != "log":
        assert again == read
        return
    # A log reader interleaves its partitions by batch size, so only each
    # partition's order is the stream's (a key lives in one partition).
    assert by_partition(again) == by_partition(read)


def by_partition(records: list[dict[str, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in records:
        out.setdefault((r["i"] * 7) % 3, []).append(r["i"])
    return out


def test_replay_of_an_input_that_no_longer_reaches_the_position_names_the_source(
        tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("a\nb\nc\n")
    source = TextFileSource(str(path))
    _, position = read_some(source, 0, 1, [10])
    path.write_text("a\n")  # truncated since the checkpoint
    with pytest.raises(ReplayError, match=r"source 'src' subtask 0/1.*input ended.*byte offset 2"):
        replayed(source, 0, 1, position)


def test_a_source_that_is_not_replayable_is_refused() -> None:
    async def gen() -> Any:
        yield 1

    from eddyflow.connectors.asynciter import AsyncIterableSource

    with pytest.raises(ReplayError, match="not replayable"):
        replayed(AsyncIterableSource(gen()), 0, 1, 1)
