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
other, and so are those to other systems, imported when first named:

* :class:`KafkaSource` (``env.read_kafka``, exactly once) and :class:`KafkaSink`
  (``stream.write_kafka``, at least once), on confluent-kafka;
* :class:`PostgresSink` (``stream.write_postgres``, exactly once by two-phase commit), on
  psycopg;
* :class:`DeltaSink` (``stream.write_delta``, exactly once) and :class:`DeltaSource`
  (``env.read_delta``: a table's snapshot, then what each later version adds, exactly once),
  on deltalake;
* :class:`IcebergSink` (``stream.write_iceberg``, exactly once), on pyiceberg.

How to write one: ``docs/connectors/writing.md``.
"""

from typing import TYPE_CHECKING, Any

from cutline.connectors.sink import (
    FunctionSink,
    GlobalCommitter,
    PendingCommit,
    RecordError,
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

if TYPE_CHECKING:
    from cutline.connectors.delta import DeltaSink, DeltaSource
    from cutline.connectors.iceberg import IcebergSink
    from cutline.connectors.kafka import KafkaSink, KafkaSource
    from cutline.connectors.postgres import PostgresSink

_LAZY = {
    "DeltaSink": "cutline.connectors.delta",
    "DeltaSource": "cutline.connectors.delta",
    "IcebergSink": "cutline.connectors.iceberg",
    "KafkaSink": "cutline.connectors.kafka",
    "KafkaSource": "cutline.connectors.kafka",
    "PostgresSink": "cutline.connectors.postgres",
}


def __getattr__(name: str) -> Any:
    """The connectors to other systems, imported (with their client library) when first
    named: ``import cutline`` does not load confluent-kafka, psycopg, deltalake and pyiceberg."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cutline.connectors' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "Batch",
    "DeltaSink",
    "DeltaSource",
    "Finished",
    "FunctionSink",
    "GlobalCommitter",
    "IcebergSink",
    "KafkaSink",
    "KafkaSource",
    "Nothing",
    "PendingCommit",
    "PostgresSink",
    "ReadResult",
    "RecordError",
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
