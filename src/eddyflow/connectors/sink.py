"""The sink protocol, and the in-memory and print sinks.

Exactly-once output is a two-phase commit driven by checkpoints
(docs/connectors.md, Writing a sink): a writer appends records to a pending
transaction; on a barrier it *prepares* it and returns a JSON-serialisable
*committable*; when the checkpoint completes the sink *commits* the
committables, idempotently, since recovery commits again what a restored
checkpoint recorded. The end of a bounded input acts as a final checkpoint.

Every method that may do I/O may be a coroutine function (``async def``):
the writer's ``write``, ``prepare_commit``, ``abort`` and ``close``, the
sink's ``commit``, ``recover`` and ``supersede``. The runtime awaits them on
the job's event loop, so a sink that waits for a database or a service lets
the job's other tasks run meanwhile; synchronous methods are called as they
are (a writer's kind is found once, when its subtask opens it).
"""

from __future__ import annotations

import inspect
import secrets
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["ListSink", "PrintSink", "Sink", "SinkWriter", "awaited"]


async def awaited(result: Any) -> Any:
    """``result`` of a sink method that may be a coroutine function: awaited
    if it is an awaitable, else as it is. For the calls made once per
    checkpoint or run (commit, recover, supersede); a writer's per-batch
    calls are told apart once, when the writer is opened."""
    if inspect.isawaitable(result):
        return await result
    return result


class SinkWriter(ABC):
    """Writes the records of one sink subtask.

    Each method may be ``async def`` (see the module docstring); the runtime
    never calls two of one writer's methods at the same time, and awaits
    ``write`` before it takes the subtask's next input: a slow writer
    back-pressures its inputs instead of buffering records without bound.
    """

    @abstractmethod
    def write(self, records: list[Any]) -> Any:
        """Add records to the pending transaction (one call per batch)."""

    def prepare_commit(self, checkpoint_id: int) -> Any:
        """Close the pending transaction as part of checkpoint ``checkpoint_id``.

        Returns a committable (JSON-serialisable) or ``None`` when there is
        nothing to commit.
        """
        return None

    def abort(self) -> Any:
        """Discard the pending transaction (the job is failing or cancelled)."""
        return None

    def close(self) -> Any:
        """Release the writer's resources (a connection): called once, when
        its subtask ends, after its last ``prepare_commit`` or after
        ``abort``."""
        return None


class Sink(ABC):
    """What ``sink_to`` takes."""

    @property
    def name(self) -> str:
        """A description of the sink (its type, and folder name): an unnamed
        sink's uid in checkpoints is derived from it, so it must be the same
        in every run of the job."""
        return type(self).__name__

    def for_job(self, job: str, uid: str) -> Sink:
        """This sink as job ``job`` runs it under operator uid ``uid``: the
        object the runtime creates writers from and commits, recovers and
        supersedes with. The default is the sink itself. A sink that names
        its transactions in the external system after the job (so that
        ``recover`` finds the job's own, and no other job's) returns a copy
        that knows both; the runtime may call this more than once with the
        same arguments, so the copies must behave alike."""
        return self

    @abstractmethod
    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        """The writer of sink subtask ``subtask`` out of ``parallelism``."""

    def commit(self, committables: list[Any]) -> Any:
        """Make prepared transactions visible; called again after recovery, so
        committing an already committed transaction must be a no-op."""
        return None

    def recover(self, committed: list[Any]) -> Any:
        """Before a (re)start: commit what the restored checkpoint recorded
        and discard every other transaction left pending by an earlier attempt."""
        return self.commit(committed)

    def supersede(self, checkpoint_id: int, committables: list[Any]) -> Any:
        """Take back the output committed for checkpoint ``checkpoint_id``.

        Called before a restore from an earlier checkpoint, which will
        produce that output again: move it aside (keep it recoverable) and
        return where it went, for the warning the runtime logs, or ``None``
        if none of it is here (another sink object or folder, or taken back
        already). Must be idempotent, like :meth:`commit`. A sink that does
        not override this cannot take output back: a restore that would
        need it is refused rather than emitting that output twice.
        Returns ``str | None`` (or an awaitable of it)."""
        return None


