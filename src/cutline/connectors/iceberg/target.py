"""An Iceberg table to write: its catalog, its name, and the schema records must have to go
into it (see :mod:`cutline.connectors.iceberg`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.utils.config import Config

from cutline.connectors.sink import SinkError
from cutline.connectors.tables.parts import cast_column, codec, line
from cutline.connectors.tables.writer import mismatch, widens

DEFAULT_CATALOG = "default"
"""The name of a catalog given by its properties (pyiceberg's own default name: a SQL
catalog keeps it beside each table, so a reader loads the catalog by the same name)."""


@dataclass(frozen=True)
class IcebergTarget:
    """An Iceberg table to write: ``table`` (``"namespace.table"``) in the catalog of
    ``catalog``'s properties (pyiceberg's: ``type``, ``uri``, ``warehouse``, ...) or of that
    name in ``~/.pyiceberg.yaml`` (resolved here, on the driver: the workers load the catalog
    from the properties), and the partition columns of a table created there."""

    table: str
    catalog: Mapping[str, Any] | str
    partition_by: Sequence[str] | None = field(default=None, kw_only=True)
    compression: str = field(default="zstd", kw_only=True)
    """The data files' Parquet codec: ``zstd`` (Iceberg's default), ``snappy``, ``lz4``,
    ``gzip``, ``brotli`` or ``none``."""
    catalog_name: str = field(default=DEFAULT_CATALOG, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compression", codec(self.compression, "write_iceberg"))
        parts = self.table.split(".") if isinstance(self.table, str) else []
        if len(parts) < 2 or not all(p.strip() for p in parts):
            raise ValueError(
                f"write_iceberg: the table must be named 'namespace.table', not {self.table!r}"
            )
        if isinstance(self.catalog, str):
            found = Config().get_catalog_config(self.catalog)
            if not found:
                raise SinkError(
                    f"Iceberg table {self.table}: no catalog named {self.catalog!r} in "
                    "~/.pyiceberg.yaml (nor in PYICEBERG_CATALOG__* variables); give the "
                    "catalog's properties instead: catalog={'type': 'sql', 'uri': ...}"
                )
            object.__setattr__(self, "catalog_name", self.catalog)
            object.__setattr__(self, "catalog", dict(found))
        elif isinstance(self.catalog, Mapping):
            object.__setattr__(self, "catalog", dict(self.catalog))
        else:
            raise ValueError(
                "write_iceberg: catalog must be a dict of pyiceberg catalog properties or the "
                f"name of a catalog in ~/.pyiceberg.yaml, not {self.catalog!r}"
            )
        if self.partition_by is not None:
            object.__setattr__(self, "partition_by", tuple(self.partition_by))

    @property
    def where(self) -> str:
        return f"Iceberg table {self.table}"

    @property
    def identifier(self) -> tuple[str, ...]:
        return tuple(self.table.split("."))

    def load_catalog(self) -> Catalog:
        """The catalog, loaded (a connection: a SQL catalog's database, a REST server)."""
        assert isinstance(self.catalog, Mapping)
        try:
            return load_catalog(self.catalog_name, **self.catalog)
        except Exception as exc:
            raise SinkError(
                f"{self.where}: cannot load the Iceberg catalog {self._catalog_named()}: "
                f"{line(exc)}"
            ) from None

    def load(self, catalog: Catalog) -> Table | None:
        """The table, at its newest snapshot; ``None`` while there is none."""
        try:
            return catalog.load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        except Exception as exc:
            raise SinkError(f"cannot open the {self.where}: {line(exc)}") from None

    def create(self, catalog: Catalog, records: pa.Schema) -> Table:
        """The table made from the records' columns (its namespace too, if missing), or the
        one made meanwhile by another writer."""
        schema = new_table_schema(self.where, records)
        for name in self.partition_by or ():
            if name not in schema.names:
                raise SinkError(f"{self.where}: cannot partition by {name!r}, not a column")
        try:
            namespace = self.identifier[:-1]
            try:
                catalog.create_namespace(namespace)
            except Exception:
                if not catalog.namespace_exists(namespace):  # (else: made meanwhile)
                    raise
            creating = catalog.create_table_transaction(self.identifier, schema=schema)
            if self.partition_by:
                with creating.update_spec() as spec:
                    for name in self.partition_by:
                        spec.add_identity(name)
            return creating.commit_transaction()
        except (TableAlreadyExistsError, CommitFailedException):  # (made meanwhile)
            found = self.load(catalog)
            if found is None:
                raise SinkError(f"{self.where} was made and dropped meanwhile") from None
            return found
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(f"{self.where}: cannot make it: {line(exc)}") from None

    def check_partitions(self, table: Table) -> tuple[str, ...]:
        """The table's partition columns (identity partitions only), checked against
        ``partition_by``."""
        spec, schema = table.spec(), table.schema()
        columns = []
        for part in spec.fields:
            source = schema.find_column_name(part.source_id)
            if not isinstance(part.transform, IdentityTransform):
                raise SinkError(
                    f"{self.where} is partitioned by {part.transform}({source}): the sink "
                    "writes identity partitions only"
                )
            columns.append(str(source))
        if self.partition_by is not None and tuple(self.partition_by) != tuple(columns):
            raise SinkError(
                f"{self.where} is partitioned by {columns}"
                if columns
                else f"{self.where} is not partitioned (partition_by={list(self.partition_by)})"
            )
        return tuple(columns)

    def _catalog_named(self) -> str:
        assert isinstance(self.catalog, Mapping)
        shown = {k: self.catalog[k] for k in ("type", "uri") if k in self.catalog}
        return f"{self.catalog_name!r} ({', '.join(f'{k}={v}' for k, v in shown.items())})"


# ---------------------------------------------------------------------------------- schemas


def new_table_schema(where: str, records: pa.Schema) -> pa.Schema:
    """The Arrow schema a table is made with from the records': nanoseconds stored as
    microseconds (Iceberg's v2 timestamps), an instant of any time zone as one in UTC; a
    column of nulls only, whose type is not known yet, refused."""
    fields = []
    for column in records:
        kind = column.type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if pa.types.is_null(kind):
            raise SinkError(
                f"{where}: column {column.name!r} holds only nulls so far, so its type is not "
                "known: make the table first, or give the records a schema"
            )
        if pa.types.is_timestamp(kind):
            kind = pa.timestamp("us", "UTC" if kind.tz is not None else None)
        fields.append(pa.field(column.name, kind, column.nullable))
    return pa.schema(fields)


def file_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of a data file of the table schema ``schema``: its field ids in each
    field's metadata (``PARQUET:field_id``), strings, binaries and lists of the small kind
    (as the records have them: no copy)."""
    return pa.schema([_small_field(f) for f in schema_to_pyarrow(schema, include_field_ids=True)])


def fits(given: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column of type ``given`` goes into one of the file's type ``wanted``: the same
    type (but for large or small strings and lists), or without loss (a smaller integer into a
    larger one, a number into a double, a timestamp of another unit or zone, nulls)."""
    t = pa.types
    if t.is_dictionary(given):
        given = given.value_type
    if _plain(given).equals(_plain(wanted)):
        return True
    if t.is_timestamp(given) and t.is_timestamp(wanted):
        return (given.tz is None) == (wanted.tz is None)  # (a lost fraction: the cast says)
    return widens(given, wanted)


def fit_plan(where: str, table: Schema, files: pa.Schema, records: pa.Schema) -> list[int | None]:
    """For each column of the files (of ``files``, the table's schema ``table``), the records'
    column that goes there (``None``: an optional column the records lack, null); or a
    :class:`SinkError` naming the column that does not fit, and both types."""
    for name in records.names:
        if files.get_field_index(name) < 0:
            raise SinkError(f"{where} has no column {name!r}, which the records have")
    plan: list[int | None] = []
    for column, wanted in zip(table.columns, files, strict=True):
        index = records.get_field_index(column.name)
        if index < 0:
            if column.required:
                raise SinkError(f"{where}: the records have no column {column.name!r}")
            plan.append(None)
            continue
        given = records.field(index).type
        if not fits(given, wanted.type):
            raise SinkError(mismatch(where, column.name, column.field_type, given))
        plan.append(index)
    return plan


def fitted(
    where: str, batch: pa.RecordBatch, plan: list[int | None], files: pa.Schema
) -> pa.RecordBatch:
    """``batch`` made a batch of the files' schema by ``plan`` (:func:`fit_plan`)."""
    columns = []
    for wanted, source in zip(files, plan, strict=True):
        if source is None:
            columns.append(pa.nulls(batch.num_rows, wanted.type))
            continue
        columns.append(cast_column(where, batch.column(source), wanted))
    return pa.RecordBatch.from_arrays(columns, schema=files)


def _small_field(column: pa.Field) -> pa.Field:
    return column.with_type(_small(column.type))


def _small(kind: pa.DataType) -> pa.DataType:
    """``kind`` with small strings, binaries and lists, its fields' metadata kept."""
    t = pa.types
    if t.is_large_string(kind):
        return pa.string()
    if t.is_large_binary(kind):
        return pa.binary()
    if t.is_large_list(kind) or t.is_list(kind):
        return pa.list_(_small_field(kind.value_field))
    if t.is_map(kind):
        return pa.map_(_small_field(kind.key_field), _small_field(kind.item_field))
    if t.is_struct(kind):
        return pa.struct([_small_field(kind.field(i)) for i in range(kind.num_fields)])
    return kind


def _plain(kind: pa.DataType) -> pa.DataType:
    """``kind`` compared by what it holds: small strings and lists, no fields' metadata,
    every field nullable."""
    t = pa.types
    if t.is_large_string(kind) or t.is_string_view(kind):
        return pa.string()
    if t.is_large_binary(kind) or t.is_binary_view(kind):
        return pa.binary()
    if t.is_large_list(kind) or t.is_list(kind) or t.is_list_view(kind):
        return pa.list_(_plain(kind.value_type))
    if t.is_map(kind):
        return pa.map_(_plain(kind.key_type), _plain(kind.item_type))
    if t.is_struct(kind):
        fields = [kind.field(i) for i in range(kind.num_fields)]
        return pa.struct([pa.field(f.name, _plain(f.type)) for f in fields])
    return kind
