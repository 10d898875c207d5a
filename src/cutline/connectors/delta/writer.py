"""A subtask's writer of a Delta table: its rows into part files while they come, the files
closed at each barrier and named in the checkpoint's committable (see
:mod:`cutline.connectors.delta`)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake.exceptions import DeltaError

from cutline.connectors.delta.files import (
    DataFile,
    DeltaCommittable,
    DeltaTarget,
    PartFiles,
    app_id,
    file_prefix,
    line,
    mismatch,
    named,
    stored,
    widens,
)
from cutline.connectors.sink import PendingCommit, SinkContext, SinkError, SinkWriter

ROW_GROUP_ROWS = 1 << 18
"""Rows a writer gathers before it hands them to its own thread, which encodes them as a row
group of the open part file while records keep flowing (DuckDB's row groups are 122,880
rows; Arrow's at most 1,048,576: larger compress better, smaller overlap more)."""
ROW_GROUP_BYTES = 64 << 20
"""... or this many bytes of Arrow data, whichever comes first."""
QUEUED = 2
"""Row groups handed over and not yet written, at most: past it the writer waits (so a
store slower than the records holds the job back, not its memory)."""


class DeltaWriter(SinkWriter):
    """One subtask's writer: rows made to fit the table's schema, encoded on a thread of the
    writer's own (:class:`PartFiles`), the files closed at every barrier on that thread and
    awaited on the subtask's snapshot thread (:class:`FilesToWrite`)."""

    def __init__(self, target: DeltaTarget, context: SinkContext, restored: Mapping[int, Any]):
        self.target, self.context, self.where = target, context, f"Delta table {target.path}"
        self.job = context.job or context.run
        self.prefix = file_prefix(self.job, context.name)
        self.schema: pa.Schema | None = None
        """What every batch is made to fit: the table's schema, or else the first batch's."""
        self.partition_by = tuple(target.partition_by or ())
        self.batches: list[pa.RecordBatch] = []
        self.rows = self.bytes = 0
        """Rows and bytes in ``batches``: from :data:`ROW_GROUP_ROWS` or
        :data:`ROW_GROUP_BYTES` on, they are handed over."""
        self.parts = PartFiles(target, self.prefix, context.subtask)
        self.thread: ThreadPoolExecutor | None = None
        self.queued: deque[Future[None]] = deque()
        self.open = False
        """Whether rows were handed over since the last barrier (files are open)."""
        self.prepared = max(
            (c.checkpoint for c in restored.values() if isinstance(c, DeltaCommittable)),
            default=0,
        )
        """The checkpoint whose barrier came last, or the restored one."""
        self.closing: list[tuple[int, pa.Schema, Future[list[DataFile]]]] = []
        """Per barrier since the last completed: its checkpoint, the schema, its files."""
        self.written: list[DataFile] = []
        self.schema_bytes = b""
        self.lock, self.completing = threading.Lock(), threading.Lock()
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
        if self.schema is None:
            self.schema = self._first_schema(batch.schema)
        batch = self._conform(batch)
        if self.batches and not self.batches[0].schema.equals(batch.schema):
            self._hand_over()  # (a null column has a type now: those go into files of their own)
        self.batches.append(batch)
        self.rows += batch.num_rows
        self.bytes += batch.nbytes
        if self.rows >= ROW_GROUP_ROWS or self.bytes >= ROW_GROUP_BYTES:
            self._hand_over()

    def prepare_commit(self, checkpoint_id: int) -> PendingCommit:
        if self.failed is not None:
            raise self.failed
        if self.batches:
            self._hand_over()
        if self.open:
            assert self.thread is not None and self.schema is not None
            files = self.thread.submit(self.parts.close, checkpoint_id)
            with self.lock:
                self.closing.append((checkpoint_id, self.schema, files))
            self.queued.clear()  # (a failure of theirs fails the close as well)
            self.open = False
        self.prepared = checkpoint_id
        return FilesToWrite(self, checkpoint_id)

    def commit(self, checkpoint_id: int) -> None:
        with self.lock:  # (the driver committed them before the subtask heard of it)
            self.written = [f for f in self.written if f.checkpoint > checkpoint_id]

    def abort(self) -> None:
        self.batches, self.rows, self.bytes = [], 0, 0
        if self.thread is not None:  # (what it wrote is an orphan: see _remove_orphans)
            self.thread.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self.thread is not None:
            self.thread.shutdown(wait=True)

    def committable(self, checkpoint_id: int) -> DeltaCommittable:
        """The files up to checkpoint ``checkpoint_id``, once closed: what it commits."""
        with self.completing:
            while True:
                with self.lock:
                    if not self.closing or self.closing[0][0] > checkpoint_id:
                        break
                    _, schema, closed = self.closing[0]
                try:
                    files = closed.result()
                except SinkError as exc:
                    self.failed = exc
                    raise
                with self.lock:
                    del self.closing[0]
                    self.written += files
                    self.schema_bytes = schema.serialize().to_pybytes()
        with self.lock:
            files = [f for f in self.written if f.checkpoint <= checkpoint_id]
        job, name = self.job, self.context.name  # (even without files: see the committer)
        return DeltaCommittable(
            job, name, checkpoint_id, self.schema_bytes, self.partition_by, (*files,)
        )

    def _hand_over(self) -> None:
        """The gathered rows to the writer's thread, as a row group of their partitions' files
        (named after the checkpoint whose barrier comes next)."""
        if self.thread is None:
            self.thread = ThreadPoolExecutor(1, thread_name_prefix="delta-files")
        batches = self.batches
        self.batches, self.rows, self.bytes = [], 0, 0
        args = (batches, batches[0].schema, self.partition_by, self.prepared + 1)
        self.queued.append(self.thread.submit(self.parts.append, *args))
        self.open = True
        while self.queued and (len(self.queued) > QUEUED or self.queued[0].done()):
            try:
                self.queued.popleft().result()  # (waits while too many are queued)
            except SinkError as exc:
                self.failed = exc
                raise

    def _first_schema(self, schema: pa.Schema) -> pa.Schema:
        table = self.target.table()
        if table is None:
            wanted = pa.schema([f.with_type(stored(f.type, self.where, f.name)) for f in schema])
        else:
            wanted = pa.schema(table.schema().to_arrow())
            columns = tuple(table.metadata().partition_columns)
            if self.target.partition_by is not None and self.partition_by != columns:
                raise SinkError(f"{self.where} is partitioned by {list(columns)}")
            self.partition_by = columns
        for name in self.partition_by:
            kind = wanted.field(name).type if name in wanted.names else pa.null()
            if not (pa.types.is_string(kind) or pa.types.is_integer(kind) or kind == pa.date32()):
                raise SinkError(f"{self.where}: cannot partition by {name!r} ({kind})")
        return wanted

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` in the schema's columns and types, or :class:`SinkError`."""
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
                try:
                    column = pc.cast(column, wanted.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise SinkError(
                        f"{self.where}: a value of column {wanted.name!r} does not fit its type "
                        f"{wanted.type}: {line(exc)}"
                    ) from None
            if not wanted.nullable and column.null_count:
                raise SinkError(f"{self.where}: a null in column {wanted.name!r}, not nullable")
            columns.append(column)
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


class FilesToWrite(PendingCommit):
    """A checkpoint's data files, awaited on the subtask's snapshot thread."""

    def __init__(self, writer: DeltaWriter, checkpoint_id: int) -> None:
        self.writer, self.checkpoint_id = writer, checkpoint_id

    def complete(self) -> DeltaCommittable:
        return self.writer.committable(self.checkpoint_id)
