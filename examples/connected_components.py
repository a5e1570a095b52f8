"""Connected components by label propagation round a loop.

Every vertex starts labelled with its own id; a vertex that learns a smaller
label adopts it and sends it to its neighbours, through the loop's feedback
edge keyed by vertex. Nothing changes any more exactly when no record is left
in the loop, which is when the job ends: each vertex's label is then the
smallest id in its component.

Input: an edge list, ``u v`` per line (examples/data/graph-edges.txt, made by
``make_graph`` below when missing).

    python examples/connected_components.py
    eddyflow run examples/connected_components.py -p 2
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import eddyflow as ef

HERE = os.path.dirname(os.path.abspath(__file__))
EDGES = os.environ.get("CC_EDGES", os.path.join(HERE, "data", "graph-edges.txt"))


def make_graph(path: str, vertices: int = 2000, edges: int = 2400, seed: int = 3) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(edges):
            u, v = rng.randrange(vertices), rng.randrange(vertices)
            if u != v:
                f.write(f"{u} {v}\n")


def parse(line: str) -> list[tuple[str, int, int]]:
    u, v = map(int, line.split())
    # Undirected: both directions, as adjacency messages.
    return [("edge", u, v), ("edge", v, u)]


class Propagate(ef.KeyedProcessFunction):
    """Keyed by vertex. ("edge", v, w): w is a neighbour of v. ("label", v, l):
    v may take label l. Emits ("label", w, l) for neighbours to learn, and
    ("final", v, l) whenever v's label improves."""

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.label = ctx.value_state("label")
        self.neighbours = ctx.list_state("neighbours")

    def process(self, value: tuple[str, int, int], ctx: ef.RuntimeContext) -> Iterator[Any]:
        kind, v, x = value
        label = self.label.value
        if label is None:
            label = self.label.value = v
            yield ("final", v, v)
        if kind == "edge":
            self.neighbours.add(x)
            yield ("label", x, label)  # the new neighbour learns my label
        elif x < label:
            self.label.value = x
            yield ("final", v, x)
            for w in self.neighbours.get():
                yield ("label", w, x)


def build(env: ef.StreamEnvironment) -> None:
    if not os.path.exists(EDGES):
        make_graph(EDGES)
    env.enable_checkpointing(interval=0.5, directory="checkpoints/connected-components")
    edges = env.read_text_file(EDGES).name("edges").flat_map(parse).name("parse")
    loop = edges.iterate()
    propagated = loop.key_by(lambda r: r[1]).process(Propagate()).name("propagate")
    loop.close_with(propagated.filter(lambda r: r[0] == "label").name("feedback"))
    (
        propagated.filter(lambda r: r[0] == "final").name("labels")
        .map(lambda r: (r[1], r[2]))
        .sink_to(ef.ListSink())
    )


def main() -> None:
    env = ef.StreamEnvironment(parallelism=2)
    build(env)
    result = env.execute("connected-components")
    labels = result.state("propagate", "label")
    components = len(set(labels.values()))
    print(f"{len(labels):,} vertices in {components:,} components; "
          f"{result.records_in['propagate']:,} messages round the loop in "
          f"{result.duration:.2f} s")


if __name__ == "__main__":
    main()
