"""Worker processes started as new interpreters, where a fork is not safe.

A process that has run RocksDB cannot fork workers (``process.py``,
``fork_hazard``), so its workers start afresh: a new interpreter with the
caller's module path, holding only its sockets, which reads the attempt's
:class:`~eddyflow.runtime.workers.worker.WorkerJob` from its control link
and runs it as a forked worker would.

The job is pickled with cloudpickle: user functions are lambdas and
closures, which the standard pickle ships by name only (Spark, Dask and Ray
ship them the same way). Functions and classes of a module the new
interpreter cannot import by name travel by value: a job file that
``eddyflow run`` loaded by path, the helpers beside it, and (cloudpickle's
rule) ``__main__``. What does not pickle at all (a lock, a socket, an open
connection in a closure) refuses the job in one line naming the operator,
source or sink and the path to the object.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import signal
import socket
import sys
import types
from collections.abc import Iterator
from typing import Any, NoReturn

import cloudpickle  # type: ignore[import-untyped]  # (no type hints shipped)

from eddyflow.runtime import faults
from eddyflow.runtime.exchange.remote import Link
from eddyflow.runtime.workers.process import (
    JOB_HEADER,
    WorkerSockets,
    WorkersRefused,
    die_with_parent,
)
from eddyflow.runtime.workers.protocol import WorkerFailed
from eddyflow.runtime.workers.worker import WorkerJob

__all__ = ["pickle_job", "worker_main"]

#: How deep the search for what does not pickle looks into an operator's
#: function (closure variables, globals, attributes, items).
SEARCH_DEPTH = 4
#: Items of a container the search looks at.
SEARCH_ITEMS = 64


def pickle_job(job: WorkerJob) -> bytes:
    """``job`` (and the armed fault points of tests) as a spawned worker
    loads it; :class:`WorkersRefused` naming what does not pickle."""
    registered = set(cloudpickle.list_registry_pickle_by_value())
    by_value = [m for m in unimportable_modules() if m.__name__ not in registered]
    for module in by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        data: bytes = cloudpickle.dumps((faults.armed(), job), protocol=pickle.HIGHEST_PROTOCOL)
        return data
    except Exception as exc:
        raise WorkersRefused(_what_does_not_pickle(job, exc)) from exc
    finally:
        for module in by_value:
            cloudpickle.unregister_pickle_by_value(module)


def unimportable_modules() -> list[types.ModuleType]:
    """The top-level modules of this process that a new interpreter with
    the same ``sys.path`` could not import by their name: loaded from a
    file by path (a job file), or from a folder since taken off the path."""
    roots = {os.path.realpath(p or os.curdir) for p in sys.path if isinstance(p, str)}
    found = []
    for name, module in list(sys.modules.items()):
        if "." in name or name in ("__main__", "__mp_main__"):
            continue  # (a submodule comes with its package; cloudpickle ships __main__)
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not file.endswith(".py"):
            continue  # built in, frozen or compiled: imported from where it was
        path = os.path.realpath(file)
        folder, base = os.path.split(path)
        if base == "__init__.py":
            folder, base = os.path.split(folder)
        else:
            base = base[:-3]
        if base != name or folder not in roots:
            found.append(module)
    return found


def _what_does_not_pickle(job: WorkerJob, exc: BaseException) -> str:
    for node in job.plan.graph.nodes:
        where = _culprit(node.payload, SEARCH_DEPTH)
        if where is not None:
            role = "source" if node.is_source else "sink" if node.is_sink else "operator"
            return f"{role} '{node.uid}' cannot be sent to a worker process: {where}"
    for label, part in (("the state backend", job.config.state_backend),
                        ("the clock", job.config.clock),
                        ("the checkpoint settings", job.checkpointing),
                        ("the restored checkpoint", job.restore)):
        where = _culprit(part, SEARCH_DEPTH)
        if where is not None:
            return f"{label} cannot be sent to a worker process: {where}"
    return f"the job cannot be sent to a worker process: {type(exc).__name__}: {exc}"


def _culprit(obj: Any, depth: int) -> str | None:
    """Where in ``obj`` pickling fails (a path of closure variables,
    globals, attributes and items, and the error), or ``None``."""
    try:
        cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        if depth > 0:
            for label, part in _parts(obj):
                inner = _culprit(part, depth - 1)
                if inner is not None:
                    return f"{label} -> {inner}"
        return f"{_describe(obj)} does not pickle ({type(exc).__name__}: {exc})"
    return None


def _parts(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, types.FunctionType):
        of = f" of {_describe(obj)}"
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=False):
            with contextlib.suppress(ValueError):  # an empty cell
                yield f"closure variable '{name}'{of}", cell.cell_contents
        for name in obj.__code__.co_names:
            if name in obj.__globals__:
                yield f"global '{name}'{of}", obj.__globals__[name]
        for i, default in enumerate(obj.__defaults__ or ()):
            yield f"default {i}{of}", default
    elif isinstance(obj, types.MethodType):
        yield "the object of its method", obj.__self__
        yield "its method", obj.__func__
    elif isinstance(obj, functools.partial):
        yield "the partial's function", obj.func
        for i, arg in enumerate(obj.args):
            yield f"the partial's argument {i}", arg
        for name, arg in obj.keywords.items():
            yield f"the partial's argument '{name}'", arg
    elif isinstance(obj, dict):
        for key, value in list(obj.items())[:SEARCH_ITEMS]:
            yield f"item {key!r}", value
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, item in enumerate(list(obj)[:SEARCH_ITEMS]):
            yield f"item {i}", item
    else:
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            for name, value in attributes.items():
                yield f"attribute '{name}' of {type(obj).__name__}", value
        for name in getattr(type(obj), "__slots__", ()):
            if isinstance(name, str) and hasattr(obj, name):
                yield f"attribute '{name}' of {type(obj).__name__}", getattr(obj, name)


def _describe(obj: Any) -> str:
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        return f"function {obj.__qualname__} ({code.co_filename}:{code.co_firstlineno})"
    kind = type(obj)
    return f"a {kind.__module__}.{kind.__qualname__}"


# -- in the worker ---------------------------------------------------------------


def worker_main(argv: list[str]) -> NoReturn:
    """A spawned worker's entry point (``process.py`` starts it): ``argv``
    is its caller's pid, its index, its control link's descriptor and its
    peers' (``worker:fd,...``)."""
    parent, index, control = int(argv[0]), int(argv[1]), int(argv[2])
    die_with_parent(parent)
    # Interrupting the job is the caller's: it stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    peers: dict[int, socket.socket] = {}
    for part in filter(None, argv[3].split(",")):
        worker, fd = part.split(":")
        peers[int(worker)] = socket.socket(fileno=int(fd))
    own = WorkerSockets(socket.socket(fileno=control), peers)
    code = 70
    try:
        try:
            armed, job = _receive(own.control)
            if not isinstance(job, WorkerJob):
                raise TypeError(f"expected a WorkerJob, got {type(job).__name__}")
        except Exception as exc:
            code = asyncio.run(_report(index, own, exc))
        else:
            faults.rearm(armed)
            code = job.main(index, own)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        # (As a forked worker: no interpreter shutdown waits for a thread
        # a library left behind.)
        os._exit(code)


def _receive(sock: socket.socket) -> tuple[dict[str, tuple[int, int]], Any]:
    (size,) = JOB_HEADER.unpack(_read_exactly(sock, JOB_HEADER.size))
    loaded = pickle.loads(_read_exactly(sock, size))
    armed, job = loaded
    return armed, job


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError("the caller closed the control link before sending the job")
        got += n
    return bytes(data)


async def _report(index: int, own: WorkerSockets, exc: BaseException) -> int:
    """Tell the caller this worker could not load the job (a restart would
    not either), and leave once it has read that."""
    message = f"worker {index} could not load the job: {type(exc).__name__}: {exc}"
    link = Link(own.control, f"control of worker {index}")
    with contextlib.suppress(OSError):
        await link.open()
        refused = pickle.dumps(WorkersRefused(message), protocol=pickle.HIGHEST_PROTOCOL)
        link.send(WorkerFailed(message, None, None, None, refused, message))
        with contextlib.suppress(EOFError):
            while True:
                await link.recv()
        await link.aclose()
    for peer in own.peers.values():
        peer.close()
    return 1
