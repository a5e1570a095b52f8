"""eddyflow ships itself to Spark executors (``offline/shipping.py``).

On the standalone cluster (``standalone`` fixture: executors run a bare
Python, with no eddyflow, no anyio, no pyspark installed) and on
``local[2]`` with the same bare Python, a driver program builds its own
``SparkSession`` (no ``PYSPARK_PYTHON``) and reads, validates and reads a
RocksDB checkpoint, reads the changes between two checkpoints and
bootstraps a word count's state from a DataFrame: the same results on
both, equal to what the jobs computed. The driver runs in a child
process (``cluster_driver.py``): one SparkContext per process, and its
environment is the test's to set. Then, without a cluster: what is
shipped, once, and the errors that name a module an executor lacks."""

from __future__ import annotations

import collections
import json
import os
import random
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES
from job_support import BACKENDS

import eddyflow as ef
from eddyflow.jobfile import build_environment
from eddyflow.offline import read_state
from eddyflow.offline import shipping as shipping_module
from eddyflow.offline.errors import original_error
from eddyflow.offline.shipping import (
    ExecutorDependencyMissing,
    executor_imports,
    import_on_executor,
    ship_to_executors,
    shipped,
)

HERE = Path(__file__).parent
DRIVER = HERE / "cluster_driver.py"
WORDCOUNT = EXAMPLES / "wordcount.py"
PACKAGED = HERE / "jobs" / "packaged_wordcount.py"
PHASED = HERE / "jobs" / "phased_state.py"
SRC = str(Path(ef.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The word count's final checkpoint, of each state backend."""
    tmp = tmp_path_factory.mktemp("wordcount")
    out: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORDCOUNT_OUTPUT", str(tmp / "out"))
        for backend in BACKENDS:
            env, _ = build_environment(WORDCOUNT, parallelism=2)
            if backend == "rocksdb":
                env.set_state_backend(ef.RocksDBStateBackend(tmp / "rocks"))
            env.enable_checkpointing(interval=1.0, directory=tmp / backend)
            result = env.execute(f"wordcount-{backend}")
            out[backend] = str(tmp / backend)
            out[f"{backend}_counts"] = result.state("count")
    assert out["memory_counts"] == out["rocksdb_counts"] and len(out["memory_counts"]) > 500
    return out


def _scrubbed_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update(extra)
    return env


def drive(tmp: Path, name: str, spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Run ``cluster_driver.py`` with ``spec``; what it printed."""
    spec_path = tmp / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, str(DRIVER), str(spec_path)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and results, f"{name} driver failed:\n{done.stderr[-6000:]}"
    got: dict[str, Any] = json.loads(results[-1][len("RESULT "):])
    return got


@pytest.fixture(scope="module")
def phased(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """jobs/phased_state.py on each backend: its checkpoint directory, the
    last checkpoint at the end of phase one and the final one (changes,
    deletions, rewrites and short-lived keys between them; the memory
    backend's pair is read from its delta files, RocksDB's diffed)."""
    out: dict[str, dict[str, Any]] = {}
    keys = 2_000
    for backend in BACKENDS:
        tmp = tmp_path_factory.mktemp(f"phased-{backend}")
        chk = tmp / "chk"
        with pytest.MonkeyPatch.context() as mp:
            for k, v in {"PHASED_KEYS": str(keys), "PHASED_CHANGED": "50",
                         "PHASED_CHECKPOINTS": str(chk), "PHASED_BACKEND": backend,
                         "PHASED_ROCKSDB": str(tmp / "rocks")}.items():
                mp.setenv(k, v)
            env, _ = build_environment(PHASED, parallelism=2)
            if backend == "rocksdb":
                env.set_state_backend(ef.RocksDBStateBackend(tmp / "rocks"))
            env.enable_checkpointing(interval=0.05, directory=chk, retained=1000)
            env.execute("phased")
        infos = ef.list_checkpoints(chk)
        at_gate = [i.id for i in infos if any(
            p.is_source and p.position == keys
            for op in i.meta.operators.values() for p in op.subtasks.values())]
        assert at_gate and infos[-1].final
        out[backend] = {"dir": str(chk), "start": at_gate[-1], "end": infos[-1].id}
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A text in two parts, for a bootstrap from the first and a streaming
    word count over the rest, and the word count of all of it."""
    rng = random.Random(16)
    vocabulary = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 5)))
                  for _ in range(300)]
    lines = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 10)))
             for _ in range(1200)]
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "first.txt").write_text("\n".join(lines[:700]) + "\n")
    (folder / "rest.txt").write_text("\n".join(lines[700:]) + "\n")
    return {"first": str(folder / "first.txt"), "rest": str(folder / "rest.txt"),
            "whole": dict(collections.Counter(w for line in lines for w in line.split())),
            "early": len({w for line in lines[:700] for w in line.split()})}


