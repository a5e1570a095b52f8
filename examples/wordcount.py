"""Word count, the running example of the ABS paper (Carbone et al. 2015, §3).

Lines of text -> words -> a running count per word. Every count update goes
to an exactly-once FileSink as JSON Lines (committed when a checkpoint
completes); the final counts are the job's keyed state. Checkpoints go to
checkpoints/wordcount; after a crash, `eddyflow run examples/wordcount.py
--restore latest` resumes from the latest one.

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
CHECKPOINTS = os.environ.get("WORDCOUNT_CHECKPOINTS", os.path.join("checkpoints", "wordcount"))

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def tokenize(line: str) -> list[str]:
    return _WORD.findall(line.lower())


def build(env: ef.StreamEnvironment) -> None:
    env.enable_checkpointing(interval=1.0, directory=CHECKPOINTS)
    env.set_restart_strategy(ef.FixedDelayRestart(attempts=3, delay=0.1))
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
    latest = ef.list_checkpoints(CHECKPOINTS)[-1]
    print(f"checkpoint {latest.id} in {latest.path}: {latest.checkpointed_size:,} bytes "
          f"of state{' (final: end of input)' if latest.final else ''}")


if __name__ == "__main__":
    main(sys.argv)
