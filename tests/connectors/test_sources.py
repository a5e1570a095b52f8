"""Built-in sources: text files, collections and async iterables.

The text file source returns lines without terminators ("\\n" or "\\r\\n"),
keeps empty lines, reads a last line without a newline, and splits a file by
byte range over parallel subtasks so that every line is read exactly once;
its position is the byte offset of the next line and seeking to a reported
position resumes at the next line. Bad paths fail when the job is declared.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eddyflow as ef
from eddyflow.connectors import AsyncIterableSource, CollectionSource, TextFileSource


async def _drain(reader: ef.SourceReader, batch: int = 3) -> list[Any]:
    out: list[Any] = []
    while (got := await reader.read_batch(batch)) is not None:
        out.extend(got)
    await reader.close()
    return out


def _read_split(path: str | Path, parallelism: int, batch: int = 3) -> list[list[str]]:
    source = TextFileSource(path)

    async def run() -> list[list[str]]:
        return [await _drain(source.create_reader(s, parallelism), batch)
                for s in range(parallelism)]

    return asyncio.run(run())


def _expected_lines(data: bytes) -> list[str]:
    """Lines as the source must return them: split on b"\\n", the empty
    remainder after a final newline is not a line, one "\\r" before the "\\n"
    is part of the terminator."""
    if not data:
        return []
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    return [(p[:-1] if p.endswith(b"\r") else p).decode("utf-8") for p in parts]


def _job_lines(path: str | Path, parallelism: int) -> list[str]:
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=4)
    sink = ef.ListSink()
    env.read_text_file(path).sink_to(sink)
    env.execute()
    return sink.results


# -- text file: line terminators and edge cases -------------------------------------


@pytest.mark.parametrize(
    ("data", "lines"),
    [
        (b"a\nb\nc\n", ["a", "b", "c"]),
        (b"a\r\nb\r\nc\r\n", ["a", "b", "c"]),
        (b"a\nb\r\nc", ["a", "b", "c"]),
        (b"last line without newline", ["last line without newline"]),
        (b"\n\nx\n\n", ["", "", "x", ""]),
        (b"\r\n", [""]),
        (b"", []),
        (b"tab\there \t \n  spaces  \n", ["tab\there \t ", "  spaces  "]),
        ("größe\n日本語\r\n😀 emoji".encode(), ["größe", "日本語", "😀 emoji"]),
        ("sep\u2028inside\x85too\n".encode(), ["sep\u2028inside\x85too"]),
    ],
    ids=["lf", "crlf", "mixed-no-final", "single-no-newline", "empty-lines", "crlf-only",
         "empty-file", "whitespace", "multibyte", "unicode-separators"],
)
def test_text_file_lines(tmp_path: Path, data: bytes, lines: list[str]) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    assert _expected_lines(data) == lines  # the oracle agrees with the examples
    for p in (1, 2, 3):
        assert [x for split in _read_split(path, p) for x in split] == lines
    assert _job_lines(path, 1) == lines
    assert sorted(_job_lines(path, 3)) == sorted(lines)


def test_text_file_larger_than_read_chunk(tmp_path: Path) -> None:
    # More than the reader's 1 MiB chunk, with lines crossing chunk borders.
    lines = [f"{i:07d} " + "x" * (i % 97) for i in range(40_000)]
    path = tmp_path / "big.txt"
    path.write_text("\n".join(lines))
    assert path.stat().st_size > 2 * (1 << 20)
    for p in (1, 3):
        assert [x for split in _read_split(path, p, batch=1000) for x in split] == lines


_line = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
    max_size=12,
)


@st.composite
def _file_contents(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(_line, max_size=25))
    out = b""
    for i, line in enumerate(lines):
        out += line.encode("utf-8")
        last = i == len(lines) - 1
        if not last or draw(st.booleans()):
            out += draw(st.sampled_from([b"\n", b"\r\n"]))
    return out


@settings(max_examples=120, deadline=None)
@given(data=_file_contents(), parallelism=st.integers(1, 5), batch=st.integers(1, 7))
def test_every_line_read_exactly_once_by_parallel_readers(
    data: bytes, parallelism: int, batch: int
) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "in.txt")
        with open(path, "wb") as f:
            f.write(data)
        splits = _read_split(path, parallelism, batch)
    # Splits are contiguous byte ranges: concatenated in order they are the file.
    assert [x for s in splits for x in s] == _expected_lines(data)


@settings(max_examples=25, deadline=None)
@given(data=_file_contents(), parallelism=st.integers(1, 5))
def test_every_line_read_exactly_once_by_parallel_job(data: bytes, parallelism: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "in.txt")
        with open(path, "wb") as f:
            f.write(data)
        got = _job_lines(path, parallelism)
    assert sorted(got) == sorted(_expected_lines(data))


def test_same_file_every_parallelism(tmp_path: Path) -> None:
    lines = [f"{i} {'é' * (i % 5)}{'😀' * (i % 3)}" for i in range(301)]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for p in range(1, 6):
        assert [x for s in _read_split(path, p, batch=16) for x in s] == lines
        assert sorted(_job_lines(path, p)) == sorted(lines)


# -- text file: positions --------------------------------------------------------------


async def test_position_is_byte_offset_of_next_line(tmp_path: Path) -> None:
    data = "a\r\nbé\n\nlast".encode()
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    reader = TextFileSource(path).create_reader(0, 1)
    assert reader.position() == 0
    positions = []
    lines = []
    while (got := await reader.read_batch(1)) is not None:
        lines.extend(got)
        positions.append(reader.position())
    await reader.close()
    assert lines == ["a", "bé", "", "last"]
    assert positions[:3] == [3, 7, 8]
    assert positions[3] >= len(data)


def _seek_file(tmp_path: Path) -> Path:
    lines = [f"line {i} {'ü' * (i % 4)}" for i in range(60)]
    path = tmp_path / "in.txt"
    path.write_text("\r\n".join(lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("parallelism", [1, 2, 3])
async def test_seek_to_reported_position_resumes_at_next_line(
    tmp_path: Path, parallelism: int
) -> None:
    source = TextFileSource(_seek_file(tmp_path))
    for s in range(parallelism):
        reader = source.create_reader(s, parallelism)
        checkpoints: list[tuple[Any, int]] = []
        mine: list[str] = []
        while (got := await reader.read_batch(4)) is not None:
            mine.extend(got)
            checkpoints.append((reader.position(), len(mine)))
        await reader.close()
        assert len(checkpoints) > 2
        for pos, n_read in checkpoints:
            # A fresh reader of the same split, restored to pos.
            fresh = source.create_reader(s, parallelism)
            fresh.seek(pos)
            assert fresh.position() == pos
            assert await _drain(fresh) == mine[n_read:], (s, pos)
        # Seeking an open reader backwards replays as well.
        again = source.create_reader(s, parallelism)
        assert await again.read_batch(9) == mine[:9]
        again.seek(checkpoints[0][0])
        assert await _drain(again) == mine[checkpoints[0][1]:]


@pytest.mark.parametrize("parallelism", [2, 3])
async def test_seek_to_position_reported_before_first_read(
    tmp_path: Path, parallelism: int
) -> None:
    # A checkpoint can be taken before a source subtask read anything; the
    # position it reports then must also be one to resume from, not a byte
    # in the middle of a line that belongs to the previous split.
    source = TextFileSource(_seek_file(tmp_path))
    for s in range(parallelism):
        mine = await _drain(source.create_reader(s, parallelism))
        initial = source.create_reader(s, parallelism).position()
        fresh = source.create_reader(s, parallelism)
        fresh.seek(initial)
        assert await _drain(fresh) == mine, (s, initial)


async def test_position_of_reports_each_line_offset(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"aa\nbbb\r\n\ncccc\n")
    reader = TextFileSource(path).create_reader(0, 1)
    batch = await reader.read_batch(10)
    assert batch == ["aa", "bbb", "", "cccc"]
    assert [reader.position_of(i) for i in range(4)] == [0, 3, 8, 9]
    assert reader.position_of(4) is None
    assert "byte offset 8" in reader.describe_position(8)
    assert str(path) in reader.describe_position(8)
    await reader.close()


async def test_seek_rejects_bad_positions(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("x\n")
    reader = TextFileSource(path).create_reader(0, 1)
    with pytest.raises(ValueError, match="byte offset"):
        reader.seek(-1)
    with pytest.raises(ValueError, match="byte offset"):
        reader.seek("3")
    await reader.close()


# -- text file: bad paths fail at build time ----------------------------------------------


def test_missing_file_fails_at_build_time(tmp_path: Path) -> None:
    env = ef.StreamEnvironment()
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        env.read_text_file(missing)
    assert env._graph.nodes == []


def test_directory_fails_at_build_time(tmp_path: Path) -> None:
    env = ef.StreamEnvironment()
    with pytest.raises(IsADirectoryError) as info:
        env.read_text_file(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_unreadable_file_fails_at_build_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "secret.txt"
    path.write_text("x\n")
    path.chmod(0)
    if os.access(path, os.R_OK):  # running as root: make the check see it as unreadable
        real_access = os.access

        def access(p: Any, mode: int, **kw: Any) -> bool:
            if os.fspath(p) == str(path):
                return False
            return real_access(p, mode, **kw)

        monkeypatch.setattr(os, "access", access)
    env = ef.StreamEnvironment()
    try:
        with pytest.raises(PermissionError) as info:
            env.read_text_file(path)
    finally:
        path.chmod(0o600)
    assert str(path) in str(info.value)


# -- collection ------------------------------------------------------------------------


async def test_collection_split_over_parallelism() -> None:
    items = list(range(10))
    source = CollectionSource(items)
    for p in range(1, 12):
        splits = [await _drain(source.create_reader(s, p), batch=2) for s in range(p)]
        assert [x for sp in splits for x in sp] == items
        sizes = [len(sp) for sp in splits]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("n", [3, 5000, 9001])
async def test_collection_replays_records_as_declared_after_in_place_changes(n: int) -> None:
    """A job changes the dicts it reads in place; a replay (a new reader, or
    a seek back) must read them as they were when the source was declared."""
    items = [{"i": i, "tags": [i]} for i in range(n)]
    source = CollectionSource(items)
    items[0]["i"] = -1  # the caller's own objects change too, after declaring
    reader = source.create_reader(0, 1)
    first = await reader.read_batch(1000)
    assert first is not None
    for r in first:
        r["i"] += 100
        r["tags"].append("seen")
    reader.seek(0)
    again = await _drain(reader, batch=700)
    assert again == [{"i": i, "tags": [i]} for i in range(n)]
    assert await _drain(source.create_reader(0, 1), batch=333) == again


async def test_collection_of_unpicklable_items_is_copied() -> None:
    items = [{"f": (lambda: 1), "n": 1}]
    source = CollectionSource(items)
    batch = await source.create_reader(0, 1).read_batch(10)
    assert batch is not None
    batch[0]["n"] = 2
    again = await source.create_reader(0, 1).read_batch(10)
    assert again is not None and again[0]["n"] == 1


async def test_collection_from_generator_and_positions() -> None:
    source = CollectionSource(x * x for x in range(6))
    reader = source.create_reader(1, 2)  # items 3..5
    assert reader.position() == 3
    assert await reader.read_batch(2) == [9, 16]
    assert reader.position() == 5
    assert reader.position_of(1) == 4
    assert reader.describe_position(4) == "index 4"
    reader.seek(3)
    assert await _drain(reader) == [9, 16, 25]
    with pytest.raises(ValueError, match="outside this split"):
        source.create_reader(0, 2).seek(5)


def test_parallel_collection_job_reads_everything_once() -> None:
    env = ef.StreamEnvironment(parallelism=3)
    sink = ef.ListSink()
    source = env.from_collection(range(1000)).set_parallelism(3)
    source.sink_to(sink)
    result = env.execute()
    assert sorted(sink.results) == list(range(1000))
    assert result.records_out[source.operator_name] == 1000


def test_collection_rejects_strings() -> None:
    env = ef.StreamEnvironment()
    with pytest.raises(TypeError, match="iterable of records"):
        env.from_collection("abc")


# -- async iterable --------------------------------------------------------------------


async def _agen(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


async def test_async_iterable_reads_everything() -> None:
    env = ef.StreamEnvironment()
    sink = ef.ListSink()
    env.from_async_iterable(_agen(5000)).sink_to(sink)
    await env.execute_async()
    assert sink.results == list(range(5000))


async def test_async_iterable_seek_is_not_replayable() -> None:
    source = AsyncIterableSource(_agen(10))
    assert not source.replayable
    reader = source.create_reader(0, 1)
    reader.seek(0)  # the start: nothing to replay
    with pytest.raises(ef.NotReplayableError):
        reader.seek(3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader.fetch)  # as the source task runs it
        got = await _read_available(reader, 4)
        assert got
        assert reader.position() == len(got)
        reader.seek(len(got))  # where it is: fine
        with pytest.raises(ef.NotReplayableError):
            reader.seek(0)
        tg.cancel_scope.cancel()
    await reader.close()


async def _read_available(reader: ef.SourceReader, n: int) -> list[Any] | None:
    """A read as the source task does it: after an empty batch, wait for
    ``available()`` (``None``: read again at once)."""
    while True:
        got = await reader.read_batch(n)
        if got != []:
            return got
        ready = reader.available()
        await (ready if ready is not None else asyncio.sleep(0))


async def test_async_iterable_reads_without_waiting_for_the_iterator() -> None:
    """``read_batch`` returns what the fetch has buffered, ``[]`` while the
    iterator is silent (instead of awaiting its next item), and ``available``
    resolves when an item arrives: the source task can checkpoint meanwhile."""
    feed: asyncio.Queue[int | None] = asyncio.Queue()

    async def gen() -> AsyncIterator[int]:
        while (item := await feed.get()) is not None:
            yield item

    reader = AsyncIterableSource(gen()).create_reader(0, 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader.fetch)
        await asyncio.sleep(0)
        assert await reader.read_batch(10) == []  # silent: nothing, at once
        ready = reader.available()
        assert ready is not None and not ready.done()
        assert reader.available() is ready  # the same future until it is done
        feed.put_nowait(1)
        feed.put_nowait(2)
        await asyncio.wait_for(ready, 5)
        assert await reader.read_batch(10) == [1, 2]
        assert reader.position() == 2
        assert await reader.read_batch(10) == []
        feed.put_nowait(None)  # the iterator ends
        assert await _read_available(reader, 10) is None
    await reader.close()


async def test_async_iterable_buffer_holds_back_the_iterator() -> None:
    """A full buffer stops the fetch: the iterator is not read further until
    the task takes records (back-pressure reaches the embedding program)."""
    pulled = 0

    async def gen() -> AsyncIterator[int]:
        nonlocal pulled
        for i in range(100):
            pulled += 1
            yield i

    reader = AsyncIterableSource(gen(), buffer=8).create_reader(0, 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader.fetch)
        for _ in range(10):
            await asyncio.sleep(0)
        assert pulled == 8
        assert await reader.read_batch(3) == [0, 1, 2]
        for _ in range(10):
            await asyncio.sleep(0)
        assert pulled == 11
        got: list[Any] = []
        while (batch := await _read_available(reader, 50)) is not None:
            got.extend(batch)
        assert got == list(range(3, 100))
    await reader.close()


async def test_async_iterable_records_never_emitted_are_reported(
        caplog: pytest.LogCaptureFixture) -> None:
    """What the fetch took from the iterator but the job never emitted is
    lost (at-most-once), and the reader says how much: not silently."""
    pulled = 0

    async def gen() -> AsyncIterator[int]:
        nonlocal pulled
        for i in range(100):
            pulled = i + 1
            yield i

    reader = AsyncIterableSource(gen(), buffer=8).create_reader(0, 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader.fetch)
        assert await _read_available(reader, 5) == [0, 1, 2, 3, 4]
        tg.cancel_scope.cancel()  # the job stops
    assert 5 < pulled < 100
    with caplog.at_level(logging.WARNING, logger="eddyflow"):
        await reader.close()
    assert (f"{pulled - 5} record(s) taken from the iterator after record #5 were never "
            "emitted") in caplog.text


def _restarting_async_job() -> tuple[ef.StreamEnvironment, ef.ListSink]:
    # A restart reads the source again: an async iterator it consumed cannot.
    # (A second execute() of one environment is refused before any source is
    # read: see tests/test_api.py.)
    env = ef.StreamEnvironment()
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=1, delay=0))
    sink = ef.ListSink()
    env.from_async_iterable(_agen(3)).map(ef.testing.FailingMap(after=2)).sink_to(sink)
    return env, sink


async def test_async_iterable_restart_raises() -> None:
    env, sink = _restarting_async_job()
    with pytest.raises(ef.NotReplayableError, match="already consumed"):
        await env.execute_async()
    assert sink.results == []


def test_async_iterable_blocking_restart_raises() -> None:
    env, _ = _restarting_async_job()
    with pytest.raises(ef.NotReplayableError, match="already consumed"):
        env.execute()


def test_async_iterable_cannot_run_in_parallel() -> None:
    env = ef.StreamEnvironment(parallelism=4)
    ds = env.from_async_iterable(_agen(3))
    with pytest.raises(ValueError, match="at most 1"):
        ds.set_parallelism(2)


def test_from_async_iterable_rejects_sync_iterables() -> None:
    env = ef.StreamEnvironment()
    with pytest.raises(TypeError, match="async iterable"):
        env.from_async_iterable([1, 2, 3])  # type: ignore[arg-type]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-16-le"])
def test_text_file_refuses_encodings_it_cannot_split_at_build_time(
        tmp_path: Path, encoding: str) -> None:
    path = tmp_path / "t.txt"
    path.write_text("a\nb\n", encoding=encoding)
    env = ef.StreamEnvironment()
    with pytest.raises(ValueError, match="not ASCII-compatible"):
        env.read_text_file(path, encoding=encoding)


def test_text_file_refuses_an_unknown_codec_at_build_time(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("a\n", encoding="utf-8")
    with pytest.raises(ValueError, match="unknown encoding 'no-such-codec'"):
        ef.StreamEnvironment().read_text_file(path, encoding="no-such-codec")


def test_latin1_text_file_reads_exactly(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    lines = [f"caf\u00e9 {i}" for i in range(1000)]
    path.write_text("\n".join(lines) + "\n", encoding="latin-1")
    env = ef.StreamEnvironment(parallelism=3)
    sink = ef.ListSink()
    env.read_text_file(path, encoding="latin-1").sink_to(sink)
    env.execute()
    assert sorted(sink.results) == sorted(lines)
