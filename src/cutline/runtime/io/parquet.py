"""Parquet input: the file's row groups, cast to the job's schema (a file whose columns cannot be
is refused naming the column)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cutline.runtime.io.formats import SourceError
from cutline.runtime.io.rows import Block, Reject, conform


def parquet_blocks(stream: Any, path: str, schema: pa.Schema) -> Iterator[Block]:
    try:
        try:
            parquet = pq.ParquetFile(stream)
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(f"{path} is not a valid parquet file: {exc}") from exc
        present = parquet.schema_arrow
        check_castable(present, schema, path)
        columns = [n for n in schema.names if n in present.names] or present.names[:1]
        row = 0
        for batch in parquet.iter_batches(columns=columns):
            table = pa.Table.from_batches([batch])
            good, failed = conform(table, schema, path)
            rejects = [
                Reject(
                    i - n,
                    f"{path}, row {row + i + 1}",
                    table.slice(i, 1).to_pylist()[0],
                    failed[i],
                )
                for n, i in enumerate(sorted(failed))
            ]
            row += batch.num_rows
            yield Block(good, rejects)
    finally:
        stream.close()


def check_castable(present: pa.Schema, schema: pa.Schema, path: str) -> None:
    """A column of the file whose type cannot become the job's is an error naming the file."""
    for target in schema:
        index = present.get_field_index(target.name)
        if index < 0:
            continue
        have = present.field(index).type
        if have == target.type:
            continue
        try:
            pa.array([], have).cast(target.type)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            raise SourceError(
                f"{path}: column {target.name!r} is {have} in this file, which cannot be read "
                f"as {target.type} (the job's schema): {exc}"
            ) from exc


def lowest_timestamp(fs: Any, path: str, column: str) -> int | None:
    """The lowest value of ``column`` in a Parquet file, in epoch milliseconds, from its
    footer's statistics (no row is read); ``None`` when a row group has none, or the column
    is neither a timestamp nor integers. A source subtask holds its watermark there for a
    file it has not started yet."""
    try:
        with fs.open(path, "rb") as stream:
            parquet = pq.ParquetFile(stream)
            index = parquet.schema_arrow.get_field_index(column)
            if index < 0:
                return None
            type_ = parquet.schema_arrow.field(index).type
            if not (pa.types.is_timestamp(type_) or pa.types.is_integer(type_)):
                return None
            leaf = parquet.schema.to_arrow_schema().get_field_index(column)
            lowest: int | None = None
            for group in range(parquet.metadata.num_row_groups):
                stats = parquet.metadata.row_group(group).column(leaf).statistics
                if stats is None or not stats.has_min_max:
                    return None
                raw = stats.min_raw
                if not isinstance(raw, int):
                    return None
                lowest = raw if lowest is None else min(lowest, raw)
    except (pa.ArrowException, OSError, ValueError):
        return None
    if lowest is None:
        return None
    unit = str(type_.unit) if pa.types.is_timestamp(type_) else "ms"
    return {"s": lowest * 1000, "ms": lowest, "us": lowest // 1000, "ns": lowest // 1_000_000}[unit]
