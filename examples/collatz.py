"""Collatz sequences round a loop.

Each number n enters the loop as (n, n, 0): (start, current, steps). The loop
body takes one Collatz step; records that have not reached 1 are fed back,
those that have leave the loop with their step count. The job ends when the
input is exhausted and no record is left in the loop.

    python examples/collatz.py
    eddyflow run examples/collatz.py -p 2
"""

from __future__ import annotations

import os

import eddyflow as ef

LIMIT = int(os.environ.get("COLLATZ_LIMIT", "20000"))


def step(record: tuple[int, int, int]) -> tuple[int, int, int]:
    start, n, steps = record
    return start, (n // 2 if n % 2 == 0 else 3 * n + 1), steps + 1


def build(env: ef.StreamEnvironment) -> None:
    env.enable_checkpointing(interval=0.5, directory="checkpoints/collatz")
    numbers = env.from_collection(range(1, LIMIT + 1)).name("numbers")
    loop = numbers.map(lambda n: (n, n, 0)).name("enter").iterate()
    stepped = loop.map(step).name("step")
    loop.close_with(stepped.filter(lambda r: r[1] != 1).name("not-there-yet"))
    (
        stepped.filter(lambda r: r[1] == 1).name("reached-1")
        .map(lambda r: (r[0], r[2])).name("steps")
        .sink_to(ef.ListSink())
    )


def main() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    build(env)
    result = env.execute("collatz")
    print(f"{result.records_out['steps']:,} numbers reached 1 after "
          f"{result.records_in['step']:,} steps round the loop, in {result.duration:.2f} s")


if __name__ == "__main__":
    main()
