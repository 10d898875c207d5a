"""The Iceberg sink's data files: where they go in the table's data location, and what an
Iceberg manifest needs of each (see :mod:`cutline.connectors.iceberg`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from cutline.connectors.iceberg.target import file_schema
from cutline.connectors.tables.parts import PartFile, PartFiles, partitions


@dataclass(frozen=True)
class IcebergFile:
    """A Parquet data file written into the table's data location, not known to be committed
    yet: what the manifest entry that adds it says."""

    path: str
    """Its location (a URI: ``file:///...``, ``s3://...``)."""
    size: int
    partition: tuple[Any, ...]
    """The values of its partition, as Iceberg keeps them (a date as days since the epoch)."""
    spec_id: int
    stats: dict[str, Any]
    """Iceberg's statistics, from the Parquet footer: ``record_count``, ``column_sizes``,
    ``value_counts``, ``null_value_counts``, ``lower_bounds``, ``upper_bounds`` (by field
    id, bounds in Iceberg's binary form), ``split_offsets``."""
    checkpoint: int
    """The checkpoint whose barrier closed its rows."""

    def data_file(self) -> DataFile:
        """Its entry in a manifest."""
        return DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=self.path,
            file_format=FileFormat.PARQUET,
            partition=Record(*self.partition),
            file_size_in_bytes=self.size,
            sort_order_id=None,
            spec_id=self.spec_id,
            equality_ids=None,
            key_metadata=None,
            **self.stats,
        )


@dataclass(frozen=True)
class IcebergCommittable:
    """A subtask's committable for a checkpoint: the files it wrote up to it and did not hear
    were committed, into the table of ``table_uuid`` (none: no file yet)."""

    job: str
    sink: str
    checkpoint: int
    table_uuid: str | None
    files: tuple[IcebergFile, ...]


class IcebergPartFiles(PartFiles[IcebergFile]):
    """An Iceberg writer's part files: in the table's data location as its location provider
    places them (``data/column=value/...`` when partitioned), written through the table's
    FileIO, with the table's field ids; described with the statistics pyiceberg's own writer
    gives."""

    def __init__(self, where: str, prefix: str, subtask: int, compression: str) -> None:
        super().__init__(where, prefix, subtask, compression)
        self.options["store_decimal_as_integer"] = True  # (as Iceberg's spec says)
        self.table: Table | None = None
        self.schema: Schema | None = None
        """The table's schema, as the files' field names have it (made fit for Parquet)."""
        self.partition_by: tuple[str, ...] = ()

    def use(self, table: Table, partition_by: tuple[str, ...]) -> pa.Schema:
        """Write the files of ``table`` (partitioned by ``partition_by``): the files' Arrow
        schema. Set by the writer at its first batch, before any file."""
        self.table, self.partition_by = table, partition_by
        schema = table.schema()
        sanitized = sanitize_column_names(schema)
        self.schema = sanitized if sanitized != schema else schema
        self.stats_plan = compute_statistics_plan(self.schema, table.metadata.properties)
        self.paths = parquet_path_to_id_mapping(self.schema)
        self.locations = table.location_provider()
        return file_schema(self.schema)

    def split(self, table: pa.Table) -> list[tuple[str, Any, pa.Table]]:
        if not self.partition_by:
            return [("", None, table)]
        assert self.table is not None
        spec, schema = self.table.spec(), self.table.schema()
        out = []
        for values, rows in partitions(table, self.partition_by):
            by_name = [values[schema.find_column_name(f.source_id) or ""] for f in spec.fields]
            fields = [PartitionFieldValue(f, v) for f, v in zip(spec.fields, by_name, strict=True)]
            key = PartitionKey(field_values=fields, partition_spec=spec, schema=schema)
            out.append((key.to_path(), key, rows))
        return out

    def create(self, folder: str, values: Any, name: str) -> tuple[str, Any]:
        assert self.table is not None
        location = self.locations.new_data_location(data_file_name=name, partition_key=values)
        return location, self.table.io.new_output(location).create(overwrite=True)

    def described(
        self, part: PartFile, size: int, metadata: pq.FileMetaData, checkpoint: int
    ) -> IcebergFile:
        assert self.table is not None
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=metadata,
            stats_columns=self.stats_plan,
            parquet_column_mapping=self.paths,
        )
        key = part.values
        record = key.partition if isinstance(key, PartitionKey) else Record()
        partition = tuple(record[i] for i in range(len(record)))
        spec_id = self.table.metadata.default_spec_id
        stats = statistics.to_serialized_dict()
        return IcebergFile(part.path, size, partition, spec_id, stats, checkpoint)
