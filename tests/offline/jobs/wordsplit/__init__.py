"""A package beside a job file, for the cluster tests: executors that have
only what eddyflow ships import it by name (cloudpickle pickles a package
under the job's folder by reference), so it must be shipped with the job."""

from __future__ import annotations

from wordsplit.words import tokenize

__all__ = ["tokenize"]
