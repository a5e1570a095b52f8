"""The job runner (``eddyflow.runtime.job``): what one run of a job starts
and must not leave behind."""

from __future__ import annotations

import os
from pathlib import Path

from sigkill_support import writer_helpers_of

import eddyflow as ef


def test_a_job_run_writes_through_its_helper_and_leaves_none_behind(tmp_path: Path) -> None:
    seen: list[list[int]] = []

    def probe(x: int) -> int:
        if x % 500 == 0:
            seen.append(writer_helpers_of(os.getpid()))
        return x

    env = ef.StreamEnvironment(parallelism=1)
    env.enable_checkpointing(0.01, tmp_path / "chk")
    sink = ef.ListSink()
    env.from_collection(range(3000)).map(probe).key_by(lambda x: x % 7).count().sink_to(sink)
    result = env.execute("writer")
    assert len(sink.results) == 3000
    assert any(seen), "no writer process while the job ran"
    assert ef.list_checkpoints(tmp_path / "chk"), "its checkpoints were written"
    assert result.completed_checkpoints
    assert writer_helpers_of(os.getpid()) == []
