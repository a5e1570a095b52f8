"""Checkpoint modes: how a task treats a checkpoint's barriers.

``exactly_once`` aligns: a task that has barrier ``n`` on one input blocks
that input until ``n`` has come on all of them, then snapshots (DESIGN.md
§2). ``at_least_once`` never blocks. ``synchronous`` aligns and stops the
sources until the checkpoint is complete (the baseline ABS is measured
against). ``unaligned`` lets barriers overtake records: a task snapshots at
the first barrier ``n``, and what the barrier overtook becomes the
checkpoint's channel state (``runtime/channel_state.py``); an aligned
checkpoint switches to it after ``aligned_timeout``.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["MODES", "CheckpointMode"]


class CheckpointMode(StrEnum):
    # A StrEnum: configuration, metadata and the API speak these strings.
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"
    UNALIGNED = "unaligned"
    SYNCHRONOUS = "synchronous"

    @property
    def blocks(self) -> bool:
        """Whether an input that delivered the barrier waits for the others."""
        return self is not CheckpointMode.AT_LEAST_ONCE


MODES = tuple(m.value for m in CheckpointMode)
