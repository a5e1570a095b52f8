"""The checkpoint writer process: the body of :mod:`eddyflow.checkpoint.writer`'s
helper. It runs as ``python -I -S writer_main.py`` and uses the standard
library only, so that it starts in milliseconds and never imports the job.

It reads requests from stdin and answers each with one JSON line on stdout,
in order. A request is a 4-byte big-endian header length, the header (JSON),
and ``size`` payload bytes. Operations:

``write``  ``path``, ``size``, ``sync_before``, ``sync_after``: fsync the
           folders ``sync_before``, write the payload to a temporary name next
           to ``path``, fsync it, rename it over ``path``, fsync the folders
           ``sync_after``; answers ``size`` and ``sha256``.
``seal``   ``tmp``, ``path``, ``sync_before``, ``sync_after``: the same for
           a file the job wrote in full at ``tmp`` (no payload): read it
           back for its size and SHA-256, fsync it, rename it over ``path``.
``remove`` ``path`` (a folder), ``first`` (a file in it): unlink ``first``,
           then the folder's tree.
``batch``  ``writes``, a list of ``write`` requests' ``path``, ``size``,
           ``sync_before`` and ``sync_after``, their payloads one after the
           other: each written as ``write`` does, in order, each durable
           before the next begins (the first failure ends the batch);
           answers ``results``, each write's ``size`` and ``sha256``. One
           round trip for what must land in order (a checkpoint's metadata,
           then its commit record).

Every answer carries the request's ``id`` and ``ok``; a failure answers
``error`` and ``errno`` and the process goes on. It exits at the end of its
input, and before any request once its parent has gone (a killed job must
not write into a folder that a restarted one is using).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import sys
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import IO, Any

#: The length of a request's JSON header, before it.
HEADER = struct.Struct(">I")


def encode_request(header: dict[str, Any], payload: bytes | Sequence[bytes] = b"") -> bytes:
    """One request as the helper reads it (the sender's side of the
    protocol). ``payload``: bytes, or chunks joined once here with the
    header (a snapshot's frames: one copy of them, not two)."""
    chunks = [payload] if isinstance(payload, bytes) else payload
    raw = json.dumps(dict(header, size=sum(map(len, chunks)))).encode()
    return b"".join([HEADER.pack(len(raw)), raw, *chunks])


def _durable() -> ModuleType:
    """:mod:`eddyflow.checkpoint.durable`: imported along with this module inside the
    package; loaded from its file when this one runs as the helper script,
    without the package on the path (it uses the standard library only)."""
    if __package__:
        from eddyflow.checkpoint import durable

        return durable
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("_eddyflow_durable",
                                                  os.path.join(here, "durable.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fsync_dir: Callable[[str], None] = _durable().fsync_dir


def write_durably(path: str, chunks: Iterable[bytes], sync_before: Iterable[str] = (),
                  sync_after: Iterable[str] = ()) -> dict[str, Any]:
    """Fsync the existing folders ``sync_before``; write ``chunks`` to a
    temporary name, fsync it, rename it over ``path``; fsync the folders
    ``sync_after``. A crash leaves the old file or the new one. Returns the
    ``size`` and ``sha256`` written. (The one write sequence of checkpoint
    files: eddyflow.checkpoint.storage calls it too when it writes in-process.)"""
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def write(fd: int) -> tuple[int, Any]:
        digest = hashlib.sha256()
        size = 0
        for chunk in chunks:
            digest.update(chunk)
            size += len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        return size, digest

    return _make_durable(temp_name(path), path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, write,
                         sync_before, sync_after)


def temp_name(path: str) -> str:
    """The temporary name this process writes ``path`` under before the
    rename that makes it exist."""
    return f"{path}.tmp-{os.getpid()}"


def seal_durably(tmp: str, path: str, sync_before: Iterable[str] = (),
                 sync_after: Iterable[str] = ()) -> dict[str, Any]:
    """:func:`write_durably` for a file another process wrote in full under
    the temporary name ``tmp`` (streamed there as it was encoded, so that
    its bytes never had to exist in memory at once nor go through a pipe):
    its size and SHA-256 are read back from it."""

    def read(fd: int) -> tuple[int, Any]:
        digest = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
            size += len(chunk)
        return size, digest

    return _make_durable(tmp, path, os.O_RDONLY, read, sync_before, sync_after)


def _make_durable(tmp: str, path: str, flags: int, fill: Callable[[int], tuple[int, Any]],
                  sync_before: Iterable[str], sync_after: Iterable[str]) -> dict[str, Any]:
    """Fsync the existing folders ``sync_before``; open ``tmp`` with
    ``flags`` and let ``fill`` write or read it (its size and digest); fsync
    it, rename it over ``path``, fsync the folders ``sync_after``. If that
    fails before the rename, ``tmp`` is removed: no temporary is left
    behind, whoever wrote it."""
    try:
        for d in sync_before:
            if os.path.isdir(d):
                fsync_dir(d)
        fd = os.open(tmp, flags, 0o644)
        try:
            size, digest = fill(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # (the first error is the one to report)
            os.unlink(tmp)
        raise
    for d in sync_after:
        fsync_dir(d)
    return {"size": size, "sha256": digest.hexdigest()}


def remove(path: str, first: str) -> dict[str, Any]:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(first)
    shutil.rmtree(path, ignore_errors=True)
    return {}


def write_batch(writes: Sequence[dict[str, Any]], payload: bytes) -> list[dict[str, Any]]:
    """The ``batch`` operation: ``writes`` in order, their bytes cut from
    ``payload`` by their sizes."""
    if sum(int(w["size"]) for w in writes) != len(payload):
        raise ValueError(f"a batch's payload of {len(payload)} bytes does not match its writes")
    results = []
    offset = 0
    for w in writes:
        end = offset + int(w["size"])
        results.append(write_durably(w["path"], [payload[offset:end]],
                                     w.get("sync_before", []), w.get("sync_after", [])))
        offset = end
    return results


def read_exactly(stream: IO[bytes], n: int) -> bytes | None:
    parts = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def serve(requests: IO[bytes], answers: IO[bytes], parent: int) -> None:
    while True:
        head = read_exactly(requests, HEADER.size)
        if head is None:
            return
        (length,) = HEADER.unpack(head)
        raw = read_exactly(requests, length)
        if raw is None:
            return
        header = json.loads(raw)
        payload = read_exactly(requests, int(header.get("size", 0))) or b""
        if parent and os.getppid() != parent:
            return  # orphaned: our job is gone
        answer: dict[str, Any] = {"id": header["id"], "ok": True}
        try:
            op = header["op"]
            if op == "write":
                answer |= write_durably(header["path"], [payload], header.get("sync_before", []),
                                        header.get("sync_after", []))
            elif op == "seal":
                answer |= seal_durably(header["tmp"], header["path"],
                                       header.get("sync_before", []),
                                       header.get("sync_after", []))
            elif op == "remove":
                answer |= remove(header["path"], header["first"])
            elif op == "batch":
                answer["results"] = write_batch(header["writes"], payload)
            else:
                raise ValueError(f"unknown operation {op!r}")
        except OSError as exc:
            answer = {"id": header["id"], "ok": False, "error": str(exc), "errno": exc.errno}
        except Exception as exc:  # reported to the caller, who raises it
            answer = {"id": header["id"], "ok": False,
                      "error": f"{type(exc).__name__}: {exc}", "errno": None}
        answers.write(json.dumps(answer).encode() + b"\n")
        answers.flush()


#: The request pipe's capacity asked for: 1 MiB, Linux's default limit for
#: an unprivileged process. With the default 64 KiB, handing over a large
#: file (a final snapshot of a million keys is ~18 MB) took ~280 turns of the
#: job's event loop, each waiting for this process to drain the pipe:
#: measured 84-106 ms for 18 MB to a tmpfs, 42-44 ms with 1 MiB.
PIPE_SIZE = 1 << 20


def _widen_pipe(fd: int) -> None:
    """Ask for a larger pipe on ``fd`` where the platform allows it (a
    pipe's capacity is the pipe's, so this process can set it for its
    parent's end too); nothing happens elsewhere or if refused."""
    try:
        import fcntl
    except ImportError:  # not on POSIX
        return
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    if setsize is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, setsize, PIPE_SIZE)


def main() -> None:
    _widen_pipe(sys.stdin.fileno())
    try:
        serve(sys.stdin.buffer, sys.stdout.buffer, int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        # Orphaned (the job was killed, its end of the pipe is gone) or
        # interrupted with it: leave quietly, without a traceback in the
        # job's terminal, nor one when the interpreter flushes stdout.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    main()
