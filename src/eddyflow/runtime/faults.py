"""Named fault points for fault-injection tests.

The runtime calls :func:`fault_point` at the moments a failure is most
damaging — while a task aligns barriers, during the asynchronous write of a
snapshot, between a checkpoint's completion and the sinks' commit — and a
test arms a point to raise :class:`InjectedFailure` there. The calls sit on
checkpoint paths only, never per record, so an unarmed point costs a dict
lookup per checkpoint event.
"""

from __future__ import annotations

import threading

__all__ = ["FAULT_POINTS", "InjectedFailure", "arm", "armed", "disarm_all", "fault_point",
           "rearm"]


class InjectedFailure(Exception):
    """A failure injected by a test; real code never raises it."""


FAULT_POINTS = frozenset({
    "task.aligning",  # a task has blocked an input and waits for the other barriers
    "snapshot.async_write",  # a task's snapshot is being written while records flow
    "checkpoint.before_metadata",  # all tasks acknowledged; _metadata not yet written
    "sink.before_commit",  # _metadata written (pre-committed); sinks not yet committed
})

_lock = threading.Lock()
_armed: dict[str, list[int]] = {}  # point -> [calls to let pass, failures left]


def arm(point: str, *, after: int = 0, times: int = 1) -> None:
    """Fail at ``point`` on its ``after``-th next call (0: the next one), then
    on following calls until ``times`` failures were raised."""
    if point not in FAULT_POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {sorted(FAULT_POINTS)}")
    with _lock:
        _armed[point] = [after, times]


def disarm_all() -> None:
    with _lock:
        _armed.clear()


def armed() -> dict[str, tuple[int, int]]:
    """The armed points (point: calls to let pass, failures left): what a
    worker process started afresh arms again (``rearm``), as a forked one
    inherits them."""
    with _lock:
        return {point: (after, times) for point, (after, times) in _armed.items()}


def rearm(points: dict[str, tuple[int, int]]) -> None:
    """Arm ``points`` (as :func:`armed` returned them), and only those."""
    with _lock:
        _armed.clear()
        _armed.update({point: [after, times] for point, (after, times) in points.items()})


def fault_point(point: str) -> None:
    if not _armed:
        return
    with _lock:
        state = _armed.get(point)
        if state is None:
            return
        if state[0] > 0:
            state[0] -= 1
            return
        state[1] -= 1
        if state[1] <= 0:
            del _armed[point]
    raise InjectedFailure(f"injected failure at {point}")
