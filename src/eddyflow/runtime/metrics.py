"""Metrics of a running job: a typed snapshot, sampled on the event loop.

:class:`MetricsReporter` samples the tasks of the job's current attempt every
``every`` seconds (the shortest interval asked for) and hands a
:class:`JobMetrics` to the callbacks registered with ``env.on_metrics`` and
to the Prometheus endpoint of ``env.expose_metrics``. Sampling reads plain
counters the tasks keep anyway (records in and out per operator, records
queued per channel, the coordinator's checkpoint statistics): a job that
nobody watches pays nothing, and one that is watched pays one pass over its
tasks per interval.

*Back-pressure* is the fill of a task's bounded input channels (records
queued over their capacity, 0 to 1): a task whose inputs stay full cannot
keep up, and everything upstream of it waits. It is reported for every
operator of the task's chain. Sources have no inputs: 0.

The Prometheus endpoint's HTTP server runs in a thread of its own and never
touches the tasks: a scrape asks the event loop for a fresh sample (and
serves the last one if the loop does not answer within a second), from a
registry of its own per job, on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eddyflow.runtime.job import JobRunner
    from eddyflow.runtime.task import Task

__all__ = ["CheckpointMetrics", "JobMetrics", "MetricsReporter", "OperatorMetrics"]

log = logging.getLogger("eddyflow")

MetricsCallback = Callable[["JobMetrics"], Any]


@dataclass(frozen=True)
class OperatorMetrics:
    """One subtask of one operator."""

    operator: str
    subtask: int
    records_in: int
    records_out: int
    #: Over the last sampling interval.
    records_in_per_second: float
    records_out_per_second: float
    #: Fill of the task's bounded input channels, 0 to 1.
    backpressure: float


@dataclass(frozen=True)
class CheckpointMetrics:
    """The last completed checkpoint."""

    id: int
    duration: float
    alignment_duration: float
    #: Bytes it wrote (incremental state: the new files only).
    checkpointed_size: int
    #: Records and bytes of channel state (unaligned checkpoints).
    channel_state_records: int
    channel_state_bytes: int
    unaligned: bool


@dataclass(frozen=True)
class JobMetrics:
    job: str
    #: Unix time of the sample, and seconds since the job started.
    timestamp: float
    uptime: float
    restarts: int
    operators: tuple[OperatorMetrics, ...] = ()
    checkpoints_completed: int = 0
    checkpoints_aborted: int = 0
    last_checkpoint: CheckpointMetrics | None = None
    #: The job has ended (the sample ``JobResult.metrics`` holds).
    final: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (``json.dumps`` takes it as it is)."""
        d = asdict(self)
        d["operators"] = list(d["operators"])
        return d

    def by_operator(self) -> dict[str, dict[str, float]]:
        """Per operator, summed over its subtasks (back-pressure: the
        highest of any subtask)."""
        out: dict[str, dict[str, float]] = {}
        for m in self.operators:
            row = out.setdefault(m.operator, dict(
                records_in=0, records_out=0, records_in_per_second=0.0,
                records_out_per_second=0.0, backpressure=0.0))
            row["records_in"] += m.records_in
            row["records_out"] += m.records_out
            row["records_in_per_second"] += m.records_in_per_second
            row["records_out_per_second"] += m.records_out_per_second
            row["backpressure"] = max(row["backpressure"], m.backpressure)
        return out


@dataclass
class _Watch:
    fn: MetricsCallback
    every: float
    due: float = 0.0


def _backpressure(task: Task) -> float:
    gate = task.gate
    if gate is None:
        return 0.0
    queued = capacity = 0
    for ch in gate.channels:
        if ch.capacity is not None:
            queued += min(ch.records, ch.capacity)
            capacity += ch.capacity
    return queued / capacity if capacity else 0.0


