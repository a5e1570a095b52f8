"""Metrics while a job runs: the ``on_metrics`` callback, ``JobResult.metrics``
and the Prometheus endpoint, scraped over 127.0.0.1 with a real HTTP client."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace

import eddyflow as ef


class Trickle(ef.Source):
    """``n`` integers, ``per_batch`` at a time with a pause between batches:
    a job that lasts long enough to be watched."""

    def __init__(self, n: int, per_batch: int = 50, pause: float = 0.005) -> None:
        self.n, self.per_batch, self.pause = n, per_batch, pause

    @property
    def name(self) -> str:
        return "trickle"

    def create_reader(self, subtask: int, parallelism: int) -> ef.SourceReader:
        return _TrickleReader(self)


class _TrickleReader(ef.SourceReader):
    def __init__(self, source: Trickle) -> None:
        self.source = source
        self.pos = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.pos >= self.source.n:
            return None
        await asyncio.sleep(self.source.pause)
        stop = min(self.pos + self.source.per_batch, self.source.n)
        batch = list(range(self.pos, stop))
        self.pos = stop
        return batch

    def position(self) -> int:
        return self.pos

    def seek(self, position: Any) -> None:
        self.pos = int(position)


def job(env: ef.StreamEnvironment, n: int = 3000, *, slow_map: bool = False) -> ef.ListSink:
    sink = ef.ListSink()
    ds = env.from_source(Trickle(n), parallelism=1).name("src")
    counted = ds.key_by(lambda i: i % 7).map_with_state(
        lambda r, s: ((r % 7, (s or 0) + 1), (s or 0) + 1)).name("count")
    if slow_map:
        counted = counted.map(Pace(1, 0.0005)).name("slow").set_parallelism(1)
    counted.sink_to(sink).name("sink").set_parallelism(1)
    return sink


def test_callback_sees_the_job_progress_and_result_holds_the_last_sample(tmp_path: Path) -> None:
    env = ef.StreamEnvironment(parallelism=2)
    env.enable_checkpointing(0.05, tmp_path / "chk")
    seen: list[ef.JobMetrics] = []
    env.on_metrics(seen.append, every=0.05)
    sink = job(env)
    result = env.execute("metrics")
    assert len(sink.results) == 3000
    running = [m for m in seen if not m.final]
    assert len(running) >= 2, f"only {len(running)} samples while the job ran"
    counts = [m.by_operator().get("count", {}).get("records_in", 0) for m in running]
    assert counts == sorted(counts) and counts[-1] > counts[0], counts
    assert any(m.by_operator()["count"]["records_in_per_second"] > 0 for m in running)
    final = result.metrics
    assert final is not None and final.final and seen[-1] is final
    ops = final.by_operator()
    assert ops["src"]["records_out"] == 3000 and ops["count"]["records_in"] == 3000
    assert {m.subtask for m in final.operators if m.operator == "count"} == {0, 1}
    assert final.checkpoints_completed >= 1 and final.last_checkpoint is not None
    assert final.last_checkpoint.checkpointed_size > 0
    assert final.restarts == 0
    as_dict = final.to_dict()
    assert as_dict["job"] == "metrics" and isinstance(as_dict["operators"], list)


def test_backpressure_shows_at_the_slow_operator(tmp_path: Path) -> None:
    env = ef.StreamEnvironment(parallelism=2, batch_size=16, channel_capacity=2)
    seen: list[ef.JobMetrics] = []
    env.on_metrics(seen.append, every=0.05)
    job(env, 3000, slow_map=True)
    env.execute("backpressure")
    slow_bp = [m.by_operator()["slow"]["backpressure"] for m in seen if not m.final]
    count_bp = [m.by_operator()["count"]["backpressure"] for m in seen if not m.final]
    assert slow_bp and max(slow_bp) >= 0.5, slow_bp
    assert all(0.0 <= b <= 1.0 for b in slow_bp + count_bp)


def test_restarts_are_counted_and_a_raising_callback_does_not_fail_the_job(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = ef.StreamEnvironment(parallelism=1)
    env.enable_checkpointing(0.02, tmp_path / "chk")
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=2, delay=0))

    def broken(m: ef.JobMetrics) -> None:
        raise RuntimeError("watcher bug")

    env.on_metrics(broken, every=0.02)
    sink = ef.ListSink()
    (env.from_source(Trickle(2000), parallelism=1).name("src")
     .map(ef.testing.FailingMap(after=1000)).name("failing").sink_to(sink))
    with caplog.at_level(logging.ERROR, logger="eddyflow"):
        result = env.execute("restarts")
    assert result.restarts == 1 and result.metrics is not None
    assert result.metrics.restarts == 1
    assert any("metrics callback raised" in r.getMessage() for r in caplog.records)


def test_prometheus_endpoint_serves_the_job_on_localhost(tmp_path: Path) -> None:
    env = ef.StreamEnvironment(parallelism=2)
    env.expose_metrics(0)  # a free port
    scraped: list[str] = []

    async def scrape(finished: asyncio.Event) -> None:
        while not finished.is_set():
            await asyncio.sleep(0.05)
            address = env.metrics_address
            if address is None:
                continue
            host, port = address
            assert host == "127.0.0.1"
            url = f"http://{host}:{port}/metrics"
            body = await asyncio.to_thread(fetch, url)
            if 'operator="count"' in body:
                scraped.append(body)
                return

    async def main() -> ef.JobResult:
        job(env, 6000)
        finished = asyncio.Event()
        watcher = asyncio.ensure_future(scrape(finished))
        try:
            return await env.execute_async("prometheus")
        finally:
            finished.set()
            await watcher

    asyncio.run(main())
    assert scraped, "the endpoint never showed the job's operators"
    body = scraped[0]
    assert 'eddyflow_records_in_total{job="prometheus",operator="count",subtask="0"}' in body
    assert "eddyflow_backpressure{" in body and "eddyflow_restarts_total" in body
    assert "eddyflow_records_out_per_second{" in body
    assert env.metrics_address is None  # shut down with the job


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def test_metrics_options_are_checked() -> None:
    env = ef.StreamEnvironment()
    with pytest.raises(TypeError):
        env.on_metrics("print")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interval"):
        env.on_metrics(print, every=0)
    with pytest.raises(ValueError, match="port"):
        env.expose_metrics(70000)
