"""RocksDB databases on disk: opening one, and moving its files between a
checkpoint storage and a local folder.

A RocksDB checkpoint's files are named by the database (``000009.sst``,
``MANIFEST-000005``, ``CURRENT``, …); in checkpoint storage each lives under
a name of ours (see :mod:`eddyflow.state.rocksdb.snapshot`) and the handle
maps one to the other. :func:`materialise` brings them back under their own
names, verifying each against its size and SHA-256 as it copies (a restore
reads every byte anyway: the check costs nothing more), so a damaged or
missing file is named before RocksDB sees it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator, Mapping
from typing import Any

from eddyflow.checkpoint.storage import CheckpointCorrupted, FileHandle

__all__ = ["DbOptions", "copy_verified", "hash_file", "materialise", "open_db", "scan"]

_CHUNK = 1 << 20


class DbOptions:
    """The tuning of a backend's databases (see ``RocksDBStateBackend``)."""

    def __init__(self, block_cache_bytes: int, write_buffer_bytes: int) -> None:
        self.block_cache_bytes = block_cache_bytes
        self.write_buffer_bytes = write_buffer_bytes
        self._cache: Any = None

    def options(self) -> Any:
        from rocksdict import BlockBasedOptions, Cache, Options

        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        table = BlockBasedOptions()
        if self._cache is None:
            # One block cache for every database of the backend, as Flink
            # shares one per slot: the bound holds for the whole job.
            self._cache = Cache(self.block_cache_bytes)
        table.set_block_cache(self._cache)
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_size(self.write_buffer_bytes)
        opts.set_max_write_buffer_number(2)
        opts.set_max_background_jobs(2)
        # A few open files per database: a job may hold many databases.
        opts.set_max_open_files(256)
        return opts


def open_db(path: str, options: DbOptions | None = None, *, read_only: bool = False) -> Any:
    from rocksdict import AccessType, Options, Rdict, WriteOptions

    opts = options.options() if options is not None else Options(raw_mode=True)
    if read_only:
        return Rdict(path, opts, access_type=AccessType.read_only())
    db = Rdict(path, opts)
    # The local database is a cache of the checkpoints: it is never
    # recovered from its own log, so it has none.
    wo = WriteOptions()
    wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property at run time
    db.set_write_options(wo)
    return db


def scan(db: Any, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``(row, value)`` of ``db`` in ``[lower, upper)``, in order."""
    from rocksdict import ReadOptions

    ro = ReadOptions()
    ro.set_iterate_lower_bound(lower)
    ro.set_iterate_upper_bound(upper)
    ro.fill_cache(False)  # type: ignore[call-arg]  # the stub lacks the argument
    it = db.iter(ro)
    it.seek(lower)
    while it.valid():
        yield it.key(), it.value()
        it.next()


def copy_verified(src: str, dst: str, expected: FileHandle | None = None, *,
                  sync: bool = False) -> tuple[int, str]:
    """Copy ``src`` to ``dst`` (fsynced if ``sync``); its size and SHA-256,
    checked against ``expected`` when given. What is wrong with the source
    (missing, unreadable, not as expected) raises :class:`CheckpointCorrupted`
    naming it; what goes wrong writing ``dst`` stays an ``OSError`` (an
    upload into a checkpoint folder that an abort removed is not damage)."""
    digest = hashlib.sha256()
    size = 0
    try:
        fin = open(src, "rb")  # noqa: SIM115 - closed below; its errors are the source's
    except FileNotFoundError:
        raise CheckpointCorrupted(f"{src}: missing") from None
    except OSError as exc:
        raise CheckpointCorrupted(f"{src}: unreadable: {exc}") from exc
    with fin, open(dst, "wb") as fout:
        while True:
            try:
                chunk = fin.read(_CHUNK)
            except OSError as exc:
                raise CheckpointCorrupted(f"{src}: unreadable: {exc}") from exc
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            fout.write(chunk)
        if sync:
            fout.flush()
            os.fsync(fout.fileno())
    sha = digest.hexdigest()
    if expected is not None and (size != expected.size or sha != expected.sha256):
        what = (f"{size} bytes instead of {expected.size}" if size != expected.size
                else "checksum mismatch")
        raise CheckpointCorrupted(f"{src}: {what}")
    return size, sha


def hash_file(path: str, *, sync: bool = False) -> tuple[int, str]:
    """Size and SHA-256 of ``path`` (fsynced first if ``sync``)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def materialise(root: str, files: Mapping[str, FileHandle], folder: str) -> None:
    """The database files of a handle, verified, under their own names in
    ``folder`` (created; emptied first)."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    try:
        for name, handle in files.items():
            copy_verified(os.path.join(root, handle.path), os.path.join(folder, name), handle)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
