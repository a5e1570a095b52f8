"""The state backends eddyflow knows, by name: a backend is its package plus
one :func:`register` call (docs/extending/state-backend.md).

A registration, a :class:`BackendKind`, is what the rest of eddyflow needs
of a backend besides its :class:`~eddyflow.state.abc.StateBackend`: the
class of its checkpoint handles (so that the metadata reads them), how to
read the entries a handle holds (restores into any backend, the offline
readers), which compiled modules a Spark executor needs to read or write
its files (shipping), when two of its handles hold the same state and which
of its files hold the changes between two (the change feed), and the
backend ``offline.bootstrap`` writes a checkpoint with. Nothing outside a
backend's package tests a backend's name: they ask its registration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from eddyflow.checkpoint.handles import KeyedStateHandle, StateFile, register_handle_type
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.state.format import DELETED

if TYPE_CHECKING:
    from eddyflow.state.abc import StateBackend

__all__ = ["BackendKind", "kind_named", "kind_of", "kind_of_backend", "kinds", "names",
           "register"]


class BackendKind(ABC):
    """One kind of state backend, as registered under :attr:`name`."""

    #: The name its handles record (``KeyedStateHandle.backend``), and that
    #: ``bootstrap(backend=...)`` takes.
    name: str
    #: The class of its checkpoint handles (``handle_type.backend == name``).
    handle_type: type[KeyedStateHandle]
    #: The class of its :class:`StateBackend` (what ``env.set_state_backend``
    #: takes), to tell which kind a configured backend is.
    backend_type: type[StateBackend]
    #: Compiled modules an executor imports to read or write its files
    #: (shipped by the driver where the executors lack them).
    executor_modules: tuple[str, ...] = ()

    @abstractmethod
    def read(self, root: str, handle: KeyedStateHandle, *, key_groups: range | None = None,
             max_parallelism: int = 0, with_groups: bool = False
             ) -> Iterator[tuple[int, str, Any, Any]]:
        """``(key_group, state, key, value)`` of the entries of ``handle`` (of
        checkpoint storage ``root``) in ``key_groups`` (all when ``None``),
        in the order they apply (a later entry of a key replaces an earlier
        one; ``DELETED`` removes it); key groups may be ``-1`` unless
        ``with_groups``. What a restore into any backend reads."""

    def read_verified(self, root: str, handle: KeyedStateHandle,
                      key_groups: range | None = None, max_parallelism: int = 0
                      ) -> Iterator[tuple[int, str, Any, Any]]:
        """``(key_group, state, key, value)`` of the state ``handle`` holds,
        each key once and each file verified against its checksum first:
        what the offline readers show. By default every file is verified
        and :meth:`read`'s entries are applied in memory; a backend whose
        entries come once each streams them."""
        storage = CheckpointStorage(root)
        for f in handle.file_handles():
            storage.verify_file(f)
        state: dict[str, dict[Any, tuple[int, Any]]] = {}
        for kg, name, key, value in self.read(root, handle, key_groups=key_groups,
                                              max_parallelism=max_parallelism,
                                              with_groups=True):
            table = state.setdefault(name, {})
            if value is DELETED:
                table.pop(key, None)
            else:
                table[key] = (kg, value)
        for name, entries in state.items():
            for key, (kg, value) in entries.items():
                yield kg, name, key, value

    def same_state(self, a: KeyedStateHandle, b: KeyedStateHandle) -> bool:
        """Two handles of this backend for the same key groups hold the same
        entries (the change feed reads neither): by default, when they name
        the same files."""
        return a.file_handles() == b.file_handles()

    def delta_files(self, start: KeyedStateHandle, end: KeyedStateHandle
                    ) -> tuple[StateFile, ...] | None:
        """The keyed-state files (``state/format.py``) that hold every key
        written between ``start`` and ``end`` (two of this backend's handles
        for the same key groups, ``end`` the later), with its value at
        ``end`` or ``DELETED``, if there are such files: the change feed
        then reads only them. ``None`` (the default): it compares both
        states whole."""
        return None

    def offline_settings(self, configured: StateBackend) -> Any:
        """What :meth:`offline_backend` keeps of the job's configured backend
        (its serializer, say), on the driver; picklable: it travels to the
        executors. ``None`` by default."""
        return None

    @abstractmethod
    def offline_backend(self, workdir: str, settings: Any) -> StateBackend:
        """The backend ``offline.bootstrap`` loads a subtask's rows into and
        snapshots, on a Spark executor: local files (if any) under
        ``workdir``; ``settings`` is what :meth:`offline_settings` kept."""


_kinds: dict[str, BackendKind] = {}


def register(kind: BackendKind) -> BackendKind:
    """Make ``kind`` known under ``kind.name`` (a backend's package calls it
    once, when it is imported); returns it. Registering one name twice with
    another kind is refused."""
    if kind.handle_type.backend != kind.name:
        raise ValueError(f"backend {kind.name!r}: its handle type "
                         f"{kind.handle_type.__qualname__} names backend "
                         f"{kind.handle_type.backend!r}")
    known = _kinds.get(kind.name)
    if known is not None and type(known) is not type(kind):
        raise ValueError(f"a state backend named {kind.name!r} is registered already "
                         f"({type(known).__qualname__})")
    register_handle_type(kind.handle_type)
    _kinds[kind.name] = kind
    return kind


def names() -> tuple[str, ...]:
    """The names of the registered backends, in registration order."""
    return tuple(_kinds)


def kinds() -> tuple[BackendKind, ...]:
    """The registered backends, in registration order."""
    return tuple(_kinds.values())


def kind_named(name: str) -> BackendKind:
    """The registration of backend ``name``; ``KeyError`` naming those known."""
    kind = _kinds.get(name)
    if kind is None:
        raise KeyError(f"no state backend is registered as {name!r}; the registered ones are "
                       + ", ".join(repr(n) for n in _kinds))
    return kind


def kind_of(handle: KeyedStateHandle) -> BackendKind:
    """The registration of the backend that wrote ``handle``."""
    return kind_named(handle.backend)


def kind_of_backend(backend: StateBackend) -> BackendKind | None:
    """The registration whose :attr:`BackendKind.backend_type` ``backend`` is
    (``None``: none is)."""
    for kind in _kinds.values():
        if isinstance(backend, kind.backend_type):
            return kind
    return None
