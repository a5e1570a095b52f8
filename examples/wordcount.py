"""Word count, the running example of the ABS paper (Carbone et al. 2015, §3).

Lines of text -> words -> a running count per word. Every count update goes
to an exactly-once FileSink as JSON Lines; the final counts are the job's
keyed state.

    python examples/wordcount.py [TEXT]      # prints the top words
    eddyflow run examples/wordcount.py -p 2
"""

from __future__ import annotations

import os
import re
import sys

import eddyflow as ef

HERE = os.path.dirname(os.path.abspath(__file__))
INPUT = os.environ.get("WORDCOUNT_INPUT", os.path.join(HERE, "data", "declaration.txt"))
OUTPUT = os.environ.get("WORDCOUNT_OUTPUT", os.path.join("out", "wordcount"))

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def tokenize(line: str) -> list[str]:
    return _WORD.findall(line.lower())


def build(env: ef.StreamEnvironment) -> None:
    (
        env.read_text_file(INPUT).name("lines")
        .flat_map(tokenize).name("tokenize")
        .key_by(lambda word: word)
        .count().name("count")
        .sink_to(ef.FileSink(OUTPUT))
    )


def main(argv: list[str]) -> None:
    global INPUT
    if len(argv) > 1:
        INPUT = argv[1]
    env = ef.StreamEnvironment(parallelism=2)
    build(env)
    result = env.execute("wordcount")
    counts = result.state("count")
    print(f"{sum(counts.values()):,} words, {len(counts):,} distinct, "
          f"in {result.duration * 1000:.0f} ms; running counts written to {OUTPUT}/")
    for word, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]:
        print(f"  {n:5d}  {word}")


if __name__ == "__main__":
    main(sys.argv)