class ListSink(Sink):
    """Collects committed records in memory; read ``.results`` after the run.

    ``results`` holds committed records only, in commit order. Output a
    restore from an earlier checkpoint takes back (see :meth:`Sink.supersede`)
    moves from ``results`` to ``superseded``.
    """

    def __init__(self) -> None:
        self.results: list[Any] = []
        self.superseded: list[Any] = []
        self._staged: dict[tuple[int, str], list[Any]] = {}
        # Committed transactions in commit order, with their record counts:
        # what supersede needs to find a transaction's records in `results`.
        self._committed: dict[tuple[int, str], int] = {}
        # Transaction names never repeat across sinks or runs (a restored
        # checkpoint's committables may come from another ListSink object).
        self._token = secrets.token_hex(4)
        self._next_txn = 0
        # Writers may run in other threads in future executors; cheap insurance.
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return "list-sink"

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        return _ListWriter(self._stage, subtask)

    def _stage(self, subtask: int, records: list[Any]) -> list[Any]:
        """Keep a writer's prepared records until their commit; returns the
        committable that names them."""
        with self._lock:
            txn = f"{self._token}-{self._next_txn}"
            self._next_txn += 1
            self._staged[(subtask, txn)] = records
        return [subtask, txn]

    def rename_transactions(self) -> None:
        """Name this copy's transactions apart from every other copy's: a
        worker process's copy of the sink (forked) would repeat the names
        of the copy it was forked from."""
        with self._lock:
            self._token = secrets.token_hex(4)
            self._next_txn = 0

    def take_staged(self) -> dict[tuple[int, str], list[Any]]:
        """Remove and return the prepared, uncommitted records: a worker
        process (``runtime/workers/``) ships them to the calling process,
        whose sink commits them (:meth:`add_staged`)."""
        with self._lock:
            staged, self._staged = self._staged, {}
        return staged

    def add_staged(self, staged: dict[tuple[int, str], list[Any]]) -> None:
        """Prepared records of this sink's copy in a worker process, to be
        committed here by their committables."""
        with self._lock:
            self._staged.update(staged)

    def commit(self, committables: list[Any]) -> None:
        with self._lock:
            for subtask, txn in committables:
                records = self._staged.pop((subtask, txn), None)
                if records is not None:  # None: committed already
                    self.results.extend(records)
                    self._committed[(subtask, txn)] = len(records)

    def supersede(self, checkpoint_id: int, committables: list[Any]) -> str | None:
        gone = {(subtask, txn) for subtask, txn in committables}
        with self._lock:
            if not gone & self._committed.keys():
                return None  # taken back already, or never here
            if len(self.results) != sum(self._committed.values()):
                raise RuntimeError(
                    "ListSink.results was changed outside the sink: the output of "
                    f"checkpoint {checkpoint_id} cannot be taken back")
            kept: list[Any] = []
            at = 0
            for txn, n in list(self._committed.items()):
                records = self.results[at:at + n]
                at += n
                if txn in gone:
                    self.superseded.extend(records)
                    del self._committed[txn]
                else:
                    kept.extend(records)
            self.results[:] = kept
        return "ListSink.superseded"

    def recover(self, committed: list[Any]) -> None:
        self.commit(committed)
        with self._lock:
            self._staged.clear()

    def __getstate__(self) -> dict[str, Any]:
        # A copy for a worker process (runtime/workers/spawn.py): its own lock.
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ListSink({len(self.results)} committed)"


class _ListWriter(SinkWriter):
    def __init__(self, stage: Callable[[int, list[Any]], list[Any]], subtask: int) -> None:
        self._stage = stage  # the sink's: holds prepared records until the commit
        self._subtask = subtask
        self._pending: list[Any] = []

    def write(self, records: list[Any]) -> None:
        self._pending.extend(records)

    def prepare_commit(self, checkpoint_id: int) -> Any:
        if not self._pending:
            return None
        pending, self._pending = self._pending, []
        return self._stage(self._subtask, pending)

    def abort(self) -> None:
        self._pending = []


class PrintSink(Sink):
    """Prints each record as it arrives (not transactional, like Flink's)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    @property
    def name(self) -> str:
        return "print"

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        prefix = f"{subtask + 1}> " if parallelism > 1 else ""
        return _PrintWriter(self._stream, prefix)


class _PrintWriter(SinkWriter):
    def __init__(self, stream: TextIO | None, prefix: str) -> None:
        self._stream = stream
        self._prefix = prefix

    def write(self, records: list[Any]) -> None:
        out = self._stream or sys.stdout
        p = self._prefix
        out.write("".join(f"{p}{r}\n" for r in records))
