"""Naming what cannot be serialized.

State values and logged records are pickled in bulk (a frame of thousands
of values, a whole batch, an SST file's rows), so pickle's own error says
only what failed (``Can't pickle local object 'f.<locals>.<lambda>'``),
never which state, key or record held it. Once a bulk write has failed,
:func:`find_unpicklable` pickles the items one at a time to find the
culprit; the callers turn it into a
:class:`~eddyflow.errors.StateSerializationError` naming the operator, the
state, the key and the checkpoint. This costs nothing until something fails.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from eddyflow.errors import StateSerializationError

__all__ = ["dumps_default", "find_unpicklable", "key_text", "raise_state_error", "reason_of",
           "record_text", "state_error"]


def dumps_default(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def key_text(key: Any) -> str:
    """A key as an error message shows it (its ``repr``, cut short)."""
    return f"{key!r:.100}"


def record_text(record: Any) -> str:
    """A record as an error message shows it (as ``TaskFailure`` does)."""
    return f"{record!r:.200}"


def reason_of(exc: BaseException) -> str:
    """Why a value cannot be pickled: pickle's message (it says "pickle"
    already), else the exception's type and message."""
    text = str(exc)
    return text if "pickle" in text.lower() else f"{type(exc).__name__}: {text}"


def find_unpicklable(items: Iterable[tuple[Any, Any]],
                     dumps: Callable[[Any], bytes] = dumps_default
                     ) -> tuple[Any, Exception] | None:
    """The first ``(label, value)`` of ``items`` whose value ``dumps``
    cannot serialize, with the error it raised; ``None`` if all can."""
    for label, value in items:
        try:
            dumps(value)
        except Exception as exc:
            return label, exc
    return None


def state_error(original: BaseException, items: Iterable[tuple[Any, Any]], *,
                operator: str | None, state: str, checkpoint: int | None = None,
                where: str | None = None, dumps: Callable[[Any], bytes] = dumps_default
                ) -> BaseException:
    """The :class:`StateSerializationError` of a failed bulk write of state
    ``state``'s ``(key, value)`` items, naming the key whose value cannot be
    serialized; ``original`` itself when each value serializes on its own
    (the failure was something else)."""
    if isinstance(original, StateSerializationError):
        return original
    found = find_unpicklable(items, dumps)
    if found is None:
        return original
    key, exc = found
    return StateSerializationError(
        reason_of(exc), verb="snapshot" if checkpoint is not None else "store",
        operator=operator, state=state, key=key_text(key), checkpoint=checkpoint, where=where)


def raise_state_error(original: BaseException, items: Iterable[tuple[Any, Any]], *,
                      operator: str | None, state: str, checkpoint: int | None = None,
                      where: str | None = None,
                      dumps: Callable[[Any], bytes] = dumps_default) -> NoReturn:
    """Raise :func:`state_error`'s answer (from ``original``), or
    ``original`` itself (call it in the ``except`` block that caught it)."""
    error = state_error(original, items, operator=operator, state=state,
                        checkpoint=checkpoint, where=where, dumps=dumps)
    if error is original:
        raise original
    raise error from original
