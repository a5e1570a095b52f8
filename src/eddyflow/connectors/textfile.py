"""``env.read_text_file``: one record per line of a UTF-8 text file, and
:class:`TextFolderSource`: the lines of every file in a folder, with files
dropped into it while the job runs.

Both are split sources (connectors/splits.py): a file is cut into byte
ranges when the source first sees it, and a split reads the lines that
*start* in its range, so every line is read exactly once whatever the cut
points are. A split's position is the byte offset of its next line; the
ranges are recorded in checkpoints, so a restore at another parallelism
deals the same ranges out anew. Lines are returned without their line
terminator (``\\n`` or ``\\r\\n``). A file must be complete when the
source sees it (write it elsewhere, then rename it into the folder).
"""

from __future__ import annotations

import codecs
import os
import zlib
from abc import abstractmethod
from collections.abc import Sequence
from typing import IO, Any

from eddyflow.connectors.source import SourceReader
from eddyflow.connectors.splits import RestoredSplit, SourceSplit, SplitSource

__all__ = ["TextFileSource", "TextFolderSource"]

_CHUNK = 1 << 20
#: A file is cut in ranges of about this many bytes (a small file in a
#: folder is one split; a large file is read by several subtasks)...
_FOLDER_SPLIT = 8 << 20
#: ... in this many at most.
_MAX_RANGES = 1024


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


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError as exc:
        raise OSError(f"cannot read input file {path!r}: {exc.strerror or exc}") from exc


def _ranges(path: str, name: str, pieces: int, base: int) -> list[SourceSplit]:
    """File ``path`` (``name`` in split ids) cut in ``pieces`` byte ranges,
    each starting at a line start; ``base`` + k is range k's index. A split
    names its file by ``name`` (relative to the source's path), so that a
    checkpoint restores against the input moved elsewhere."""
    size = _file_size(path)
    out = []
    for k in range(pieces):
        lo = _line_start_at_or_after(path, size * k // pieces)
        hi = size * (k + 1) // pieces
        out.append(SourceSplit(f"{name}:{k}", {"file": name, "start": lo, "end": hi}, base + k))
    return out


class _TextSplits(SplitSource):
    """What both text sources share: reading a byte range of a file."""

    path: str
    encoding: str

    @abstractmethod
    def file_path(self, name: str) -> str:
        """The path of the file a split names."""

    def create_split_reader(self, split: SourceSplit) -> SourceReader:
        data = split.data
        try:
            name, lo, hi = str(data["file"]), int(data["start"]), int(data["end"])
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{self.name}: split {split.split_id!r} is not a byte range of "
                             f"a file: {data!r}") from None
        return _TextFileReader(self.file_path(name), self.encoding, lo, hi)


class TextFileSource(_TextSplits):
    """The source of ``env.read_text_file``: one record per line, the file
    cut in byte ranges when the job first starts, one per subtask at least
    and one per 8 MiB (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], encoding: str = "utf-8") -> None:
        self.path = os.fspath(path)
        self.encoding = _check_encoding(encoding, self.path)
        check_readable(self.path)

    @property
    def name(self) -> str:
        return f"file:{os.path.basename(self.path)}"

    def file_path(self, name: str) -> str:
        return self.path  # whatever the file was called when checkpointed

    def discover_splits(self, known: Sequence[SourceSplit], parallelism: int
                        ) -> list[SourceSplit]:
        if known:
            return []  # cut once, when the job first started
        # At least a range per subtask; a large file in more, so that a
        # restore at a higher parallelism still spreads it.
        pieces = max(parallelism, min(_MAX_RANGES, -(-_file_size(self.path) // _FOLDER_SPLIT)))
        return _ranges(self.path, os.path.basename(self.path), pieces, 0)

    def splits_of_subtask(self, subtask: int, parallelism: int, position: Any
                          ) -> list[RestoredSplit]:
        # Before it was a split source, subtask s of p read range s of p.
        size = _file_size(self.path)
        lo = _line_start_at_or_after(self.path, size * subtask // parallelism)
        hi = size * (subtask + 1) // parallelism
        name = os.path.basename(self.path)
        split = SourceSplit(f"{name}:{subtask}", {"file": name, "start": lo, "end": hi}, subtask)
        if position is not None and not isinstance(position, int):
            raise ValueError(f"text file position must be a byte offset, got {position!r}")
        return [RestoredSplit(split, position)]


class TextFolderSource(_TextSplits):
    """The lines of every file directly inside folder ``path`` (names that
    begin with ``.`` or ``_`` are not read: a file being written hides
    under such a name until it is renamed). Each file is read from its
    start; a large file is cut in byte ranges of about 8 MiB. With
    ``monitor_interval`` (seconds) the folder is looked at again while the
    job runs and a new file is read as it appears (the source then never
    ends); without it, the files there when the job first starts are read,
    and the source ends.
    """

    def __init__(self, path: str | os.PathLike[str], encoding: str = "utf-8", *,
                 monitor_interval: float | None = None) -> None:
        self.path = os.fspath(path)
        self.encoding = _check_encoding(encoding, self.path)
        if not os.path.isdir(self.path):
            raise NotADirectoryError(f"input folder {self.path!r} is not a directory")
        if monitor_interval is not None and not monitor_interval > 0:
            raise ValueError(f"TextFolderSource({self.path!r}): monitor_interval must be "
                             f"positive, got {monitor_interval!r}")
        self.discovery_interval = monitor_interval

    @property
    def name(self) -> str:
        return f"folder:{os.path.basename(self.path.rstrip(os.sep))}"

    def file_path(self, name: str) -> str:
        return os.path.join(self.path, name)

    def discover_splits(self, known: Sequence[SourceSplit], parallelism: int
                        ) -> list[SourceSplit]:
        seen = {s.data.get("file") for s in known if isinstance(s.data, dict)}
        out: list[SourceSplit] = []
        try:
            names = sorted(os.listdir(self.path))
        except OSError as exc:
            raise OSError(f"cannot list input folder {self.path!r}: "
                          f"{exc.strerror or exc}") from exc
        for name in names:
            path = os.path.join(self.path, name)
            if name.startswith((".", "_")) or name in seen or not os.path.isfile(path):
                continue
            pieces = max(1, min(_MAX_RANGES, -(-_file_size(path) // _FOLDER_SPLIT)))
            # Spread a file's ranges from a subtask its name picks.
            out.extend(_ranges(path, name, pieces, zlib.crc32(name.encode())))
        return out


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
