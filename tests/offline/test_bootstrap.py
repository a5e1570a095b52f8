"""``bootstrap``: a checkpoint written from a Spark DataFrame, restored by a
streaming job, validated.

The round trip of issue 16: word counts computed by a Spark batch job over
the first part of a text file are bootstrapped into the word count's
``count`` operator; the streaming word count restored from that checkpoint
reads the rest of the text; its final state must be the word count of the
whole text, computed here independently (``collections.Counter``)."""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, env_for
from job_support import BACKENDS
from tamper import change_one_drop_one, rewrite_state

import eddyflow as ef
from eddyflow.checkpoint.metadata import read_checkpoint
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.cli.main import main
from eddyflow.jobfile import build_environment
from eddyflow.offline import BootstrapError, bootstrap, open_checkpoint, validate
from eddyflow.offline.bootstrap_executors import spark_to_python as _python

WORDCOUNT = EXAMPLES / "wordcount.py"
JOBS = Path(__file__).parent / "jobs"
RESCALE = JOBS / "wordcount_rescale.py"
PROFILES = JOBS / "purchase_profiles.py"


def _words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 6)))
            for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A text in two parts, and the word count of all of it."""
    rng = random.Random(16)
    vocabulary = _words(rng, 400)
    lines = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 12)))
             for _ in range(1500)]
    folder = tmp_path_factory.mktemp("corpus")
    first, rest = folder / "first.txt", folder / "rest.txt"
    first.write_text("\n".join(lines[:900]) + "\n")
    rest.write_text("\n".join(lines[900:]) + "\n")
    whole = collections.Counter(w for line in lines for w in line.split())
    early = collections.Counter(w for line in lines[:900] for w in line.split())
    return {"first": first, "rest": rest, "whole": dict(whole), "early": dict(early)}


def counts_df(spark: Any, path: Path) -> Any:
    """The batch side: split the lines into words, count them per word."""
    from pyspark.sql import functions as F

    words = spark.read.text(str(path)).select(F.explode(F.split("value", " ")).alias("word"))
    return words.where(F.col("word") != "").groupBy("word").agg(F.count("*").alias("n"))


@pytest.fixture()
def wordcount_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  corpus: dict[str, Any]) -> Path:
    """The word count reads the rest of the text; its checkpoints and output
    go under ``tmp_path``."""
    env_for(monkeypatch, WORDCOUNT_INPUT=str(corpus["rest"]),
            WORDCOUNT_OUTPUT=str(tmp_path / "out"),
            WORDCOUNT_CHECKPOINTS=str(tmp_path / "checkpoints"))
    return tmp_path


def restored_run(job: Path, restore: str, parallelism: int,
                 backend: ef.StateBackend | None = None) -> ef.JobResult:
    env, _ = build_environment(job, parallelism=parallelism)
    if backend is not None:
        env.set_state_backend(backend)
    return env.execute(job.stem, restore=restore)


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_through_the_word_count(spark: Any, corpus: dict[str, Any],
                                           wordcount_env: Path, backend: str) -> None:
    tmp = wordcount_env
    path = bootstrap(spark, counts_df(spark, corpus["first"]), job=str(WORDCOUNT),
                     operator="count", key="word", state="count", value="n",
                     directory=str(tmp / "backfill"), parallelism=2, backend=backend)
    assert path == str(tmp / "backfill" / "chk-1")

    # What was written: the job's checkpoint at the start of its input.
    ref = open_checkpoint(path)
    meta = ref.meta
    assert set(meta.operators) == {n.uid for n in meta.graph.nodes}
    lines = meta.operators["lines"]
    assert lines.parallelism == 2 and all(p.is_source for p in lines.subtasks.values())
    size = os.path.getsize(corpus["rest"])
    # A split source: each subtask records its byte range's position.
    starts = sorted(at for p in lines.subtasks.values() for at in p.position.values())
    assert len(starts) == 2 and starts[0] == 0 and 0 < starts[1] < size  # the two splits' starts
    count = meta.operators["count"]
    handles = [count.subtasks[s].keyed for s in range(2)]
    assert all(h is not None and h.backend == backend for h in handles)
    assert [h.key_groups for h in handles if h is not None] == [range(0, 64), range(64, 128)]
    sink = next(uid for uid, op in meta.operators.items() if op.kind == "sink")
    assert all(not p.committables for p in meta.operators[sink].subtasks.values())
    (given,) = meta.bootstrap
    assert (given.operator, given.state, given.kind, given.rows) == (
        "count", "count", "value", len(corpus["early"]))
    # Every file is in the metadata with its size and checksum, and verifies.
    read_checkpoint(CheckpointStorage(ref.root), ref.id, verify_files=True)

    report = validate(spark, path, job=str(WORDCOUNT))
    assert report.ok, report.first_mismatches()
    assert report.compared == len(corpus["early"])
    assert report.bootstrapped == {"count/count": (len(corpus["early"]), path)}

    result = restored_run(WORDCOUNT, path, parallelism=2,
                          backend=(ef.RocksDBStateBackend(str(tmp / "db"))
                                   if backend == "rocksdb" else None))
    assert dict(result.state("count")) == corpus["whole"]

    # The streaming job's own checkpoint validates too: the replay of the
    # rest of the text starts from the rows bootstrapped.
    final = validate(spark, str(tmp / "checkpoints"), job=str(WORDCOUNT))
    assert final.ok, final.first_mismatches()
    assert final.compared == len(corpus["whole"])
    assert final.bootstrapped == report.bootstrapped
    if backend == "memory":
        # Without the checkpoint it started from, the history's input is
        # not all there: the counts bootstrapped show as mismatches.
        shutil.rmtree(tmp / "backfill")
        orphan = validate(spark, str(tmp / "checkpoints"), job=str(WORDCOUNT))
        assert not orphan.ok
        assert orphan.mismatch_count == len(corpus["early"])


def test_spark_values_become_what_a_job_holds() -> None:
    from pyspark.sql import Row

    struct = Row(total=3, items=["a", "b"], raw=bytearray(b"x"), tags={"k": Row(n=1)})
    assert _python(struct, False) == {"total": 3, "items": ["a", "b"], "raw": b"x",
                                      "tags": {"k": {"n": 1}}}
    assert _python(Row(a="x", b=Row(c=2, d=[1, 2])), True) == ("x", (2, (1, 2)))
    assert _python(bytearray(b"k"), True) == b"k"
    assert _python(["a", 1], True) == ("a", 1)


@pytest.mark.parametrize(("backend", "parallelism"),
                         [("memory", 1), ("memory", 3), ("rocksdb", 3)])
def test_restores_at_another_parallelism(spark: Any, corpus: dict[str, Any],
                                         wordcount_env: Path, backend: str,
                                         parallelism: int) -> None:
    path = bootstrap(spark, counts_df(spark, corpus["first"]), job=str(RESCALE),
                     operator="count", key="word", state="count", value="n",
                     directory=str(wordcount_env / "backfill"), parallelism=2, backend=backend)
    assert open_checkpoint(path).meta.operators["count"].parallelism == 2
    result = restored_run(RESCALE, path, parallelism=parallelism)
    assert dict(result.state("count")) == corpus["whole"]


def test_a_tampered_bootstrapped_checkpoint_fails_validation(
        spark: Any, corpus: dict[str, Any], wordcount_env: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = bootstrap(spark, counts_df(spark, corpus["first"]), job=str(WORDCOUNT),
                     operator="count", key="word", state="count", value="n",
                     directory=str(wordcount_env / "backfill"), parallelism=2)
    monkeypatch.setenv("COLUMNS", "300")
    ok = CliRunner().invoke(main, ["validate", path, "--job", str(WORDCOUNT)])
    assert ok.exit_code == 0, ok.output
    assert (f"replayed from {len(corpus['early']):,} rows bootstrapped into count/count "
            f"({path})") in ok.output
    changed, dropped = sorted(corpus["early"])[:2]
    # The state files rewritten and the metadata re-signed: it verifies, but
    # no longer holds the rows it was bootstrapped with.
    rewrite_state(path, "count", change_one_drop_one("count", changed, dropped))
    report = validate(spark, path, job=str(WORDCOUNT))
    assert not report.ok
    assert sorted(report.first_mismatches()) == [
        ("count", "count", changed, str(corpus["early"][changed]),
         str(corpus["early"][changed] + 1)),
        ("count", "count", dropped, str(corpus["early"][dropped]), None),
    ]


def test_mutable_values_of_a_process_functions_own_state(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import functions as F

    rng = random.Random(7)
    customers = [f"c{i}" for i in range(60)]
    lines = [f"{rng.choice(customers)} {rng.randint(1, 50)} {rng.choice('xyzw')}"
             for _ in range(800)]
    first, rest = tmp_path / "first.txt", tmp_path / "rest.txt"
    first.write_text("\n".join(lines[:500]) + "\n")
    rest.write_text("\n".join(lines[500:]) + "\n")
    env_for(monkeypatch, PROFILES_INPUT=str(rest),
            PROFILES_CHECKPOINTS=str(tmp_path / "checkpoints"))
    parts = F.split("value", " ")
    df = (spark.read.text(str(first))
          .select(parts[0].alias("customer"), parts[1].cast("long").alias("amount"),
                  parts[2].alias("item"))
          .groupBy("customer")
          .agg(F.sum("amount").alias("total"), F.collect_list("item").alias("items")))
    # Two columns: a dict per key, its array a list.
    path = bootstrap(spark, df, job=str(PROFILES), operator="profiles", key="customer",
                     state="profile", value=["total", "items"],
                     directory=str(tmp_path / "backfill"), parallelism=2)
    report = validate(spark, path, job=str(PROFILES))
    assert report.ok, report.first_mismatches()

    result = restored_run(PROFILES, path, parallelism=2)
    profiles = result.state("profiles", "profile")
    want: dict[str, dict[str, Any]] = {}
    for line in lines:
        c, amount, item = line.split()
        p = want.setdefault(c, {"total": 0, "items": []})
        p["total"] += int(amount)
        p["items"].append(item)
    # The items bought before and after the restore, in whatever order
    # Spark collected the first ones.
    assert {c: (p["total"], sorted(p["items"])) for c, p in profiles.items()} == {
        c: (p["total"], sorted(p["items"])) for c, p in want.items()}
    # Only the state named was bootstrapped: the other counts the rest alone.
    later = collections.Counter(line.split()[0] for line in lines[500:])
    assert dict(result.state("profiles", "purchases")) == dict(later)


def test_the_next_id_and_never_over_a_checkpoint(spark: Any, corpus: dict[str, Any],
                                                 wordcount_env: Path) -> None:
    directory = wordcount_env / "backfill"
    (directory / "chk-4").mkdir(parents=True)  # an incomplete one, say
    df = counts_df(spark, corpus["first"])
    kw: dict[str, Any] = {"job": str(WORDCOUNT), "operator": "count", "key": "word",
                          "state": "count", "value": "n", "directory": str(directory),
                          "parallelism": 2}
    assert bootstrap(spark, df, **kw) == str(directory / "chk-5")
    assert bootstrap(spark, df, **kw) == str(directory / "chk-6")
    assert sorted(os.listdir(directory / "chk-4")) == []


def test_clear_errors(spark: Any, corpus: dict[str, Any], wordcount_env: Path) -> None:
    directory = wordcount_env / "backfill"
    df = counts_df(spark, corpus["first"])
    kw: dict[str, Any] = {"job": str(WORDCOUNT), "operator": "count", "key": "word",
                          "state": "count", "value": "n", "directory": str(directory),
                          "parallelism": 2}
    with pytest.raises(BootstrapError, match=r"has no operator 'counter'; its keyed "
                                             r"operators are 'count' \(count\)"):
        bootstrap(spark, df, **{**kw, "operator": "counter"})
    with pytest.raises(BootstrapError, match=r"'tokenize' .* is a flat_map operator, which "
                                             r"holds no keyed state"):
        bootstrap(spark, df, **{**kw, "operator": "tokenize"})
    with pytest.raises(BootstrapError, match=r"operator 'count' .* has no state 'counts'; "
                                             r"it declares 'count' \(value\)"):
        bootstrap(spark, df, **{**kw, "state": "counts"})
    with pytest.raises(BootstrapError, match=r"no column 'total'; its columns are 'word', 'n'"):
        bootstrap(spark, df, **{**kw, "value": "total"})
    with pytest.raises(BootstrapError, match=r"no column 'words'"):
        bootstrap(spark, df, **{**kw, "key": "words"})
    with pytest.raises(BootstrapError, match=r"backend must be one of memory, rocksdb"):
        bootstrap(spark, df, **{**kw, "backend": "heap"})
    # Found on an executor: raised as itself, and nothing is left behind.
    twice = df.unionAll(df.limit(1))
    with pytest.raises(BootstrapError, match=r"is given twice"):
        bootstrap(spark, twice, **kw)
    nulls = df.selectExpr("word", "CAST(NULL AS BIGINT) AS n")
    with pytest.raises(BootstrapError, match=r"column 'n' is null for key"):
        bootstrap(spark, nulls, **kw)
    floats = df.selectExpr("CAST(n AS DOUBLE) AS n", "array(word) AS word")
    with pytest.raises(BootstrapError, match=r"column 'word': key"):
        bootstrap(spark, floats, **kw, key_fn=lambda k: list(k))
    assert sorted(os.listdir(directory)) == ["_commits", "_lock", "shared"]
    assert os.listdir(directory / "shared") == []


def test_the_metadata_says_where_the_state_came_from(spark: Any, corpus: dict[str, Any],
                                                     wordcount_env: Path) -> None:
    path = bootstrap(spark, counts_df(spark, corpus["first"]), job=str(WORDCOUNT),
                     operator="count", key="word", state="count", value="n",
                     directory=str(wordcount_env / "backfill"), parallelism=2)
    with open(os.path.join(path, "_metadata")) as f:
        raw = json.load(f)
    (given,) = raw["bootstrap"]
    assert given["origin"] == "DataFrame[word: string, n: bigint]: key 'word', value 'n'"
    paths = {f["path"] for f in raw["files"]}
    assert {f["path"] for f in given["files"]} <= paths


def test_an_empty_dataframe_bootstraps_empty_state(spark: Any, corpus: dict[str, Any],
                                                   wordcount_env: Path) -> None:
    empty = counts_df(spark, corpus["first"]).where("n < 0")
    path = bootstrap(spark, empty, job=str(WORDCOUNT), operator="count", key="word",
                     state="count", value="n", directory=str(wordcount_env / "backfill"),
                     parallelism=2, backend="rocksdb")
    (given,) = open_checkpoint(path).meta.bootstrap
    assert (given.rows, given.files) == (0, ())
    assert validate(spark, path, job=str(WORDCOUNT)).ok
    result = restored_run(WORDCOUNT, path, parallelism=2)
    later = collections.Counter(w for w in corpus["rest"].read_text().split())
    assert dict(result.state("count")) == dict(later)
