"""The typed checkpoint metadata (``eddyflow.checkpoint.metadata``) and the
``chk-<n>`` folder names.

Every checkpoint of a real job (a source, a loop with back-edge logs, keyed
state, an exactly-once sink with pending transactions) reads into the model
and writes back to the very bytes on disk; metadata of format 1 (one full
keyed-state file per subtask, without key groups) still restores; and only
names ``checkpoint_dir_name`` gives parse as checkpoint folders.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import eddyflow as ef
from eddyflow.checkpoint.handles import KeyedStateHandle
from eddyflow.checkpoint.layout import METADATA, checkpoint_dir_name, parse_checkpoint_dir
from eddyflow.checkpoint.metadata import (
    BackEdgeLog,
    CheckpointMetadata,
    SubtaskState,
    read_checkpoint,
)
from eddyflow.checkpoint.storage import (
    CheckpointCorrupted,
    CheckpointStorage,
    FileHandle,
    _checksum_of,
)
from eddyflow.offline.checkpoint import keyed_files, open_checkpoint, read_keyed_file
from eddyflow.runtime.recovery.restore import RestoredCheckpoint
from eddyflow.state.format import encode_frames
from eddyflow.state.registry import kind_of

N = 1500
KEYS = 12
RECORDS = [(f"k{i % KEYS}", i % 3) for i in range(N)]  # (key, rounds round the loop)
FINAL_COUNTS = dict(Counter(k for k, _ in RECORDS))
#: Written by the storage around the coordinator's metadata.
ENVELOPE = ("format_version", "checkpoint_id", "checksum")


class Pace:
    """Identity, a millisecond slower every 8 records: a dozen checkpoints
    fall before the input ends."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, r: Any) -> Any:
        self.n += 1
        if self.n % 8 == 0:
            time.sleep(0.001)
        return r


def step(r: tuple[str, int]) -> tuple[str, int]:
    return r[0], r[1] - 1


def loop_job(env: ef.StreamEnvironment, sink: ef.Sink, count_parallelism: int = 2) -> None:
    ds = env.from_collection(RECORDS).name("src")
    ds = ds.map(Pace()).name("pace").set_parallelism(1)
    head = ds.iterate()
    head.name("head")
    stepped = head.map(step).name("step")
    head.close_with(stepped.filter(lambda r: r[1] > 0).name("again"))
    done = stepped.filter(lambda r: r[1] <= 0).name("done")
    counted = done.key_by(0).count().name("count").set_parallelism(count_parallelism)
    counted.sink_to(sink).name("sink").set_parallelism(count_parallelism)


