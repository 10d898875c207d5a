"""Connectors: the public API a source or a sink implements to be used by a cutline job.

* Sources (:mod:`cutline.connectors.source`): a :class:`Source` of splits, read on every
  subtask by a :class:`SplitReader` that reports :class:`Records`, :class:`Nothing` now, or a
  split :class:`Finished`, and its position per split at every checkpoint.

The built-in sources (``env.from_sequence``, ``env.read_parquet``, ``read_csv``,
``read_jsonl``) are sources of this API like any other. How to write one:
``docs/design/connectors.md``.
"""

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
    "Nothing",
    "ReadResult",
    "Records",
    "Source",
    "SourceContext",
    "SourceError",
    "Split",
    "SplitReader",
]
