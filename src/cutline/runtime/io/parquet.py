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
