"""The Delta sink's data files: where they go, how they are named, and how they are written.

A writer's rows go into **part files** (Flink's name): Parquet files written while the rows
arrive, one open per partition folder, closed at the checkpoint's barrier (or when one grows
past :data:`TARGET_FILE_BYTES`). :class:`PartFiles` writes them, on the writer's own thread;
what Delta's add action needs of a closed one is a :class:`DataFile`, its statistics read from
the Parquet footer the writer just wrote (:func:`footer_stats`), not computed again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import time
import uuid
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

STATS_COLUMNS = 32
"""Statistics of the first 32 columns (Delta's default ``dataSkippingNumIndexedCols``)."""
TARGET_FILE_BYTES = 128 << 20
"""A part file this large is closed and another opened (delta-rs's target is 100 MiB)."""
MAX_OPEN_FILES = 64
"""Part files a writer keeps open at once (one per partition folder): past it, the one written
least recently is closed (a table partitioned by a column of many values gets more files,
not more memory or descriptors)."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CODECS = ("zstd", "snappy", "lz4", "gzip", "brotli", "none")


def app_id(job: str, sink: str) -> str:
    """The Delta application id of a job's sink: ``cutline-<job>-<sink>``."""
    return f"cutline-{token(job)}-{token(sink)}"


def file_prefix(job: str, sink: str) -> str:
    """The start of the names of a job's sink's data files: ``part-<job>-<sink>-``."""
    return f"part-{token(job)}-{token(sink)}-"


def named(name: str, prefix: str) -> tuple[int, int] | None:
    """The subtask and checkpoint of a data file of ``prefix`` (``part-<job>-<sink>-``)."""
    pattern = re.escape(prefix) + r"(\d{5})-(\d{10})-[0-9a-f-]+\.[a-z0-9]+\.parquet"
    found = re.fullmatch(pattern, name)
    return (int(found.group(1)), int(found.group(2))) if found else None


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
        if not isinstance(self.compression, str) or self.compression.lower() not in CODECS:
            raise ValueError(
                f"write_delta: compression must be one of {', '.join(CODECS)}, "
                f"not {self.compression!r}"
            )
        object.__setattr__(self, "compression", self.compression.lower())
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


class PartFile:
    """One open part file: rows appended as row groups, statistics from its footer."""

    def __init__(
        self,
        store: pafs.FileSystem,
        path: str,
        first: pa.Table,
        values: dict[str, str | None],
        compression: str,
    ) -> None:
        """A file for rows of ``first``'s schema (its first rows, not written yet)."""
        self.path, self.schema, self.values = path, first.schema, values
        self.out = store.open_output_stream(path)
        self.parquet = pq.ParquetWriter(
            self.out, self.schema, compression=compression, use_dictionary=dictionary(first)
        )
        self.not_finite: set[str] = set()
        """Float columns with a NaN or an infinity: no bounds in the statistics."""

    def append(self, rows: pa.Table) -> None:
        for name in rows.column_names[:STATS_COLUMNS]:
            column = rows.column(name)
            if (
                pa.types.is_floating(column.type)
                and name not in self.not_finite
                and not pc.all(pc.is_finite(column)).as_py()  # (nulls skipped)
            ):
                self.not_finite.add(name)
        self.parquet.write_table(rows)

    def size(self) -> int:
        return int(self.out.tell())

    def close(self) -> DataFile:
        """The file, finished (its checkpoint is set when the interval's files are)."""
        self.parquet.close()
        size = self.size()
        self.out.close()
        metadata = self.parquet.writer.metadata
        stats = footer_stats(metadata, self.schema, self.not_finite)
        return DataFile(self.path, size, self.values, now(), stats, 0)


class PartFiles:
    """A writer's part files of one checkpoint interval, one open per partition folder. Used
    on one thread only (the writer's own), in order: :meth:`append` as rows come, :meth:`close`
    at the barrier. After a failure it refuses everything: a file it could not write would be
    committed without some of its rows."""

    def __init__(self, target: DeltaTarget, prefix: str, subtask: int) -> None:
        self.target, self.prefix, self.subtask = target, prefix, subtask
        self.store = target.store()
        self.open: dict[str, PartFile] = {}
        """By partition folder, the one written last at the end."""
        self.closed: list[DataFile] = []
        self.folders = {""}
        """Partition folders known to exist."""
        self.failed: SinkError | None = None

    def append(
        self,
        batches: list[pa.RecordBatch],
        schema: pa.Schema,
        partition_by: tuple[str, ...],
        named_after: int,
    ) -> None:
        """Write ``batches`` (of ``schema``) into the open files of their partitions; a file
        opened for them is named after checkpoint ``named_after``: the one after the last
        barrier, whose barrier closes it (or a later one's; so after a restore, the files of
        an attempt are orphans precisely when named after a checkpoint the table lacks)."""
        self._check()
        try:
            table = pa.Table.from_batches(batches, schema=schema)
            for values, folder, rows in partitions(table, partition_by):
                part = self.open.pop(folder, None)
                if part is not None and not part.schema.equals(rows.schema):
                    self.closed.append(part.close())  # (a null column has a type now)
                    part = None
                if part is None:
                    if len(self.open) >= MAX_OPEN_FILES:
                        oldest = next(iter(self.open))
                        self.closed.append(self.open.pop(oldest).close())
                    if folder not in self.folders:
                        self.store.create_dir(folder.rstrip("/"), recursive=True)
                        self.folders.add(folder)
                    name = f"{folder}{self._name(named_after)}"
                    part = PartFile(self.store, name, rows, values, self.target.compression)
                part.append(rows)
                if part.size() >= TARGET_FILE_BYTES:
                    self.closed.append(part.close())
                else:
                    self.open[folder] = part
        except Exception as exc:
            raise self._failure(exc) from None

    def close(self, checkpoint: int) -> list[DataFile]:
        """Close every open file: the files of the interval that checkpoint's barrier ends."""
        self._check()
        try:
            while self.open:
                self.closed.append(self.open.popitem()[1].close())
        except Exception as exc:
            raise self._failure(exc) from None
        files = [dataclasses.replace(f, checkpoint=checkpoint) for f in self.closed]
        self.closed = []
        return files

    def _failure(self, exc: Exception) -> SinkError:
        """What failed, kept: every later call refuses (whatever it was)."""
        if not isinstance(exc, SinkError):
            exc = SinkError(f"cannot write into {self.target.path}: {line(exc)}")
        self.failed = exc
        return exc

    def _check(self) -> None:
        if self.failed is not None:
            raise self.failed

    def _name(self, checkpoint: int) -> str:
        unique = uuid.uuid4()
        codec = self.target.compression
        return f"{self.prefix}{self.subtask:05d}-{checkpoint:010d}-{unique}.{codec}.parquet"


# ------------------------------------------------------------------------------- encodings

SAMPLE = 8192
"""Values of a column looked at to tell whether a dictionary pays."""


def dictionary(rows: pa.Table) -> bool | list[str]:
    """The columns a new file dictionary-encodes: all but those whose first :data:`SAMPLE`
    values are mostly distinct (ids, random numbers, free text). Arrow encodes every column
    with a dictionary until it outgrows 1 MiB; for such a column that is work thrown away,
    three to six times the time of plain encoding, and a larger file (parquet-mr falls back
    the same way)."""
    distinct = set()
    for column in rows.schema:
        kind = column.type
        if pa.types.is_nested(kind) or pa.types.is_dictionary(kind) or "." in column.name:
            continue
        sample = rows.column(column.name).slice(0, SAMPLE)
        present = len(sample) - sample.null_count
        if present >= 64 and pc.count_distinct(sample).as_py() * 2 > present:
            distinct.add(column.name)
    if not distinct:
        return True
    return [path for path in _leaf_paths(rows.schema) if path not in distinct]


@functools.lru_cache(maxsize=64)
def _leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet column paths of ``schema`` (``a``, ``s.b``, ``l.list.element``, ...)."""
    out = pa.BufferOutputStream()
    with pq.ParquetWriter(out, schema) as writer:
        writer.write_table(schema.empty_table())
    columns = writer.writer.metadata.schema
    return [columns.column(i).path for i in range(len(columns))]


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


def partitions(
    table: pa.Table, columns: tuple[str, ...]
) -> list[tuple[dict[str, str | None], str, pa.Table]]:
    """The rows of each partition: (partition values, folder, rows without those columns)."""
    if not columns:
        return [({}, "", table)]
    keyed = table.select(list(columns)).append_column("_row", pa.array(range(table.num_rows)))
    groups = keyed.group_by(list(columns), use_threads=False).aggregate([("_row", "list")])
    out = []
    for i in range(groups.num_rows):
        values = {c: partition_value(groups.column(c)[i].as_py()) for c in columns}
        folder = "".join(f"{quote(c, safe='')}={_folder(v)}/" for c, v in values.items())
        rows = table.take(groups.column("_row_list")[i].values).drop_columns(list(columns))
        out.append((values, folder, rows))
    return out


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


def widens(given: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column of type ``given`` goes into one of ``wanted`` without loss."""
    t = pa.types
    if t.is_integer(given) and t.is_integer(wanted):
        return bool(given.bit_width < wanted.bit_width and t.is_signed_integer(wanted))
    numeric = t.is_integer(given) or t.is_floating(given)
    return bool(t.is_null(given) or (numeric and t.is_float64(wanted)))


def mismatch(where: str, column: str, table: pa.DataType, records: pa.DataType) -> str:
    return f"{where}: column {column!r} is {table} in the table, {records} in the records"


# ------------------------------------------------------------------------------------ words


def now() -> int:
    return int(time.time() * 1000)


def token(name: str) -> str:
    """``name`` as a part of a file's name or an app id: letters, digits and ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "_"


def line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
