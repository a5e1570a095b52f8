"""Checkpoint storage on a local folder (docs/concepts/checkpoints.md, What a checkpoint holds);
where each file lives is :class:`~eddyflow.checkpoint.layout.CheckpointLayout`'s.

Every file is written to a temporary name, fsynced, renamed, and its folder
fsynced, so a crash leaves either the old state or the new one, never half a
file under a real name. ``_metadata`` carries the size and SHA-256 of every
file of the checkpoint and a checksum of itself; a checkpoint whose
``_metadata`` is missing, unreadable, or does not match its files does not
exist for recovery (:meth:`CheckpointStorage.latest_valid` skips it with a
warning naming the file). This module reads and writes ``_metadata`` as JSON
and checks its envelope; what it says is modelled in ``checkpoint/metadata.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, ParamSpec, TypeVar

import aiofiles.os
import anyio
import anyio.lowlevel

from eddyflow.checkpoint.durable import fsync_dir
from eddyflow.checkpoint.layout import (
    COMMITS,
    SHARED,
    CheckpointLayout,
    parse_checkpoint_dir,
    temp_name,
)
from eddyflow.checkpoint.writer import FileWrite, WriterProcess
from eddyflow.checkpoint.writer_main import remove, seal_durably, write_durably

__all__ = ["CheckpointCorrupted", "CheckpointStorage", "FileHandle"]

log = logging.getLogger("eddyflow.checkpoint.listing")

FORMAT_VERSION = 1


#: Files verified by this process: absolute path -> (inode, size, mtime,
#: ctime, expected SHA-256) when they checked out.
_verified: dict[str, tuple[int, int, int, int, str]] = {}
_VERIFIED_MAX = 1 << 16


class CheckpointCorrupted(Exception):
    """A checkpoint's metadata or one of its files fails verification."""


@dataclass(frozen=True)
class FileHandle:
    """A durable file of a checkpoint: path relative to the checkpoint
    storage root, size in bytes and SHA-256 of the content."""

    path: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @staticmethod
    def from_json(d: dict[str, Any]) -> FileHandle:
        return FileHandle(str(d["path"]), int(d["size"]), str(d["sha256"]))


#: Without a writer process (``EDDYFLOW_WRITER_PROCESS=0``, or outside a job
#: run), files up to this size are written on the event loop's thread (a few
#: ms, fsync included); larger ones in one call on aiofiles' executor. A worker
#: thread of a busy event loop starves for the GIL: measured, a 54 KB state
#: file took up to 0.9 s off-loop and 3-7 ms inline, so that off-loop writes
#: let most checkpoints miss their interval (benchmarks/overhead.py).
INLINE_WRITE_LIMIT = 4 << 20


def _write_durably(path: str, chunks: list[bytes], *sync_dirs: str,
                   sync_before: Sequence[str] = ()) -> tuple[int, str]:
    """Fsync the existing folders ``sync_before``, write to a temporary name,
    fsync, rename over ``path``, then fsync ``sync_dirs``: a crash leaves the
    old file or the new one. (State files leave their folders' fsync to
    ``write_metadata``, which does it once per checkpoint before the metadata
    makes the checkpoint exist.) The same sequence as the writer process's,
    by the same code."""
    done = write_durably(path, chunks, sync_before=sync_before, sync_after=sync_dirs)
    return int(done["size"]), str(done["sha256"])


_P = ParamSpec("_P")
_R = TypeVar("_R")


