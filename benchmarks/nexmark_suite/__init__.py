"""The Nexmark benchmark suite for eddyflow: a seeded event generator
(``generator``), the queries on eddyflow (``queries``) and plain-Python
references (``reference``). ``benchmarks/nexmark.py`` runs and times them;
``tests/integration/test_nexmark.py`` checks them with failures.
"""
