"""The Delta sink's data files: where they go, and what Delta's add action needs of each.

A writer's rows go into **part files** (:mod:`cutline.connectors.tables.parts`), one open per
partition folder; :class:`DeltaPartFiles` puts them in the table's folder (through delta-rs's
own store for a URI), and what Delta's add action needs of a closed one is a
:class:`DataFile`, its statistics read from the Parquet footer the writer just wrote
(:func:`footer_stats`), not computed again.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlparse
from urllib.request import url2pathname

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from cutline.connectors.sink import SinkError
from cutline.connectors.tables.parts import (
    PartFile,
    PartFiles,
    codec,
    line,
    now,
    partitions,
    token,
)

STATS_COLUMNS = 32
"""Statistics of the first 32 columns (Delta's default ``dataSkippingNumIndexedCols``)."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def app_id(job: str, sink: str) -> str:
    """The Delta application id of a job's sink: ``cutline-<job>-<sink>``."""
    return f"cutline-{token(job)}-{token(sink)}"


@dataclass(frozen=True)
class DeltaTarget:
    """A Delta table to write: where it is (a local path, or a URI delta-rs knows, with its
    ``storage_options``), and the partition columns of a table created there."""

    path: str
    storage_options: Mapping[str, str] | None = field(default=None, kw_only=True)
    partition_by: Sequence[str] | None = field(default=None, kw_only=True)
    compression: str = field(default="zstd", kw_only=True)
    """The data files' Parquet codec: ``zstd`` (smaller), ``snappy`` (Spark's and delta-rs's
    default: faster), ``lz4``, ``gzip``, ``brotli`` or ``none``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "compression", codec(self.compression, "write_delta"))
        object.__setattr__(self, "path", table_path(self.path))
        if self.partition_by is not None:
            object.__setattr__(self, "partition_by", tuple(self.partition_by))

    def table(self) -> DeltaTable | None:
        """The table, at its newest version; ``None`` while there is none."""
        try:
            return DeltaTable(self.path, storage_options=self.options())
        except TableNotFoundError:
            return None
        except DeltaError as exc:
            raise SinkError(f"cannot open the Delta table {self.path}: {line(exc)}") from None

    def options(self) -> dict[str, str] | None:
        return dict(self.storage_options) if self.storage_options else None

    def store(self) -> pafs.FileSystem:
        """The table's folder as a filesystem (delta-rs's object store: every store it knows)."""
        if "://" not in self.path:
            os.makedirs(self.path, exist_ok=True)
        try:
            return table_store(self.path, self.options())
        except DeltaError as exc:
            raise SinkError(f"cannot open {self.path}: {line(exc)}") from None


def table_path(path: str | os.PathLike[str]) -> str:
    """A table's location as delta-rs and every worker take it: a URI as given, a local path
    (or a ``file://`` URI) made absolute (a worker's working directory is not the driver's)."""
    where = os.fspath(path)
    if where.startswith("file://"):  # (a local path: as one, delta-rs's store needs it made)
        where = url2pathname(urlparse(where).path)
    return where if "://" in where else os.path.abspath(where)


def table_store(path: str, options: dict[str, str] | None) -> pafs.FileSystem:
    """The folder of the table at ``path`` (:func:`table_path`) as a filesystem: Arrow's own
    for a local one (it reads and writes without holding the GIL), else delta-rs's object
    store (every store it knows). Raises ``DeltaError`` for a URI it cannot open."""
    if "://" not in path:
        return pafs.SubTreeFileSystem(path, pafs.LocalFileSystem())
    return pafs.PyFileSystem(DeltaStorageHandler(path, options))


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written into the table, not known to be committed yet."""

    path: str
    """Relative to the table's root, as stored (delta-rs URI-encodes it in the log)."""
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    """Milliseconds since the epoch."""
    stats: str
    """Delta's statistics, as JSON: numRecords, minValues, maxValues, nullCount."""
    checkpoint: int
    """The checkpoint whose barrier closed its rows."""


@dataclass(frozen=True)
class DeltaCommittable:
    """A subtask's committable for a checkpoint: the files it wrote up to it and did not hear
    were committed."""

    job: str
    sink: str
    checkpoint: int
    schema: bytes
    """The files' Arrow schema, serialized (``pa.ipc.read_schema`` reads it)."""
    partition_by: tuple[str, ...]
    files: tuple[DataFile, ...]


class DeltaPartFile(PartFile):
    """A part file of a Delta table: it notes the float columns that hold a NaN or an
    infinity (no bounds in their statistics)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.not_finite: set[str] = set()

    def append(self, rows: pa.Table) -> None:
        for name in rows.column_names[:STATS_COLUMNS]:
            column = rows.column(name)
            if (
                pa.types.is_floating(column.type)
                and name not in self.not_finite
                and not pc.all(pc.is_finite(column)).as_py()  # (nulls skipped)
            ):
                self.not_finite.add(name)
        super().append(rows)


class DeltaPartFiles(PartFiles[DataFile]):
    """A Delta writer's part files: in the table's folder (``column=value/`` folders when it
    is partitioned, the partition columns left out of the files), described for Delta's add
    actions."""

    def __init__(self, target: DeltaTarget, prefix: str, subtask: int) -> None:
        super().__init__(target.path, prefix, subtask, target.compression)
        self.store = target.store()
        self.partition_by: tuple[str, ...] = ()
        """Set by the writer once it knows the table's."""
        self.folders = {""}
        """Partition folders known to exist."""

    def split(self, table: pa.Table) -> list[tuple[str, Any, pa.Table]]:
        out = []
        for found, rows in partitions(table, self.partition_by):
            values = {c: partition_value(v) for c, v in found.items()}
            folder = "".join(f"{quote(c, safe='')}={_folder(v)}/" for c, v in values.items())
            out.append((folder, values, rows.drop_columns(list(self.partition_by))))
        return out

    def create(self, folder: str, values: Any, name: str) -> tuple[str, Any]:
        if folder not in self.folders:
            self.store.create_dir(folder.rstrip("/"), recursive=True)
            self.folders.add(folder)
        path = f"{folder}{name}"
        return path, self.store.open_output_stream(path)

    def part(self, out: Any, path: str, first: pa.Table, values: Any) -> PartFile:
        return DeltaPartFile(out, path, first, values, self.options)

    def described(
        self, part: PartFile, size: int, metadata: pq.FileMetaData, checkpoint: int
    ) -> DataFile:
        assert isinstance(part, DeltaPartFile)
        stats = footer_stats(metadata, part.schema, part.not_finite)
        return DataFile(part.path, size, part.values, now(), stats, checkpoint)


# ------------------------------------------------------------------------------- statistics


def footer_stats(metadata: pq.FileMetaData, schema: pa.Schema, not_finite: set[str]) -> str:
    """Delta's statistics of a data file, from the Parquet writer's own (per row group): the
    first :data:`STATS_COLUMNS` columns, nested ones left out; bounds only where JSON holds
    them and they bound every value (no NaN, no infinity; a long string's minimum cut to 32
    characters, its maximum left out; Parquet drops the bounds of very long values)."""
    mins: dict[str, Any] = {}
    maxes: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    leaf = 0
    for position, column in enumerate(schema):
        first, leaf = leaf, leaf + _leaves(column.type)
        kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
        if position >= STATS_COLUMNS or pa.types.is_nested(kind):
            continue
        groups = [metadata.row_group(g).column(first) for g in range(metadata.num_row_groups)]
        stats = [c.statistics for c in groups]
        if any(s is None or not s.has_null_count for s in stats):
            continue
        nulls[column.name] = sum(s.null_count for s in stats)
        bounded = [s for s in stats if s.num_values]  # (row groups with values)
        if not bounded or column.name in not_finite or not all(s.has_min_max for s in bounded):
            continue
        bounds = _bounds(kind, bounded)
        if bounds is None:
            continue
        low, high = bounds
        mins[column.name] = low[:32] if isinstance(low, str) else low  # (still a lower bound)
        if not isinstance(high, str) or len(high) <= 32 or pa.types.is_timestamp(kind):
            maxes[column.name] = high  # (a long string's maximum is left out)
    out = {"numRecords": metadata.num_rows, "minValues": mins, "maxValues": maxes}
    return json.dumps({**out, "nullCount": nulls}, separators=(",", ":"))


def _bounds(kind: pa.DataType, stats: list[Any]) -> tuple[Any, Any] | None:
    t = pa.types
    if t.is_binary(kind) or t.is_large_binary(kind) or t.is_decimal(kind):
        return None
    if t.is_timestamp(kind):
        if kind.tz is None:
            return None  # (no form of it here)
        unit = json.loads(stats[0].logical_type.to_json())["timeUnit"]
        low = min(int(s.min_raw) for s in stats)
        high = max(int(s.max_raw) for s in stats)
        return _utc(low, unit), _utc(high, unit)  # (UTC, in milliseconds, as delta-rs writes)
    if not (
        t.is_integer(kind)
        or t.is_floating(kind)
        or t.is_boolean(kind)
        or t.is_string(kind)
        or t.is_large_string(kind)
        or t.is_date(kind)
    ):
        return None
    low, high = min(s.min for s in stats), max(s.max for s in stats)
    if isinstance(low, float) and not (math.isfinite(low) and math.isfinite(high)):
        return None
    if isinstance(low, date):
        return low.isoformat(), high.isoformat()
    return low, high


def _leaves(kind: pa.DataType) -> int:
    """The Parquet leaf columns of an Arrow column of type ``kind``."""
    t = pa.types
    if t.is_struct(kind):
        return sum(_leaves(kind.field(i).type) for i in range(kind.num_fields))
    if t.is_map(kind):
        return _leaves(kind.key_type) + _leaves(kind.item_type)
    if t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind):
        return _leaves(kind.value_type)
    return 1


