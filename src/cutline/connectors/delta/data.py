"""A Delta table's data file read as the stream's records (:class:`DataFileReader`): its Parquet
row groups from a row on, with the job's columns, the partition columns made from the log's
partition values (a data file does not hold them), a column the file lacks (added to the table
after it was written) null."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cutline.connectors.delta.log import AddedFile
from cutline.connectors.source import SourceError
from cutline.connectors.tables.parts import line

BATCH_ROWS = 65_536
"""Rows decoded at a time (a read hands out at most what it is asked for, the rest next)."""


class DataFileReader:
    """The rows of data file ``file`` of ``version`` from row ``skip`` on (0-based), in the
    job's ``schema``; ``partition_columns``: those of the table. ``where`` names the table in
    messages."""

    def __init__(
        self,
        store: pafs.FileSystem,
        file: AddedFile,
        version: int,
        schema: pa.Schema,
        partition_columns: tuple[str, ...],
        where: str,
        skip: int = 0,
    ) -> None:
        self.file, self.schema = file, schema
        self.where = f"{where}: data file {file.path} (version {version})"
        if file.deletion_vector:
            raise SourceError(
                f"{self.where} has a deletion vector (rows of it deleted), which this source "
                "cannot apply: its rows would come back"
            )
        try:
            self.handle = store.open_input_file(file.path)
        except FileNotFoundError:
            raise SourceError(
                f"{self.where} is gone (removed by VACUUM?): the log names it, so its rows "
                "cannot be read; a stream must read a version before its files are vacuumed "
                "(delta.deletedFileRetentionDuration)"
            ) from None
        except OSError as exc:
            raise SourceError(f"{self.where} cannot be read: {exc}") from None
        try:
            parquet = pq.ParquetFile(self.handle)
        except (pa.ArrowException, OSError) as exc:
            self.handle.close()
            raise SourceError(f"{self.where} is not a valid Parquet file: {exc}") from None
        present = parquet.schema_arrow
        self.columns = {
            f.name: present.field(f.name).type
            for f in schema
            if f.name in present.names and f.name not in partition_columns
        }
        self.constants = {
            f.name: _partition_value(file.partition.get(f.name), f.type, self.where, f.name)
            for f in schema
            if f.name in partition_columns
        }
        groups, passed = [], 0
        metadata = parquet.metadata
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group).num_rows
            if passed + rows <= skip:
                passed += rows
            else:
                groups.append(group)
        total = metadata.num_rows
        if skip > total:
            self.handle.close()
            raise SourceError(
                f"{self.where} has {total} rows, and the checkpoint says {skip} were read: the "
                "file changed since"
            )
        self.drop = skip - passed
        """Rows of the first row group read already."""
        read = list(self.columns) or present.names[:1]  # (partition columns only: the rows)
        self.batches: Iterator[pa.RecordBatch] = parquet.iter_batches(
            batch_size=BATCH_ROWS, row_groups=groups, columns=read, use_threads=False
        )
        self.pending: pa.RecordBatch | None = None

    def take(self, max_rows: int) -> pa.RecordBatch | None:
        """The next rows, at most ``max_rows``; ``None`` once every row was handed out."""
        while self.pending is None or not self.pending.num_rows:
            try:
                batch = next(self.batches, None)
            except (pa.ArrowException, OSError) as exc:
                raise SourceError(f"{self.where} cannot be read: {line(exc)}") from None
            if batch is None:
                return None
            if self.drop:
                dropped = min(self.drop, batch.num_rows)
                batch, self.drop = batch.slice(dropped), self.drop - dropped
            self.pending = self._conform(batch)
        out = self.pending.slice(0, max_rows)
        self.pending = self.pending.slice(out.num_rows)
        return out

    def close(self) -> None:
        self.handle.close()

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rows = batch.num_rows
        arrays: list[Any] = []
        for field in self.schema:
            if field.name in self.constants:
                arrays.append(pa.repeat(self.constants[field.name], rows))
            elif field.name not in self.columns:
                arrays.append(pa.nulls(rows, field.type))  # (added to the table since)
            else:
                column = batch.column(field.name)
                if column.type != field.type:
                    try:
                        column = column.cast(field.type)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                        raise SourceError(
                            f"{self.where}: column {field.name!r} is {column.type} in this "
                            f"file, which cannot be read as {field.type} (the table's type): "
                            f"{line(exc)}"
                        ) from None
                arrays.append(column)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _partition_value(value: Any, kind: pa.DataType, where: str, column: str) -> pa.Scalar:
    """A partition column's value for the rows of a file: a commit's text parsed as the
    protocol writes it (an empty text is null; a timestamp without a zone is UTC), or
    delta-rs's value of a snapshot."""
    if value is None or value == "":
        return pa.scalar(None, kind)
    if not isinstance(value, str) or pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.scalar(value, kind)
    text = pa.array([value])
    try:
        try:
            return text.cast(kind)[0]
        except pa.ArrowInvalid:
            if not (pa.types.is_timestamp(kind) and kind.tz is not None):
                raise
            # "2024-01-02 03:04:05.123456", without a zone: UTC, by the protocol
            return text.cast(pa.timestamp(kind.unit)).cast(kind)[0]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SourceError(
            f"{where}: its partition value {value!r} of column {column!r} is not "
            f"{kind}: {line(exc)}"
        ) from None
