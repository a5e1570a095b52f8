"""``map_async`` throughput against the ideal (issue 28, Must show).

The job::

    from_collection(range(--calls)) -> map_async(sleep --latency; capacity --capacity)
      -> a ListSink

With ``capacity`` calls always in flight, ``calls`` calls of ``latency``
seconds each take ``calls * latency / capacity`` seconds at best (1 s for
the defaults: 10,000 calls of 10 ms at capacity 100). Reported per mode
(ordered, unordered): the job's wall time, best of ``--rounds``, and its
ratio to that ideal. The goal: at most 1.5x, in both modes; the calls are
``asyncio.sleep``, so everything above the ideal is the runtime's own cost
(a task per call, the wake-ups, the batches through the chain) and the
event loop's. For scale, the same calls made by plain asyncio (a task per
call, ``capacity`` at a time, no eddyflow) are reported first: on a loaded
machine the loop's own delays move both.

    python benchmarks/map_async.py            # 3 rounds per mode
    python benchmarks/map_async.py --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import eddyflow as ef

GOAL = 1.5


def run_once(calls: int, latency: float, capacity: int, ordered: bool) -> float:
    """Seconds one job takes, checked for a complete and, when ordered,
    in-order output."""

    async def call(x: int) -> int:
        await asyncio.sleep(latency)
        return x

    env = ef.StreamEnvironment(parallelism=1)
    sink = ef.ListSink()
    (env.from_collection(list(range(calls)))
        .map_async(call, capacity=capacity, timeout=60.0, ordered=ordered)
        .sink_to(sink))
    began = time.perf_counter()
    env.execute("map-async-benchmark")
    took = time.perf_counter() - began
    got = sink.results
    if len(got) != calls or sorted(got) != list(range(calls)):
        raise SystemExit(f"wrong output: {len(got)} results for {calls} calls")
    if ordered and got != list(range(calls)):
        raise SystemExit("ordered mode emitted results out of input order")
    return took


def plain_asyncio(calls: int, latency: float, capacity: int) -> float:
    """Seconds plain asyncio takes for the same calls: ``capacity`` at a
    time, each a task, the next started when one completes."""

    async def run() -> float:
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        done: asyncio.Future[None] = loop.create_future()
        started = 0
        left = calls

        async def call() -> None:
            await asyncio.sleep(latency)

        def start() -> None:
            nonlocal started
            started += 1
            loop.create_task(call()).add_done_callback(finished)

        def finished(_: object) -> None:
            nonlocal left
            left -= 1
            if started < calls:
                start()
            if not left:
                done.set_result(None)

        for _ in range(min(capacity, calls)):
            start()
        await done
        return time.perf_counter() - began

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--latency", type=float, default=0.01, help="seconds per call")
    p.add_argument("--capacity", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    ideal = args.calls * args.latency / args.capacity
    print(f"{args.calls:,} calls of {args.latency * 1000:g} ms at capacity {args.capacity}: "
          f"ideal {ideal:.3f} s")
    plain = min(plain_asyncio(args.calls, args.latency, args.capacity)
                for _ in range(args.rounds))
    print(f"plain asyncio: {plain:.3f} s (best of {args.rounds}), {plain / ideal:.2f}x the ideal")
    worst = 0.0
    for ordered in (True, False):
        best = min(run_once(args.calls, args.latency, args.capacity, ordered)
                   for _ in range(args.rounds))
        ratio = best / ideal
        worst = max(worst, ratio)
        mode = "ordered" if ordered else "unordered"
        print(f"{mode:>9}: {best:.3f} s (best of {args.rounds}), {ratio:.2f}x the ideal")
    ok = worst <= GOAL
    print(f"goal <= {GOAL}x: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
