"""Unaligned checkpoints over worker processes (docs/concepts/workers.md).

A priority barrier crosses the link between two workers out of band of
credit and overtakes the consumer's queue there; the records it overtook
become the consumer's channel state. Every job here runs under
back-pressure (small channels in front of a slow keyed stage) and is
compared with the failure-free result: a per-key running count, so the
multiset of committed records and the final keyed state are the same
whatever the interleaving. The checkpoints' metadata must show records in
flight on channels between two workers, so no test passes without a
barrier having overtaken something across a process link.

Each scenario runs in a fresh process (workers are forked; see
test_workers.py for why), and no child process may be left behind.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from sigkill_support import (
    WorkerKiller,
    in_clean_process,
    latest_checkpoint,
    no_process_left_behind,  # noqa: F401 - the autouse fixture
    seed,
)

import eddyflow as ef
from eddyflow.checkpoint.metadata import read_checkpoint
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.runtime.checkpointing.channel_state import split_channel_key

KEYS = 13
#: The checkpoint options of the two ways a barrier comes to overtake.
MODES = {"unaligned": {"mode": "unaligned"},
         "aligned_timeout": {"mode": "exactly_once", "aligned_timeout": 0.002}}




def count(record: Any, state: int | None) -> tuple[Any, int]:
    n = (state or 0) + 1
    return (record % KEYS, n), n


def identity(record: Any) -> Any:
    return record


def busy(record: int) -> int:
    until = time.perf_counter() + 15e-6
    while time.perf_counter() < until:
        pass
    return record


def run(records: int, *, workers: int, directory: Path, mode: str, failing: Any = None,
        restarts: int = 0, restore: str | None = None, sink: ef.ListSink | None = None
        ) -> tuple[list[Any], dict[Any, Any], ef.JobResult]:
    """A back-pressured job: a rebalance and two keyed exchanges, the slow
    stage behind the first keyed one, channels of two small batches; every
    checkpoint kept (the test counts their channel state)."""
    env = ef.StreamEnvironment(parallelism=2, workers=workers, batch_size=32,
                               channel_capacity=2)
    env.enable_checkpointing(interval=0.05, directory=str(directory), retained=10_000,
                             **MODES[mode])
    if restarts:
        env.set_restart_strategy(ef.FixedDelayRestart(attempts=restarts, delay=0.05))
    sink = sink if sink is not None else ef.ListSink()
    stream = env.from_collection(list(range(records))).rebalance().map(lambda x: x * 3)
    # The same operators whether it fails or not: a restore matches them by uid.
    stream = stream.map(failing if failing is not None else identity).name("failing")
    stream.key_by(lambda x: x % 7).map(busy).key_by(lambda x: x % KEYS) \
        .map_with_state(count).name("count").sink_to(sink)
    result = env.execute("unaligned over workers", restore=restore)
    return sorted(sink.results), dict(result.state("count")), result


def expected(records: int) -> tuple[list[Any], dict[Any, Any]]:
    out, state = [], {}
    for x in range(records):
        k = (x * 3) % KEYS
        state[k] = state.get(k, 0) + 1
        out.append((k, state[k]))
    return sorted(out), state


def channel_state(directory: Path, checkpoint_id: int, workers: int) -> tuple[int, int]:
    """Records checkpoint ``checkpoint_id`` holds in flight: on channels
    between two of ``workers`` worker processes (subtask ``s`` runs on
    worker ``s % workers``), and in all."""
    meta = read_checkpoint(CheckpointStorage(str(directory)), checkpoint_id)
    across = total = 0
    for op in meta.operators.values():
        for part in op.subtasks.values():
            cs = part.channel_state
            if cs is None:
                continue
            for key, n in (*cs.inputs.items(), *cs.outputs.items()):
                _, up, down = split_channel_key(key)
                total += n
                if up % workers != down % workers:
                    across += n
    return across, total


def across_workers(directory: Path, workers: int) -> int:
    """Records in flight between two workers, over every checkpoint kept."""
    return sum(channel_state(directory, c.id, workers)[0]
               for c in ef.list_checkpoints(directory))


def restarts_exactly_once(tmp_path: Path, mode: str) -> None:
    chk = tmp_path / "chk"
    failing = ef.testing.FailingMap(after=30_000, times=2)
    out, state, result = run(100_000, workers=2, directory=chk, mode=mode, failing=failing,
                             restarts=3)
    assert failing.failures == 2 and result.restarts == 2
    assert (out, state) == expected(100_000)
    # Barriers overtook records queued between the two workers.
    assert across_workers(chk, 2) > 0


@pytest.mark.parametrize("mode", sorted(MODES))
def test_failures_over_workers_restart_exactly_once_with_overtaking_barriers(
        tmp_path: Path, mode: str) -> None:
    in_clean_process(restarts_exactly_once, tmp_path, mode)


def killed_under_back_pressure(tmp_path: Path) -> None:
    """A worker is killed twice (kill -9) at a random moment after a
    checkpoint of its generation, while the job is back-pressured and its
    checkpoints unaligned: restarted from the latest, 0 lost, 0 duplicated."""
    rng = random.Random(seed(2929))
    chk = tmp_path / "chk"
    with WorkerKiller(chk, rng) as kills:
        out, state, result = run(200_000, workers=2, directory=chk, mode="unaligned",
                                 restarts=5)
    assert len(kills) == 2, f"the job ended after {kills}"
    assert result.restarts == 2, kills
    assert (out, state) == expected(200_000), kills
    assert across_workers(chk, 2) > 0


def test_sigkill_of_a_worker_under_back_pressure_with_unaligned_checkpoints(
        tmp_path: Path) -> None:
    in_clean_process(killed_under_back_pressure, tmp_path)


def restores_at_other_worker_counts(tmp_path: Path, taken: int, restored: list[int]) -> None:
    """A run with ``taken`` workers fails with no restart left; its latest
    checkpoint, which holds records in flight, restores with each worker
    count of ``restored``, and the committed output of the failed run and
    the restored one together is the failure-free one."""
    chk = tmp_path / "chk"
    first = ef.ListSink()  # what the failed run committed
    with pytest.raises(ef.JobFailed, match="InjectedFailure"):
        run(120_000, workers=taken, directory=chk, mode="unaligned", sink=first,
            failing=ef.testing.FailingMap(after=40_000))
    latest = latest_checkpoint(chk)
    assert latest > 0
    across, total = channel_state(chk, latest, taken)
    # Records in flight to put back, between two processes if there were two.
    assert total > 0 and (across > 0 or taken == 1), (across, total)
    want_out, want_state = expected(120_000)
    for workers in restored:
        copy = tmp_path / f"chk-{workers}"
        shutil.copytree(chk, copy)
        out, state, _ = run(120_000, workers=workers, directory=copy, mode="unaligned",
                            restore="latest")
        assert state == want_state, workers
        # The failed run committed the output up to the restored checkpoint.
        assert sorted(first.results + out) == want_out, workers


def test_an_unaligned_checkpoint_of_two_workers_restores_with_one_and_with_three(
        tmp_path: Path) -> None:
    in_clean_process(restores_at_other_worker_counts, tmp_path, 2, [1, 3])


def test_an_unaligned_checkpoint_of_one_process_restores_with_two_workers(
        tmp_path: Path) -> None:
    in_clean_process(restores_at_other_worker_counts, tmp_path, 1, [2])