@pytest.fixture(scope="module")
def runs(standalone: Any, checkpoints: dict[str, Any], phased: dict[str, dict[str, Any]],
         corpus: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[dict[str, dict[str, Any]]]:
    """The driver program on ``local[2]`` and on the cluster."""
    tmp = tmp_path_factory.mktemp("drivers")
    common = {"src": SRC, "memory": checkpoints["memory"], "rocksdb": checkpoints["rocksdb"],
              "job": str(WORDCOUNT), "packaged_job": str(PACKAGED), "changes": phased}

    def backfill(where: str) -> dict[str, Any]:
        return {"text": corpus["first"], "job": str(WORDCOUNT),
                "env": {"WORDCOUNT_INPUT": corpus["rest"]},
                "dirs": {b: str(tmp / f"backfill-{where}-{b}") for b in BACKENDS}}
    quiet = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    # local[2]: executors are the driver's children and inherit its
    # environment, PYTHONPATH included; so eddyflow is put on the driver's
    # sys.path by the driver itself, and the bare Python is first on PATH
    # (what "python3" runs when PYSPARK_PYTHON is not set).
    local = drive(tmp, "local", {**common, "master": "local[2]", "conf": quiet,
                                 "bootstrap": backfill("local")},
                  _scrubbed_env(PATH=f"{standalone.python_bin}{os.pathsep}"
                                     f"{os.environ.get('PATH', '')}"))
    # The cluster: the driver has eddyflow on its PYTHONPATH, as a user's
    # shell might; executors must not get it from there.
    cluster = drive(tmp, "cluster",
                    {**common, "master": standalone.master_url,
                     "conf": {**quiet, **standalone.session_conf()},
                     "bootstrap": backfill("cluster")},
                    standalone.driver_env(_scrubbed_env(PYTHONPATH=SRC)))
    yield {"local": local, "cluster": cluster}


@pytest.mark.cluster
def test_executors_run_a_python_without_eddyflow(runs: dict[str, dict[str, Any]],
                                                 standalone: Any) -> None:
    bare = os.path.realpath(standalone.python)
    assert runs["cluster"]["pythonpath"] == SRC and runs["cluster"]["pyspark_python"] is None
    for where in ("local", "cluster"):
        # Before anything of eddyflow ran: the executors' Python is the bare
        # one, and imports neither eddyflow nor its dependencies.
        assert runs[where]["before"] == [[bare, None, None]], where
        # After: both come from the shipped zip.
        [(python, eddyflow_from, anyio_from)] = runs[where]["after"]
        assert python == bare
        assert ".zip/eddyflow/__init__.py" in eddyflow_from, where
        assert ".zip/anyio/__init__.py" in anyio_from, where


@pytest.mark.cluster
def test_readers_and_validate_on_the_cluster_as_on_local(runs: dict[str, dict[str, Any]],
                                                         checkpoints: dict[str, Any]) -> None:
    local, cluster = runs["local"], runs["cluster"]
    counts = {w: str(n) for w, n in checkpoints["memory_counts"].items()}
    # (as text: the value column's type is the readers' to choose)
    assert {k: str(v) for k, v, _ in local["state"]} == counts
    for field in ("state", "positions", "rocksdb_state", "validate_job",
                  "validate_packaged_job"):
        assert cluster[field] == local[field], field
    # Read by the executors from the RocksDB checkpoint: the same rows.
    assert cluster["rocksdb_state"] == cluster["state"]
    assert len(cluster["positions"]) == 2
    for name in ("validate_job", "validate_packaged_job"):
        report = cluster[name]
        assert report["ok"] and report["mismatches"] == 0 and not report["unreplayed"], name
        assert report["compared"] == len(counts)


@pytest.mark.cluster
@pytest.mark.parametrize("backend", BACKENDS)
def test_read_changes_on_the_cluster_as_on_local(runs: dict[str, dict[str, Any]],
                                                 backend: str) -> None:
    """The rows of read_changes, read by executors without eddyflow, are
    those of local[2], and the difference of the two read_state results
    computed here (exact), or give the end's state when applied to the
    start's (as read from the delta files)."""
    local, cluster = runs["local"][f"changes_{backend}"], runs["cluster"][f"changes_{backend}"]
    assert cluster == local
    start = {(op, st, k): v for op, st, k, v in cluster["start"]}
    end = {(op, st, k): v for op, st, k, v in cluster["end"]}
    want = {k: ("upsert", v) for k, v in end.items() if start.get(k) != v}
    want.update({k: ("delete", None) for k in start if k not in end})
    assert len(want) == 100  # 50 changed, 50 cleared (jobs/phased_state.py)

    def as_changes(rows: list[list[Any]]) -> dict[tuple[str, str, str], tuple[str, Any]]:
        return {(op, st, k): (change, None if change == "delete" else v)
                for _, change, op, _, k, st, v in rows}

    assert as_changes(cluster["exact=True"]) == want
    applied = dict(start)
    for k, (change, v) in as_changes(cluster["exact=False"]).items():
        if change == "upsert":
            applied[k] = v
        else:
            applied.pop(k, None)
    assert applied == end


@pytest.mark.cluster
def test_bootstrap_on_the_cluster_as_on_local(runs: dict[str, dict[str, Any]],
                                              corpus: dict[str, Any], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts of the first part of a text, computed by Spark and
    bootstrapped by executors without eddyflow, validate; the streaming
    word count restored from them over the rest of the text ends with the
    word count of the whole text, as from local[2]'s."""
    monkeypatch.setenv("WORDCOUNT_INPUT", corpus["rest"])
    monkeypatch.setenv("WORDCOUNT_OUTPUT", str(tmp_path / "out"))
    for where in ("local", "cluster"):
        for backend, made in runs[where]["bootstrap"].items():
            assert made["ok"] and made["mismatches"] == 0, (where, backend, made)
            assert made["compared"] == corpus["early"], (where, backend)
            monkeypatch.setenv("WORDCOUNT_CHECKPOINTS", str(tmp_path / where / backend))
            env, _ = build_environment(WORDCOUNT, parallelism=2)
            if backend == "rocksdb":
                env.set_state_backend(ef.RocksDBStateBackend(tmp_path / f"db-{where}"))
            result = env.execute("wordcount", restore=made["path"])
            assert dict(result.state("count")) == corpus["whole"], (where, backend)


@pytest.mark.cluster
def test_shipped_once_per_context_and_logged(runs: dict[str, dict[str, Any]]) -> None:
    for where in ("local", "cluster"):
        run = runs[where]
        [first] = run["first_logs"]
        # (which packages besides anyio and aiofiles depends on their versions)
        assert first.startswith("shipped eddyflow with "), first
        assert "aiofiles, anyio" in first and " to the executors of " in first, first
        assert run["second_logs"] == []  # a second call ships nothing
        # Later calls (positions, two validations, the RocksDB read) ship
        # only what was new: the package beside the second job, rocksdict.
        assert len(run["logs"]) == 2, run["logs"]
        assert "shipped the job's modules wordsplit" in run["logs"][0]
        assert "shipped rocksdict (binary" in run["logs"][1]
        assert [s.split(":")[0] for s in run["shipped"]] == ["eddyflow", "job", "native"]


@pytest.mark.cluster
def test_a_module_an_executor_lacks_is_named(runs: dict[str, dict[str, Any]],
                                             standalone: Any) -> None:
    kind, message = runs["cluster"]["missing"]
    assert kind == "ExecutorDependencyMissing"
    assert "module 'eddyflow_absent_module'" in message
    assert "python-bin/python3" in message and "install it there" in message


@pytest.mark.cluster
def test_cli_validates_on_the_cluster(standalone: Any, checkpoints: dict[str, Any]) -> None:
    env = standalone.driver_env(_scrubbed_env(PYTHONPATH=SRC))
    done = subprocess.run(
        [sys.executable, "-c", "from eddyflow.cli.main import main; main()", "validate",
         checkpoints["memory"], "--job", str(WORDCOUNT), "--master", standalone.master_url],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "consistent" in done.stdout + done.stderr


# --- without a cluster -------------------------------------------------------------


def test_a_second_call_ships_nothing(spark: Any, checkpoints: dict[str, Any],
                                     caplog: pytest.LogCaptureFixture) -> None:
    read_state(spark, checkpoints["memory"]).count()
    assert "eddyflow" in shipped(spark)
    caplog.set_level("INFO", logger="eddyflow.offline")
    ship_to_executors(spark)
    ship_to_executors(spark.sparkContext)
    read_state(spark, checkpoints["memory"]).count()
    assert [r for r in caplog.records if r.getMessage().startswith("shipped")] == []


def test_the_zip_holds_eddyflow_and_its_pure_python_imports() -> None:
    imports = executor_imports()
    assert {"anyio", "aiofiles"} <= set(imports)
    # Asked of this tree's eddyflow, not of another installed copy.
    assert imports["eddyflow"] == [os.path.dirname(os.path.abspath(ef.__file__))]
    bundle = shipping_module._eddyflow_bundle()
    assert set(bundle.extras) == set(imports) - {"eddyflow", "pyspark", "py4j"}
    names = zipfile.ZipFile(bundle.path).namelist()
    assert "eddyflow/__init__.py" in names and "eddyflow/offline/shipping.py" in names
    assert "anyio/__init__.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith((".so", ".pyc"))]
    # Built once: the same file again.
    assert shipping_module._eddyflow_bundle().path == bundle.path


def test_module_not_found_on_an_executor_is_named() -> None:
    class PythonException(Exception):  # named as pyspark's
        pass

    text = ("An exception was thrown from the Python worker:\n"
            "Traceback (most recent call last):\n"
            '  File "/spark/python/pyspark/worker.py", line 1, in main\n'
            "    func = read_command(serializer, infile)\n"
            "ModuleNotFoundError: No module named 'numpy'\n")
    got = original_error(PythonException(text))
    assert isinstance(got, ExecutorDependencyMissing)
    assert "No module named 'numpy'" in str(got) and "install" in str(got)


def _native_zip(folder: Path, tag: str, module: str, body: str) -> None:
    with zipfile.ZipFile(folder / f"eddyflow-native-{module}-{tag}-0123456789abcdef.zip",
                         "w") as z:
        z.writestr(f"{module}/__init__.py", body)


def test_a_shipped_native_module_is_unpacked_and_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipping_module, "_spark_files_root", lambda: str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    tag = shipping_module._native_name("eddyflow_fake_native")[
        len("eddyflow-native-eddyflow_fake_native-"):]
    _native_zip(tmp_path, tag, "eddyflow_fake_native", "VALUE = {'shipped': [1, 2]}\n")
    try:
        mod = import_on_executor("eddyflow_fake_native")
        assert mod.VALUE == {"shipped": [1, 2]}
        assert Path(mod.__file__).parent.parent.parent == tmp_path
    finally:
        sys.modules.pop("eddyflow_fake_native", None)


def test_a_native_module_of_another_platform_is_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipping_module, "_spark_files_root", lambda: str(tmp_path))
    _native_zip(tmp_path, "cpython-39-aarch64-linux-gnu-so", "eddyflow_fake_other", "")
    with pytest.raises(ExecutorDependencyMissing) as err:
        import_on_executor("eddyflow_fake_other")
    message = str(err.value)
    assert "'eddyflow_fake_other'" in message and sys.executable in message
    assert "another Python or platform (cpython-39-aarch64-linux-gnu-so)" in message
