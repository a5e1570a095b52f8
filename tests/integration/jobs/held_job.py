"""A job that holds still on request, for tests/integration/test_folder_lock.py.

``from_collection(range(N)) -> map(hold) -> key_by -> count -> FileSink``.
Once a checkpoint of its folder ``EF_HELD_CHK`` (one every 20 ms) has
completed, the map waits while the file ``EF_HELD_FILE`` exists: the
process stays alive, holding the folder's lock, for as long as the test
needs, whatever the machine's load. The sink's folder is ``EF_HELD_OUT``.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any

import eddyflow as ef

N = 200_000


class Hold:
    def __init__(self, path: str, checkpoints: str) -> None:
        self.path = path
        self.checkpoints = checkpoints
        self.n = 0
        self.checked = False

    def __call__(self, record: Any) -> Any:
        self.n += 1
        if not self.checked and self.n % 1000 == 0 and glob.glob(
                os.path.join(self.checkpoints, "chk-*", "_metadata")):
            self.checked = True
            while os.path.exists(self.path):
                time.sleep(0.01)
        return record


def build(env: ef.StreamEnvironment) -> None:
    chk = os.environ["EF_HELD_CHK"]
    env.enable_checkpointing(0.02, chk)
    (env.from_collection(range(N)).name("numbers")
     .map(Hold(os.environ["EF_HELD_FILE"], chk)).name("hold").set_parallelism(1)
     .key_by(lambda n: n % 10).count().name("count")
     .sink_to(ef.FileSink(os.environ["EF_HELD_OUT"])).name("out"))
