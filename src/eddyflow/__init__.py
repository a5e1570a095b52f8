"""eddyflow: exactly-once stream processing on asyncio.

The public API (API.md) is re-exported here: ``import eddyflow as ef``.
"""

from eddyflow.connectors import (
    FileSink,
    ListSink,
    NotReplayableError,
    PrintSink,
    Sink,
    SinkWriter,
    Source,
    SourceReader,
)
from eddyflow.datastream import DataStream, KeyedStream
from eddyflow.environment import StreamEnvironment
from eddyflow.errors import EddyflowError, JobFailed
from eddyflow.functions import KeyedProcessFunction, RuntimeContext
from eddyflow.keygroups import UnsupportedKeyError
from eddyflow.result import JobResult
from eddyflow.state import (
    ListState,
    MapState,
    MemoryStateBackend,
    ReducingState,
    StateBackend,
    ValueState,
)

__version__ = "0.1.0"

__all__ = [
    "DataStream",
    "EddyflowError",
    "FileSink",
    "JobFailed",
    "JobResult",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListSink",
    "ListState",
    "MapState",
    "MemoryStateBackend",
    "NotReplayableError",
    "PrintSink",
    "ReducingState",
    "RuntimeContext",
    "Sink",
    "SinkWriter",
    "Source",
    "SourceReader",
    "StateBackend",
    "StreamEnvironment",
    "UnsupportedKeyError",
    "ValueState",
    "__version__",
]
