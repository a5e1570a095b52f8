"""Order and completeness of records through exchanges.

A hash exchange (``key_by``) must keep the order of each key's records as one
upstream subtask sent them; union, rebalance and broadcast must deliver every
record the right number of times; and a word count must give the same final
counts as plain Python at every parallelism, with and without chaining.
"""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

import eddyflow as ef


class TaggingSink(ef.Sink):
    """Records ``(subtask, record)`` in the order each sink subtask receives
    records (not commit order), so delivery order per subtask is visible."""

    def __init__(self) -> None:
        self.received: list[tuple[int, Any]] = []
        self.parallelism: int | None = None
        self._lock = threading.Lock()

    def create_writer(self, subtask: int, parallelism: int) -> ef.SinkWriter:
        self.parallelism = parallelism
        return _TaggingWriter(self, subtask)

    def by_subtask(self) -> dict[int, list[Any]]:
        out: dict[int, list[Any]] = defaultdict(list)
        for s, r in self.received:
            out[s].append(r)
        return dict(out)


class _TaggingWriter(ef.SinkWriter):
    def __init__(self, sink: TaggingSink, subtask: int) -> None:
        self._sink = sink
        self._subtask = subtask

    def write(self, records: list[Any]) -> None:
        with self._sink._lock:
            self._sink.received.extend((self._subtask, r) for r in records)


