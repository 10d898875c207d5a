"""A writer's part files: Parquet files written while the rows arrive, one open per partition,
closed at the checkpoint's barrier (or when one grows past :data:`TARGET_FILE_BYTES`).
:class:`PartFiles` writes them on the writer's own thread; a table format says where each goes
and what its commit needs of a closed one (its statistics, taken from the Parquet footer just
written, not computed again).
"""

from __future__ import annotations

import functools
import re
import time
import uuid
from abc import ABC, abstractmethod
from typing import Any, Generic, Literal, TypeAlias, TypeVar, get_args

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cutline.connectors.sink import SinkError

TARGET_FILE_BYTES = 128 << 20
"""A part file this large is closed and another opened (delta-rs's target is 100 MiB,
Iceberg's 512 MiB)."""
MAX_OPEN_FILES = 64
"""Part files a writer keeps open at once (one per partition): past it, the one written least
recently is closed (a table partitioned by a column of many values gets more files, not more
memory or descriptors)."""
Compression: TypeAlias = Literal["zstd", "snappy", "lz4", "gzip", "brotli", "none"]
"""The Parquet codec of a table's data files (a name in any case is taken: ``"ZSTD"``)."""
CODECS: tuple[Compression, ...] = get_args(Compression)

File = TypeVar("File")
"""What a table format's commit needs of a closed file."""


def file_prefix(job: str, sink: str) -> str:
    """The start of the names of a job's sink's data files: ``part-<job>-<sink>-``."""
    return f"part-{token(job)}-{token(sink)}-"


def named(name: str, prefix: str) -> tuple[int, int] | None:
    """The subtask and checkpoint of a data file of ``prefix`` (``part-<job>-<sink>-``)."""
    pattern = re.escape(prefix) + r"(\d{5})-(\d{10})-[0-9a-f-]+\.[a-z0-9]+\.parquet"
    found = re.fullmatch(pattern, name)
    return (int(found.group(1)), int(found.group(2))) if found else None


def codec(compression: str, what: str) -> str:
    """``compression``, checked: one of :data:`CODECS` (in lowercase), else ``ValueError``."""
    if not isinstance(compression, str) or compression.lower() not in CODECS:
        raise ValueError(
            f"{what}: compression must be one of {', '.join(CODECS)}, not {compression!r}"
        )
    return compression.lower()


class PartFile:
    """One open part file: rows appended as row groups."""

    def __init__(
        self, out: Any, path: str, first: pa.Table, values: Any, options: dict[str, Any]
    ) -> None:
        """A file for rows of ``first``'s schema (its first rows, not written yet), written to
        the stream ``out``; ``options``: the Parquet writer's (the codec, ...)."""
        self.path, self.schema, self.values, self.out = path, first.schema, values, out
        self.parquet = pq.ParquetWriter(
            self.out, self.schema, use_dictionary=dictionary(first), **options
        )

    def append(self, rows: pa.Table) -> None:
        self.parquet.write_table(rows)

    def size(self) -> int:
        return int(self.out.tell())

    def close(self) -> tuple[int, pq.FileMetaData]:
        """The file, finished: its size and its footer."""
        self.parquet.close()
        size = self.size()
        self.out.close()
        return size, self.parquet.writer.metadata


