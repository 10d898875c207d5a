"""What ``window_all`` (windows of the whole stream) keys its records by: one key for every
record, as a function (a user's window function) or as a column (a built-in's vectorized
path), which no output shows."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pyarrow as pa


class _AllRecords:
    """The key of ``window_all``: one for every record."""

    __name__ = "all"

    def __call__(self, record: Any) -> Hashable:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _AllRecords)

    def __hash__(self) -> int:
        return 0


ALL = _AllRecords()
ALL_COLUMN = "_window_all"
"""The key column ``window_all`` of a built-in adds (the vectorized path needs one)."""


def with_window_all_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``window_all``'s records with its key column."""
    return batch.append_column(ALL_COLUMN, pa.repeat(0, batch.num_rows))


def without_window_all_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``window_all``'s late records as they came (without its key column)."""
    return batch.drop_columns([ALL_COLUMN]) if ALL_COLUMN in batch.schema.names else batch
