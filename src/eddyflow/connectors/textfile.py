"""``env.read_text_file``: one record per line of a UTF-8 text file.

The position is the byte offset of the next line. With parallelism > 1 the
file is split into byte ranges; a subtask reads the lines that *start* in its
range, so every line is read exactly once whatever the split points are.
Lines are returned without their line terminator (``\\n`` or ``\\r\\n``).
"""

from __future__ import annotations

import codecs
import os
from typing import IO, Any

from eddyflow.connectors.source import Source, SourceReader

__all__ = ["TextFileSource"]

_CHUNK = 1 << 20


def _check_encoding(encoding: str, path: str) -> str:
    """``encoding``, if the reader can split its text at byte offsets: the
    file is read in byte ranges cut at b"\\n", so "\\n" must be that one
    byte and no character may contain it (UTF-8, Latin-1 and the other
    ASCII-compatible encodings; not UTF-16 or UTF-32)."""
    try:
        codecs.lookup(encoding)
    except (LookupError, TypeError):
        raise ValueError(f"read_text_file({path!r}): unknown encoding {encoding!r}") from None
    if "\n".encode(encoding, "replace") != b"\n" or "a".encode(encoding, "replace") != b"a":
        raise ValueError(
            f"read_text_file({path!r}): encoding {encoding!r} is not ASCII-compatible; "
            "the file is split at b'\\n' byte offsets (convert it to UTF-8)"
        )
    return encoding


class TextFileSource(Source):
    """The source of ``env.read_text_file``: one record per line, split over
    the subtasks by byte range (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], encoding: str = "utf-8") -> None:
        self.path = os.fspath(path)
        self.encoding = _check_encoding(encoding, self.path)
        check_readable(self.path)

    @property
    def name(self) -> str:
        return f"file:{os.path.basename(self.path)}"

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        try:
            size = os.path.getsize(self.path)
        except OSError as exc:
            raise OSError(f"cannot read input file {self.path!r}: {exc.strerror or exc}") from exc
        lo = _line_start_at_or_after(self.path, size * subtask // parallelism)
        hi = size * (subtask + 1) // parallelism
        return _TextFileReader(self.path, self.encoding, lo, hi)


def _line_start_at_or_after(path: str, offset: int) -> int:
    """The first line start >= ``offset``: a split begins with the first line
    that starts in it (the line through ``offset - 1`` belongs to the split
    before), so that even its very first position is a line start."""
    if offset == 0:
        return 0
    try:
        with open(path, "rb") as f:
            f.seek(offset - 1)
            return offset - 1 + len(f.readline())
    except OSError as exc:
        raise OSError(f"cannot read input file {path!r}: {exc.strerror or exc}") from exc


def check_readable(path: str) -> None:
    """Fail at build time, naming the path, rather than deep inside a run."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"input file {path!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"input file {path!r} is a directory")
    if not os.access(path, os.R_OK):
        raise PermissionError(f"input file {path!r} is not readable")


class _TextFileReader(SourceReader):
    def __init__(self, path: str, encoding: str, lo: int, hi: int) -> None:
        self._path = path
        self._encoding = encoding
        self._hi = hi
        self._file: IO[bytes] | None = None
        self._pos = lo  # byte offset of the next line handed out; lo is a line start
        self._pending: list[bytes] = []  # complete lines read ahead, in order
        self._pending_at = 0
        self._tail = b""  # an incomplete last line
        self._eof = False
        self._last_offsets: list[int] = []

    def _open(self) -> IO[bytes]:
        try:
            f = open(self._path, "rb")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise OSError(f"cannot read input file {self._path!r}: {exc.strerror or exc}") from exc
        f.seek(self._pos)
        self._file = f
        return f

    def _fill(self, f: IO[bytes]) -> None:
        chunk = f.read(_CHUNK)
        if not chunk:
            self._eof = True
            if self._tail:
                self._pending.append(self._tail)
                self._tail = b""
            return
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()
        self._pending = self._pending[self._pending_at :] + lines
        self._pending_at = 0

    async def read_batch(self, max_records: int) -> list[Any] | None:
        f = self._file or self._open()
        out: list[str] = []
        offsets = self._last_offsets = []
        pos = self._pos
        while len(out) < max_records and pos < self._hi:
            if self._pending_at >= len(self._pending):
                if self._eof:
                    break
                self._pending, self._pending_at = [], 0
                self._fill(f)
                continue
            raw = self._pending[self._pending_at]
            self._pending_at += 1
            offsets.append(pos)
            pos += len(raw) + 1
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            try:
                out.append(raw.decode(self._encoding))
            except UnicodeDecodeError as exc:
                self._pos = offsets[-1]  # the bad line, for the error report
                raise ValueError(
                    f"input file {self._path!r}: line at byte offset {offsets[-1]} is not "
                    f"valid {self._encoding}: {exc.reason}"
                ) from exc
        self._pos = pos
        if not out and (pos >= self._hi or self._eof):
            return None
        return out

    def position(self) -> int:
        return self._pos

    def seek(self, position: Any) -> None:
        if not isinstance(position, int) or position < 0:
            raise ValueError(f"text file position must be a byte offset, got {position!r}")
        self._pos = position
        self._pending, self._pending_at, self._tail, self._eof = [], 0, b"", False
        if self._file is not None:
            self._file.seek(position)

    def position_of(self, index: int) -> int | None:
        offsets = self._last_offsets
        return offsets[index] if 0 <= index < len(offsets) else None

    def describe_position(self, position: Any) -> str:
        return f"{self._path!r} byte offset {position}"

    async def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