def _utc(value: int, unit: str) -> str:
    """A timestamp's integer ``value`` in Parquet's ``unit``, as Delta's statistics write it."""
    scale = {"milliseconds": 1000, "microseconds": 1, "nanoseconds": 0}[unit]
    micros = value * scale if scale else value // 1000
    return (EPOCH + timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# ------------------------------------------------------------------------------- partitions


def partition_value(value: Any) -> str | None:
    return None if value is None else value.isoformat() if isinstance(value, date) else str(value)


def _folder(value: str | None) -> str:
    return "__HIVE_DEFAULT_PARTITION__" if value is None else quote(value, safe="")


# ------------------------------------------------------------------------------------ types

_STORED: dict[str, pa.DataType] = {}


def stored(kind: pa.DataType, where: str, column: str) -> pa.DataType:
    """The type a Delta table stores a column of type ``kind`` as (strings for large ones)."""
    if str(kind) not in _STORED:
        try:
            as_stored = DeltaSchema.from_arrow(pa.schema([pa.field("c", kind)])).to_arrow()
        except Exception as exc:
            raise SinkError(
                f"{where}: column {column!r} is {kind}, which Delta cannot store: {line(exc)}"
            ) from None
        _STORED[str(kind)] = pa.schema(as_stored).field("c").type
    return _STORED[str(kind)]
