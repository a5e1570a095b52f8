"""``FileSink``: exactly-once JSON Lines files.

Layout inside the sink's folder (docs/connectors.md): committed data is exactly the files
named ``part-*``; a transaction in progress is ``.part-*.inprogress``, a
prepared one ``.part-*.pending``; readers ignore names that begin with ``.``
or ``_``. Preparing fsyncs and renames in-progress to pending; committing
renames pending to its final ``part-*`` name (atomic on POSIX) and fsyncs the
folder. A commit whose pending file is gone and whose final file exists was
done already, which makes commits idempotent for recovery.

Output that a restore from an earlier checkpoint will produce again is moved
into ``_superseded/chk-<n>/`` (ignored by readers, kept for whoever wants it
back), file by file, so that the folder never holds a record twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from typing import IO, Any

from eddyflow.checkpoint.durable import fsync_dir
from eddyflow.connectors.sink import Sink, SinkWriter

__all__ = ["FileSink"]


class FileSink(Sink):
    """Exactly-once JSON Lines files in the folder ``path`` (see the module
    docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    @property
    def name(self) -> str:
        return f"file-sink:{os.path.basename(self.path.rstrip('/'))}"

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise OSError(f"FileSink cannot create folder {self.path!r}: {exc}") from exc
        return _FileWriter(self, subtask)

    def commit(self, committables: list[Any]) -> None:
        for pending, final in committables:
            src = os.path.join(self.path, pending)
            dst = os.path.join(self.path, final)
            if os.path.exists(src):
                os.replace(src, dst)
            elif not os.path.exists(dst):
                raise FileNotFoundError(
                    f"FileSink {self.path!r}: prepared file {pending!r} is missing and was "
                    "never committed; the output of that transaction is lost"
                )
        if committables:
            fsync_dir(self.path)

    def supersede(self, checkpoint_id: int, committables: list[Any]) -> str | None:
        aside = os.path.join(self.path, "_superseded", f"chk-{checkpoint_id}")
        moved = False
        for _pending, final in committables:
            src = os.path.join(self.path, final)
            if not os.path.exists(src):
                # Moved already, or never committed: then its pending file
                # is discarded by recover() like any unrecorded transaction.
                continue
            os.makedirs(aside, exist_ok=True)
            os.replace(src, os.path.join(aside, final))
            moved = True
        if not moved:
            return None  # taken back already, or never here
        fsync_dir(aside)
        fsync_dir(os.path.dirname(aside))
        fsync_dir(self.path)
        return aside

    def recover(self, committed: list[Any]) -> None:
        if not os.path.isdir(self.path):
            return
        self.commit(committed)
        # Every other in-progress or prepared file belongs to a transaction
        # that no completed checkpoint recorded: its records will be replayed.
        for name in os.listdir(self.path):
            if name.startswith(".part-") and name.endswith((".inprogress", ".pending")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.path, name))


class _FileWriter(SinkWriter):
    def __init__(self, sink: FileSink, subtask: int) -> None:
        self._sink = sink
        self._subtask = subtask
        # Part names of separate runs (and restarts) into one folder must
        # never collide: committables carry the names, so any token works.
        self._token = secrets.token_hex(4)
        self._txn = 0
        self._file: IO[str] | None = None
        self._name = ""

    def _open(self) -> IO[str]:
        self._name = f"part-{self._token}-{self._subtask}-{self._txn}"
        path = os.path.join(self._sink.path, f".{self._name}.inprogress")
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed on prepare/abort
        return self._file

    def write(self, records: list[Any]) -> None:
        f = self._file or self._open()
        try:
            f.write("".join([json.dumps(r) + "\n" for r in records]))
        except TypeError:
            for r in records:  # name the record that cannot be written
                try:
                    json.dumps(r)
                except TypeError as exc:
                    raise TypeError(
                        f"FileSink {self._sink.path!r} cannot write record {r!r:.200}: {exc}"
                    ) from exc
            raise

    def prepare_commit(self, checkpoint_id: int) -> Any:
        f = self._file
        if f is None:
            return None
        f.flush()
        os.fsync(f.fileno())
        f.close()
        self._file = None
        name = self._name
        os.replace(
            os.path.join(self._sink.path, f".{name}.inprogress"),
            os.path.join(self._sink.path, f".{name}.pending"),
        )
        self._txn += 1
        return [f".{name}.pending", name]

    def abort(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            f.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._sink.path, f".{self._name}.inprogress"))
