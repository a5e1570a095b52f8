"""Splitting lines into words as examples/wordcount.py does."""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def tokenize(line: str) -> list[str]:
    return _WORD.findall(line.lower())
