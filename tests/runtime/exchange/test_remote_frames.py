"""What crosses a link between workers (``exchange/remote.py``'s frame
format): a record batch of ``str`` records packed into one string comes out
of the reader's unpickling as the batch that went in (records, order, span,
timestamps), whatever its strings hold; any other batch crosses pickled as
it is. And over a real socket pair, a link delivers packed and plain items
in order."""

from __future__ import annotations

import asyncio
import pickle
import socket
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from eddyflow.runtime.exchange.events import RecordBatch
from eddyflow.runtime.exchange.remote import DATA, PACK_MIN, Link, PackedStrs, pack_batch


def _crossed(item: Any) -> Any:
    return pickle.loads(pickle.dumps(pack_batch(item), protocol=5))


@given(st.lists(st.text(), min_size=PACK_MIN), st.booleans())
def test_a_batch_of_strings_crosses_packed_and_comes_out_equal(words: list[str],
                                                               stamped: bool) -> None:
    words.append("\ud800 a lone surrogate")
    stamps = [float(i) if i % 3 else None for i in range(len(words))] if stamped else None
    batch = RecordBatch(words, (("lines.txt", 3, 99),), stamps)
    out = _crossed(batch)
    assert type(out) is RecordBatch
    assert list(out) == words
    assert out.span == batch.span and out.timestamps == stamps
    if "\0" not in "".join(words):
        assert isinstance(pack_batch(batch), PackedStrs)


class Word(str):
    """A subclass of ``str``: its records must come out as themselves."""


def test_other_batches_cross_as_they_are() -> None:
    for records in (["a\0b"] + ["w"] * PACK_MIN,  # holds the separator
                    ["w"] * (PACK_MIN - 1),  # too few to pack
                    ["w"] * PACK_MIN + [1],  # not all str
                    [Word("w")] * PACK_MIN,  # a subclass stays itself
                    [""] * PACK_MIN):
        batch = RecordBatch(records)
        packed = pack_batch(batch)
        out = _crossed(batch)
        assert list(out) == records and [type(r) for r in out] == [type(r) for r in records]
        if records != [""] * PACK_MIN:
            assert packed is batch


def test_a_link_delivers_packed_and_plain_items_in_order() -> None:
    async def main() -> list[Any]:
        a, b = socket.socketpair()
        sender, receiver = Link(a, "a"), Link(b, "b")
        await sender.open()
        await receiver.open()
        sent: list[Any] = []
        for i in range(50):
            item: Any = RecordBatch([f"w{i}-{j}" for j in range(i)])
            sender.send((DATA, i % 3, pack_batch(item)))
            sent.append((DATA, i % 3, item))
            if i % 7 == 0:
                await sender.drain()  # several frames, several messages each
        await sender.aclose()
        got = []
        for _ in sent:
            got.append(await receiver.recv())
        receiver.close()
        return [sent, got]

    sent, got = asyncio.run(main())
    assert [(k, c, list(item)) for k, c, item in got] == [(k, c, list(item))
                                                          for k, c, item in sent]
