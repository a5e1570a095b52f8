"""eddyflow: exactly-once stream processing on asyncio.

The public API (docs/reference/) is re-exported here: ``import eddyflow as ef``.
"""

from eddyflow import testing
from eddyflow.checkpoint.listing import CheckpointInfo, list_checkpoints
from eddyflow.connectors import (
    FileSink,
    ListSink,
    NotReplayableError,
    PrintSink,
    Sink,
    SinkWriter,
    Source,
    SourceReader,
    SourceSplit,
    SplitSource,
)
from eddyflow.connectors.log import Log
from eddyflow.datastream import DataStream, IterativeStream, KeyedStream
from eddyflow.environment import StreamEnvironment
from eddyflow.errors import (
    CheckpointFolderInUse,
    EddyflowError,
    IncompatibleCheckpoint,
    JobFailed,
    RestoreRefused,
)
from eddyflow.functions import KeyedProcessFunction, RuntimeContext
from eddyflow.keygroups import UnsupportedKeyError
from eddyflow.restart import FixedDelayRestart, NoRestart, RestartStrategy
from eddyflow.result import JobResult
from eddyflow.runtime.metrics import CheckpointMetrics, JobMetrics, OperatorMetrics
from eddyflow.state import (
    ListState,
    MapState,
    MemoryStateBackend,
    ReducingState,
    RocksDBStateBackend,
    StateBackend,
    ValueState,
)
from eddyflow.state.ttl import StateTtl
from eddyflow.windowing import (
    AggregateFunction,
    EventTimeSessionWindows,
    OutputTag,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WatermarkStrategy,
    WindowResult,
)

__version__ = "0.1.0"

__all__ = [
    "AggregateFunction",
    "CheckpointFolderInUse",
    "CheckpointInfo",
    "CheckpointMetrics",
    "DataStream",
    "EddyflowError",
    "EventTimeSessionWindows",
    "FileSink",
    "FixedDelayRestart",
    "IncompatibleCheckpoint",
    "IterativeStream",
    "JobFailed",
    "JobMetrics",
    "JobResult",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListSink",
    "ListState",
    "Log",
    "MapState",
    "MemoryStateBackend",
    "NoRestart",
    "NotReplayableError",
    "OperatorMetrics",
    "OutputTag",
    "PrintSink",
    "ProcessWindowFunction",
    "ReducingState",
    "RestartStrategy",
    "RestoreRefused",
    "RocksDBStateBackend",
    "RuntimeContext",
    "Sink",
    "SinkWriter",
    "SlidingEventTimeWindows",
    "Source",
    "SourceReader",
    "SourceSplit",
    "SplitSource",
    "StateBackend",
    "StateTtl",
    "StreamEnvironment",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "UnsupportedKeyError",
    "ValueState",
    "WatermarkStrategy",
    "WindowResult",
    "__version__",
    "list_checkpoints",
    "testing",
]
