"""Connectors: the public API a source or a sink implements to be used by a cutline job.

* Sources (:mod:`cutline.connectors.source`): a :class:`Source` of splits, read on every
  subtask by a :class:`SplitReader` that reports :class:`Records`, :class:`Nothing` now, or a
  split :class:`Finished`, and its position per split at every checkpoint.
* Sinks (:mod:`cutline.connectors.sink`): a :class:`Sink` whose :class:`SinkWriter` writes,
  prepares a committable at every checkpoint (possibly a :class:`PendingCommit` finished on
  the snapshot thread) and commits it once the checkpoint is complete; a
  :class:`FunctionSink` (``stream.sink_to(fn)``) for destinations without transactions, at
  least once.

The built-in connectors (``env.from_sequence``, ``env.read_parquet``, ``read_csv``,
``read_jsonl``, ``write_parquet``, ``write_jsonl``, ``collect``) are of this API like any
other. How to write one: ``docs/connectors.md``.
"""

from cutline.connectors.sink import (
    FunctionSink,
    GlobalCommitter,
    PendingCommit,
    Sink,
    SinkContext,
    SinkError,
    SinkWriter,
)
from cutline.connectors.source import (
    Batch,
    Finished,
    Nothing,
    ReadResult,
    Records,
    Source,
    SourceContext,
    SourceError,
    SplitReader,
)
from cutline.protocol.splits import Split

__all__ = [
    "Batch",
    "Finished",
    "FunctionSink",
    "GlobalCommitter",
    "Nothing",
    "PendingCommit",
    "ReadResult",
    "Records",
    "Sink",
    "SinkContext",
    "SinkError",
    "SinkWriter",
    "Source",
    "SourceContext",
    "SourceError",
    "Split",
    "SplitReader",
]
