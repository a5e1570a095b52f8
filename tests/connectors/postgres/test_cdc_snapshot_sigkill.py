"""An initial snapshot killed in the middle (SIGKILL of the job's process)
resumes from the restored checkpoint's progress: the restored run's chunks
start where the checkpoint's snapshot was, none before it (chunk reads
counted from the source's log), and every row is read exactly once in the
committed output. 30,000 rows here; 1,000,000 in the slow-marked version."""

from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from cdc_support import cdc_position, sql, wal_lsn
from sigkill_support import RUN_TIMEOUT, JobProcess, latest_checkpoint
from test_cdc_sigkill import JOB, committed

import eddyflow as ef
from eddyflow.checkpoint.storage import CheckpointCorrupted


def snapshot_progress(chk: Path, n: int) -> Any:
    """The source's position in checkpoint ``n``."""
    return cdc_position(chk, n)


def mid_snapshot(chk: Path) -> bool:
    """Whether a completed checkpoint holds a position inside the snapshot."""
    for c in reversed(ef.list_checkpoints(chk)):
        try:
            pos = snapshot_progress(chk, c.id)
        except CheckpointCorrupted:
            continue
        snap = pos.get("snapshot")
        return bool(snap) and isinstance(snap["progress"][0], list)
    return False


def chunk_reads(log: Path) -> dict[int, list[list[str] | None]]:
    """The keys each process's chunks were read after, by process id."""
    out: dict[int, list[list[str] | None]] = {}
    for line in log.read_text().splitlines():
        pid, _, rest = line.partition(" ")
        out.setdefault(int(pid), []).append(json.loads(rest.rsplit(" after key ", 1)[1]))
    return out


def kill_mid_snapshot(dsn: str, tmp_path: Path, rows: int, chunk: int) -> None:
    slot = f"kill_snapshot_{rows}"
    sql(dsn, "CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, "
             "amount int NOT NULL)",
        "ALTER TABLE orders REPLICA IDENTITY FULL",
        f"INSERT INTO orders SELECT g, 'c' || (g % 20), g % 97 "
        f"FROM generate_series(1, {rows}) g")
    out, changes, chk, log = (tmp_path / "out", tmp_path / "changes", tmp_path / "chk",
                              tmp_path / "chunks.log")
    until = tmp_path / "until"
    until.write_text(str(wal_lsn(dsn)))
    job = JobProcess(JOB, tmp_path, tmp_path / "unused-log", out, chk, 0.0)
    job.env.update(EF_CDC_SLOT=slot, EF_CDC_DSN=dsn,
                   EF_CDC_CHANGES=str(changes), EF_CDC_CHUNK=str(chunk),
                   EF_CDC_CHUNKS=str(log), EF_CDC_UNTIL=str(until), EF_SIGKILL_INTERVAL="0.2")
    proc, stderr = job.start()
    deadline = time.monotonic() + RUN_TIMEOUT
    while not mid_snapshot(chk):
        assert proc.poll() is None, "the snapshot ended before it could be killed: " + \
            stderr.read_text()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    restored = latest_checkpoint(chk)
    progress = snapshot_progress(chk, restored)["snapshot"]["progress"][0]
    proc, stderr = job.start()
    assert proc.wait(RUN_TIMEOUT) == 0, stderr.read_text()[-3000:]

    reads = chunk_reads(log)
    assert len(reads) == 2, reads.keys()
    first, restored_run = sorted(reads, key=lambda pid: 0 if reads[pid][0] is None else 1)
    assert reads[first][0] is None  # the first run started at the table's start
    # The restored run starts at the checkpoint's key and never before it.
    after = reads[restored_run]
    assert after[0] == progress
    assert all(a is not None and int(a[0]) >= int(progress[0]) for a in after)
    # Only the chunks after the checkpoint's key are read (and the empty last).
    assert len(after) <= math.ceil((rows - int(progress[0])) / chunk) + 1
    # (The checkpoint may fall inside a chunk: its rows emitted so far count
    # as read, and the restored run's first chunk starts after them.)
    ids = [i for i, op, _ in committed(changes) if op == "r"]
    assert sorted(ids) == list(range(1, rows + 1)), "a row read twice or not at all"


def test_snapshot_killed_mid_way_resumes_without_rereading(postgres_dsn: str,
                                                           tmp_path: Path) -> None:
    kill_mid_snapshot(postgres_dsn, tmp_path, rows=30_000, chunk=1_000)


@pytest.mark.slow
def test_snapshot_of_a_million_rows_killed_mid_way_resumes(postgres_dsn: str,
                                                           tmp_path: Path) -> None:
    kill_mid_snapshot(postgres_dsn, tmp_path, rows=1_000_000, chunk=10_000)
