# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create the virtual environment on first use; nothing else is needed
# beyond Python 3.11, Java 17 (for the Spark jobs of eddyflow.offline) and the
# PostgreSQL server package (the connector's tests start a private server).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all test-cluster lint docs bench bench-all clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,spark,docs,postgres]'
	touch $(STAMP)

$(VENV)/.bench: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,spark,docs,postgres,bench]'
	touch $(VENV)/.bench

demo: $(STAMP)
	$(PY) examples/wordcount.py
	$(VENV)/bin/eddyflow validate checkpoints/wordcount --job examples/wordcount.py --master 'local[2]'

lint: $(STAMP)
	$(PY) -m ruff check src tests examples benchmarks
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml) into site/; --strict fails on any warning
# (a broken link or anchor, a docstring mkdocstrings cannot render).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet

# Two pytest processes (tests/conftest.py says why, and how Spark's tests are
# grouped); TEST_PROCESSES=0 runs the suite in this process.
TEST_PROCESSES ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_PROCESSES) --dist loadgroup

test: lint docs
	$(PYTEST) -m "not slow" --durations=15

test-all: lint docs
	$(PYTEST)

# Only the tests on the local Spark standalone cluster (also part of `test`).
test-cluster: $(STAMP)
	$(PY) -m pytest -q -m cluster

bench: $(VENV)/.bench
	$(PY) benchmarks/throughput.py

bench-all: $(VENV)/.bench
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/overhead.py --plot docs/img/overhead.png
	$(PY) benchmarks/iterations.py
	$(PY) benchmarks/validate.py
	$(PY) benchmarks/offline.py
	$(PY) benchmarks/windows.py
	$(PY) benchmarks/nexmark.py --repeat 3

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
