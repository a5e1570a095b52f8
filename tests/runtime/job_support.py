"""What several runtime tests share to run a job: an identity map that
paces it (so several checkpoints fall between the records of a small
input), and a watchdog that fails the test when a job hangs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import pytest

import eddyflow as ef


def watched(job: Coroutine[Any, Any, ef.JobResult], timeout: float) -> ef.JobResult:
    """Run ``job`` (an ``execute_async``); a hung job fails the test."""
    async def go() -> ef.JobResult:
        return await asyncio.wait_for(job, timeout)
    try:
        return asyncio.run(go())
    except TimeoutError:
        pytest.fail(f"the job hung: not finished after {timeout} s")


class Pace:
    """Identity map sleeping ``seconds`` every ``every`` records: keeps the
    source feeding the job long enough for several checkpoints (checkpoints
    stop once the sources have finished)."""

    def __init__(self, every: int, seconds: float = 0.001) -> None:
        self.every = every
        self.seconds = seconds
        self.n = 0

    def __call__(self, r: Any) -> Any:
        self.n += 1
        if self.n % self.every == 0:
            time.sleep(self.seconds)
        return r
