"""Validation never mistakes user data for its own tags: a word count whose
words are the evaluator's tag letters ("s" from "U.S.", "r", "o", "p"), and
arbitrary generated text, validates as consistent."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, env_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eddyflow as ef
from eddyflow.jobfile import build_environment
from eddyflow.offline import validate

WORDCOUNT = EXAMPLES / "wordcount.py"


def run_and_validate(spark: Any, folder: Path, text: str,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "input.txt").write_text(text, encoding="utf-8")
    env_for(monkeypatch, WORDCOUNT_INPUT=str(folder / "input.txt"),
            WORDCOUNT_OUTPUT=str(folder / "out"), WORDCOUNT_CHECKPOINTS=str(folder / "unused"))
    env, _ = build_environment(WORDCOUNT, parallelism=2)
    env.enable_checkpointing(interval=0.01, directory=folder / "chk")
    result = env.execute("wordcount")
    infos = ef.list_checkpoints(folder / "chk")
    assert infos
    for info in (infos[0], infos[-1]):
        report = validate(spark, info.path, job=WORDCOUNT)
        assert report.ok, (text[:200], report.first_mismatches(5))
    if result.state("count"):
        assert report.compared > 0


def test_words_that_look_like_tags_validate(
        spark: Any, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = "The U.S. is s. R o p: s s o'p r-s\n"
    run_and_validate(spark, in_tmp / "tags", line * 2000, monkeypatch)


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.sampled_from(["s", "r", "o", "p", "U.S.", "s's", "\n"]),
                          st.text(min_size=1, max_size=12)), min_size=1, max_size=400))
def test_generated_text_validates(spark: Any, tmp_path_factory: pytest.TempPathFactory,
                                  monkeypatch: pytest.MonkeyPatch, words: list[str]) -> None:
    text = " ".join(words)
    run_and_validate(spark, tmp_path_factory.mktemp("text"), text, monkeypatch)


KEYED = Path(__file__).parent / "jobs" / "keyed_records.py"
generated_keys = st.one_of(
    st.text(max_size=8), st.integers(),
    st.tuples(st.text(max_size=4), st.integers(min_value=-5, max_value=5)),
    st.sampled_from(["s", "p", ("s", 1), ("p", "s")]))


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(generated_keys, st.integers(-1000, 1000)), min_size=1, max_size=300))
def test_generated_keys_validate(spark: Any, tmp_path_factory: pytest.TempPathFactory,
                                 monkeypatch: pytest.MonkeyPatch,
                                 records: list[tuple[Any, int]]) -> None:
    folder = tmp_path_factory.mktemp("keys")
    (folder / "records.pickle").write_bytes(pickle.dumps(records))
    env_for(monkeypatch, KEYED_RECORDS=str(folder / "records.pickle"))
    env, _ = build_environment(KEYED, parallelism=2)
    env.enable_checkpointing(interval=0.01, directory=folder / "chk")
    result = env.execute("keys")
    sums: dict[Any, int] = {}
    for key, value in records:
        sums[key] = sums.get(key, 0) + value
    assert dict(result.state("sum")) == sums
    report = validate(spark, ef.list_checkpoints(folder / "chk")[-1].path, job=KEYED)
    assert report.ok, (records[:20], report.first_mismatches(5))
    assert report.compared > 0
