"""Durability helpers shared by everything that writes files for recovery
(checkpoint storage, the exactly-once FileSink, the checkpoint writer
process). Standard library only: the writer process loads this file by its
path, without the package (see :mod:`eddyflow.checkpoint.writer_main`)."""

from __future__ import annotations

import os

__all__ = ["fsync_dir"]


def fsync_dir(path: str) -> None:
    """Make the entries of folder ``path`` (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
