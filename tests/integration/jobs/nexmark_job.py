"""A Nexmark query (``benchmarks/nexmark_suite``) as a job file, for
``tests/integration/test_nexmark.py`` to kill with SIGKILL and restore.

``generate(config) -> source (timestamps, watermarks) -> pace -> query ->
FileSink``; the events are generated from a seed in every run, so each run
reads the same stream and a restored run resumes it at the checkpoint's
position. Settings come from environment variables:

* ``NEXMARK_QUERY``  the query, ``q0``..``q8`` (default ``q5``)
* ``NEXMARK_EVENTS``  events to generate (default 20,000)
* ``EF_SIGKILL_OUT``  the ``FileSink`` folder (required)
* ``EF_SIGKILL_CHK``  the checkpoint folder (required)
* ``EF_SIGKILL_INTERVAL``  checkpoint interval in seconds (default 0.05)
* ``EF_SIGKILL_SLOW``  seconds the pacing map sleeps every 100 events
  (default 0: full speed), so that a run outlasts its kill
* ``EF_SIGKILL_BACKEND`` (and ``EF_SIGKILL_ROCKSDB*``)  the state backend
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from sigkill_settings import setting, state_backend

import eddyflow as ef

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from nexmark_suite import queries
from nexmark_suite.generator import GeneratorConfig, generate

JOB = "nexmark_job.py"


def config() -> GeneratorConfig:
    """The stream every run reads: 100 events per second of event time (so
    a few thousand events span several 10 s windows), shuffled in groups
    of 50 (disorder up to half a second)."""
    return GeneratorConfig(events=int(os.environ.get("NEXMARK_EVENTS", "20000")), seed=30,
                           first_event_rate=100, out_of_order_group_size=50)


class Pace:
    """Identity map sleeping ``seconds`` every 100 records."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.n = 0

    def __call__(self, record: Any) -> Any:
        self.n += 1
        if self.seconds and self.n % 100 == 0:
            time.sleep(self.seconds)
        return record


def build(env: ef.StreamEnvironment) -> None:
    """The job: the query of ``NEXMARK_QUERY`` into a FileSink."""
    query = os.environ.get("NEXMARK_QUERY", "q5")
    if query not in queries.QUERIES:
        raise RuntimeError(f"{JOB}: NEXMARK_QUERY={query!r}: one of {', '.join(queries.QUERIES)}")
    env.enable_checkpointing(interval=float(os.environ.get("EF_SIGKILL_INTERVAL", "0.05")),
                             directory=setting("EF_SIGKILL_CHK", JOB))
    env.set_state_backend(state_backend(JOB))
    cfg = config()
    events = queries.source(env, generate(cfg), cfg)
    paced = events.map(Pace(float(os.environ.get("EF_SIGKILL_SLOW", "0")))).name("pace")
    queries.QUERIES[query](paced).sink_to(ef.FileSink(setting("EF_SIGKILL_OUT", JOB)))


if __name__ == "__main__":
    env = ef.StreamEnvironment(parallelism=2)
    build(env)
    env.execute(f"nexmark-{os.environ.get('NEXMARK_QUERY', 'q5')}")
