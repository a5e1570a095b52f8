"""The checkpoint protocol's messages cross a process boundary: each one, and
the statistics, pickles and comes back equal, whatever state it carries."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest

from eddyflow.checkpoint.handles import StateFile
from eddyflow.checkpoint.metadata import BackEdgeLog, ChannelState, SubtaskState
from eddyflow.checkpoint.storage import FileHandle
from eddyflow.runtime.checkpointing import messages
from eddyflow.runtime.checkpointing.barriers import CheckpointMode
from eddyflow.runtime.checkpointing.messages import (
    AbortCheckpoint,
    AcknowledgeCheckpoint,
    CheckpointOptions,
    CheckpointStats,
    DeclineCheckpoint,
    NotifyCheckpointComplete,
    SubtaskCheckpointStats,
    SubtaskId,
    SwitchToUnaligned,
    TaskStateSnapshot,
    TriggerCheckpoint,
)
from eddyflow.runtime.exchange.events import Barrier
from eddyflow.state.memory.handle import MemoryStateHandle

HANDLE = FileHandle("chk-4/head-0/backedge-log", 12, "ab" * 32)
CHANNELS = FileHandle("chk-4/op-1/channel-state", 40, "cd" * 32)
KEYED = MemoryStateHandle(
    kinds={"count": "value"}, entries=3, key_groups=range(0, 64),
    files=(StateFile(FileHandle("shared/f", 9, "ef" * 32), {"3": (0, 9)}, full=True,
                     grouped=False),))
ME = SubtaskId(2, 1)

#: Every state a subtask can acknowledge, each kind of part at least once.
STATE = TaskStateSnapshot(
    {
        "src": SubtaskState(is_source=True, position={"partition": [1, 2]}),
        "head": SubtaskState(backedge=BackEdgeLog(HANDLE, 4), watermark=1_000.5),
        "count": SubtaskState(keyed=KEYED, watermark=math.inf),
        "op": SubtaskState(channel_state=ChannelState(CHANNELS, {"x:a:b/0/1": 2},
                                                      {"y:b:c/1/0": 5})),
        "sink": SubtaskState(committables=((1, "txn-4"),), watermark=-math.inf),
    },
    (HANDLE, CHANNELS, KEYED.files[0].handle),
)

MESSAGES: list[Any] = [
    SubtaskId(0, 3),
    CheckpointOptions(),
    CheckpointOptions(CheckpointMode.UNALIGNED, unaligned=True),
    TriggerCheckpoint(4, 1_700_000_000.25),
    TriggerCheckpoint(5, 1_700_000_001.0, CheckpointOptions(CheckpointMode.SYNCHRONOUS)),
    SwitchToUnaligned(4),
    NotifyCheckpointComplete(4),
    AbortCheckpoint(4, "not complete after 60.0 s"),
    AcknowledgeCheckpoint(4, ME, STATE, SubtaskCheckpointStats(
        0.01, 0.002, 0.3, unaligned=True, channel_state_records=7, channel_state_bytes=40)),
    AcknowledgeCheckpoint(6, ME, TaskStateSnapshot({})),
    STATE,
    DeclineCheckpoint(4, ME, "subsumed by its final snapshot"),
    SubtaskCheckpointStats(),
    CheckpointStats(4, 0.5, 0.01, 1_024, 4_096, unaligned=True, switched=True,
                    channel_state_records=7, channel_state_bytes=40),
]


def test_every_message_of_the_module_is_covered() -> None:
    kinds = {type(m).__name__ for m in MESSAGES}
    assert kinds == set(messages.__all__)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_a_message_pickles_and_comes_back_equal(message: Any) -> None:
    for protocol in (pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):
        back = pickle.loads(pickle.dumps(message, protocol=protocol))
        assert back == message and type(back) is type(message)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_a_message_is_frozen(message: Any) -> None:
    name = next(iter(message.__dataclass_fields__))
    with pytest.raises(AttributeError):
        setattr(message, name, None)


def test_the_acknowledged_state_survives_the_trip_typed() -> None:
    ack = MESSAGES[8]
    back = pickle.loads(pickle.dumps(ack))
    parts = back.state.operators
    assert parts["head"].watermark == 1_000.5 and parts["count"].watermark == math.inf
    assert parts["count"].keyed == KEYED and parts["count"].keyed.key_groups == range(0, 64)
    assert parts["head"].backedge == BackEdgeLog(HANDLE, 4)
    assert parts["op"].channel_state is not None and parts["op"].channel_state.records == 7
    assert parts["src"].is_source and parts["src"].position == {"partition": [1, 2]}
    assert back.stats.channel_state_bytes == 40 and back.subtask == ME


def test_a_trigger_makes_the_barrier_the_task_emits() -> None:
    assert TriggerCheckpoint(4, 2.0).barrier() == Barrier(4, 2.0)
    unaligned = TriggerCheckpoint(4, 2.0, CheckpointOptions(CheckpointMode.UNALIGNED, True))
    assert unaligned.barrier() == Barrier(4, 2.0, unaligned=True)


def test_subtasks_order_by_chain_then_subtask() -> None:
    assert sorted([SubtaskId(1, 0), SubtaskId(0, 2), SubtaskId(0, 1)]) == [
        SubtaskId(0, 1), SubtaskId(0, 2), SubtaskId(1, 0)]
