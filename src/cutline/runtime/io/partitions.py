"""Hive-style partitions of a file sink's output (``write_parquet(..., partition_by=[...])``):
the records of each value of the partition columns go into a folder ``column=value/`` (nested,
one level per column, in the order given), without those columns, as ``write_delta`` lays out
a partitioned table. Readers that know the layout (``pyarrow.dataset`` with
``partitioning="hive"``, Spark, DuckDB, Polars) give the columns back from the folder names.

A value is written as text: integers in decimal, a date as ``YYYY-MM-DD``, a bool as ``true``
or ``false``, text as it is; the text is percent-encoded (``a/b`` as ``a%2Fb``), as readers
decode it. A null is ``__HIVE_DEFAULT_PARTITION__`` (Hive's, Spark's and Arrow's name for
it)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa

from cutline.connectors.sink import SinkError

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
"""The folder name of a null value."""


def partitionable(kind: pa.DataType) -> bool:
    """Whether a column of type ``kind`` can name folders: text, integers, bools, dates."""
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_date32(kind)
        or pa.types.is_null(kind)  # (a column all null so far: every row in the null folder)
    )


def check_columns(columns: Sequence[str], what: str) -> tuple[str, ...]:
    """``partition_by`` as given (a list of column names), checked: no name twice."""
    if isinstance(columns, str | bytes) or not all(isinstance(c, str) and c for c in columns):
        raise TypeError(f"{what}: partition_by must be a list of column names, not {columns!r}")
    names = tuple(columns)
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise ValueError(f"{what}: partition_by names {twice[0]!r} twice")
    return names


def check_schema(schema: pa.Schema | None, columns: Sequence[str], what: str) -> None:
    """When the records' columns are known as the job is built: each partition column is one
    of them, of a type that can name a folder, and not every column is one (a file needs a
    column of its own)."""
    if schema is None or not columns:
        return
    for column in columns:
        index = schema.get_field_index(column)
        if index < 0:
            raise ValueError(
                f"{what}: partition_by={list(columns)}: the records have no column {column!r} "
                f"(columns: {', '.join(schema.names) or 'none'})"
            )
        kind = schema.field(index).type
        if not partitionable(kind):
            raise ValueError(
                f"{what}: cannot partition by {column!r}, a column of {kind} (text, integers, "
                "bools and dates name folders)"
            )
    if set(schema.names) <= set(columns):
        raise ValueError(f"{what}: partition_by takes every column: the files would hold none")


def split(batch: pa.RecordBatch, columns: tuple[str, ...]) -> list[tuple[str, pa.RecordBatch]]:
    """The rows of ``batch`` by the values of ``columns``: per value, its folder
    (``a=1/b=x/``) and its rows (in their order) without those columns."""
    for column in columns:
        index = batch.schema.get_field_index(column)
        if index < 0:
            raise SinkError(
                f"cannot partition by {column!r}: the records have no such column (columns: "
                f"{', '.join(batch.schema.names)})"
            )
        kind = batch.schema.field(index).type
        if not partitionable(kind):
            raise SinkError(
                f"cannot partition by {column!r}, a column of {kind} (text, integers, bools "
                "and dates name folders)"
            )
    keys = pa.Table.from_batches([batch]).select(list(columns))
    for index, field in enumerate(keys.schema):
        if pa.types.is_null(field.type):  # (Arrow groups no nulls of type null)
            keys = keys.set_column(index, field.name, keys.column(index).cast(pa.string()))
    keyed = keys.append_column("_row", pa.array(np.arange(len(batch))))
    groups = keyed.group_by(list(columns), use_threads=False).aggregate([("_row", "list")])
    rows = groups.column("_row_list")
    out = []
    for i in range(groups.num_rows):
        folder = "".join(f"{_text(c)}={folder_name(groups.column(c)[i].as_py())}/" for c in columns)
        out.append((folder, batch.take(rows[i].values).drop_columns(list(columns))))
    return out


def folder_name(value: Any) -> str:
    """How a value of a partition column names its folder (see the module's docstring)."""
    if value is None:
        return HIVE_NULL
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.date):
        return value.isoformat()
    return _text(str(value))


def _text(text: str) -> str:
    return quote(text, safe="")


def is_partition_folder(name: str) -> bool:
    """Whether a folder of the output is one of a partition (``column=value``), not another
    (``_pending``, a hidden one)."""
    return "=" in name and not name.startswith(("_", "."))
