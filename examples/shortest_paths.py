"""Single-source shortest paths (Bellman-Ford by messages) round a loop.

Edges ``u v w`` (weight w) arrive as adjacency records; the source vertex
gets distance 0. A vertex that learns a shorter distance keeps it and offers
distance + w to each neighbour through the loop's feedback edge, keyed by
vertex. The job ends when no offer is left in the loop; each vertex's state
is then its shortest distance from the source.

    python examples/shortest_paths.py
    eddyflow run examples/shortest_paths.py -p 2
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import eddyflow as ef

HERE = os.path.dirname(os.path.abspath(__file__))
EDGES = os.environ.get("SSSP_EDGES", os.path.join(HERE, "data", "weighted-edges.txt"))
SOURCE = 0


def make_graph(path: str, vertices: int = 1000, edges: int = 5000, seed: int = 5) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(edges):
            u, v = rng.randrange(vertices), rng.randrange(vertices)
            if u != v:
                f.write(f"{u} {v} {rng.randint(1, 20)}\n")


def parse(line: str) -> list[tuple[str, int, int, int]]:
    u, v, w = map(int, line.split())
    out = [("edge", u, v, w)]
    if u == SOURCE:
        out.append(("dist", SOURCE, 0, 0))
    return out


class Relax(ef.KeyedProcessFunction):
    """Keyed by vertex. ("edge", u, v, w) adds an out-edge of u; ("dist", v,
    d, 0) offers distance d to v. Emits offers to neighbours and ("final", v,
    d, 0) whenever v's distance improves."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.dist = ctx.value_state("distance")
        self.out = ctx.map_state("out-edges")

    def process(self, value: tuple[str, int, int, int], ctx: ef.RuntimeContext
                ) -> Iterator[Any]:
        kind, v, x, w = value
        d = self.dist.value
        if kind == "edge":
            best = self.out.get(x)
            if best is None or w < best:
                self.out.put(x, w)
                if d is not None:
                    yield ("dist", x, d + w, 0)
        elif d is None or x < d:
            self.dist.value = x
            yield ("final", v, x, 0)
            for u, weight in self.out.items():
                yield ("dist", u, x + weight, 0)


def build(env: ef.StreamEnvironment) -> None:
    if not os.path.exists(EDGES):
        make_graph(EDGES)
    env.enable_checkpointing(interval=0.5, directory="checkpoints/shortest-paths")
    edges = env.read_text_file(EDGES).name("edges").flat_map(parse).name("parse")
    loop = edges.iterate()
    relaxed = loop.key_by(lambda r: r[1]).process(Relax()).name("relax")
    loop.close_with(relaxed.filter(lambda r: r[0] == "dist").name("offers"))
    (
        relaxed.filter(lambda r: r[0] == "final").name("improvements")
        .map(lambda r: (r[1], r[2]))
        .sink_to(ef.ListSink())
    )


def main() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    build(env)
    result = env.execute("shortest-paths")
    dist = result.state("relax", "distance")
    far = max(dist.items(), key=lambda kv: kv[1])
    print(f"{len(dist):,} vertices reachable from {SOURCE}; farthest {far[0]} at {far[1]}; "
          f"{result.records_in['relax']:,} messages in {result.duration:.2f} s")


if __name__ == "__main__":
    main()
