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

So one helper process per job run (:mod:`eddyflow.checkpoint.writer_main`,
standard library only) does the writes, with its own interpreter and on
another core; the loop only hands it bytes through a pipe and awaits the
answer. The helper writes exactly as :func:`eddyflow.checkpoint.storage` would
(temporary name, fsync, rename, folder fsyncs) and returns the size and
SHA-256 that go into the metadata.

Calls are shielded from cancellation: a failing job waits for a write to
land or fail rather than leave a checkpoint to complete behind its back.

Calls are pipelined: each request goes into the pipe at once (a ``write`` of
whole bytes cannot interleave with another's), and the helper's answers are
read in the event loop's callback for the pipe, which hands each to its
caller's future as it reads it. On a busy event loop every hand-off costs a
turn of the loop (as long as the tasks' batches take, under back-pressure
100 ms and more), so an answer reaches its caller in the turn after the one
that reads it: not through a stream read by a task, which wakes a turn later
and wakes the callers a turn after that (``benchmarks/backpressure.py``'s
deep pipeline, whose asynchronous phase is counted in turns).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import subprocess
import sys
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from eddyflow.checkpoint.writer_main import encode_request

__all__ = ["FileWrite", "WriterProcess"]

log = logging.getLogger("eddyflow.checkpoint.listing")

#: Set ``EDDYFLOW_WRITER_PROCESS=0`` to write in-process (a program that may
#: not start processes, or a test that slows the disk down in-process).
ENABLED = os.environ.get("EDDYFLOW_WRITER_PROCESS", "1") != "0"

_HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "writer_main.py")
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


class _Answers(asyncio.SubprocessProtocol):
    """The helper process's side of the event loop: its answers, read in
    the loop's own callback as they arrive, each handed straight to its
    caller's future; the request pipe's flow control; the helper's exit."""

    def __init__(self) -> None:
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.failed: str | None = None
        self.exited = anyio.Event()
        self._buffer = bytearray()
        self._writable: asyncio.Future[None] | None = None

    def fail(self, reason: str) -> None:
        """Every caller still waiting gets ``reason``, and so does every
        later one."""
        if self.failed is None:
            self.failed = reason
        for waiter in self.waiting.values():
            if not waiter.done():
                waiter.set_exception(OSError(self.failed))
        self.waiting.clear()
        self._resume()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        if fd != 1 or self.failed is not None:
            return
        buffer = self._buffer
        buffer += data if isinstance(data, bytes) else data.encode()
        while (end := buffer.find(b"\n")) >= 0:
            try:
                got = json.loads(bytes(buffer[:end]))
                rid = int(got["id"])
            except (ValueError, KeyError, TypeError):
                self.fail("the checkpoint writer process answered garbage")
                return
            del buffer[:end + 1]
            waiter = self.waiting.pop(rid, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(got)
        if len(buffer) > _MAX_ANSWER:
            self.fail("the checkpoint writer process answered garbage")

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        # The end of its answers, read to the last one (its exit may be
        # reported before them: it alone fails no caller).
        if fd == 1:
            self.fail("the checkpoint writer process is gone "
                      f"({type(exc).__name__ if exc else 'end of stream'})")

    def process_exited(self) -> None:
        self.exited.set()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._resume()

    def _resume(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    async def drain(self) -> None:
        """Wait while the request pipe is full (a large snapshot's bytes)."""
        while self._writable is not None and self.failed is None:
            await asyncio.shield(self._writable)


class WriterProcess:
    """A helper process writing checkpoint files durably."""

    def __init__(self) -> None:
        self._transport: asyncio.SubprocessTransport | None = None
        self._answers: _Answers | None = None
        self._ids = itertools.count(1)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._transport, self._answers = await loop.subprocess_exec(
            _Answers, sys.executable, "-I", "-S", _HELPER, str(os.getpid()),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)

    @property
    def running(self) -> bool:
        return self._transport is not None and self._answers is not None \
            and self._answers.failed is None

    async def write(self, path: str, data: bytes | Sequence[bytes],
                    sync_before: Sequence[str] = (),
                    sync_after: Sequence[str] = ()) -> tuple[int, str]:
        """Write ``data`` (bytes, or chunks to write one after the other) to
        ``path`` durably; returns its size and SHA-256."""
        return await self.start_write(path, data, sync_before, sync_after)

    def start_write(self, path: str, data: bytes | Sequence[bytes],
                    sync_before: Sequence[str] = (), sync_after: Sequence[str] = ()
                    ) -> Coroutine[Any, Any, tuple[int, str]]:
        """:meth:`write`, with the request sent before this returns: a caller
        with two files to write awaits both answers in the same turns of the
        loop rather than one round trip after the other, without a task
        (whose start and end cost turns too). Await the result, or close it."""
        answer = self._send({"op": "write", "path": path, "sync_before": list(sync_before),
                             "sync_after": list(sync_after)}, data)

        async def written() -> tuple[int, str]:
            got = await self._answer(answer, path)
            return int(got["size"]), str(got["sha256"])

        return written()

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
        return await self._answer(self._send(header, payload), what)

    def _send(self, header: dict[str, Any], payload: bytes | Sequence[bytes]
              ) -> asyncio.Future[dict[str, Any]]:
        """Send a request; the future its answer goes to."""
        transport, answers = self._transport, self._answers
        pipe = transport.get_pipe_transport(0) if transport is not None else None
        if answers is None or not isinstance(pipe, asyncio.WriteTransport):
            raise RuntimeError("the checkpoint writer process is not running")
        if answers.failed is not None:
            raise OSError(answers.failed)
        rid = next(self._ids)
        request = encode_request(dict(header, id=rid), payload)
        answer = answers.waiting[rid] = asyncio.get_running_loop().create_future()
        # No lock: the request's bytes go into the pipe (or the transport's
        # buffer) whole, in the order of the calls.
        pipe.write(request)
        return answer

    async def _answer(self, answer: asyncio.Future[dict[str, Any]], what: str
                      ) -> dict[str, Any]:
        answers = self._answers
        assert answers is not None
        with anyio.CancelScope(shield=True):
            await answers.drain()
            got = await answer
        if not got["ok"]:
            errno = got.get("errno")
            if errno is not None:
                raise OSError(errno, f"checkpoint writer: {got['error']}", what)
            raise OSError(f"checkpoint writer: {got['error']} ({what})")
        return got

    async def aclose(self) -> None:
        """Let the helper finish what it was asked and exit."""
        transport, answers = self._transport, self._answers
        if transport is None or answers is None:
            return
        self._transport = None
        with anyio.CancelScope(shield=True):
            try:
                pipe = transport.get_pipe_transport(0)
                if pipe is not None:
                    pipe.close()  # the helper reads to the end, then exits
                with anyio.move_on_after(10):
                    await answers.exited.wait()
                if transport.get_returncode() is None:
                    log.warning("checkpoint writer process did not exit: killing it")
                    transport.kill()
                    await answers.exited.wait()
            finally:
                transport.close()
