"""A subtask's writer of an Iceberg table: its rows into part files while they come, the files
closed at each barrier and named in the checkpoint's committable (see
:mod:`cutline.connectors.iceberg`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO

from cutline.connectors.iceberg.committer import newest_checkpoint
from cutline.connectors.iceberg.files import IcebergCommittable, IcebergFile, IcebergPartFiles
from cutline.connectors.iceberg.target import IcebergTarget, fit_plan, fitted
from cutline.connectors.sink import SinkContext, SinkError
from cutline.connectors.tables.parts import line, named
from cutline.connectors.tables.writer import PartWriter


class IcebergWriter(PartWriter[IcebergFile]):
    """One subtask's writer of an Iceberg table (:class:`~cutline.connectors.tables.writer.
    PartWriter`): rows made to fit the table's schema, into part files in its data location.
    The table is read at the first batch (made from the records' columns if missing)."""

    parts: IcebergPartFiles

    def __init__(self, target: IcebergTarget, context: SinkContext, restored: Mapping[int, Any]):
        super().__init__(context, target.where)
        self.target = target
        self.parts = IcebergPartFiles(
            target.where, self.prefix, context.subtask, target.compression
        )
        self.table_uuid: str | None = None
        self.plans: dict[pa.Schema, list[int | None]] = {}
        """How batches of each schema seen go into the files' columns."""
        self.prepared = max(
            (c.checkpoint for c in restored.values() if isinstance(c, IcebergCommittable)),
            default=0,
        )
        if restored or context.generation > 1:
            self._remove_orphans({context.subtask, *restored})

    @staticmethod
    def checkpoint_of(file: IcebergFile) -> int:
        return file.checkpoint

    def first_schema(self, schema: pa.Schema) -> pa.Schema:
        catalog = self.target.load_catalog()
        table = self.target.load(catalog) or self.target.create(catalog, schema)
        self.table_uuid = str(table.metadata.table_uuid)
        return self.parts.use(table, self.target.check_partitions(table))

    def fit(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        assert self.schema is not None and self.parts.table is not None
        plan = self.plans.get(batch.schema)
        if plan is None:
            table = self.parts.table.schema()
            plan = self.plans[batch.schema] = fit_plan(self.where, table, self.schema, batch.schema)
        return fitted(self.where, batch, plan, self.schema)

    def committed(self, checkpoint_id: int, files: list[IcebergFile]) -> IcebergCommittable:
        name = self.context.name  # (even without files: see the committer)
        return IcebergCommittable(self.job, name, checkpoint_id, self.table_uuid, (*files,))

    def _remove_orphans(self, subtasks: set[int]) -> None:
        """Delete the files ``subtasks`` wrote in earlier attempts of the job for checkpoints
        after the newest the table holds: never committed (the restore's commit is done).
        Through a store pyiceberg's own FileIO (Arrow's) lists; with another FileIO they are
        left to Iceberg's removal of orphan files."""
        table = self.target.load(self.target.load_catalog())
        if table is None or not isinstance(table.io, PyArrowFileIO):
            return
        done = newest_checkpoint(table, self.job, self.context.name)
        try:
            scheme, netloc, path = table.io.parse_location(
                table.location_provider().data_path, table.io.properties
            )
            store = table.io.fs_by_scheme(scheme, netloc)
            found = store.get_file_info(
                pafs.FileSelector(path, recursive=True, allow_not_found=True)
            )
            for info in found:
                subtask, checkpoint = named(info.base_name, self.prefix) or (-1, -1)
                if subtask in subtasks and checkpoint > (-1 if done is None else done):
                    store.delete_file(info.path)
        except (OSError, ValueError) as exc:
            raise SinkError(f"cannot clean the {self.where} up: {line(exc)}") from None
