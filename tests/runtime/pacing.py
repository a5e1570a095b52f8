"""An identity map that paces a job, for the runtime tests that need several
checkpoints to fall between the records of a small input."""

from __future__ import annotations

import time
from typing import Any


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
