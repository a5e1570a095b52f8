"""The feedback channel of a loop's back-edge.

A loop whose body multiplies records would deadlock on bounded channels: the
head blocks on a full body channel while the tail blocks on a full feedback
channel. So a back-edge channel always accepts. To keep memory bounded it
spills: once it holds more than ``memory_records`` records, further batches
are pickled to a temporary file and read back in order (FIFO across memory
and disk is preserved because, once spilling started, everything goes to
disk until the disk part is drained).
"""

from __future__ import annotations

import pickle
import struct
import tempfile
from typing import IO, Any

from eddyflow.errors import StateSerializationError
from eddyflow.runtime.exchange.channel import Channel
from eddyflow.runtime.exchange.events import RecordBatch
from eddyflow.state.serialization import find_unpicklable, reason_of, record_text

__all__ = ["FeedbackChannel"]

_LEN = struct.Struct(">Q")


class FeedbackChannel(Channel):
    """An unbounded channel that spills batches to disk past a memory bound."""

    __slots__ = ("_disk", "_disk_items", "_read_at", "_write_at", "memory_records",
                 "spill_dir", "spilled_batches")

    def __init__(self, name: str, memory_records: int = 1 << 16,
                 spill_dir: str | None = None) -> None:
        super().__init__(name, None)
        self.memory_records = memory_records
        self.spill_dir = spill_dir
        self._disk: IO[bytes] | None = None
        self._disk_items = 0  # items waiting on disk, all behind the memory ones
        self._read_at = 0
        self._write_at = 0
        self.spilled_batches = 0

    def append(self, item: Any) -> None:
        # Unbounded, so ``put`` never waits and ends here, as does an
        # unaligned checkpoint's hand-off.
        if self._disk_items or (self._records >= self.memory_records
                                and type(item) is RecordBatch):
            self._spill(item)
            gate = self._gate
            if gate is not None:
                gate.wake()
            return
        super().append(item)

    def _spill(self, item: Any) -> None:
        f = self._disk
        if f is None:
            f = self._disk = tempfile.TemporaryFile(  # noqa: SIM115 - closed in close()
                dir=self.spill_dir, prefix="eddyflow-feedback-")
        try:
            data = pickle.dumps((item, getattr(item, "span", None)),
                                protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            # Name the record; a restart would make and spill it again.
            records = item if type(item) is RecordBatch else [item]
            found = find_unpicklable((r, r) for r in records)
            if found is None:
                raise
            record, why = found
            raise StateSerializationError(
                reason_of(why), verb="spill", where="to disk",
                subject=f"record {record_text(record)} on back-edge channel '{self.name}'",
            ) from exc
        f.seek(self._write_at)
        f.write(_LEN.pack(len(data)))
        f.write(data)
        self._write_at = f.tell()
        self._disk_items += 1
        self.spilled_batches += 1
        if not self._items:
            self._unspill()

    def _unspill(self) -> None:
        """Move the oldest spilled item back into memory."""
        f = self._disk
        assert f is not None and self._disk_items
        f.seek(self._read_at)
        (n,) = _LEN.unpack(f.read(_LEN.size))
        item, span = pickle.loads(f.read(n))
        if type(item) is RecordBatch:
            item.span = span
        self._read_at = f.tell()
        self._disk_items -= 1
        if not self._disk_items:
            # Empty again: start the file over so it does not grow forever.
            self._read_at = self._write_at = 0
            f.truncate(0)
        self._items.append(item)
        self._records += len(item) if type(item) is RecordBatch else 1

    def __len__(self) -> int:
        return len(self._items) + self._disk_items

    def pop(self) -> Any:
        item = super().pop()
        if not self._items and self._disk_items:
            self._unspill()
        return item

    def close(self) -> None:
        """Close (and so delete) the spill file, if there is one."""
        if self._disk is not None:
            self._disk.close()
            self._disk = None
