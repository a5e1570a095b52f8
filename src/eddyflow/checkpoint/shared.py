"""Reference counts of the files in a checkpoint directory's ``shared/``
folder, as Flink's ``SharedStateRegistry`` keeps them.

Incremental snapshots write a file once and reference it from every later
checkpoint whose chain includes it, so a file may be deleted only when no
retained checkpoint references it. The registry is rebuilt at start-up from
the metadata of the checkpoints on disk; files no completed checkpoint
references (of aborted checkpoints, or written by a run that crashed) are
garbage, collected when no checkpoint is in flight — a snapshot in flight
may build on a file that only a checkpoint being discarded references, and
its own new files are in no metadata yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable

from eddyflow.checkpoint.layout import SHARED, CheckpointLayout

__all__ = ["SharedStateRegistry"]

log = logging.getLogger("eddyflow.checkpoint.listing")


class SharedStateRegistry:
    """Which retained checkpoint references which file of ``shared/``, in
    the checkpoint folder of ``layout``."""

    def __init__(self, layout: CheckpointLayout) -> None:
        self.layout = layout
        self._by_checkpoint: dict[int, frozenset[str]] = {}
        self._counts: dict[str, int] = {}

    @staticmethod
    def is_shared(path: str) -> bool:
        """Whether ``path`` (relative to the root) lies in ``shared/``."""
        return CheckpointLayout.is_shared_file(path)

    def register(self, checkpoint_id: int, paths: Iterable[str]) -> None:
        """Checkpoint ``checkpoint_id`` completed (or was found on disk)
        referencing ``paths``."""
        mine = frozenset(p for p in paths if self.is_shared(p))
        self.unregister(checkpoint_id)
        self._by_checkpoint[checkpoint_id] = mine
        for p in mine:
            self._counts[p] = self._counts.get(p, 0) + 1

    def unregister(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is discarded."""
        for p in self._by_checkpoint.pop(checkpoint_id, frozenset()):
            left = self._counts[p] - 1
            if left:
                self._counts[p] = left
            else:
                del self._counts[p]

    def referenced(self, path: str) -> bool:
        return path in self._counts

    def collect_garbage(self) -> list[str]:
        """Delete every file of ``shared/`` that no registered checkpoint
        references (call only while no checkpoint is in flight)."""
        folder = self.layout.shared_dir
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
        removed = []
        for name in names:
            rel = f"{SHARED}/{name}"
            if rel in self._counts:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
                removed.append(rel)
        if removed:
            log.debug("removed %d unreferenced shared files", len(removed))
        return removed
