"""The job runner (``eddyflow.runtime.job``): what one run of a job starts
and must not leave behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sigkill_support import writer_helpers_of

import eddyflow as ef
from eddyflow.state.abc import KeyedSnapshot, SnapshotTarget
from eddyflow.state.memory import MemoryKeyedStateBackend


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


class _Recording(ef.MemoryStateBackend):
    """The memory backend, recording each keyed backend's snapshots and
    closes in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: dict[tuple[str, int], list[str]] = {}

    def create_keyed_backend(self, operator: str, subtask: int, key_groups: range,
                             max_parallelism: int, *, checkpointing: bool = False
                             ) -> MemoryKeyedStateBackend:
        backend = super().create_keyed_backend(operator, subtask, key_groups,
                                               max_parallelism, checkpointing=checkpointing)
        events = self.events.setdefault((operator, subtask), [])
        snapshot, close = backend.snapshot, backend.close

        def recorded_snapshot(target: SnapshotTarget) -> KeyedSnapshot:
            events.append("snapshot")
            return snapshot(target)

        def recorded_close() -> None:
            events.append("close")
            close()

        backend.snapshot = recorded_snapshot  # type: ignore[method-assign]
        backend.close = recorded_close  # type: ignore[method-assign]
        return backend


def test_keyed_backends_are_closed_once_after_their_last_snapshot(tmp_path: Path) -> None:
    """A finished task acknowledges every later checkpoint (the final one
    included) with its final state: its backends stay open until then, and
    are closed exactly once, after the last snapshot."""
    recording = _Recording()
    env = ef.StreamEnvironment(parallelism=2, batch_size=16)
    env.set_state_backend(recording)
    env.enable_checkpointing(0.005, tmp_path / "chk")

    def pace(x: int) -> int:
        if x % 50 == 0:
            time.sleep(0.002)
        return x

    sink = ef.ListSink()
    (env.from_collection(range(2000)).map(pace).key_by(lambda x: x % 13).count().name("c")
     .sink_to(sink))
    result = env.execute("lifecycle")
    assert len(sink.results) == 2000 and len(result.completed_checkpoints) >= 2
    assert set(recording.events) == {("c", 0), ("c", 1)}
    for key, events in recording.events.items():
        assert events.count("close") == 1, (key, events)
        assert events[-1] == "close", (key, events)
        assert events.count("snapshot") >= len(result.completed_checkpoints) - 1, (key, events)
