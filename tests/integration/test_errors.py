"""Failure reports: a job that fails says where and why.

``ef.JobFailed`` must name the failing operator (its uid), the subtask
("subtask i of n"), the record, and the source position the record was read
from: an index for a collection, a path and byte offset for a text file,
traced back exactly through the operators chained before the failing one, or
a position range once the record has crossed an exchange. ``__cause__`` is
the original exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import eddyflow as ef


def _fail(env: ef.StreamEnvironment) -> ef.JobFailed:
    with pytest.raises(ef.JobFailed) as info:
        env.execute("failing")
    return info.value


def _parse(line: str) -> tuple[str, int]:
    word, n = line.split()
    return word, int(n)


def _write_lines(path: Path, lines: list[str]) -> list[int]:
    """Write lines with "\\n"; return the byte offset of each line."""
    offsets, pos, data = [], 0, b""
    for line in lines:
        raw = line.encode() + b"\n"
        offsets.append(pos)
        pos += len(raw)
        data += raw
    path.write_bytes(data)
    return offsets


# -- user functions -----------------------------------------------------------


def test_map_failure_names_operator_subtask_record_and_index() -> None:
    env = ef.StreamEnvironment()
    env.from_collection(["1", "2", "x3", "4"]).map(int).name("parse").sink_to(ef.ListSink())
    e = _fail(env)
    msg = str(e)
    assert "'parse'" in msg
    assert "subtask 1 of 1" in msg
    assert "'x3'" in msg
    assert "index 2" in msg
    assert "ValueError" in msg
    assert e.operator == "parse"
    assert e.subtask == 0
    assert e.position is not None and "index 2" in e.position


def test_collection_index_is_global_with_parallel_collection_source() -> None:
    items = [str(i) for i in range(100)]
    items[77] = "bad"
    env = ef.StreamEnvironment(parallelism=2)
    env.from_collection(items).set_parallelism(2).map(int).name("parse").sink_to(ef.ListSink())
    msg = str(_fail(env))
    assert "'parse' (subtask 2 of 2)" in msg
    assert "'bad'" in msg
    assert "index 77" in msg


def test_text_file_failure_names_path_and_exact_byte_offset(tmp_path: Path) -> None:
    lines = [f"w{i} {i}" for i in range(500)]
    lines[321] = "w321 notanumber"
    path = tmp_path / "input.txt"
    offsets = _write_lines(path, lines)

    env = ef.StreamEnvironment(parallelism=1, batch_size=64)
    env.read_text_file(path).map(_parse).name("parse").sink_to(ef.ListSink())
    e = _fail(env)
    msg = str(e)
    assert "'parse' (subtask 1 of 1)" in msg
    assert "'w321 notanumber'" in msg
    assert str(path) in msg
    assert f"byte offset {offsets[321]}" in msg


def test_text_file_failure_in_second_split(tmp_path: Path) -> None:
    lines = [f"w{i} {i}" for i in range(400)]
    lines[350] = "broken"
    path = tmp_path / "input.txt"
    offsets = _write_lines(path, lines)

    env = ef.StreamEnvironment(parallelism=2, batch_size=32)
    env.read_text_file(path).map(_parse).name("parse").sink_to(ef.ListSink())
    e = _fail(env)
    msg = str(e)
    assert "'parse' (subtask 2 of 2)" in msg
    assert e.subtask == 1
    assert "'broken'" in msg
    assert f"{str(path)!r} byte offset {offsets[350]}" in msg


@pytest.mark.parametrize("before", ["flat_map", "filter", "flat_map+filter", "map+filter"])
def test_failure_after_other_chained_operators_is_traced_back(
    tmp_path: Path, before: str
) -> None:
    # Each line holds several numbers; the failing map divides by (n - 99999)
    # and only the bad line holds 99999.
    lines = [" ".join(str(10 * i + j) for j in range(3)) for i in range(200)]
    bad_line = 137
    lines[bad_line] = "5 99999 7"
    path = tmp_path / "nums.txt"
    offsets = _write_lines(path, lines)

    env = ef.StreamEnvironment(parallelism=1, batch_size=50)
    ds = env.read_text_file(path)
    if before == "flat_map":
        ds = ds.flat_map(str.split).map(int)
    elif before == "filter":
        ds = ds.filter(lambda line: not line.startswith("1")).map(lambda s: int(s.split()[1]))
    elif before == "flat_map+filter":
        ds = ds.flat_map(str.split).filter(lambda s: s != "7").map(int)
    else:
        ds = ds.map(str.split).filter(lambda ws: len(ws) == 3).map(lambda ws: int(ws[1]))
    ds.map(lambda n: 1 // (n - 99999)).name("divide").sink_to(ef.ListSink())
    assert len(env.plan().chains) == 1  # really one chain

    msg = str(_fail(env))
    assert "'divide' (subtask 1 of 1)" in msg
    assert "ZeroDivisionError" in msg
    assert "on record 99999" in msg
    assert f"byte offset {offsets[bad_line]}" in msg


def test_failure_after_flat_map_from_collection_is_traced_to_index() -> None:
    env = ef.StreamEnvironment()
    (env.from_collection(list(range(50)))
        .flat_map(lambda r: [r, r + 100] if r % 2 else [])
        .filter(lambda r: r % 3)
        .map(lambda r: 1 // (r - 131)).name("div")
        .sink_to(ef.ListSink()))
    msg = str(_fail(env))
    assert "on record 131" in msg
    assert "index 31" in msg


def test_failure_downstream_of_exchange_reports_position_range() -> None:
    env = ef.StreamEnvironment(parallelism=1, batch_size=16)
    (env.from_collection(list(range(300)))
        .rebalance().map(lambda r: 1 // (r - 123)).name("div").set_parallelism(2)
        .sink_to(ef.ListSink()))
    e = _fail(env)
    msg = str(e)
    assert "'div' (subtask" in msg and "of 2)" in msg
    assert "on record 123" in msg
    m = re.search(r"positions (\d+) to (\d+)", msg)
    assert m, msg
    first, end = int(m.group(1)), int(m.group(2))
    assert first <= 123 < end
    assert end - first <= 300


def test_text_file_failure_downstream_of_exchange_reports_byte_range(tmp_path: Path) -> None:
    lines = [f"k{i % 5} {i}" for i in range(300)]
    lines[222] = "k2 oops"
    path = tmp_path / "in.txt"
    offsets = _write_lines(path, lines)
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    (env.read_text_file(path).set_parallelism(1)
        .key_by(lambda line: line.split()[0])
        .map(_parse).name("parse")
        .sink_to(ef.ListSink()))
    msg = str(_fail(env))
    assert "'parse'" in msg
    assert "'k2 oops'" in msg
    m = re.search(r"positions (\d+) to (\d+)", msg)
    assert m, msg
    assert int(m.group(1)) <= offsets[222] < int(m.group(2))


def test_keyed_process_function_failure_names_record() -> None:
    class Boom(ef.KeyedProcessFunction):
        def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
            if value == ("b", 3):
                raise RuntimeError("no b3")
            yield value

    env = ef.StreamEnvironment(parallelism=2)
    (env.from_collection([("a", 1), ("b", 2), ("b", 3), ("a", 4)])
        .key_by(0).process(Boom()).name("boom").sink_to(ef.ListSink()))
    msg = str(_fail(env))
    assert "'boom'" in msg
    assert "RuntimeError: no b3" in msg
    assert "on record ('b', 3)" in msg


# -- key selectors ------------------------------------------------------------


@pytest.mark.parametrize("p", [1, 2])
def test_raising_key_selector_names_key_selector_of_downstream_operator(p: int) -> None:
    env = ef.StreamEnvironment(parallelism=p)
    (env.from_collection([{"a": 1}, {"a": 2}])
        .key_by(lambda r: r["missing"]).count().name("cnt")
        .sink_to(ef.ListSink()))
    e = _fail(env)
    msg = str(e)
    assert "key selector of 'cnt'" in msg
    assert "KeyError" in msg
    assert "{'a': 1}" in msg
    assert "index 0" in msg


def test_raising_key_selector_after_chained_map_is_traced_to_index() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    (env.from_collection([{"k": i} for i in range(40)])
        .map(lambda r: r if r["k"] != 29 else {"other": 29}).set_parallelism(1)
        .key_by("k").count().name("cnt")
        .sink_to(ef.ListSink()))
    msg = str(_fail(env))
    assert "key selector of 'cnt'" in msg
    assert "{'other': 29}" in msg
    assert "index 29" in msg


@pytest.mark.parametrize("op", ["count", "sum", "reduce", "map_with_state", "process"])
@pytest.mark.parametrize("p", [1, 2])
def test_unsupported_key_type_fails_with_unsupported_key_error(op: str, p: int) -> None:
    class Ident(ef.KeyedProcessFunction):
        def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
            yield value

    env = ef.StreamEnvironment(parallelism=p)
    keyed = env.from_collection([(1, 2), (3, 4)]).key_by(lambda r: list(r))
    out = {
        "count": lambda: keyed.count(),
        "sum": lambda: keyed.sum(),
        "reduce": lambda: keyed.reduce(lambda a, b: a),
        "map_with_state": lambda: keyed.map_with_state(lambda r, s: (r, 1)),
        "process": lambda: keyed.process(Ident()),
    }[op]()
    out.name("keyed").sink_to(ef.ListSink())
    e = _fail(env)
    # The message carries UnsupportedKeyError's explanation, not a bare
    # "unhashable type" from some dict look-up.
    assert "UnsupportedKeyError" in str(e)
    assert "no stable hash" in str(e)
    assert isinstance(e.__cause__, ef.UnsupportedKeyError)


# -- sources and sinks -----------------------------------------------------------


class _RaisingSource(ef.Source):
    def __init__(self, fail_after: int) -> None:
        self.fail_after = fail_after

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return _RaisingReader(self.fail_after)


class _RaisingReader(ef.SourceReader):
    def __init__(self, fail_after: int) -> None:
        self.pos = 0
        self.fail_after = fail_after

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.pos >= self.fail_after:
            raise OSError("device unplugged")
        self.pos += 1
        return [self.pos]

    def position(self) -> int:
        return self.pos

    def seek(self, position: Any) -> None:
        self.pos = position


def test_raising_source_names_the_source() -> None:
    env = ef.StreamEnvironment()
    sink = ef.ListSink()
    env.from_source(_RaisingSource(fail_after=3)).name("sensor").map(str).sink_to(sink)
    e = _fail(env)
    msg = str(e)
    assert "source 'sensor' (subtask 1 of 1)" in msg
    assert "OSError: device unplugged" in msg
    assert "position 3" in msg
    assert e.operator == "sensor"
    assert sink.results == []  # nothing committed by a failed job


def test_non_utf8_line_names_path_and_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    good = b"fine\nalso fine\n"
    path.write_bytes(good + b"caf\xe9\nmore\n")
    env = ef.StreamEnvironment()
    env.read_text_file(path).name("lines").sink_to(ef.ListSink())
    e = _fail(env)
    msg = str(e)
    assert "source 'lines'" in msg
    assert str(path) in msg
    assert f"byte offset {len(good)}" in msg


def test_non_utf8_line_position_is_the_bad_line(tmp_path: Path) -> None:
    # The position a failure reports (JobFailed.position, also the "read
    # from ..." part of the message) must be the bad line's, not the start of
    # the batch that contained it.
    path = tmp_path / "latin.txt"
    good = b"fine\nalso fine\n"
    path.write_bytes(good + b"caf\xe9\nmore\n")
    env = ef.StreamEnvironment()
    env.read_text_file(path).name("lines").sink_to(ef.ListSink())
    e = _fail(env)
    assert e.position is not None
    assert str(path) in e.position
    assert e.position.endswith(f"byte offset {len(good)}")


def test_file_sink_rejects_non_json_record(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = ef.StreamEnvironment()
    env.from_collection([{"a": 1}, {"b": {2, 3}}, {"c": 3}]).sink_to(ef.FileSink(out)).name("files")
    e = _fail(env)
    msg = str(e)
    assert "'files'" in msg
    assert str(out) in msg
    assert "{'b': {2, 3}}" in msg
    assert "not JSON serializable" in msg
    # Nothing committed, nothing in progress left behind.
    assert sorted(p.name for p in out.iterdir()) == []


def test_file_sink_error_downstream_of_exchange(tmp_path: Path) -> None:
    out = tmp_path / "out"
    records: list[Any] = [[i] for i in range(100)]
    records[60] = object()
    env = ef.StreamEnvironment(parallelism=2)
    env.from_collection(records).rebalance().map(lambda r: r).sink_to(ef.FileSink(out))
    e = _fail(env)
    assert str(out) in str(e)
    assert "object object at" in str(e)
    assert not [p for p in out.iterdir() if p.name.startswith("part-")]


# -- the cause ------------------------------------------------------------------------


def _user_fn_job(env: ef.StreamEnvironment, tmp: Path) -> None:
    env.from_collection([1, 0]).map(lambda x: 1 // x).sink_to(ef.ListSink())


def _key_selector_job(env: ef.StreamEnvironment, tmp: Path) -> None:
    env.from_collection([{"a": 1}]).key_by(lambda r: r["missing"]).count().sink_to(ef.ListSink())


def _source_job(env: ef.StreamEnvironment, tmp: Path) -> None:
    env.from_source(_RaisingSource(fail_after=0)).sink_to(ef.ListSink())


def _file_sink_job(env: ef.StreamEnvironment, tmp: Path) -> None:
    env.from_collection([{1}]).sink_to(ef.FileSink(tmp / "out"))


def _decode_job(env: ef.StreamEnvironment, tmp: Path) -> None:
    path = tmp / "bad.txt"
    path.write_bytes(b"\xff\n")
    env.read_text_file(path).sink_to(ef.ListSink())


@pytest.mark.parametrize(
    ("build", "cause"),
    [
        (_user_fn_job, ZeroDivisionError),
        (_key_selector_job, KeyError),
        (_source_job, OSError),
        (_file_sink_job, TypeError),
        (_decode_job, ValueError),
    ],
    ids=["user-fn", "key-selector", "source", "file-sink", "decode"],
)
@pytest.mark.parametrize("p", [1, 2])
def test_cause_is_the_original_exception(
    tmp_path: Path, build: Callable[[ef.StreamEnvironment, Path], None],
    cause: type[BaseException], p: int,
) -> None:
    env = ef.StreamEnvironment(parallelism=p)
    build(env, tmp_path)
    e = _fail(env)
    assert isinstance(e.__cause__, cause), repr(e.__cause__)
    assert not isinstance(e.__cause__, ef.JobFailed)
    # The traceback of the cause reaches into the code that raised it.
    assert e.__cause__.__traceback__ is not None


def test_failed_job_leaves_nothing_committed_in_list_sink() -> None:
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    sink = ef.ListSink()
    env.from_collection(range(1000)).map(lambda x: 1 // (x - 900)).sink_to(sink)
    _fail(env)
    assert sink.results == []


def test_job_failed_is_an_eddyflow_error() -> None:
    env = ef.StreamEnvironment()
    env.from_collection([json]).map(lambda m: m.nope).sink_to(ef.ListSink())
    e = _fail(env)
    assert isinstance(e, ef.EddyflowError)
    assert "AttributeError" in str(e)