class PartFiles(ABC, Generic[File]):
    """A writer's part files of one checkpoint interval, one open per partition. Used on one
    thread only (the writer's own), in order: :meth:`append` as rows come, :meth:`close` at the
    barrier. After a failure it refuses everything: a file it could not write would be
    committed without some of its rows.

    A table format says where a file goes (:meth:`create`), how rows are split into
    partitions (:meth:`split`) and what its commit needs of a closed file (:meth:`described`)."""

    def __init__(self, where: str, prefix: str, subtask: int, compression: str) -> None:
        """``where``: the table, as messages name it; ``prefix``: the start of the files'
        names (:func:`file_prefix`)."""
        self.where, self.prefix, self.subtask, self.compression = (
            where,
            prefix,
            subtask,
            compression,
        )
        self.options: dict[str, Any] = {"compression": compression}
        """The Parquet writer's options."""
        self.open: dict[str, PartFile] = {}
        """By partition, the one written last at the end."""
        self.closed: list[tuple[PartFile, int, pq.FileMetaData]] = []
        self.failed: SinkError | None = None

    @abstractmethod
    def split(self, table: pa.Table) -> list[tuple[str, Any, pa.Table]]:
        """The rows of each partition of ``table``: its folder (which tells the partitions
        apart), its values, and its rows as the file holds them."""

    @abstractmethod
    def create(self, folder: str, values: Any, name: str) -> tuple[str, Any]:
        """A new file called ``name`` in partition ``folder`` (of ``values``): its path, as
        :meth:`described` gives it to the commit, and an output stream to write it to."""

    @abstractmethod
    def described(
        self, part: PartFile, size: int, metadata: pq.FileMetaData, checkpoint: int
    ) -> File:
        """What the commit needs of the closed file ``part`` (``size`` bytes, of footer
        ``metadata``), whose rows checkpoint ``checkpoint``'s barrier closed."""

    def part(self, out: Any, path: str, first: pa.Table, values: Any) -> PartFile:
        """A new open file (a format may keep more of what is written)."""
        return PartFile(out, path, first, values, self.options)

    def append(self, batches: list[pa.RecordBatch], schema: pa.Schema, named_after: int) -> None:
        """Write ``batches`` (of ``schema``) into the open files of their partitions; a file
        opened for them is named after checkpoint ``named_after``: the one after the last
        barrier, whose barrier closes it (or a later one's; so after a restore, the files of
        an attempt are orphans precisely when named after a checkpoint the table lacks)."""
        self._check()
        try:
            table = pa.Table.from_batches(batches, schema=schema)
            for folder, values, rows in self.split(table):
                part = self.open.pop(folder, None)
                if part is not None and not part.schema.equals(rows.schema):
                    self.closed.append((part, *part.close()))  # (a null column has a type now)
                    part = None
                if part is None:
                    if len(self.open) >= MAX_OPEN_FILES:
                        oldest = self.open.pop(next(iter(self.open)))
                        self.closed.append((oldest, *oldest.close()))
                    path, out = self.create(folder, values, self._name(named_after))
                    part = self.part(out, path, rows, values)
                part.append(rows)
                if part.size() >= TARGET_FILE_BYTES:
                    self.closed.append((part, *part.close()))
                else:
                    self.open[folder] = part
        except Exception as exc:
            raise self._failure(exc) from None

    def close(self, checkpoint: int) -> list[File]:
        """Close every open file: the files of the interval that checkpoint's barrier ends."""
        self._check()
        try:
            while self.open:
                part = self.open.popitem()[1]
                self.closed.append((part, *part.close()))
            files = [self.described(*closed, checkpoint) for closed in self.closed]
        except Exception as exc:
            raise self._failure(exc) from None
        self.closed = []
        return files

    def _failure(self, exc: Exception) -> SinkError:
        """What failed, kept: every later call refuses (whatever it was)."""
        if not isinstance(exc, SinkError):
            exc = SinkError(f"cannot write into {self.where}: {line(exc)}")
        self.failed = exc
        return exc

    def _check(self) -> None:
        if self.failed is not None:
            raise self.failed

    def _name(self, checkpoint: int) -> str:
        unique = uuid.uuid4()
        codec = self.compression
        return f"{self.prefix}{self.subtask:05d}-{checkpoint:010d}-{unique}.{codec}.parquet"


def partitions(table: pa.Table, columns: tuple[str, ...]) -> list[tuple[dict[str, Any], pa.Table]]:
    """The rows of each partition of ``table`` by ``columns``: its values, its rows."""
    if not columns:
        return [({}, table)]
    keyed = table.select(list(columns)).append_column("_row", pa.array(range(table.num_rows)))
    groups = keyed.group_by(list(columns), use_threads=False).aggregate([("_row", "list")])
    out = []
    for i in range(groups.num_rows):
        values = {c: groups.column(c)[i].as_py() for c in columns}
        out.append((values, table.take(groups.column("_row_list")[i].values)))
    return out


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


# ------------------------------------------------------------------------------------ words


def now() -> int:
    """Milliseconds since the epoch."""
    return int(time.time() * 1000)


def token(name: str) -> str:
    """``name`` as a part of a file's name or an app id: letters, digits and ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "_"


def line(exc: BaseException) -> str:
    """The first line of an exception's message (or its kind)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def cast_column(where: str, column: pa.Array, wanted: pa.Field) -> pa.Array:
    """``column`` as a column of field ``wanted`` of a table (``where`` names it): cast to its
    type, no value lost (a :class:`SinkError` naming the column if one does not fit), and no
    null where it is required."""
    if not column.type.equals(wanted.type):
        try:
            column = pc.cast(column, wanted.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SinkError(
                f"{where}: a value of column {wanted.name!r} does not fit its type "
                f"{wanted.type}: {line(exc)}"
            ) from None
    if not wanted.nullable and column.null_count:
        raise SinkError(f"{where}: a null in column {wanted.name!r}, which is required")
    return column
