"""A Delta Lake table, appended to exactly once: ``stream.sink_to(DeltaSink("s3://b/sums"))``.

Flink's Delta sink, on cutline's connector API (:mod:`cutline.connectors.sink`):

1. each subtask's :class:`DeltaWriter` keeps the record batches of a checkpoint interval;
2. at the barrier of checkpoint ``n`` they become Parquet **data files** in the table's
   directory (in ``column=value/`` folders when partitioned), written on the subtask's
   snapshot thread while records keep flowing, named
   ``part-<job>-<sink>-<subtask>-<checkpoint>-<uuid>.zstd.parquet``; the committable stored in
   the checkpoint (:class:`DeltaCommittable`) holds what Delta's add action needs of each;
3. once checkpoint ``n`` is complete, the driver's :class:`DeltaCommitter` adds every
   subtask's files in **one Delta commit**, which also records the application transaction
   ``(cutline-<job>-<sink>, n)``: the table itself knows the checkpoints it holds.

Why every row is in the table once:

* after a failure the committer is called again for the restored checkpoint, which it may
  have committed. Before every commit it reads ``transaction_version(app_id)`` and skips a
  checkpoint recorded there (delta-rs itself would accept the same commit again). The job's id
  (``SinkContext.job``) is the same for the runs that resume a checkpoint directory
  (``restore_from="latest"``): they go on with the same app id; a fresh start has a new one.
* a job may restore an *older* checkpoint than the newest it committed: one restored by hand
  (``restore_from=`` an older checkpoint's or savepoint's folder), or a run resumed from its
  checkpoint directory whose newest checkpoint is damaged. The rows of the checkpoints after the restored one come again: the committer,
  called for the restored one, **withdraws** the files the job added for those (one commit
  of remove actions; the app's transaction keeps the newest checkpoint it committed).
* files written by an attempt that failed before their checkpoint completed are **orphans**:
  not in the Delta log, so no reader sees them. The restored attempt's writers delete those
  of their subtasks (named for checkpoints after the newest the table records);
  ``DeltaTable.vacuum()`` removes any other, and withdrawn files, after the retention period.
* a writer hears that a checkpoint was committed after the next barrier may have passed: its
  files are then in the next committable too, and the committer adds only those of
  checkpoints after the one the table records.

The table is created at the first commit if there is none (the records' schema and
``partition_by``). If there is one, a writer reads its schema at its first batch: a column
missing on either side, or of another type (but for widening: a smaller integer into a larger
one, a number into a double, nulls into anything) fails the job at once with a
:class:`SinkError` naming the table, the column and both types; so does a value that does not
fit its column. ``storage_options`` are delta-rs's (``AWS_REGION``, ...): the data files are
written through delta-rs's own object store, so every store it knows works, local paths too.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake._internal import DeltaFileSystemHandler  # (its public wrapper cannot write)
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from cutline.connectors.sink import (
    GlobalCommitter,
    PendingCommit,
    Sink,
    SinkContext,
    SinkError,
    SinkWriter,
)

STATS_COLUMNS = 32
"""Statistics of the first 32 columns (Delta's default ``dataSkippingNumIndexedCols``)."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


AHEAD_ROWS = 1 << 20
"""Rows a writer gathers before it writes them as a data file ahead of the barrier, on a
thread of its own, while records keep flowing (the rest is written at the barrier)."""


def app_id(job: str, sink: str) -> str:
    """The Delta application id of a job's sink: ``cutline-<job>-<sink>``."""
    return f"cutline-{_token(job)}-{_token(sink)}"


@dataclass(frozen=True)
class DeltaSink(Sink):
    """Append to the Delta table at ``path`` (a local path, or a URI delta-rs knows), exactly
    once. ``partition_by``: the partition columns (strings, integers or dates) of a table it
    creates (an existing table keeps its own, which these must equal if given)."""

    path: str
    storage_options: Mapping[str, str] | None = field(default=None, kw_only=True)
    partition_by: Sequence[str] | None = field(default=None, kw_only=True)

    columnar = True

    def __post_init__(self) -> None:
        path = os.fspath(self.path)
        if "://" not in path:
            path = os.path.abspath(path)  # (a worker's working directory is not the driver's)
        object.__setattr__(self, "path", path)
        if self.partition_by is not None:
            object.__setattr__(self, "partition_by", tuple(self.partition_by))

    def global_committer(self) -> DeltaCommitter:
        return DeltaCommitter(self)

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> DeltaWriter:
        return DeltaWriter(self, context, restored)

    def table(self) -> DeltaTable | None:
        """The table, at its newest version; ``None`` while there is none."""
        try:
            return DeltaTable(self.path, storage_options=self.options())
        except TableNotFoundError:
            return None
        except DeltaError as exc:
            raise SinkError(f"cannot open the Delta table {self.path}: {_line(exc)}") from None

    def options(self) -> dict[str, str] | None:
        return dict(self.storage_options) if self.storage_options else None


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


class DeltaWriter(SinkWriter):
    """One subtask's writer (see the module's docstring)."""

    def __init__(self, sink: DeltaSink, context: SinkContext, restored: Mapping[int, Any]):
        self.sink, self.context, self.where = sink, context, f"Delta table {sink.path}"
        self.job = context.job or context.run
        self.prefix = f"part-{_token(self.job)}-{_token(context.name)}-"
        if "://" not in sink.path:
            os.makedirs(sink.path, exist_ok=True)
        self.store = DeltaFileSystemHandler(sink.path, sink.options())
        self.target: pa.Schema | None = None
        """What every batch is made to fit: the table's schema, or else the first batch's."""
        self.partition_by = tuple(sink.partition_by or ())
        self.batches: list[pa.RecordBatch] = []
        self.rows = 0
        """Rows in ``batches``: from :data:`AHEAD_ROWS` on, they are written ahead."""
        self.ahead: list[Future[list[DataFile]]] = []
        """Files of the interval written ahead of its barrier, on the writer's own thread."""
        self.encoder: ThreadPoolExecutor | None = None
        self.prepared = max(
            (c.checkpoint for c in restored.values() if isinstance(c, DeltaCommittable)),
            default=0,
        )
        """The checkpoint whose barrier came last, or the restored one (files written ahead
        are named after it: for the checkpoint after it, which commits them, or else removes
        them as orphans after a restore)."""
        self.unwritten: list[
            tuple[int, list[pa.RecordBatch], pa.Schema, list[Future[list[DataFile]]]]
        ] = []
        self.written: list[DataFile] = []
        self.schema = b""
        self.lock, self.writing = threading.Lock(), threading.Lock()
        self.failed: SinkError | None = None
        if restored or context.generation > 1:
            self._remove_orphans({context.subtask, *restored})

    def write(self, batch: Any) -> None:
        if self.failed is not None:
            raise self.failed
        if not len(batch):
            return
        if not isinstance(batch, pa.RecordBatch):
            batch = pa.RecordBatch.from_pylist(list(batch))
        if self.target is None:
            self.target = self._first_schema(batch.schema)
        self.batches.append(self._conform(batch))
        self.rows += batch.num_rows
        if self.rows >= AHEAD_ROWS:  # (encoded on another core while records flow)
            if self.encoder is None:
                self.encoder = ThreadPoolExecutor(1, thread_name_prefix="delta-files")
            batches, target = self.batches, self.target
            # named after the last barrier: what comes before the next one, which commits it
            job = self.encoder.submit(self._write_files, self.prepared + 1, batches, target)
            self.ahead.append(job)
            self.batches, self.rows = [], 0

    def prepare_commit(self, checkpoint_id: int) -> PendingCommit:
        if self.failed is not None:
            raise self.failed
        if self.batches or self.ahead:
            assert self.target is not None
            with self.lock:
                self.unwritten.append((checkpoint_id, self.batches, self.target, self.ahead))
            self.batches, self.rows, self.ahead = [], 0, []
        self.prepared = checkpoint_id
        return FilesToWrite(self, checkpoint_id)

    def commit(self, checkpoint_id: int) -> None:
        with self.lock:  # (the driver committed them before the subtask heard of it)
            self.written = [f for f in self.written if f.checkpoint > checkpoint_id]

    def abort(self) -> None:
        self.batches, self.rows, self.ahead = [], 0, []
        if self.encoder is not None:  # (what it wrote ahead is an orphan: see _remove_orphans)
            self.encoder.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.shutdown(wait=True)

    def committable(self, checkpoint_id: int) -> DeltaCommittable:
        """Write the files still to write: what checkpoint ``checkpoint_id`` commits."""
        with self.writing:
            while self.unwritten:
                checkpoint, batches, target, ahead = self.unwritten[0]
                try:
                    files = [
                        dataclasses.replace(f, checkpoint=checkpoint)
                        for job in ahead
                        for f in job.result()
                    ]
                    files += self._write_files(checkpoint, batches, target) if batches else []
                except SinkError as exc:
                    self.failed = exc
                    raise
                with self.lock:
                    del self.unwritten[0]
                    self.written += files
                    self.schema = target.serialize().to_pybytes()
        with self.lock:
            files = [f for f in self.written if f.checkpoint <= checkpoint_id]
        job, name = self.job, self.context.name  # (even without files: see _withdraw)
        return DeltaCommittable(job, name, checkpoint_id, self.schema, self.partition_by, (*files,))

    def _first_schema(self, schema: pa.Schema) -> pa.Schema:
        table = self.sink.table()
        if table is None:
            target = pa.schema([f.with_type(_stored(f.type, self.where, f.name)) for f in schema])
        else:
            target = pa.schema(table.schema().to_arrow())
            columns = tuple(table.metadata().partition_columns)
            if self.sink.partition_by is not None and self.partition_by != columns:
                raise SinkError(f"{self.where} is partitioned by {list(columns)}")
            self.partition_by = columns
        for name in self.partition_by:
            kind = target.field(name).type if name in target.names else pa.null()
            if not (pa.types.is_string(kind) or pa.types.is_integer(kind) or kind == pa.date32()):
                raise SinkError(f"{self.where}: cannot partition by {name!r} ({kind})")
        return target

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` in the target's columns and types, or :class:`SinkError`."""
        target = self.target
        assert target is not None
        for name in batch.schema.names:
            if name not in target.names:
                raise SinkError(f"{self.where} has no column {name!r}, which the records have")
        columns = []
        for i, wanted in enumerate(target):
            if wanted.name not in batch.schema.names:
                raise SinkError(f"{self.where}: the records have no column {wanted.name!r}")
            column = batch.column(wanted.name)
            if pa.types.is_null(wanted.type):  # (a new table's: its type known now)
                wanted = wanted.with_type(_stored(column.type, self.where, wanted.name))
                target = self.target = target.set(i, wanted)
            if not column.type.equals(wanted.type):
                given = _stored(column.type, self.where, wanted.name)
                if not (given.equals(wanted.type) or _widens(given, wanted.type)):
                    raise SinkError(_mismatch(self.where, wanted.name, wanted.type, column.type))
                try:
                    column = pc.cast(column, wanted.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise SinkError(
                        f"{self.where}: a value of column {wanted.name!r} does not fit its type "
                        f"{wanted.type}: {_line(exc)}"
                    ) from None
            if not wanted.nullable and column.null_count:
                raise SinkError(f"{self.where}: a null in column {wanted.name!r}, not nullable")
            columns.append(column)
        return pa.RecordBatch.from_arrays(columns, schema=target)

    def _write_files(
        self, checkpoint: int, batches: list[pa.RecordBatch], target: pa.Schema
    ) -> list[DataFile]:
        tables = [pa.Table.from_batches([b]) for b in batches]
        table = pa.concat_tables(tables, promote_options="default").cast(target)
        files = []
        for values, folder, rows in _partitions(table, self.partition_by):
            name = f"{self.prefix}{self.context.subtask:05d}-{checkpoint:010d}-{uuid.uuid4()}"
            relative = f"{folder}{name}.zstd.parquet"
            buffer = io.BytesIO()
            pq.write_table(rows, buffer, compression="zstd")
            data = buffer.getvalue()
            try:
                out = self.store.open_output_stream(relative)
                out.write(data)
                out.close()  # type: ignore[attr-defined]  # (it has one; its stub does not)
            except Exception as exc:
                raise SinkError(f"cannot write {self.sink.path}/{relative}: {_line(exc)}") from None
            at = _now()
            files.append(DataFile(relative, len(data), values, at, _stats(rows), checkpoint))
        return files

    def _remove_orphans(self, subtasks: set[int]) -> None:
        """Delete the files ``subtasks`` wrote in earlier attempts of the job for checkpoints
        after the newest the table records: never committed (the restore's commit is done)."""
        table = self.sink.table()
        done = table.transaction_version(app_id(self.job, self.context.name)) if table else None
        try:
            for info in self.store.get_file_info_selector("", True, True):
                name = info.path.rsplit("/", 1)[-1]
                subtask, checkpoint = _named(name, self.prefix) or (-1, -1)
                if subtask in subtasks and checkpoint > (-1 if done is None else done):
                    self.store.delete_file(info.path)
        except (OSError, DeltaError) as exc:
            raise SinkError(f"cannot clean {self.sink.path} up: {_line(exc)}") from None


class FilesToWrite(PendingCommit):
    """A checkpoint's data files, written on the subtask's snapshot thread."""

    def __init__(self, writer: DeltaWriter, checkpoint_id: int) -> None:
        self.writer, self.checkpoint_id = writer, checkpoint_id

    def complete(self) -> DeltaCommittable:
        return self.writer.committable(self.checkpoint_id)


class DeltaCommitter(GlobalCommitter):
    """The driver's committer: one Delta commit per checkpoint, once."""

    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink

    def commit(self, checkpoint_id: int, committables: list[Any]) -> None:
        apps: dict[str, list[DeltaCommittable]] = {}
        for c in committables:
            if isinstance(c, DeltaCommittable):
                apps.setdefault(app_id(c.job, c.sink), []).append(c)
        for app, group in apps.items():
            self._commit(app, checkpoint_id, group)

    def _commit(self, app: str, checkpoint_id: int, group: list[DeltaCommittable]) -> None:
        path = self.sink.path
        for attempt in range(2):
            table = self.sink.table()
            done = table.transaction_version(app) if table is not None else None
            if table is not None and done is not None and done > checkpoint_id:
                self._withdraw(table, group[0], checkpoint_id)
                return
            if done == checkpoint_id:
                return  # committed before: a replay after a failure
            after = -1 if done is None else done
            files = {f.path: f for c in group for f in c.files if f.checkpoint > after}
            adds = [
                AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
                for f in files.values()
            ]
            if not adds:
                return
            properties = CommitProperties(app_transactions=[Transaction(app, checkpoint_id)])
            try:
                if table is None:
                    schema = _common_schema([c for c in group if c.files], f"Delta table {path}")
                    create_table_with_add_actions(
                        path,
                        DeltaSchema.from_arrow(schema),
                        adds,
                        partition_by=list(group[0].partition_by),
                        storage_options=self.sink.options(),
                        commit_properties=properties,
                    )
                else:
                    _check_files(table, [c for c in group if c.files], f"Delta table {path}")
                    table.create_write_transaction(
                        cast("list[AddAction | RemoveAction]", adds),
                        mode="append",
                        schema=table.schema(),
                        partition_by=table.metadata().partition_columns,
                        commit_properties=properties,
                    )
                return
            except DeltaError as exc:
                if table is None and attempt == 0 and "already exists" in str(exc):
                    continue  # created meanwhile (by another job): append to it
                raise SinkError(
                    f"Delta table {path}: the commit of checkpoint {checkpoint_id} failed: "
                    f"{_line(exc)}"
                ) from None

    def _withdraw(self, table: DeltaTable, restored: DeltaCommittable, checkpoint_id: int) -> None:
        """The job restored checkpoint ``checkpoint_id``, older than the newest it committed (a
        run resumed from its checkpoint directory after a savepoint; the newest checkpoint
        damaged): the rows of the newer ones come again. Remove their files from the table,
        at once (idempotently: none are left the second time)."""
        prefix, at = f"part-{_token(restored.job)}-{_token(restored.sink)}-", _now()
        removes: list[AddAction | RemoveAction] = []
        for add in pa.table(table.get_add_actions(flatten=False)).to_pylist():
            path = unquote(add["path"])  # (as stored; the log URI-encodes it)
            if (_named(path.rsplit("/", 1)[-1], prefix) or (0, -1))[1] > checkpoint_id:
                values = {c: _partition_value(v) for c, v in (add.get("partition") or {}).items()}
                removes.append(RemoveAction(path, True, at, add["size_bytes"], values or None))
        if removes:
            try:
                table.create_write_transaction(
                    removes,
                    mode="append",
                    schema=table.schema(),
                    partition_by=table.metadata().partition_columns,
                )
            except DeltaError as exc:
                raise SinkError(
                    f"Delta table {self.sink.path}: cannot withdraw the files of the checkpoints "
                    f"after {checkpoint_id}: {_line(exc)}"
                ) from None


# -------------------------------------------------------------------------------- helpers


def _named(name: str, prefix: str) -> tuple[int, int] | None:
    """The subtask and checkpoint of a data file of ``prefix`` (``part-<job>-<sink>-``)."""
    found = re.fullmatch(re.escape(prefix) + r"(\d{5})-(\d{10})-[0-9a-f-]+\.zstd\.parquet", name)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _now() -> int:
    return int(time.time() * 1000)


def _token(name: str) -> str:
    """``name`` as a part of a file's name or an app id: letters, digits and ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "_"


def _line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _mismatch(where: str, column: str, table: pa.DataType, records: pa.DataType) -> str:
    return f"{where}: column {column!r} is {table} in the table, {records} in the records"


_STORED: dict[str, pa.DataType] = {}


def _stored(kind: pa.DataType, where: str, column: str) -> pa.DataType:
    """The type a Delta table stores a column of type ``kind`` as (strings for large ones)."""
    if str(kind) not in _STORED:
        try:
            stored = DeltaSchema.from_arrow(pa.schema([pa.field("c", kind)])).to_arrow()
        except Exception as exc:
            raise SinkError(
                f"{where}: column {column!r} is {kind}, which Delta cannot store: {_line(exc)}"
            ) from None
        _STORED[str(kind)] = pa.schema(stored).field("c").type
    return _STORED[str(kind)]


def _widens(given: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column of type ``given`` goes into one of ``wanted`` without loss."""
    t = pa.types
    if t.is_integer(given) and t.is_integer(wanted):
        return bool(given.bit_width < wanted.bit_width and t.is_signed_integer(wanted))
    numeric = t.is_integer(given) or t.is_floating(given)
    return bool(t.is_null(given) or (numeric and t.is_float64(wanted)))


def _partitions(
    table: pa.Table, columns: tuple[str, ...]
) -> list[tuple[dict[str, str | None], str, pa.Table]]:
    """The rows of each partition: (partition values, folder, rows without those columns)."""
    if not columns:
        return [({}, "", table)]
    keyed = table.select(list(columns)).append_column("_row", pa.array(range(table.num_rows)))
    groups = keyed.group_by(list(columns), use_threads=False).aggregate([("_row", "list")])
    out = []
    for i in range(groups.num_rows):
        values = {c: _partition_value(groups.column(c)[i].as_py()) for c in columns}
        folder = "".join(f"{quote(c, safe='')}={_folder(v)}/" for c, v in values.items())
        rows = table.take(groups.column("_row_list")[i].values).drop_columns(list(columns))
        out.append((values, folder, rows))
    return out


def _partition_value(value: Any) -> str | None:
    return None if value is None else value.isoformat() if isinstance(value, date) else str(value)


def _folder(value: str | None) -> str:
    return "__HIVE_DEFAULT_PARTITION__" if value is None else quote(value, safe="")


def _stats(table: pa.Table) -> str:
    """Delta's statistics of a data file's rows (nested columns left out)."""
    mins: dict[str, Any] = {}
    maxes: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in table.column_names[:STATS_COLUMNS]:
        column = table.column(name)
        kind, t = column.type, pa.types
        if t.is_nested(kind):
            continue
        nulls[name] = column.null_count
        if column.null_count == len(column) or t.is_binary(kind) or t.is_decimal(kind):
            continue
        if t.is_floating(kind) and not pc.all(pc.is_finite(column)).as_py():
            continue  # (NaN or infinite: not a bound JSON can hold)
        if t.is_timestamp(kind) and kind.tz is None:
            continue  # (no form of it here)
        values = column.cast(pa.int64()) if t.is_timestamp(kind) else column
        low, high = (v.as_py() for v in pc.min_max(values).values())
        if t.is_timestamp(kind):  # (UTC, in milliseconds, as delta-rs writes them)
            low, high = _utc(low, kind.unit), _utc(high, kind.unit)
        elif isinstance(low, date):
            low, high = low.isoformat(), high.isoformat()
        mins[name] = low[:32] if isinstance(low, str) else low  # (a prefix: still a lower bound)
        if not isinstance(high, str) or len(high) <= 32 or t.is_timestamp(kind):
            maxes[name] = high  # (a long string's maximum is left out)
    stats = {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxes}
    return json.dumps({**stats, "nullCount": nulls}, separators=(",", ":"))


def _utc(value: int, unit: str) -> str:
    """A timestamp's integer ``value`` in ``unit``, as Delta's statistics write it."""
    micros = {"s": value * 1_000_000, "ms": value * 1000, "us": value, "ns": value // 1000}[unit]
    return (EPOCH + timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _common_schema(group: list[DeltaCommittable], where: str) -> pa.Schema:
    """The schema of a new table: its files' schemas, unified (a null column takes a type)."""
    schemas = [pa.ipc.read_schema(pa.py_buffer(c.schema)) for c in group]
    try:
        return pa.unify_schemas(schemas, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise SinkError(f"{where}: the subtasks' records differ: {_line(exc)}") from None


def _check_files(table: DeltaTable, group: list[DeltaCommittable], where: str) -> None:
    """The files fit the table (written before it existed; or it changed since)."""
    wanted = pa.schema(table.schema().to_arrow())
    for c in group:
        schema = pa.ipc.read_schema(pa.py_buffer(c.schema))
        if set(schema.names) != set(wanted.names):
            raise SinkError(f"{where} has columns {wanted.names}, the records {schema.names}")
        if set(table.metadata().partition_columns) != set(c.partition_by):
            raise SinkError(f"{where} is partitioned by {table.metadata().partition_columns}")
        for column in wanted:
            given = schema.field(column.name).type
            if not (given.equals(column.type) or pa.types.is_null(given)):
                raise SinkError(_mismatch(where, column.name, column.type, given))
