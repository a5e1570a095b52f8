"""Built-in sinks: FileSink (JSON Lines, two-phase commit), ListSink and print.

Committed FileSink output is exactly the ``part-*`` files directly inside the
sink's folder, one ``json.dumps(record)`` per line; a successful bounded run
leaves no in-progress or pending (dot-) files behind. ListSink holds committed
records only; ``print()`` writes each record to stdout.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import eddyflow as ef


def _committed(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith("part-"))


def _read_committed(folder: Path) -> list[Any]:
    out: list[Any] = []
    for p in _committed(folder):
        out.extend(json.loads(line) for line in p.read_text(encoding="utf-8").splitlines())
    return out


RECORDS: list[Any] = [
    ("word", 1),
    {"k": "v", "n": [1, 2.5, None, True]},
    "plain string with \"quotes\" and \\ backslash",
    "ünïcödé 😀 and a\nnewline inside",
    42,
    3.25,
    None,
    [("nested", "tuple")],
]


def test_file_sink_writes_json_lines(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = ef.StreamEnvironment()
    env.from_collection(RECORDS).sink_to(ef.FileSink(out))
    env.execute()

    files = _committed(out)
    assert len(files) == 1
    text = files[0].read_text(encoding="utf-8")
    assert text == "".join(json.dumps(r) + "\n" for r in RECORDS)
    # tuples become lists
    assert json.loads(text.splitlines()[0]) == ["word", 1]
    assert json.loads(text.splitlines()[-1]) == [["nested", "tuple"]]


def test_file_sink_leaves_no_hidden_files_after_success(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = ef.StreamEnvironment(parallelism=3)
    env.from_collection(range(5000)).rebalance().map(lambda x: {"x": x}).sink_to(ef.FileSink(out))
    env.execute()
    names = [p.name for p in out.iterdir()]
    assert names, "nothing written"
    assert all(n.startswith("part-") for n in names), names
    assert not [n for n in names if n.startswith((".", "_"))]
    assert all(p.is_file() for p in out.iterdir())


@pytest.mark.parametrize("p", [2, 3, 4])
def test_parallel_file_sink_writes_one_part_file_per_subtask(tmp_path: Path, p: int) -> None:
    out = tmp_path / "out"
    env = ef.StreamEnvironment(parallelism=p, batch_size=64)
    (env.from_collection(range(4000)).rebalance()
        .map(lambda x: [x, x % 7]).sink_to(ef.FileSink(out)))
    env.execute()

    files = _committed(out)
    assert len(files) == p  # every subtask got records: one file each
    assert all(f.stat().st_size > 0 for f in files)
    assert sorted(_read_committed(out)) == sorted([x, x % 7] for x in range(4000))


def test_file_sink_output_of_keyed_job(tmp_path: Path) -> None:
    out = tmp_path / "counts"
    words = ["a", "b", "a", "c", "b", "a"] * 50
    env = ef.StreamEnvironment(parallelism=2)
    env.from_collection(words).key_by(lambda w: w).count().sink_to(ef.FileSink(out))
    env.execute()
    got = _read_committed(out)
    final: dict[str, int] = {}
    for w, c in got:
        final[w] = max(final.get(w, 0), c)
    assert final == dict(Counter(words))
    assert len(got) == len(words)


def test_file_sink_separate_runs_do_not_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for batch in ([1, 2], [3]):
        env = ef.StreamEnvironment()
        env.from_collection(batch).sink_to(ef.FileSink(out))
        env.execute()
    assert len(_committed(out)) == 2
    assert sorted(_read_committed(out)) == [1, 2, 3]


def test_file_sink_second_run_of_same_job_keeps_first_output(tmp_path: Path) -> None:
    # Running the same job again (a new environment: one runs once) is a
    # separate fresh run (restore=None): its output must be committed next
    # to the first run's, not over it.
    out = tmp_path / "out"

    def job(items: list[str]) -> ef.StreamEnvironment:
        env = ef.StreamEnvironment()
        env.from_collection(items).name("lines").sink_to(ef.FileSink(out)).name("out")
        return env

    first = job(["first"])
    first.execute("job")
    with pytest.raises(RuntimeError, match="already executed job 'job'"):
        first.execute("job")
    job(["second"]).execute("job")
    assert sorted(_read_committed(out)) == ["first", "second"]


def test_file_sink_ignores_foreign_hidden_files_and_empty_input(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "_SUCCESS").write_text("")
    env = ef.StreamEnvironment()
    env.from_collection([]).sink_to(ef.FileSink(out))
    env.execute()
    assert _committed(out) == []  # no records: no empty part file
    assert [p.name for p in out.iterdir()] == ["_SUCCESS"]


def test_file_sink_creates_nested_folder(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "c"
    env = ef.StreamEnvironment()
    env.from_collection(["x"]).sink_to(ef.FileSink(out))
    env.execute()
    assert _read_committed(out) == ["x"]


def test_file_sink_failed_job_commits_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = ef.StreamEnvironment(batch_size=16)
    env.from_collection(range(500)).map(lambda x: 1 // (x - 400)).sink_to(ef.FileSink(out))
    with pytest.raises(ef.JobFailed):
        env.execute()
    assert _committed(out) == []
    assert list(out.iterdir()) == []  # the in-progress file was aborted


# -- ListSink ---------------------------------------------------------------------------


def test_list_sink_holds_committed_records_in_order() -> None:
    env = ef.StreamEnvironment()
    sink = ef.ListSink()
    env.from_collection(RECORDS).sink_to(sink)
    assert sink.results == []  # nothing before the run
    env.execute()
    assert sink.results == RECORDS  # records as they are, tuples stay tuples
    assert "8 committed" in repr(sink)


def test_list_sink_parallel_commits_every_record_once() -> None:
    env = ef.StreamEnvironment(parallelism=4)
    sink = ef.ListSink()
    env.from_collection(range(3000)).rebalance().map(lambda x: x).sink_to(sink)
    env.execute()
    assert sorted(sink.results) == list(range(3000))


def test_list_sink_committed_only_on_failure() -> None:
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    sink = ef.ListSink()
    env.from_collection(range(1000)).map(lambda x: x if x != 990 else 1 // 0).sink_to(sink)
    with pytest.raises(ef.JobFailed):
        env.execute()
    assert sink.results == []


def test_list_sink_writer_protocol() -> None:
    sink = ef.ListSink()
    w0 = sink.create_writer(0, 2)
    w1 = sink.create_writer(1, 2)
    w0.write([1, 2])
    w1.write([3])
    assert w1.prepare_commit(1) is not None
    c0 = w0.prepare_commit(1)
    assert w0.prepare_commit(2) is None  # nothing pending
    assert sink.results == []  # prepared is not committed
    sink.commit([c0])
    sink.commit([c0])  # idempotent
    assert sink.results == [1, 2]
    w1.write([9])
    w1.abort()
    assert w1.prepare_commit(3) is None
    assert sink.results == [1, 2]


# -- print --------------------------------------------------------------------------------


def test_print_writes_records_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    env = ef.StreamEnvironment()
    env.from_collection([("a", 1), "b", {"c": 3}]).print()
    env.execute()
    assert capsys.readouterr().out == "('a', 1)\nb\n{'c': 3}\n"


def test_parallel_print_prefixes_subtask(capsys: pytest.CaptureFixture[str]) -> None:
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    env.from_collection(range(100)).rebalance().map(lambda x: x).print()
    env.execute()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 100
    prefixes = Counter(line.split("> ")[0] for line in lines)
    assert set(prefixes) == {"1", "2"}
    assert sorted(int(line.split("> ")[1]) for line in lines) == list(range(100))


def test_print_sink_to_given_stream() -> None:
    buf = io.StringIO()
    env = ef.StreamEnvironment()
    env.from_collection([1, 2]).sink_to(ef.PrintSink(buf))
    env.execute()
    assert buf.getvalue() == "1\n2\n"
