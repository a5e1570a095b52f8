"""Between two worker processes: a socket, or a ring in shared memory? (docs/concepts/workers.md)

The smallest honest experiment for the records a keyed exchange moves
between workers: a producer process sends a word count's record batches
(``--batch`` words each, as ``exchange/remote.py`` frames them: a pickled
list of ``(DATA, channel, batch)``), a consumer process unpickles each one
and returns a credit for it; the producer keeps at most ``--window``
frames unconsumed (the channel's capacity). Three transports:

* ``socket``: a ``socketpair`` (what the runtime uses): the frame is
  copied into the kernel and out again, credits come back on the same
  socket;
* ``ring``: a ring of frames in ``multiprocessing.shared_memory``: the
  producer copies the frame into the ring and the consumer unpickles it
  where it lies (no copy out); a pipe in each direction carries the
  wake-up ("a frame is there") and the credit ("a frame was consumed"),
  as the reader of an event loop has to be woken by something it can
  wait on;
* ``none``: pickling and unpickling in one process, no transport: the
  floor both are measured against.

Each with both encodings of a batch of words: ``pickle`` (a list of
``str``) and ``packed`` (``exchange/remote.py``'s ``PackedStrs``: the
words joined into one UTF-8 string). Prints words/s, the CPU seconds both
processes used, and every configuration's CPU against ``socket`` with
``pickle`` (the runtime before packing), best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import struct
import time
from collections.abc import Callable
from multiprocessing import shared_memory
from typing import Any

from eddyflow.runtime.exchange.events import RecordBatch
from eddyflow.runtime.exchange.remote import DATA, pack_batch

_HEADER = struct.Struct("!I")
_INDEX = struct.Struct("<Q")  # the ring's write offset, at its start


def make_batches(words: int, batch: int) -> list[RecordBatch]:
    """The benchmark's batches: the words of benchmarks/workers.py's word count."""
    all_words = [f"w{i * 7919 % 50_000}" for i in range(words)]
    span = (("words.txt split 'words.txt:0'", 0, words),)
    return [RecordBatch(all_words[i:i + batch], span) for i in range(0, words, batch)]


def encode(batch: RecordBatch, packed: bool) -> bytes:
    """One frame's body, as a link pickles it."""
    return pickle.dumps([(DATA, 0, pack_batch(batch) if packed else batch)], protocol=5)


def decode(body: Any) -> int:
    """The records a frame's body holds (unpickled, as a link's reader does)."""
    return sum(len(item) for _, _, item in pickle.loads(body))


#: CPU seconds the consumer process used, as it reported them (the fork
#: and the child's exit are left out: they are no part of a transport).
CHILD_CPU: list[float] = [0.0]
_CPU = struct.Struct("<d")


