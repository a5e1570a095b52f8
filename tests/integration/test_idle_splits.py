"""Idleness in a running job: a ``Log`` partition without records holds
the watermark of an unbounded job back (the minimum over the splits) until
``with_idleness`` declares it idle on the job's clock; then the windows of
the other partition fire. A ``ManualClock`` moves processing time, so the
test waits on events, not on wall-clock time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import eddyflow as ef


def _ts(r: dict[str, Any]) -> float:
    return float(r["ts"])


async def _run_until(env: ef.StreamEnvironment, seen: list[Any], clock: ef.testing.ManualClock,
                     want: int, advance: float) -> None:
    job = asyncio.ensure_future(env.execute_async("idle"))
    try:
        for _ in range(2000):  # up to ~20 s on a loaded machine, usually well under 1
            if len(seen) >= want:
                return
            if job.done():
                job.result()
            clock.advance(advance)
            await asyncio.sleep(0.01)
        raise AssertionError(f"only {seen} after the clock moved {2000 * advance} s")
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)


def _job(tmp_path: Path, idleness: float | None, seen: list[Any]
         ) -> tuple[ef.StreamEnvironment, ef.testing.ManualClock]:
    log = ef.Log(tmp_path / "clicks", partitions=2)
    for t in range(30):
        log.append({"user": "u", "ts": float(t)}, partition=0)  # partition 1 stays empty
    clock = ef.testing.ManualClock(1000.0)
    env = ef.StreamEnvironment(parallelism=2, batch_size=8)
    env.set_clock(clock)
    env.set_auto_watermark_interval(0)
    strategy = ef.WatermarkStrategy.bounded_out_of_orderness(0.0, _ts)
    if idleness is not None:
        strategy = strategy.with_idleness(idleness)
    (env.from_log(tmp_path / "clicks", bounded=False).name("clicks")
        .assign_timestamps_and_watermarks(strategy).name("timestamps")
        .key_by(lambda r: r["user"]).window(ef.TumblingEventTimeWindows(10.0)).count()
        .name("counts").map(lambda r: seen.append(r) or r).name("observe")
        .print())
    return env, clock


def test_an_idle_split_stops_holding_the_watermark(tmp_path: Path) -> None:
    seen: list[Any] = []
    env, clock = _job(tmp_path, 5.0, seen)
    asyncio.run(_run_until(env, seen, clock, want=2, advance=1.0))
    # Partition 0's watermark is 29: [0, 10) and [10, 20) are complete.
    assert seen[:2] == [ef.WindowResult("u", 0.0, 10.0, 10), ef.WindowResult("u", 10.0, 20.0, 10)]


def test_without_idleness_the_empty_split_holds_every_window() -> None:
    """The same job without ``with_idleness``: the empty partition's
    watermark stays at -inf, so no window fires, however far processing
    time moves (checked over a bounded number of clock steps)."""
    import tempfile

    seen: list[Any] = []
    with tempfile.TemporaryDirectory() as d:
        env, clock = _job(Path(d), None, seen)

        async def go() -> None:
            job = asyncio.ensure_future(env.execute_async("held"))
            try:
                for _ in range(50):
                    clock.advance(10.0)
                    await asyncio.sleep(0.01)
            finally:
                job.cancel()
                await asyncio.gather(job, return_exceptions=True)
        asyncio.run(go())
    assert seen == []