async def _run_off_loop(fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    # A worker thread cannot be cancelled: shield the wait, so that a
    # cancelled job waits for the write to land instead of leaving it to
    # complete (a checkpoint, even) after the job has failed or restarted.
    with anyio.CancelScope(shield=True):
        result: _R = await aiofiles.os.wrap(fn)(*args, **kwargs)
    return result


def _encode_metadata(meta: dict[str, Any]) -> bytes:
    # Compact: indented, the metadata (mostly key-group indexes) took 0.74 ms
    # to encode at every checkpoint of benchmarks/overhead.py, compact 0.12
    # ms. `eddyflow checkpoints --show N` prints it for people.
    return json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()


def _checksum_of(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _check(path: str, size: int, sha256: str, handle: FileHandle) -> None:
    if size != handle.size:
        raise CheckpointCorrupted(f"{path}: {size} bytes, the metadata says {handle.size}")
    if sha256 != handle.sha256:
        raise CheckpointCorrupted(f"{path}: checksum mismatch")


class CheckpointStorage:
    """The checkpoints of one folder: writing their files durably, reading
    and verifying them, listing and removing them. ``root`` (absolute) names
    the folder: two storages are the same folder when their roots are
    equal; ``layout`` says where each file lives in it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.layout = CheckpointLayout(root)
        self.root = self.layout.root
        #: Set while a job runs: the helper process that does the writes
        #: (see :mod:`eddyflow.checkpoint.writer`); without it they are done here.
        self.writer: WriterProcess | None = None

    def _running_writer(self) -> WriterProcess | None:
        writer = self.writer
        return writer if writer is not None and writer.running else None

    # -- the folder ------------------------------------------------------------

    def ensure(self) -> None:
        """Create the folder and its ``shared/`` and ``_commits/`` folders."""
        created = False
        for sub in (SHARED, COMMITS):
            path = self.layout.path(sub)
            if not os.path.isdir(path):
                os.makedirs(path, exist_ok=True)
                created = True
        if created:
            # The commit journal's folder must survive a power loss with the
            # sink commits it vouches for.
            fsync_dir(self.root)

    def checkpoint_ids(self) -> list[int]:
        """Ids of every ``chk-<n>`` folder, complete or not, ascending."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(n for name in names if (n := parse_checkpoint_dir(name)) is not None)

    # -- writing ---------------------------------------------------------------

    async def write_file(self, relpath: str, chunks: Iterable[bytes]) -> FileHandle:
        """Write ``chunks`` durably to ``relpath`` (under the root) and return
        its handle. While a job runs, its writer process does it (see
        :mod:`eddyflow.checkpoint.writer`). Without one, small files are written
        inline (see ``INLINE_WRITE_LIMIT``) and a large one in one call off
        the loop."""
        path = self.layout.path(relpath)
        writer = self._running_writer()
        if writer is not None:
            size, sha = await writer.write(path, list(chunks))
            return FileHandle(relpath, size, sha)
        data = list(chunks)
        if sum(map(len, data)) <= INLINE_WRITE_LIMIT:
            size, sha = _write_durably(path, data)
        else:
            size, sha = await _run_off_loop(_write_durably, path, data)
        return FileHandle(relpath, size, sha)

    def start_write_file(self, relpath: str, chunks: Iterable[bytes]
                         ) -> Coroutine[Any, Any, FileHandle]:
        """:meth:`write_file`, with the request to the writer process (when
        there is one) sent before this returns, for a caller to await
        together with another write (see ``WriterProcess.start_write``).
        Await the result, or close it."""
        writer = self._running_writer()
        if writer is None:
            return self.write_file(relpath, chunks)
        written = writer.start_write(self.layout.path(relpath), list(chunks))

        async def handle() -> FileHandle:
            size, sha = await written
            return FileHandle(relpath, size, sha)

        return handle()

    def open_temp(self, relpath: str) -> tuple[str, BinaryIO]:
        """A new file under a temporary name next to ``relpath`` (under the
        root), for the caller to write in full, close and hand to
        :meth:`seal` (or delete): for a large file encoded straight into it
        rather than held in memory and copied through the writer's pipe."""
        path = self.layout.path(relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = temp_name(path)
        return tmp, open(tmp, "wb")

    async def seal(self, relpath: str, tmp: str) -> FileHandle:
        """Make the file written at ``tmp`` (see :meth:`open_temp`) durable
        under ``relpath``, as :meth:`write_file` would have written it; its
        handle, with the size and SHA-256 read back from the file."""
        path = self.layout.path(relpath)
        writer = self._running_writer()
        if writer is not None:
            size, sha = await writer.seal(tmp, path)
        else:
            done = await _run_off_loop(seal_durably, tmp, path)
            size, sha = int(done["size"]), str(done["sha256"])
        return FileHandle(relpath, size, sha)

    def small_write(self, relpath: str, data: bytes) -> FileWrite:
        """A small file under the root, its folder's entry included, for
        :meth:`write_all`."""
        path = self.layout.path(relpath)
        return FileWrite(path, data, sync_after=[os.path.dirname(path)])

    async def write_small(self, relpath: str, data: bytes) -> None:
        """Write a small file under the root durably, its folder's entry
        included (by the writer process when there is one)."""
        await self.write_all([self.small_write(relpath, data)])

    def metadata_write(self, checkpoint_id: int, meta: dict[str, Any]) -> FileWrite:
        """``chk-<n>/_metadata``, for :meth:`write_all`: from the moment it
        is written the checkpoint exists."""
        meta = dict(meta, format_version=FORMAT_VERSION, checkpoint_id=checkpoint_id)
        meta["checksum"] = _checksum_of(meta)
        data = _encode_metadata(meta)
        folder = self.layout.checkpoint_dir(checkpoint_id)
        path = self.layout.metadata(checkpoint_id)
        # The renames of the checkpoint's files must be durable before the
        # metadata that names them: each of their folders is fsynced, first.
        files_dirs = sorted({os.path.dirname(self.layout.path(str(f["path"])))
                             for f in meta.get("files", [])})
        return FileWrite(path, data, sync_before=files_dirs, sync_after=[folder, self.root])

    async def write_metadata(self, checkpoint_id: int, meta: dict[str, Any]) -> str:
        """Write ``chk-<n>/_metadata`` last and atomically; from this moment
        the checkpoint exists."""
        write = self.metadata_write(checkpoint_id, meta)
        await self.write_all([write])
        return write.path

    async def write_all(self, writes: Sequence[FileWrite]) -> None:
        """Write small files durably, in order, each before the next begins
        (the first failure raises, and the rest are not written): by the
        writer process in one round trip when there is one (the loop's cost
        and a turn of a busy loop per file, else), else here."""
        writer = self._running_writer()
        if writer is not None:
            await writer.write_batch(writes)
            return
        for w in writes:
            _write_durably(w.path, [w.data], *w.sync_after, sync_before=w.sync_before)
        await anyio.lowlevel.checkpoint()

    def discard(self, checkpoint_id: int) -> None:
        """Remove a checkpoint folder (aborted, superseded or incomplete).

        The metadata goes first, so a crash half-way through leaves an
        incomplete folder, never a complete-looking one with files missing."""
        # As the writer process does it:
        remove(self.layout.checkpoint_dir(checkpoint_id), self.layout.metadata(checkpoint_id))

    async def discard_async(self, checkpoint_id: int) -> None:
        """:meth:`discard`, by the writer process when there is one."""
        writer = self._running_writer()
        if writer is not None:
            await writer.remove(self.layout.checkpoint_dir(checkpoint_id),
                                self.layout.metadata(checkpoint_id))
        else:
            self.discard(checkpoint_id)

    # -- reading and verifying -------------------------------------------------

    def read_metadata(self, checkpoint_id: int) -> dict[str, Any]:
        """The verified metadata of a checkpoint; raises CheckpointCorrupted."""
        path = self.layout.metadata(checkpoint_id)
        try:
            with open(path, "rb") as f:
                meta = json.loads(f.read())
        except FileNotFoundError:
            folder = self.layout.checkpoint_dir(checkpoint_id)
            if not os.path.isdir(folder):
                raise CheckpointCorrupted(f"{folder}: no such checkpoint") from None
            raise CheckpointCorrupted(f"{path}: missing (the checkpoint never completed)") from None
        except (OSError, ValueError) as exc:
            raise CheckpointCorrupted(f"{path}: unreadable: {exc}") from exc
        if not isinstance(meta, dict) or meta.get("checksum") != _checksum_of(meta):
            raise CheckpointCorrupted(f"{path}: checksum mismatch (truncated or altered)")
        if meta.get("format_version") != FORMAT_VERSION:
            raise CheckpointCorrupted(
                f"{path}: format version {meta.get('format_version')!r}, expected {FORMAT_VERSION}"
            )
        return meta

    def verify_file(self, handle: FileHandle) -> None:
        """Check a file against its size and SHA-256. A file this process
        verified already is not hashed again while its inode, size, mtime
        and ctime are unchanged (RocksDB checkpoints reference the same
        shared SST files, checkpoint after checkpoint: verifying each one
        must not re-read them all every time)."""
        path = self.layout.path(handle.path)
        try:
            st = os.stat(path)
        except OSError as exc:
            raise CheckpointCorrupted(f"{path}: unreadable: {exc}") from exc
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, handle.sha256)
        key = os.path.abspath(path)
        if _verified.get(key) == stamp and st.st_size == handle.size:
            return
        digest = hashlib.sha256()
        size = 0
        try:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError as exc:
            raise CheckpointCorrupted(f"{path}: unreadable: {exc}") from exc
        _check(path, size, digest.hexdigest(), handle)
        if len(_verified) > _VERIFIED_MAX:
            _verified.clear()
        _verified[key] = stamp

    def read_verified(self, handle: FileHandle) -> bytes:
        """A checkpoint file's content, verified against ``handle`` (for
        readers that need all of it anyway: one read, not two)."""
        path = self.layout.path(handle.path)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise CheckpointCorrupted(f"{path}: unreadable: {exc}") from exc
        _check(path, len(data), hashlib.sha256(data).hexdigest(), handle)
        return data

    def verify(self, checkpoint_id: int) -> dict[str, Any]:
        """Metadata of a checkpoint whose every file checks out."""
        meta = self.read_metadata(checkpoint_id)
        for handle in meta.get("files", []):
            self.verify_file(FileHandle.from_json(handle))
        return meta

    def completed_ids(self) -> list[int]:
        """Checkpoints with readable metadata (files not verified), ascending."""
        done = []
        for n in self.checkpoint_ids():
            if os.path.exists(self.layout.metadata(n)):
                done.append(n)
        return done

    def latest_valid(self, among: Iterable[int] | None = None
                     ) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint (of ``among``, if given) that verifies,
        skipping (with a warning naming the file) any that does not."""
        ids = self.completed_ids()
        if among is not None:
            wanted = set(among)
            ids = [n for n in ids if n in wanted]
        for n in reversed(ids):
            try:
                return n, self.verify(n)
            except CheckpointCorrupted as exc:
                log.warning("skipping checkpoint %d: %s", n, exc)
        return None

    def clean_incomplete(self, keep: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
        """Delete ``chk-*`` folders without metadata (left by a crash or an
        aborted checkpoint), except those in ``keep`` (in progress)."""
        removed = []
        for n in self.checkpoint_ids():
            if n in keep:
                continue
            if not os.path.exists(self.layout.metadata(n)):
                self.discard(n)
                removed.append(n)
        return removed

    def next_id(self) -> int:
        ids = self.checkpoint_ids()
        return (ids[-1] + 1) if ids else 1

