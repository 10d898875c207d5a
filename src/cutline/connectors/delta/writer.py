"""A subtask's writer of a Delta table: its rows into part files while they come, the files
closed at each barrier and named in the checkpoint's committable (see
:mod:`cutline.connectors.delta`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake.exceptions import DeltaError

from cutline.connectors.delta.files import (
    DataFile,
    DeltaCommittable,
    DeltaPartFiles,
    DeltaTarget,
    app_id,
    stored,
)
from cutline.connectors.sink import SinkContext, SinkError
from cutline.connectors.tables.parts import cast_column, line, named
from cutline.connectors.tables.writer import PartWriter, mismatch, widens


class DeltaWriter(PartWriter[DataFile]):
    """One subtask's writer of a Delta table (:class:`~cutline.connectors.tables.writer.
    PartWriter`): rows made to fit the table's schema, into part files in its folder."""

    parts: DeltaPartFiles

    def __init__(self, target: DeltaTarget, context: SinkContext, restored: Mapping[int, Any]):
        super().__init__(context, f"Delta table {target.path}")
        self.target = target
        self.partition_by = tuple(target.partition_by or ())
        self.parts = DeltaPartFiles(target, self.prefix, context.subtask)
        self.prepared = max(
            (c.checkpoint for c in restored.values() if isinstance(c, DeltaCommittable)),
            default=0,
        )
        if restored or context.generation > 1:
            self._remove_orphans({context.subtask, *restored})

    @staticmethod
    def checkpoint_of(file: DataFile) -> int:
        return file.checkpoint

    def committed(self, checkpoint_id: int, files: list[DataFile]) -> DeltaCommittable:
        schema = self.file_schema
        serialized = schema.serialize().to_pybytes() if schema is not None else b""
        job, name = self.job, self.context.name
        return DeltaCommittable(job, name, checkpoint_id, serialized, self.partition_by, (*files,))

    def first_schema(self, schema: pa.Schema) -> pa.Schema:
        table = self.target.table()
        if table is None:
            wanted = pa.schema([f.with_type(stored(f.type, self.where, f.name)) for f in schema])
        else:
            wanted = pa.schema(table.schema().to_arrow())
            columns = tuple(table.metadata().partition_columns)
            if self.target.partition_by is not None and self.partition_by != columns:
                raise SinkError(f"{self.where} is partitioned by {list(columns)}")
            self.partition_by = columns
        self.parts.partition_by = self.partition_by
        for name in self.partition_by:
            kind = wanted.field(name).type if name in wanted.names else pa.null()
            if not (pa.types.is_string(kind) or pa.types.is_integer(kind) or kind == pa.date32()):
                raise SinkError(f"{self.where}: cannot partition by {name!r} ({kind})")
        return wanted

    def fit(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        schema = self.schema
        assert schema is not None
        for name in batch.schema.names:
            if name not in schema.names:
                raise SinkError(f"{self.where} has no column {name!r}, which the records have")
        columns = []
        for i, wanted in enumerate(schema):
            if wanted.name not in batch.schema.names:
                raise SinkError(f"{self.where}: the records have no column {wanted.name!r}")
            column = batch.column(wanted.name)
            if pa.types.is_null(wanted.type):  # (a new table's: its type known now)
                wanted = wanted.with_type(stored(column.type, self.where, wanted.name))
                schema = self.schema = schema.set(i, wanted)
            if not column.type.equals(wanted.type):
                given = stored(column.type, self.where, wanted.name)
                if not (given.equals(wanted.type) or widens(given, wanted.type)):
                    raise SinkError(mismatch(self.where, wanted.name, wanted.type, column.type))
            columns.append(cast_column(self.where, column, wanted))
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def _remove_orphans(self, subtasks: set[int]) -> None:
        """Delete the files ``subtasks`` wrote in earlier attempts of the job for checkpoints
        after the newest the table records: never committed (the restore's commit is done)."""
        table = self.target.table()
        done = table.transaction_version(app_id(self.job, self.context.name)) if table else None
        store = self.parts.store
        try:
            found = store.get_file_info(pafs.FileSelector("", recursive=True, allow_not_found=True))
            for info in found:
                subtask, checkpoint = named(info.base_name, self.prefix) or (-1, -1)
                if subtask in subtasks and checkpoint > (-1 if done is None else done):
                    store.delete_file(info.path)
        except (OSError, DeltaError) as exc:
            raise SinkError(f"cannot clean {self.target.path} up: {line(exc)}") from None
