"""Word count whose source keeps parallelism 1 while the tokenizer and the
count run at the job's: a source cannot change parallelism across a
restore, keyed state can, so a checkpoint bootstrapped at one parallelism
restores into the count at another. Reads ``WORDCOUNT_INPUT``; checkpoints
into ``WORDCOUNT_CHECKPOINTS``."""

from __future__ import annotations

import os
import re

import eddyflow as ef

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def tokenize(line: str) -> list[str]:
    return _WORD.findall(line.lower())


def build(env: ef.StreamEnvironment) -> None:
    env.enable_checkpointing(interval=60.0, directory=os.environ["WORDCOUNT_CHECKPOINTS"])
    (
        env.read_text_file(os.environ["WORDCOUNT_INPUT"]).name("lines").set_parallelism(1)
        .flat_map(tokenize).name("tokenize")
        .key_by(lambda word: word)
        .count().name("count")
        .sink_to(ef.ListSink()).name("counts")
    )