class Passthrough(ef.KeyedProcessFunction):
    """Emits each record unchanged and counts per key in keyed state."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.seen = ctx.value_state("seen", default=0)

    def process(self, value: Any, ctx: ef.RuntimeContext) -> Any:
        self.seen.value = self.seen.value + 1
        yield value


def _keyed_records(n_keys: int = 50, per_key: int = 60, seed: int = 7) -> list[tuple[str, int]]:
    """(key, seq) records; seq increases per key; keys interleaved randomly."""
    rng = random.Random(seed)
    pending = {f"k{i}": 0 for i in range(n_keys)}
    out = []
    while pending:
        k = rng.choice(sorted(pending))
        out.append((k, pending[k]))
        pending[k] += 1
        if pending[k] == per_key:
            del pending[k]
    return out


def _assert_per_key_increasing(records: list[tuple[str, int]]) -> None:
    last: dict[str, int] = {}
    for k, seq in records:
        assert seq > last.get(k, -1), f"key {k}: seq {seq} after {last[k]}"
        last[k] = seq


@pytest.mark.parametrize("downstream", [3, 4])
@pytest.mark.parametrize("chaining", [True, False])
def test_key_by_map_keeps_per_key_order(downstream: int, chaining: bool) -> None:
    records = _keyed_records()
    env = ef.StreamEnvironment(parallelism=1, batch_size=16, chaining=chaining)
    sink = TaggingSink()
    (env.from_collection(records)
        .key_by(0).map(lambda r: r).set_parallelism(downstream)
        .sink_to(sink).set_parallelism(downstream))
    env.execute()

    got = [r for _, r in sink.received]
    assert sorted(got) == sorted(records)
    _assert_per_key_increasing(got)
    parts = sink.by_subtask()
    # A key lives on exactly one subtask, and the exchange really spread keys.
    owners: dict[str, set[int]] = defaultdict(set)
    for s, (k, _) in sink.received:
        owners[k].add(s)
    assert all(len(v) == 1 for v in owners.values())
    assert len(parts) == downstream
    for recs in parts.values():
        _assert_per_key_increasing(recs)


@pytest.mark.parametrize("downstream", [3, 4])
def test_key_by_process_keeps_per_key_order(downstream: int) -> None:
    records = _keyed_records(n_keys=40, per_key=80, seed=11)
    env = ef.StreamEnvironment(parallelism=1, batch_size=32)
    sink = ef.ListSink()
    (env.from_collection(records)
        .key_by(lambda r: r[0]).process(Passthrough()).name("pass").set_parallelism(downstream)
        .sink_to(sink).set_parallelism(downstream))
    result = env.execute()

    assert sorted(sink.results) == sorted(records)
    _assert_per_key_increasing(sink.results)
    assert result.state("pass", "seen") == dict(Counter(k for k, _ in records))


def test_text_file_source_keeps_per_split_order(tmp_path: Path) -> None:
    records = _keyed_records(n_keys=30, per_key=100, seed=3)
    # seq of the line is its line number, so it identifies the line.
    lines = [f"{k} {i}" for i, (k, _) in enumerate(records)]
    path = tmp_path / "keyed.txt"
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(data)
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    half = len(data) // 2  # subtask 0 of 2 owns lines that start before this byte
    split_of = {i: (0 if off < half else 1) for i, off in enumerate(offsets)}

    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    sink = TaggingSink()
    (env.read_text_file(path)
        .map(lambda line: (line.split()[0], int(line.split()[1])))
        .key_by(0).map(lambda r: r).set_parallelism(3)
        .sink_to(sink).set_parallelism(3))
    env.execute()

    got = [r for _, r in sink.received]
    assert sorted(seq for _, seq in got) == list(range(len(lines)))
    assert {split_of[seq] for _, seq in got} == {0, 1}
    last: dict[tuple[str, int], int] = {}
    for k, seq in got:
        slot = (k, split_of[seq])
        assert seq > last.get(slot, -1), f"key {k} split {slot[1]}: {seq} after {last[slot]}"
        last[slot] = seq


def test_union_delivers_both_inputs_in_their_order() -> None:
    env = ef.StreamEnvironment(parallelism=1, batch_size=8)
    a = env.from_collection([("a", i) for i in range(500)]).name("a")
    b = env.from_collection([("b", i) for i in range(300)]).name("b")
    sink = ef.ListSink()
    mapped = a.union(b).map(lambda r: r)
    mapped.sink_to(sink)
    result = env.execute()

    assert sorted(sink.results) == sorted([("a", i) for i in range(500)]
                                          + [("b", i) for i in range(300)])
    assert [r for r in sink.results if r[0] == "a"] == [("a", i) for i in range(500)]
    assert [r for r in sink.results if r[0] == "b"] == [("b", i) for i in range(300)]
    assert result.records_in[mapped.operator_name] == 800


def test_union_of_three_streams_then_key_by() -> None:
    env = ef.StreamEnvironment(parallelism=3)
    streams = [env.from_collection([f"w{i % 7}" for i in range(n)]).name(f"words-{n}")
               for n in (70, 140, 210)]
    sink = ef.ListSink()
    streams[0].union(streams[1], streams[2]).key_by(lambda w: w).count().sink_to(sink)
    env.execute()
    final: dict[str, int] = {}
    for k, c in sink.results:
        final[k] = max(final.get(k, 0), c)
    assert final == {f"w{i}": 60 for i in range(7)}
    assert len(sink.results) == 420


def test_rebalance_spreads_over_all_subtasks_exactly_once() -> None:
    env = ef.StreamEnvironment(parallelism=1, batch_size=16)
    sink = TaggingSink()
    (env.from_collection(range(2000)).rebalance()
        .map(lambda x: x * 2).set_parallelism(3)
        .sink_to(sink).set_parallelism(3))
    env.execute()

    assert sorted(r for _, r in sink.received) == [2 * i for i in range(2000)]
    parts = sink.by_subtask()
    assert sorted(parts) == [0, 1, 2]
    assert all(len(v) > 0 for v in parts.values())
    # Whole batches go round-robin and a forward channel is FIFO: each
    # subtask sees its share in source order.
    for recs in parts.values():
        assert recs == sorted(recs)


def test_broadcast_delivers_each_record_to_every_subtask() -> None:
    env = ef.StreamEnvironment(parallelism=1, batch_size=16)
    sink = TaggingSink()
    mapped = env.from_collection(range(100)).broadcast().map(lambda x: x).set_parallelism(3)
    mapped.sink_to(sink).set_parallelism(3)
    result = env.execute()

    parts = sink.by_subtask()
    assert sorted(parts) == [0, 1, 2]
    for recs in parts.values():
        assert recs == list(range(100))
    assert result.records_in[mapped.operator_name] == 300


def test_broadcast_into_parallelism_one_sink_gets_three_copies() -> None:
    env = ef.StreamEnvironment(parallelism=1)
    sink = ef.ListSink()
    env.from_collection(range(50)).broadcast().map(lambda x: x).set_parallelism(3).sink_to(sink)
    env.execute()
    assert Counter(sink.results) == {i: 3 for i in range(50)}


TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "a stream is a sequence of records and a record is a value",
    "",
    "the dog barks   the fox runs",
    "exactly once means once and exactly once",
] * 40


def _word_count_job(env: ef.StreamEnvironment) -> ef.ListSink:
    sink = ef.ListSink()
    (env.from_collection(TEXT)
        .flat_map(str.split)
        .map(lambda w: (w, 1))
        .key_by(0).sum()
        .sink_to(sink))
    return sink


@pytest.mark.parametrize("chaining", [True, False])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_word_count_equals_plain_python(p: int, chaining: bool) -> None:
    expected = Counter(w for line in TEXT for w in line.split())
    env = ef.StreamEnvironment(parallelism=p, batch_size=32, chaining=chaining)
    sink = _word_count_job(env)
    result = env.execute()

    final: dict[str, int] = {}
    for word, count in sink.results:  # per-key order: the last one is final
        final[word] = count
    assert final == dict(expected)
    assert len(sink.results) == sum(expected.values())
    sum_uid = next(u for u in result.final_state if u.startswith("sum-"))
    assert result.state(sum_uid) == dict(expected)
    for word, n in expected.items():
        assert [c for w, c in sink.results if w == word] == list(range(1, n + 1))


def test_chaining_disabled_creates_a_task_per_operator() -> None:
    env = ef.StreamEnvironment(parallelism=2, chaining=False)
    _word_count_job(env)
    names = [c.name for c in env.plan().chains]
    assert len(names) == 5
    assert all(" -> " not in n for n in names)
    env2 = ef.StreamEnvironment(parallelism=2)
    _word_count_job(env2)
    assert len(env2.plan().chains) < 5