@dataclass
class MetricsReporter:
    """Samples one job (across its restarts) for callbacks and Prometheus."""

    job: str
    watches: list[_Watch] = field(default_factory=list)
    port: int | None = None
    started: float = field(default_factory=time.monotonic)
    restarts: int = 0
    last: JobMetrics | None = None
    _runner: JobRunner | None = None
    # Per consumer (the callbacks, Prometheus): the counters of its last
    # sample, from which its rates are computed, so a scrape does not
    # shorten the callbacks' interval.
    _previous: dict[str, dict[tuple[str, int], tuple[float, int, int]]] = field(
        default_factory=dict)
    _server: Any = None
    _loop: asyncio.AbstractEventLoop | None = None

    @staticmethod
    def create(job: str, callbacks: Sequence[tuple[MetricsCallback, float]],
               port: int | None) -> MetricsReporter:
        return MetricsReporter(job, [_Watch(fn, every) for fn, every in callbacks], port)

    @property
    def active(self) -> bool:
        """Whether anyone watches the job while it runs."""
        return bool(self.watches) or self.port is not None

    def attach(self, runner: JobRunner, restarts: int) -> None:
        """A new attempt of the job starts."""
        self._runner = runner
        self.restarts = restarts

    @property
    def address(self) -> tuple[str, int] | None:
        """Where the Prometheus endpoint listens, once started."""
        server = self._server
        return None if server is None else (str(server.server_address[0]),
                                            int(server.server_address[1]))

    def sample(self, final: bool = False, consumer: str = "callbacks") -> JobMetrics:
        """The job now; rates over the time since ``consumer``'s last sample."""
        now = time.monotonic()
        previous = self._previous.setdefault(consumer, {})
        ops: list[OperatorMetrics] = []
        runner = self._runner
        for t in runner.tasks if runner is not None else ():
            bp = _backpressure(t)
            counters = [(op.uid, op.records_in, op.records_out) for op in t.operators]
            if t.source_uid is not None:
                counters.insert(0, (t.source_uid, 0, t.records_read))
            for uid, r_in, r_out in counters:
                key = (uid, t.subtask)
                before = previous.get(key)
                rate_in = rate_out = 0.0
                if before is not None:
                    at, was_in, was_out = before
                    dt = now - at
                    if dt > 0:
                        # A restart starts the counters again: count from 0.
                        rate_in = (r_in - was_in if r_in >= was_in else r_in) / dt
                        rate_out = (r_out - was_out if r_out >= was_out else r_out) / dt
                previous[key] = (now, r_in, r_out)
                ops.append(OperatorMetrics(uid, t.subtask, r_in, r_out, rate_in, rate_out, bp))
        completed = aborted = 0
        last = None
        c = runner.coordinator if runner is not None else None
        if c is not None:
            completed, aborted = len(c.completed), len(c.aborted)
            if c.stats:
                s = c.stats[-1]
                last = CheckpointMetrics(
                    s.checkpoint_id, s.duration, s.alignment_duration, s.checkpointed_size,
                    s.channel_state_records, s.channel_state_bytes, s.unaligned)
        m = JobMetrics(self.job, time.time(), now - self.started, self.restarts, tuple(ops),
                       completed, aborted, last, final)
        self.last = m
        return m

    def _notify(self, m: JobMetrics, now: float, force: bool = False) -> None:
        for w in self.watches:
            if force or now >= w.due:
                w.due = now + w.every
                try:
                    w.fn(m)
                except Exception:  # a broken watcher must not break the job
                    log.exception("job '%s': a metrics callback raised; the job goes on",
                                  self.job)

    async def run(self) -> None:
        """Sample and report until cancelled."""
        if not self.active:
            return
        every = min([w.every for w in self.watches] + ([1.0] if self.port is not None else []))
        for w in self.watches:
            w.due = time.monotonic() + w.every
        while True:
            await asyncio.sleep(every)
            m = self.sample()
            self._notify(m, time.monotonic())

    def finish(self, notify: bool = True) -> JobMetrics:
        """The job ended: the last sample, given to every callback once more
        if ``notify``."""
        m = self.sample(final=True)
        if notify:
            self._notify(m, time.monotonic(), force=True)
        return m

    # -- Prometheus ------------------------------------------------------------------

    def start_server(self) -> None:
        if self.port is None:
            return
        from prometheus_client import CollectorRegistry, start_http_server

        self._loop = asyncio.get_running_loop()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        self._server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)

    def sample_from_thread(self) -> JobMetrics | None:
        """A fresh sample, taken on the event loop, for another thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return self.last

        async def take() -> JobMetrics:
            return self.sample(consumer="prometheus")

        try:
            return asyncio.run_coroutine_threadsafe(take(), loop).result(timeout=1.0)
        except Exception:  # the loop is busy or gone: the last sample will do
            return self.last

    def stop_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class _Collector:
    """The reporter's last sample as Prometheus metric families."""

    def __init__(self, reporter: MetricsReporter) -> None:
        self.reporter = reporter

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m = self.reporter.sample_from_thread()
        if m is None:
            return
        labels = ["job", "operator", "subtask"]
        rin = CounterMetricFamily("eddyflow_records_in", "Records into an operator subtask",
                                  labels=labels)
        rout = CounterMetricFamily("eddyflow_records_out", "Records out of an operator subtask",
                                   labels=labels)
        rate = GaugeMetricFamily("eddyflow_records_in_per_second",
                                 "Records into an operator subtask per second", labels=labels)
        rate_out = GaugeMetricFamily("eddyflow_records_out_per_second",
                                     "Records out of an operator subtask per second",
                                     labels=labels)
        bp = GaugeMetricFamily("eddyflow_backpressure",
                               "Fill of the subtask's bounded input channels (0-1)",
                               labels=labels)
        for o in m.operators:
            lv = [m.job, o.operator, str(o.subtask)]
            rin.add_metric(lv, o.records_in)
            rout.add_metric(lv, o.records_out)
            rate.add_metric(lv, o.records_in_per_second)
            rate_out.add_metric(lv, o.records_out_per_second)
            bp.add_metric(lv, o.backpressure)
        yield from (rin, rout, rate, rate_out, bp)
        job = ["job"]
        restarts = CounterMetricFamily("eddyflow_restarts", "Restarts of the job", labels=job)
        restarts.add_metric([m.job], m.restarts)
        done = CounterMetricFamily("eddyflow_checkpoints_completed",
                                   "Completed checkpoints", labels=job)
        done.add_metric([m.job], m.checkpoints_completed)
        aborted = CounterMetricFamily("eddyflow_checkpoints_aborted",
                                      "Aborted checkpoints", labels=job)
        aborted.add_metric([m.job], m.checkpoints_aborted)
        yield from (restarts, done, aborted)
        last = m.last_checkpoint
        if last is not None:
            for name, value, text in (
                    ("duration_seconds", last.duration, "Duration of the last checkpoint"),
                    ("alignment_seconds", last.alignment_duration,
                     "Longest alignment in the last checkpoint"),
                    ("size_bytes", last.checkpointed_size, "Bytes the last checkpoint wrote"),
                    ("channel_state_bytes", last.channel_state_bytes,
                     "Channel state of the last checkpoint")):
                g = GaugeMetricFamily(f"eddyflow_last_checkpoint_{name}", text, labels=job)
                g.add_metric([m.job], value if math.isfinite(value) else 0.0)
                yield g