def run(directory: Path, sink: ef.Sink, restore: str | None = None,
        count_parallelism: int = 2) -> ef.JobResult:
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.enable_checkpointing(0.01, directory, retained=1000)
    loop_job(env, sink, count_parallelism)

    async def go() -> ef.JobResult:
        return await asyncio.wait_for(env.execute_async("metadata", restore=restore), 90)
    return asyncio.run(go())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoints of one run of the loop job (read only by the tests)."""
    directory = tmp_path_factory.mktemp("metadata") / "chk"
    run(directory, ef.ListSink())
    return directory


def body(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in ENVELOPE}


# -- round trip of real checkpoints ---------------------------------------------------


def test_every_checkpoint_of_a_job_round_trips_to_the_same_json(checkpoints: Path) -> None:
    storage = CheckpointStorage(checkpoints)
    ids = storage.completed_ids()
    assert len(ids) >= 3
    for n in ids:
        raw = storage.read_metadata(n)
        meta = CheckpointMetadata.from_json(raw)
        assert meta == read_checkpoint(storage, n, verify_files=True)
        out = meta.to_json()
        assert json.dumps(out, sort_keys=True) == json.dumps(body(raw), sort_keys=True)
        assert CheckpointMetadata.from_json(out) == meta


def test_rewriting_the_model_gives_the_bytes_on_disk(checkpoints: Path, tmp_path: Path) -> None:
    storage = CheckpointStorage(checkpoints)
    again = CheckpointStorage(tmp_path)
    for n in storage.completed_ids():
        meta = read_checkpoint(storage, n)
        path = asyncio.run(again.write_metadata(n, meta.to_json()))
        on_disk = Path(storage.layout.checkpoint_dir(n), METADATA).read_bytes()
        assert Path(path).read_bytes() == on_disk, f"checkpoint {n}"


def test_the_model_says_what_the_job_recorded(checkpoints: Path) -> None:
    infos = ef.list_checkpoints(checkpoints)
    seen: Counter[str] = Counter()
    for info in infos:
        meta = info.meta
        assert meta.job == "metadata" and meta.mode == "exactly_once"
        assert (meta.completed_at, meta.full_size) == (info.completed_at, info.full_size)
        assert set(meta.operators) == {"src", "pace", "head", "step", "again", "done",
                                       "count", "sink"}
        assert meta.operators["count"].parallelism == 2
        assert {n.uid for n in meta.graph.nodes} == set(meta.operators)
        assert sum(e.back_edge for e in meta.graph.edges) == 1
        assert {h.path for h in meta.files} == {f["path"] for f in info.metadata["files"]}
        assert meta.full_size == sum(h.size for h in meta.files)
        for uid, op in meta.operators.items():
            assert info.operators[uid]["parallelism"] == op.parallelism
            assert list(op.subtasks) == list(range(op.parallelism))
            for part in op.subtasks.values():
                assert part.is_source == (uid == "src")
                assert part.extra == {}
                seen["source"] += part.is_source
                seen["keyed"] += part.keyed is not None
                seen["committables"] += bool(part.committables)
                seen["backedge"] += part.backedge is not None
                if part.keyed is not None:
                    assert uid == "count" and part.keyed.kinds == {"count": "value"}
                if part.backedge is not None:
                    assert uid == "head"
                    assert part.backedge.file in meta.files
        assert len(meta.tasks) == len(info.metadata["tasks"])
    assert infos[-1].final and infos[-1].meta.operators["src"].subtasks[0].position is not None
    assert all(seen[k] for k in ("source", "keyed", "committables", "backedge")), seen


def test_a_subtask_part_round_trips_whatever_it_holds() -> None:
    handle = FileHandle("chk-3/head-0/backedge-log", 12, "ab" * 32)
    keyed = {"backend": "memory", "kinds": {"n": "value"}, "entries": 2, "key_groups": [0, 64],
             "files": [{"path": "shared/f", "size": 9, "sha256": "cd" * 32,
                        "index": {"3": [0, 9]}, "full": True, "grouped": False}]}
    parts: list[dict[str, Any]] = [
        {},
        {"source": None},  # a position may be None: still a source's
        {"source": {"partition": [1, 2]}, "committables": [[0, "txn-1"]]},
        {"keyed": keyed, "backedge": {"file": handle.to_json(), "records": 4}},
        {"channels": [1, 2], "source": 7},  # a key the model does not know is kept
        {"watermark": 12.5, "keyed": keyed},
        {"watermark": "inf"},  # JSON has no infinities
        {"watermark": "-inf", "source": 3},
        {"watermark": 7},  # an int stays an int
    ]
    for part in parts:
        state = SubtaskState.from_json(part)
        assert state.to_json() == part
    assert SubtaskState.from_json(parts[1]).is_source
    assert SubtaskState.from_json(parts[3]).backedge == BackEdgeLog(handle, 4)
    assert SubtaskState.from_json(parts[4]).extra == {"channels": [1, 2]}
    # The watermark is a typed field, not one of the unknown keys.
    assert [SubtaskState.from_json(p).watermark for p in parts[5:]] == [
        12.5, float("inf"), float("-inf"), 7]
    assert all(SubtaskState.from_json(p).extra == {} for p in parts[5:])
    assert SubtaskState.from_json(parts[0]).watermark is None


def test_the_watermarks_of_an_old_checkpoint_read_into_the_typed_field() -> None:
    """The previous main wrote each operator's watermark as a key of its
    subtask's part, which the model kept in ``extra``: it reads into
    ``SubtaskState.watermark`` now, and writes back to the same JSON."""
    fixtures = Path(__file__).parents[1] / "fixtures" / "old_checkpoints"
    for kind in ("memory", "rocksdb"):
        raw = CheckpointStorage(fixtures / kind).read_metadata(1)
        meta = CheckpointMetadata.from_json(raw)
        marks = [part.watermark for op in meta.operators.values()
                 for part in op.subtasks.values() if part.watermark is not None]
        assert len(marks) == 14, kind
        assert all(part.extra == {} for op in meta.operators.values()
                   for part in op.subtasks.values())
        assert json.dumps(meta.to_json(), sort_keys=True) == json.dumps(body(raw), sort_keys=True)


def test_malformed_metadata_is_a_clear_error(checkpoints: Path, tmp_path: Path) -> None:
    raw = CheckpointStorage(checkpoints).read_metadata(1)
    del raw["operators"]["count"]["parallelism"]
    with pytest.raises(ValueError, match="not checkpoint metadata: KeyError: 'parallelism'"):
        CheckpointMetadata.from_json(raw)
    # On disk, with a valid checksum: the checkpoint does not exist for recovery.
    storage = CheckpointStorage(tmp_path)
    asyncio.run(storage.write_metadata(1, body(raw)))
    with pytest.raises(CheckpointCorrupted, match=f"{tmp_path}/chk-1/_metadata: not checkpoint"):
        read_checkpoint(storage, 1)
    assert ef.list_checkpoints(tmp_path) == []


# -- metadata format 1 -----------------------------------------------------------------


def to_format_1(directory: Path, n: int) -> None:
    """Rewrite checkpoint ``n``'s keyed state as metadata format 1 wrote it:
    per subtask one full file, by key group, its index beside it, and no
    key groups or backend recorded; the metadata re-signed."""
    ref = open_checkpoint(directory / checkpoint_dir_name(n))
    meta = CheckpointStorage(directory).read_metadata(n)
    for kf in keyed_files(ref, "count"):
        columns: dict[int, list[tuple[str, list[Any], list[Any], list[Any]]]] = {}
        entries = list(read_keyed_file(kf))
        for kg, name, key, value in entries:
            cols = columns.setdefault(kg, [])
            if not cols or cols[-1][0] != name:
                cols.append((name, [], [], []))
            cols[-1][1].append(key)
            cols[-1][2].append(value)
        chunks, index = encode_frames(columns)
        data = b"".join(chunks)
        rel = f"{checkpoint_dir_name(n)}/count-{kf.subtask}/keyed-state"
        os.makedirs(directory / os.path.dirname(rel), exist_ok=True)
        (directory / rel).write_bytes(data)
        handle = {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        meta["operators"]["count"]["subtasks"][str(kf.subtask)]["keyed"] = {
            "file": handle, "index": {k: list(v) for k, v in index.items()},
            "kinds": dict(kf.kinds), "entries": len(entries)}
        old = {f.path for f in kf.handle.file_handles()}
        meta["files"] = [f for f in meta["files"] if f["path"] not in old] + [handle]
    meta["checksum"] = _checksum_of(meta)
    Path(directory, checkpoint_dir_name(n), METADATA).write_text(json.dumps(meta))


@pytest.mark.parametrize("count_parallelism", [2, 3])
def test_metadata_format_1_still_restores(checkpoints: Path, tmp_path: Path,
                                          count_parallelism: int) -> None:
    directory = tmp_path / "old"
    shutil.copytree(checkpoints, directory)
    infos = ef.list_checkpoints(directory)
    # One taken half-way: restored state and replayed input must add up.
    # (from_collection is a split source: its one slice's position.)
    info = next(i for i in infos
                if 0 < int(i.meta.operators["src"].subtasks[0].position["slice-0"]) < N
                and any(p.keyed is not None and p.keyed.entries
                        for p in i.meta.operators["count"].subtasks.values()))
    to_format_1(directory, info.id)

    meta = read_checkpoint(CheckpointStorage(directory), info.id, verify_files=True)
    handles = [p.keyed for p in meta.operators["count"].subtasks.values()]
    assert all(h is not None and h.key_groups == range(0, 0) and len(h.files) == 1
               for h in handles)
    # Written back in today's form, which reads as the same handles.
    again = CheckpointMetadata.from_json(json.loads(json.dumps(meta.to_json())))
    assert again == meta
    assert "file" not in meta.to_json()["operators"]["count"]["subtasks"]["0"]["keyed"]

    restored = RestoredCheckpoint(CheckpointStorage(directory), info.id, meta)
    # Without key groups on record, every old subtask may hold some of ours.
    assert restored.keyed_handles("count", range(0, 1)) == handles

    position = int(meta.operators["src"].subtasks[0].position["slice-0"])
    result = run(tmp_path / "new", ef.ListSink(), count_parallelism=count_parallelism,
                 restore=str(directory / checkpoint_dir_name(info.id)))
    assert result.records_out["src"] == N - position
    assert result.state("count") == FINAL_COUNTS


# -- RestoredCheckpoint ----------------------------------------------------------------


def test_keyed_handles_are_those_overlapping_the_key_groups(checkpoints: Path) -> None:
    storage = CheckpointStorage(checkpoints)
    n = storage.completed_ids()[-1]
    restored = RestoredCheckpoint(storage, n, read_checkpoint(storage, n))
    old = [p.keyed for _, p in sorted(restored.operators["count"].subtasks.items())]
    assert all(isinstance(h, KeyedStateHandle) for h in old)
    mp = restored.meta.max_parallelism
    assert restored.keyed_handles("count", range(0, mp)) == old
    assert restored.keyed_handles("count", range(0, 1)) == old[:1]
    assert restored.keyed_handles("count", range(mp - 1, mp)) == old[-1:]
    assert restored.keyed_handles("count", range(0, 0)) == []
    assert restored.keyed_handles("src", range(0, mp)) == []
    assert restored.keyed_handles("no-such-operator", range(0, mp)) == []
    assert restored.keyed_kinds("count") == {"count": "value"}
    entries = [e for h in restored.keyed_handles("count", range(0, mp))
               for e in kind_of(h).read(str(checkpoints), h, max_parallelism=mp)]
    assert {k: v for _, _, k, v in entries} == FINAL_COUNTS


# -- chk-<n> names ---------------------------------------------------------------------


def test_checkpoint_dir_names_round_trip() -> None:
    for n in (0, 1, 7, 12, 10**12):
        name = checkpoint_dir_name(n)
        assert name == f"chk-{n}"
        assert parse_checkpoint_dir(name) == n
        assert parse_checkpoint_dir(f"/some/dir/{name}") == n
        assert parse_checkpoint_dir(Path("dir") / name) == n
        assert parse_checkpoint_dir(f"dir/{name}/") == n
    with pytest.raises(ValueError, match="whole number"):
        checkpoint_dir_name(-1)


@pytest.mark.parametrize("name", [
    "chk-", "chk", "chk-x", "chk-1a", "chk--1", "chk-+1", "chk-1.0", "chk-01", "chk-007",
    "chk- 1", "chk-1 ", "CHK-1", "chk_1", "xchk-1", "chk-\u0661", "chk-1/_metadata", "", "shared",
])
def test_other_names_are_not_checkpoint_folders(name: str, tmp_path: Path) -> None:
    assert parse_checkpoint_dir(name) is None
    folder = tmp_path / "chk"
    folder.mkdir()
    if name and "/" not in name:
        (folder / name).mkdir(exist_ok=True)
    assert CheckpointStorage(folder).checkpoint_ids() == []


def test_restoring_from_a_folder_not_named_chk_n_is_a_clear_error(tmp_path: Path) -> None:
    env = ef.StreamEnvironment()
    env.from_collection([1]).sink_to(ef.ListSink())
    for bad in (tmp_path / "chk-01", tmp_path / "snapshots"):
        bad.mkdir()
        with pytest.raises(ValueError, match="expected 'latest' or a chk-<n> folder"):
            env.execute(restore=str(bad))