def in_child(fn: Callable[[], None]) -> tuple[int, int]:
    """Fork a child that runs ``fn``; its pid and the pipe its CPU time comes on."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            started = time.process_time()
            fn()
            os.write(w, _CPU.pack(time.process_time() - started))
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(w)
    return pid, r


def reap(child: tuple[int, int]) -> None:
    """Wait for the child; its CPU seconds into ``CHILD_CPU``."""
    pid, r = child
    _, status = os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    if status or len(data) != _CPU.size:
        raise RuntimeError(f"the benchmark's child failed ({status})")
    CHILD_CPU[0] = _CPU.unpack(data)[0]


def run_none(batches: list[RecordBatch], packed: bool, window: int) -> int:
    return sum(decode(encode(b, packed)) for b in batches)


def run_socket(batches: list[RecordBatch], packed: bool, window: int) -> int:
    a, b = socket.socketpair()
    n_frames = len(batches)

    def consume() -> None:
        a.close()
        buf = bytearray(1 << 16)
        for _ in range(n_frames):
            head = b.recv(_HEADER.size, socket.MSG_WAITALL)
            (n,) = _HEADER.unpack(head)
            if len(buf) < n:
                buf = bytearray(n)
            view = memoryview(buf)[:n]
            got = 0
            while got < n:
                got += b.recv_into(view[got:], n - got)
            decode(view)
            del view
            b.sendall(b"c")  # the credit
        b.close()

    child = in_child(consume)
    b.close()
    unacked = 0
    for batch in batches:
        while unacked >= window:
            unacked -= len(a.recv(window))
        body = encode(batch, packed)
        a.sendall(_HEADER.pack(len(body)) + body)
        unacked += 1
    while unacked:
        unacked -= len(a.recv(window))
    a.close()
    reap(child)
    return sum(map(len, batches))


def run_ring(batches: list[RecordBatch], packed: bool, window: int) -> int:
    frame = max(len(encode(b, packed)) for b in batches) + _HEADER.size
    size = frame * (window + 1)
    shm = shared_memory.SharedMemory(create=True, size=size)
    wake_r, wake_w = os.pipe()  # producer -> consumer: a frame is there
    credit_r, credit_w = os.pipe()  # consumer -> producer: a frame was consumed
    n_frames = len(batches)

    def consume() -> None:
        os.close(wake_w)
        os.close(credit_r)
        ring = shared_memory.SharedMemory(name=shm.name)
        buf = ring.buf
        assert buf is not None
        offset = 0
        for _ in range(n_frames):
            os.read(wake_r, 1)
            (n,) = _HEADER.unpack_from(buf, offset)
            if n == 0:  # the producer wrapped around
                offset = 0
                (n,) = _HEADER.unpack_from(buf, offset)
            view = buf[offset + _HEADER.size:offset + _HEADER.size + n]
            decode(view)  # where it lies: no copy out
            view.release()
            offset += _HEADER.size + n
            os.write(credit_w, b"c")
        del buf
        ring.close()

    child = in_child(consume)
    os.close(wake_r)
    os.close(credit_w)
    buf = shm.buf
    assert buf is not None
    offset = 0
    unacked = 0
    try:
        for batch in batches:
            while unacked >= window:
                unacked -= len(os.read(credit_r, window))
            body = encode(batch, packed)
            if offset + _HEADER.size + len(body) > size:
                # (The window's frames fit in the ring: the start is free.)
                _HEADER.pack_into(buf, offset, 0)
                offset = 0
            _HEADER.pack_into(buf, offset, len(body))
            buf[offset + _HEADER.size:offset + _HEADER.size + len(body)] = body
            offset += _HEADER.size + len(body)
            os.write(wake_w, b"w")
            unacked += 1
        while unacked:
            unacked -= len(os.read(credit_r, window))
        reap(child)
    finally:
        del buf
        os.close(wake_w)
        os.close(credit_r)
        shm.close()
        shm.unlink()
    return sum(map(len, batches))


TRANSPORTS: dict[str, Callable[[list[RecordBatch], bool, int], int]] = {
    "none": run_none, "socket": run_socket, "ring": run_ring}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--words", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=5_000,
                   help="words a frame (a flat_map of 1024 lines of 10 words, split over "
                        "2 channels, sends about 5000)")
    p.add_argument("--window", type=int, default=2, help="frames unconsumed at most")
    p.add_argument("--repeat", type=int, default=5, help="rounds (best of)")
    args = p.parse_args()
    batches = make_batches(args.words, args.batch)
    best_wall: dict[tuple[str, str], float] = {}
    best_cpu: dict[tuple[str, str], float] = {}
    for _ in range(args.repeat):
        for name, fn in TRANSPORTS.items():
            for encoding in ("pickle", "packed"):
                CHILD_CPU[0] = 0.0
                cpu = time.process_time()
                t = time.perf_counter()
                n = fn(batches, encoding == "packed", args.window)
                wall = time.perf_counter() - t
                used = time.process_time() - cpu + CHILD_CPU[0]
                assert n == args.words, (n, args.words)
                key = (name, encoding)
                best_wall[key] = min(best_wall.get(key, wall), wall)
                best_cpu[key] = min(best_cpu.get(key, used), used)
    base = best_cpu[("socket", "pickle")]
    print(f"{os.cpu_count()} CPUs; CPU seconds of both processes (the fork left out); "
          f"{args.words:,} words in frames of {args.batch:,}, "
          f"window {args.window}; best of {args.repeat}")
    for (name, encoding), cpu in best_cpu.items():
        wall = best_wall[(name, encoding)]
        print(f"{name:6} {encoding:6}: {args.words / wall / 1e6:6.2f} M words/s, "
              f"CPU {cpu:.3f} s ({cpu / args.words * 1e9:4.0f} ns a word), "
              f"{cpu / base:.2f}x the CPU of socket+pickle")


if __name__ == "__main__":
    main()
