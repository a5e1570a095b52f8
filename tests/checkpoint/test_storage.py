"""Unit tests of checkpoint storage (DESIGN.md §6); the keyed-state file
format and snapshots are tested in test_memory_snapshot.py.

``CheckpointStorage``: durable writes whose handle carries size and SHA-256,
verification that catches flipped bytes, truncation and missing files,
checksummed ``_metadata`` written last, ``latest_valid`` skipping damaged or
half-written checkpoints with a warning naming the bad file,
``clean_incomplete`` and ``discard``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from eddyflow.checkpoint import storage as storage_module
from eddyflow.checkpoint.layout import METADATA
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage, FileHandle


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    s = CheckpointStorage(tmp_path / "chk")
    s.ensure()
    return s


def write(storage: CheckpointStorage, relpath: str, *chunks: bytes) -> FileHandle:
    return asyncio.run(storage.write_file(relpath, list(chunks)))


def complete(storage: CheckpointStorage, n: int, payload: bytes = b"state") -> FileHandle:
    """A complete checkpoint ``n`` with one state file."""
    handle = write(storage, f"chk-{n}/op-0/keyed-state", payload)
    asyncio.run(storage.write_metadata(n, {"files": [handle.to_json()], "note": f"cp {n}"}))
    return handle


def flip_byte(path: Path, at: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


# -- write_file and verify_file -----------------------------------------------------


def test_write_file_round_trip(storage: CheckpointStorage) -> None:
    handle = write(storage, "chk-1/op-0/keyed-state", b"hello ", b"", b"world")
    assert handle.path == "chk-1/op-0/keyed-state"
    assert handle.size == 11
    assert handle.sha256 == hashlib.sha256(b"hello world").hexdigest()
    path = Path(storage.root, handle.path)
    assert path.read_bytes() == b"hello world"
    assert os.listdir(path.parent) == ["keyed-state"]  # no temporary file left
    storage.verify_file(handle)
    assert FileHandle.from_json(json.loads(json.dumps(handle.to_json()))) == handle


def test_write_file_replaces_atomically(storage: CheckpointStorage) -> None:
    write(storage, "chk-1/f", b"old content")
    handle = write(storage, "chk-1/f", b"new")
    assert Path(storage.root, "chk-1/f").read_bytes() == b"new"
    storage.verify_file(handle)


def test_empty_file_verifies(storage: CheckpointStorage) -> None:
    handle = write(storage, "chk-1/empty")
    assert handle.size == 0
    storage.verify_file(handle)


def test_flipped_byte_is_a_checksum_mismatch(storage: CheckpointStorage) -> None:
    handle = write(storage, "chk-1/f", b"0123456789")
    path = Path(storage.root, handle.path)
    flip_byte(path, 5)
    with pytest.raises(CheckpointCorrupted, match="checksum mismatch") as info:
        storage.verify_file(handle)
    assert str(path) in str(info.value)


def test_truncated_file_is_detected(storage: CheckpointStorage) -> None:
    handle = write(storage, "chk-1/f", b"0123456789")
    path = Path(storage.root, handle.path)
    path.write_bytes(b"01234")
    with pytest.raises(CheckpointCorrupted, match="5 bytes") as info:
        storage.verify_file(handle)
    assert str(path) in str(info.value)


def test_appended_file_is_detected(storage: CheckpointStorage) -> None:
    handle = write(storage, "chk-1/f", b"0123456789")
    with open(Path(storage.root, handle.path), "ab") as f:
        f.write(b"x")
    with pytest.raises(CheckpointCorrupted):
        storage.verify_file(handle)


def test_missing_file_is_detected(storage: CheckpointStorage) -> None:
    handle = write(storage, "chk-1/f", b"data")
    Path(storage.root, handle.path).unlink()
    with pytest.raises(CheckpointCorrupted, match="unreadable"):
        storage.verify_file(handle)


# -- metadata -----------------------------------------------------------------------


def test_metadata_round_trip_and_verify(storage: CheckpointStorage) -> None:
    handle = complete(storage, 3)
    meta = storage.read_metadata(3)
    assert meta["checkpoint_id"] == 3
    assert meta["note"] == "cp 3"
    assert meta["files"] == [handle.to_json()]
    assert "checksum" in meta and "format_version" in meta
    assert storage.verify(3) == meta
    names = os.listdir(storage.layout.checkpoint_dir(3))
    assert sorted(names) == [METADATA, "op-0"]  # no temporary file left


def test_metadata_missing(storage: CheckpointStorage) -> None:
    write(storage, "chk-2/op-0/keyed-state", b"x")
    with pytest.raises(CheckpointCorrupted, match="missing"):
        storage.read_metadata(2)


def test_metadata_truncated(storage: CheckpointStorage) -> None:
    complete(storage, 1)
    path = Path(storage.layout.checkpoint_dir(1), METADATA)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(CheckpointCorrupted) as info:
        storage.read_metadata(1)
    assert str(path) in str(info.value)


def test_metadata_altered_but_valid_json_fails_its_checksum(storage: CheckpointStorage) -> None:
    complete(storage, 1)
    path = Path(storage.layout.checkpoint_dir(1), METADATA)
    meta = json.loads(path.read_text())
    meta["note"] = "tampered"
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointCorrupted, match="checksum"):
        storage.read_metadata(1)


@pytest.mark.parametrize("content", [b"", b"[]", b"null", b"\xff\xfe\x00garbage", b"{}"])
def test_metadata_garbage_is_corrupted_not_a_crash(storage: CheckpointStorage,
                                                    content: bytes) -> None:
    os.makedirs(storage.layout.checkpoint_dir(1))
    Path(storage.layout.checkpoint_dir(1), METADATA).write_bytes(content)
    with pytest.raises(CheckpointCorrupted):
        storage.read_metadata(1)
    assert storage.latest_valid() is None


def test_metadata_of_another_format_version_is_rejected(storage: CheckpointStorage) -> None:
    complete(storage, 1)
    path = Path(storage.layout.checkpoint_dir(1), METADATA)
    meta = json.loads(path.read_text())
    meta["format_version"] = 999
    meta["checksum"] = storage_module._checksum_of(meta)
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointCorrupted, match="format version"):
        storage.read_metadata(1)


def test_verify_checks_every_listed_file(storage: CheckpointStorage) -> None:
    a = write(storage, "chk-1/a", b"aaaa")
    b = write(storage, "chk-1/b", b"bbbb")
    asyncio.run(storage.write_metadata(1, {"files": [a.to_json(), b.to_json()]}))
    storage.verify(1)
    flip_byte(Path(storage.root, b.path))
    with pytest.raises(CheckpointCorrupted, match="chk-1/b"):
        storage.verify(1)


# -- listing, latest_valid, clean_incomplete, discard ----------------------------------


def test_ids_listing_and_next_id(storage: CheckpointStorage) -> None:
    assert storage.checkpoint_ids() == []
    assert storage.next_id() == 1
    complete(storage, 1)
    complete(storage, 10)
    write(storage, "chk-2/op-0/keyed-state", b"half")  # no metadata
    os.makedirs(Path(storage.root, "chk-x"))
    os.makedirs(Path(storage.root, "not-chk-3"))
    assert storage.checkpoint_ids() == [1, 2, 10]  # numeric order, not lexical
    assert storage.completed_ids() == [1, 10]
    assert storage.next_id() == 11


def test_missing_root_has_no_checkpoints(tmp_path: Path) -> None:
    s = CheckpointStorage(tmp_path / "nowhere")
    assert s.checkpoint_ids() == []
    assert s.latest_valid() is None
    assert s.clean_incomplete() == []


def test_latest_valid_skips_damaged_checkpoints_with_a_warning(
        storage: CheckpointStorage, caplog: pytest.LogCaptureFixture) -> None:
    complete(storage, 1)
    complete(storage, 2)
    h3 = complete(storage, 3)
    complete(storage, 4)
    write(storage, "chk-5/op-0/keyed-state", b"half-written")  # no metadata
    # 4: truncated metadata; 3: a flipped byte in its state file.
    meta4 = Path(storage.layout.checkpoint_dir(4), METADATA)
    meta4.write_bytes(meta4.read_bytes()[:10])
    flip_byte(Path(storage.root, h3.path))
    with caplog.at_level(logging.WARNING, logger="eddyflow.checkpoint.listing"):
        found = storage.latest_valid()
    assert found is not None
    n, meta = found
    assert n == 2 and meta["checkpoint_id"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "checkpoint 4" in warnings[0] and str(meta4) in warnings[0]
    assert "checkpoint 3" in warnings[1] and str(Path(storage.root, h3.path)) in warnings[1]


def test_latest_valid_skips_a_checkpoint_whose_state_file_is_gone(
        storage: CheckpointStorage, caplog: pytest.LogCaptureFixture) -> None:
    complete(storage, 1)
    h2 = complete(storage, 2)
    Path(storage.root, h2.path).unlink()
    with caplog.at_level(logging.WARNING, logger="eddyflow.checkpoint.listing"):
        found = storage.latest_valid()
    assert found is not None and found[0] == 1
    assert any(str(Path(storage.root, h2.path)) in r.getMessage() for r in caplog.records)


def test_latest_valid_none_when_everything_is_damaged(storage: CheckpointStorage) -> None:
    h = complete(storage, 1)
    Path(storage.root, h.path).write_bytes(b"")
    assert storage.latest_valid() is None


def test_clean_incomplete(storage: CheckpointStorage) -> None:
    complete(storage, 1)
    write(storage, "chk-2/op-0/keyed-state", b"half")
    write(storage, "chk-3/op-0/keyed-state", b"in progress")
    os.makedirs(storage.layout.checkpoint_dir(4))  # empty
    Path(storage.root, "shared", "sst-1").write_bytes(b"shared file")
    removed = storage.clean_incomplete(keep={3})
    assert sorted(removed) == [2, 4]
    assert storage.checkpoint_ids() == [1, 3]
    assert Path(storage.root, "shared", "sst-1").exists()
    storage.verify(1)
    assert storage.clean_incomplete() == [3]
    assert storage.checkpoint_ids() == [1]


def test_discard(storage: CheckpointStorage) -> None:
    complete(storage, 1)
    complete(storage, 2)
    storage.discard(1)
    assert not os.path.exists(storage.layout.checkpoint_dir(1))
    assert storage.completed_ids() == [2]
    storage.discard(1)  # again: a no-op
    storage.discard(77)  # never existed
    storage.verify(2)


def test_a_verified_file_is_not_hashed_again_until_it_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_hashlib = hashlib
    storage = CheckpointStorage(tmp_path)
    os.makedirs(tmp_path / "shared")
    data = b"x" * 1000
    (tmp_path / "shared" / "f").write_bytes(data)
    handle = FileHandle("shared/f", len(data), real_hashlib.sha256(data).hexdigest())
    hashed: list[int] = []

    class Counting:
        @staticmethod
        def sha256(*args: Any) -> Any:
            hashed.append(1)
            return real_hashlib.sha256(*args)

    monkeypatch.setattr(storage_module, "hashlib", Counting)
    storage.verify_file(handle)
    CheckpointStorage(tmp_path).verify_file(handle)  # another instance, same process
    assert len(hashed) == 1
    st = os.stat(tmp_path / "shared" / "f")
    (tmp_path / "shared" / "f").write_bytes(b"y" * 1000)  # same size...
    os.utime(tmp_path / "shared" / "f", ns=(st.st_atime_ns, st.st_mtime_ns))  # ...and mtime
    with pytest.raises(CheckpointCorrupted, match="checksum"):
        storage.verify_file(handle)
    assert len(hashed) == 2
