"""Sources and sinks: the replayable ``Source`` protocol with its built-in
implementations, and the two-phase-commit sink protocol with ``ListSink``,
``FileSink`` and the print sink.
"""

from eddyflow.connectors.asynciter import AsyncIterableSource
from eddyflow.connectors.collection import CollectionSource
from eddyflow.connectors.filesink import FileSink
from eddyflow.connectors.log import LogSource
from eddyflow.connectors.sink import ListSink, PrintSink, Sink, SinkWriter
from eddyflow.connectors.source import NotReplayableError, Source, SourceReader
from eddyflow.connectors.splits import SourceSplit, SplitSource
from eddyflow.connectors.textfile import TextFileSource, TextFolderSource

__all__ = [
    "AsyncIterableSource",
    "CollectionSource",
    "FileSink",
    "ListSink",
    "LogSource",
    "NotReplayableError",
    "PrintSink",
    "Sink",
    "SinkWriter",
    "Source",
    "SourceReader",
    "SourceSplit",
    "SplitSource",
    "TextFileSource",
    "TextFolderSource",
]
