"""A subtask's writer of a table format: its rows into part files while they come, the files
closed at each barrier and named in the checkpoint's committable (see
:mod:`cutline.connectors.tables`)."""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic

import pyarrow as pa

from cutline.connectors.sink import PendingCommit, SinkContext, SinkError, SinkWriter
from cutline.connectors.tables.parts import File, PartFiles, file_prefix

ROW_GROUP_ROWS = 1 << 18
"""Rows a writer gathers before it hands them to its own thread, which encodes them as a row
group of the open part file while records keep flowing (DuckDB's row groups are 122,880
rows; Arrow's at most 1,048,576: larger compress better, smaller overlap more)."""
ROW_GROUP_BYTES = 64 << 20
"""... or this many bytes of Arrow data, whichever comes first."""
QUEUED = 2
"""Row groups handed over and not yet written, at most: past it the writer waits (so a
store slower than the records holds the job back, not its memory)."""


class PartWriter(SinkWriter, Generic[File]):
    """One subtask's writer: rows made to fit the table's schema (:meth:`fit`), encoded on a
    thread of the writer's own (its :class:`~cutline.connectors.tables.parts.PartFiles`), the
    files closed at every barrier on that thread and awaited on the subtask's snapshot thread
    (:class:`FilesToWrite`); the committable (:meth:`committed`) names those not yet heard
    to be committed.

    A format sets :attr:`parts` and :attr:`prepared` (the restored checkpoint) when it is
    made, and says how the first batch fixes the schema (:meth:`first_schema`), how a batch
    is made to fit it (:meth:`fit`) and what the committable is (:meth:`committed`)."""

    parts: PartFiles[File]

    def __init__(self, context: SinkContext, where: str) -> None:
        self.context, self.where = context, where
        self.job = context.job or context.run
        self.prefix = file_prefix(self.job, context.name)
        self.schema: pa.Schema | None = None
        """What every batch is made to fit: the table's schema, or else the first batch's."""
        self.batches: list[pa.RecordBatch] = []
        self.rows = self.bytes = 0
        """Rows and bytes in ``batches``: from :data:`ROW_GROUP_ROWS` or
        :data:`ROW_GROUP_BYTES` on, they are handed over."""
        self.thread: ThreadPoolExecutor | None = None
        self.queued: deque[Future[None]] = deque()
        self.open = False
        """Whether rows were handed over since the last barrier (files are open)."""
        self.prepared = 0
        """The checkpoint whose barrier came last, or the restored one."""
        self.closing: list[tuple[int, pa.Schema, Future[list[File]]]] = []
        """Per barrier since the last completed: its checkpoint, the schema, its files."""
        self.written: list[File] = []
        self.file_schema: pa.Schema | None = None
        """The schema of the files closed last."""
        self.lock, self.completing = threading.Lock(), threading.Lock()
        self.failed: SinkError | None = None

    @abstractmethod
    def first_schema(self, schema: pa.Schema) -> pa.Schema:
        """The schema every batch is made to fit, fixed at the first batch (of ``schema``)."""

    @abstractmethod
    def fit(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` in the schema's columns and types, or :class:`SinkError`."""

    @abstractmethod
    def committed(self, checkpoint_id: int, files: list[File]) -> Any:
        """The committable of checkpoint ``checkpoint_id``: ``files``, every file closed up to
        it that the writer did not hear was committed."""

    @staticmethod
    @abstractmethod
    def checkpoint_of(file: File) -> int:
        """The checkpoint whose barrier closed ``file``."""

    def write(self, batch: Any) -> None:
        if self.failed is not None:
            raise self.failed
        if not len(batch):
            return
        if not isinstance(batch, pa.RecordBatch):
            batch = pa.RecordBatch.from_pylist(list(batch))
        if self.schema is None:
            self.schema = self.first_schema(batch.schema)
        batch = self.fit(batch)
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
            self.written = [f for f in self.written if self.checkpoint_of(f) > checkpoint_id]

    def abort(self) -> None:
        self.batches, self.rows, self.bytes = [], 0, 0
        if self.thread is not None:  # (what it wrote is an orphan, in no commit)
            self.thread.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self.thread is not None:
            self.thread.shutdown(wait=True)

    def committable(self, checkpoint_id: int) -> Any:
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
                    self.file_schema = schema
        with self.lock:
            files = [f for f in self.written if self.checkpoint_of(f) <= checkpoint_id]
        return self.committed(checkpoint_id, files)  # (even without files: see the committers)

    def _hand_over(self) -> None:
        """The gathered rows to the writer's thread, as a row group of their partitions' files
        (named after the checkpoint whose barrier comes next)."""
        if self.thread is None:
            self.thread = ThreadPoolExecutor(1, thread_name_prefix="part-files")
        batches = self.batches
        self.batches, self.rows, self.bytes = [], 0, 0
        args = (batches, batches[0].schema, self.prepared + 1)
        self.queued.append(self.thread.submit(self.parts.append, *args))
        self.open = True
        while self.queued and (len(self.queued) > QUEUED or self.queued[0].done()):
            try:
                self.queued.popleft().result()  # (waits while too many are queued)
            except SinkError as exc:
                self.failed = exc
                raise


class FilesToWrite(PendingCommit):
    """A checkpoint's data files, awaited on the subtask's snapshot thread."""

    def __init__(self, writer: PartWriter[Any], checkpoint_id: int) -> None:
        self.writer, self.checkpoint_id = writer, checkpoint_id

    def complete(self) -> Any:
        return self.writer.committable(self.checkpoint_id)


def widens(given: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column of type ``given`` goes into one of ``wanted`` without loss."""
    t = pa.types
    if t.is_integer(given) and t.is_integer(wanted):
        return bool(given.bit_width < wanted.bit_width and t.is_signed_integer(wanted))
    numeric = t.is_integer(given) or t.is_floating(given)
    return bool(t.is_null(given) or (numeric and t.is_float64(wanted)))


def mismatch(where: str, column: str, table: Any, records: Any) -> str:
    return f"{where}: column {column!r} is {table} in the table, {records} in the records"
