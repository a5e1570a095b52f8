"""The asynchronous phase's file I/O, done by a helper process.

Creating, writing, fsyncing and renaming a checkpoint's files costs the
thread that does it several milliseconds per checkpoint (on the ext4 disks
here a new file costs ~1 ms, a new folder ~0.7 ms, each fsync 0.3-0.9 ms),
and a checkpoint has a file per stateful subtask plus its metadata. On the
event loop's thread that time is taken from processing, in every mode: the
asynchronous phase would not be asynchronous at all. A worker thread does not
help: a thread that waits for the GIL while the event loop keeps releasing
and retaking it (at every ``select``) restarts its wait each time and can
starve for hundreds of milliseconds (measured: up to 1 s per fsync).

So one helper process per job run (:mod:`eddyflow.state._writer_main`,
standard library only) does the writes, with its own interpreter and on
another core; the loop only hands it bytes through a pipe and awaits the
answer. The helper writes exactly as :func:`eddyflow.state.storage` would
(temporary name, fsync, rename, folder fsyncs) and returns the size and
SHA-256 that go into the metadata.

Calls are shielded from cancellation: a failing job waits for a write to
land or fail rather than leave a checkpoint to complete behind its back.

Calls are pipelined: each request goes into the pipe at once (a ``write`` of
whole bytes cannot interleave with another's), and whichever caller reads
the helper's answers hands each to its caller's future as it reads it. On a
busy event loop every hand-off through a lock costs a turn of the loop
(10-25 ms when a task's batch takes that long): with a lock per direction
the writes of one checkpoint's dozen tasks went through one after another
(measured: 15-20 ms apart under back-pressure); now they land together.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from eddyflow.state._writer_main import encode_request

__all__ = ["FileWrite", "WriterProcess"]

log = logging.getLogger("eddyflow.checkpoints")

#: Set ``EDDYFLOW_WRITER_PROCESS=0`` to write in-process (a program that may
#: not start processes, or a test that slows the disk down in-process).
ENABLED = os.environ.get("EDDYFLOW_WRITER_PROCESS", "1") != "0"

_HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_writer_main.py")
_MAX_ANSWER = 1 << 20


@dataclass(frozen=True)
class FileWrite:
    """One small file to write durably (see :meth:`WriterProcess.write`):
    folders to fsync before it, its bytes, folders to fsync after its
    rename."""

    path: str
    data: bytes
    sync_before: Sequence[str] = ()
    sync_after: Sequence[str] = ()


class WriterProcess:
    """A helper process writing checkpoint files durably."""

    def __init__(self) -> None:
        self._process: Process | None = None
        self._answers: BufferedByteReceiveStream | None = None
        self._ids = itertools.count(1)
        # Answers not yet read, by request id, and whether a caller reads.
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reading = False
        self._reader_free: asyncio.Future[None] | None = None
        self._failed: str | None = None

    async def start(self) -> None:
        self._process = await anyio.open_process(
            [sys.executable, "-I", "-S", _HELPER, str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)
        assert self._process.stdout is not None
        self._answers = BufferedByteReceiveStream(self._process.stdout)

    @property
    def running(self) -> bool:
        return self._process is not None and self._failed is None

    async def write(self, path: str, data: bytes | Sequence[bytes],
                    sync_before: Sequence[str] = (),
                    sync_after: Sequence[str] = ()) -> tuple[int, str]:
        """Write ``data`` (bytes, or chunks to write one after the other) to
        ``path`` durably; returns its size and SHA-256."""
        answer = await self._call({"op": "write", "path": path,
                                   "sync_before": list(sync_before),
                                   "sync_after": list(sync_after)}, data, path)
        return int(answer["size"]), str(answer["sha256"])

    async def write_batch(self, writes: Sequence[FileWrite]) -> list[tuple[int, str]]:
        """Write ``writes`` durably in order, each before the next begins,
        in one round trip; returns each one's size and SHA-256. The first
        failure raises, and the writes after it are not made."""
        header = {"op": "batch", "writes": [
            {"path": w.path, "size": len(w.data), "sync_before": list(w.sync_before),
             "sync_after": list(w.sync_after)} for w in writes]}
        answer = await self._call(header, [w.data for w in writes],
                                  ", ".join(w.path for w in writes))
        return [(int(r["size"]), str(r["sha256"])) for r in answer["results"]]

    async def seal(self, tmp: str, path: str) -> tuple[int, str]:
        """Make the file the caller wrote in full at ``tmp`` durable under
        ``path``; returns its size and SHA-256 (read back from the file)."""
        answer = await self._call({"op": "seal", "tmp": tmp, "path": path}, b"", path)
        return int(answer["size"]), str(answer["sha256"])

    async def remove(self, folder: str, first: str) -> None:
        """Delete file ``first``, then the tree ``folder``."""
        await self._call({"op": "remove", "path": folder, "first": first}, b"", folder)

    async def _call(self, header: dict[str, Any], payload: bytes | Sequence[bytes],
                    what: str) -> dict[str, Any]:
        with anyio.CancelScope(shield=True):
            answer = await self._exchange(header, payload)
        if not answer["ok"]:
            errno = answer.get("errno")
            if errno is not None:
                raise OSError(errno, f"checkpoint writer: {answer['error']}", what)
            raise OSError(f"checkpoint writer: {answer['error']} ({what})")
        return answer

    async def _exchange(self, header: dict[str, Any], payload: bytes | Sequence[bytes]
                        ) -> dict[str, Any]:
        process, answers = self._process, self._answers
        if process is None or answers is None or process.stdin is None:
            raise RuntimeError("the checkpoint writer process is not running")
        if self._failed is not None:
            raise OSError(self._failed)
        rid = next(self._ids)
        request = encode_request(dict(header, id=rid), payload)
        answer = self._waiting[rid] = asyncio.get_running_loop().create_future()
        try:
            # No lock: the request's bytes go into the pipe whole before the
            # first await, and concurrent drains are safe.
            await process.stdin.send(request)
            # The helper answers in order; whoever reads hands each answer to
            # its caller, so no reader task has to outlive the callers.
            while not answer.done():
                if self._reading:
                    free = self._reader_free
                    if free is None or free.done():
                        free = self._reader_free = asyncio.get_running_loop().create_future()
                    await asyncio.wait((answer, free), return_when=asyncio.FIRST_COMPLETED)
                    continue
                self._reading = True
                try:
                    while not answer.done():
                        line = await answers.receive_until(b"\n", _MAX_ANSWER)
                        got = json.loads(line)
                        waiter = self._waiting.pop(int(got["id"]), None)
                        if waiter is not None and not waiter.done():
                            waiter.set_result(got)
                finally:
                    self._reading = False
                    free = self._reader_free
                    if free is not None and not free.done():
                        free.set_result(None)  # someone else reads on
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError,
                anyio.IncompleteRead, OSError) as exc:
            self._failed = f"the checkpoint writer process is gone ({type(exc).__name__})"
            for waiter in self._waiting.values():
                if not waiter.done():
                    waiter.set_exception(OSError(self._failed))
            self._waiting.clear()
            raise OSError(self._failed) from exc
        finally:
            self._waiting.pop(rid, None)
        result: dict[str, Any] = answer.result()
        return result

    async def aclose(self) -> None:
        """Let the helper finish what it was asked and exit."""
        process = self._process
        if process is None:
            return
        self._process = None
        with anyio.CancelScope(shield=True):
            try:
                if process.stdin is not None:
                    await process.stdin.aclose()
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    log.warning("checkpoint writer process did not exit: killing it")
                    process.kill()
                    await process.wait()
            finally:
                await process.aclose()
