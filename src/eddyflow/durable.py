"""Durability helpers shared by everything that writes files for recovery
(checkpoint storage, the exactly-once FileSink)."""

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
