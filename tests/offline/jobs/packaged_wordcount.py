"""examples/wordcount.py with its tokenizer in a package beside it
(``wordsplit/``): the same operators, so it validates that job's
checkpoints, and its executors need the package shipped."""

from __future__ import annotations

import os

from wordsplit import tokenize

import eddyflow as ef

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                        "examples")
INPUT = os.environ.get("WORDCOUNT_INPUT", os.path.join(EXAMPLES, "data", "declaration.txt"))


def build(env: ef.StreamEnvironment) -> None:
    (
        env.read_text_file(INPUT).name("lines")
        .flat_map(tokenize).name("tokenize")
        .key_by(lambda word: word)
        .count().name("count")
        .sink_to(ef.ListSink())
    )
