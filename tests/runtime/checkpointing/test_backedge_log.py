"""The back-edge log file: batches keep their records' timestamps, logs of
the older formats still read, and a damaged log is refused by name."""

from __future__ import annotations

import pickle

import pytest

from eddyflow.checkpoint.storage import CheckpointCorrupted
from eddyflow.runtime.checkpointing.backedge_log import (
    BackEdgeRecords,
    decode_backedge_batches,
    decode_backedge_log,
    encode_batch,
)


def _file(channels: dict[str, list[bytes]], fmt: int = 3) -> bytes:
    return pickle.dumps({"format": fmt, "channels": channels})


def test_batches_keep_their_timestamps() -> None:
    data = _file({"0": [encode_batch([{"n": 1}, {"n": 2}], [5.0, 7.5]),
                        encode_batch(["x"], None)],
                  "2": [encode_batch([("a", 1)], [1.0])]})
    assert decode_backedge_batches(data, "log") == {
        0: [([{"n": 1}, {"n": 2}], [5.0, 7.5]), (["x"], None)], 2: [([("a", 1)], [1.0])]}
    assert decode_backedge_log(data, "log") == {0: [{"n": 1}, {"n": 2}, "x"], 2: [("a", 1)]}


def test_logs_of_formats_one_and_two_read_without_timestamps() -> None:
    two = _file({"0": [pickle.dumps([1, 2]), pickle.dumps([3])]}, fmt=2)
    assert decode_backedge_batches(two, "log") == {0: [([1, 2], None), ([3], None)]}
    one = pickle.dumps({"channels": {"1": [4, 5], "2": []}})
    assert decode_backedge_batches(one, "log") == {1: [([4, 5], None)], 2: []}


def test_of_logs_each_channel_as_one_batch_without_timestamps() -> None:
    log = BackEdgeRecords.of({0: [1, 2, 3], 1: []})
    assert log.count == 3
    data = _file({str(i): blobs for i, blobs in log.channels.items()})
    assert decode_backedge_batches(data, "log") == {0: [([1, 2, 3], None)], 1: []}


@pytest.mark.parametrize("data", [
    _file({"0": [pickle.dumps(([1, 2], [1.0]))]}),  # a timestamp short
    _file({"0": [b"not a pickle"]}),
    b"garbage",
])
def test_a_damaged_log_is_refused_naming_the_file(data: bytes) -> None:
    with pytest.raises(CheckpointCorrupted, match="chk-3/head-0/backedge-log"):
        decode_backedge_batches(data, "chk-3/head-0/backedge-log")
