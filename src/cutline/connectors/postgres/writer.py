"""A subtask's writer (:class:`PostgresWriter`): its transactions, one per checkpoint
interval, prepared at the barrier and committed when the checkpoint completes; what a restored
writer settles; and the records the server refuses, handed to cutline one at a time."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from cutline.connectors.postgres.rows import Rows
from cutline.connectors.postgres.server import (
    Destination,
    check_prepared_transactions,
    connect,
    described,
    transaction_id,
    transaction_prefix,
)
from cutline.connectors.postgres.table import Table
from cutline.connectors.sink import PendingCommit, RecordError, SinkContext, SinkError, SinkWriter
from cutline.connectors.source import Batch


class PostgresWriter(SinkWriter):
    """One subtask's transactions: the open one (rows since the last barrier) on ``data``,
    the prepared ones (awaiting their checkpoint's completion) committed on ``control``.

    A record the server refuses is found (:mod:`~cutline.connectors.postgres.rows`), the
    rest of its batch is written, and :meth:`write` or :meth:`prepare_commit` raises a
    :class:`~cutline.connectors.RecordError` for it, one a call (cutline puts it in the dead
    letters and goes on, or fails the job); :meth:`prepare_commit`, asked again, raises for
    the next until none is left, then prepares."""

    def __init__(
        self, sink: Destination, context: SinkContext, restored: Mapping[int, Any]
    ) -> None:
        self.sink, self.context = sink, context
        self.prefix = transaction_prefix(context.job, context.uid)
        self.control = connect(sink)
        self.data: psycopg.Connection[Any] | None = None
        try:
            check_prepared_transactions(sink, self.control)
            self.table = Table.read(sink, self.control)
            self._recover(restored)
            self.data = connect(sink)
        except BaseException:
            self._close()
            raise
        self.rows = Rows(sink, self.table)
        self.buffer: list[pa.RecordBatch] = []
        """Records taken and not sent yet (every field, as they came)."""
        self.buffered = 0
        self.checked: list[pa.Table] = []
        """Upserts left to the snapshot thread: records checked (:meth:`Rows.check`)."""
        self.refused: deque[RecordError] = deque()
        """Records refused and not yet handed to cutline."""
        self.fields: list[str] | None = None
        self.open = False
        """Whether ``data`` has a transaction open (rows written since the last barrier)."""
        self.prepared: list[tuple[int, str]] = []
        """(checkpoint, transaction id) prepared and not known to be committed, oldest first."""
        self.preparing: list[int] = []
        """Upserts: the checkpoints whose prepare the snapshot thread has still to do."""

    # ---------------------------------------------------------------- restore

    def _recover(self, restored: Mapping[int, Any]) -> None:
        """Commit the restored checkpoint's prepared transactions of the old subtasks this one
        takes over; roll back the others those subtasks left."""
        held = {gid for committable in restored.values() for _, gid in committable or ()}
        rows = self.control.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND "
            "(starts_with(gid, %s) OR gid = ANY(%s)) ORDER BY prepared",
            (self.prefix, sorted(held)),
        ).fetchall()
        for (gid,) in rows:
            if gid in held:  # (named by another job when restored from elsewhere)
                self._finish("COMMIT PREPARED", gid)
                continue
            subtask = int(gid[len(self.prefix) :].split(":")[0])
            if subtask % self.context.parallelism == self.context.subtask:
                self._finish("ROLLBACK PREPARED", gid)  # (else another subtask's to settle)

    def _finish(self, command: str, gid: str) -> None:
        try:
            self.control.execute(sql.SQL(command + " {}").format(sql.Literal(gid)))
        except psycopg.errors.UndefinedObject:
            pass  # (settled already: by this writer before a failure, or by another)
        except psycopg.Error as exc:
            raise SinkError(
                f"{self.sink.describe()}: {command} {gid!r} failed: {described(exc)}"
            ) from None

    # ----------------------------------------------------------------- writes

    def write(self, batch: Batch) -> None:
        if not isinstance(batch, pa.RecordBatch):  # (a columnar sink gets Arrow batches)
            batch = pa.RecordBatch.from_pylist(list(batch))
        if batch.num_rows:
            names = self.sink.written(batch.schema.names)
            if names != self.fields:
                self.table.check_fields(self.sink, names)
                self.fields = names
            batch, refused = self.rows.fitting(batch, names)
            self.refused.extend(refused)
            self.buffer.append(batch)
            self.buffered += batch.num_rows
            if self.buffered >= self.sink.batch_rows and not self._may_wait():
                self.refused.extend(self._send(self._take()))
        self._hand_refused()

    def _hand_refused(self) -> None:
        """Raise the oldest record refused and not yet handed to cutline, if any."""
        if self.refused:
            raise self.refused.popleft()

    def _may_wait(self) -> bool:
        """Whether writing now could wait for row locks of a transaction still prepared:
        an upsert of a key that one wrote waits until it is committed, which this thread
        does (:meth:`commit`) once told its checkpoint completed, so it must not wait."""
        return self.sink.key is not None and bool(self.prepared or self.preparing)

    def _take(self) -> list[pa.RecordBatch]:
        batches, self.buffer, self.buffered = self.buffer, [], 0
        return batches

    def _send(self, batches: list[pa.RecordBatch] | list[pa.Table]) -> list[RecordError]:
        """Write ``batches`` into the open transaction (begun if need be): the records the
        server refused are returned, the rest are written."""
        if not any(b.num_rows for b in batches):
            return []
        assert self.data is not None
        refused = []
        try:
            if not self.open:
                self.data.execute("BEGIN")
                self.open = True
            for records in _runs(batches):
                names = self.sink.written(records.schema.names)
                refused += self.rows.send(self.data, records, names)
        except psycopg.Error as exc:
            raise SinkError(
                f"{self.sink.describe()}: writing rows failed: {described(exc)}"
            ) from None
        return refused

    # ------------------------------------------------------------ checkpoints

    def prepare_commit(self, checkpoint_id: int) -> list[tuple[int, str]] | PendingCommit | None:
        """The barrier: the interval's rows are sent and their transaction prepared. The
        committable: every transaction prepared and not known to be committed. Upserts that
        could wait for an earlier checkpoint's prepared transaction (its completion may come
        after this barrier) are checked here (:meth:`Rows.check`: a record refused can still
        be put aside) and sent by the snapshot thread, while this one goes on (and commits
        that transaction when told)."""
        if self._may_wait():
            try:
                for records in _runs(self._take()):
                    names = self.sink.written(records.schema.names)
                    kept, refused = self.rows.check(self.control, records, names)
                    self.checked.append(kept)
                    self.refused.extend(refused)
            except psycopg.Error as exc:
                raise SinkError(
                    f"{self.sink.describe()}: checking rows failed: {described(exc)}"
                ) from None
            self._hand_refused()
            checked, self.checked = self.checked, []
            self.preparing.append(checkpoint_id)
            return _Prepare(self, checkpoint_id, checked)
        self.refused.extend(self._send(self._take()))
        self._hand_refused()
        return self._prepare(checkpoint_id)

    def _prepare(self, checkpoint_id: int) -> list[tuple[int, str]] | None:
        if self.open:
            gid = transaction_id(
                self.context.job, self.context.uid, self.context.subtask, checkpoint_id
            )
            assert self.data is not None
            try:
                self.data.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
            except psycopg.Error as exc:
                raise SinkError(
                    f"{self.sink.describe()}: preparing the transaction of checkpoint "
                    f"{checkpoint_id} failed: {described(exc)}"
                ) from None
            self.open = False
            self.prepared.append((checkpoint_id, gid))
        return list(self.prepared) or None

    def commit(self, checkpoint_id: int) -> None:
        while self.prepared and self.prepared[0][0] <= checkpoint_id:
            self._finish("COMMIT PREPARED", self.prepared[0][1])
            self.prepared.pop(0)

    def abort(self) -> None:
        """The open transaction is rolled back (closing its connection does); the prepared
        ones are the restored writer's to settle."""
        self.buffer, self.buffered, self.checked = [], 0, []
        self.refused.clear()
        self._close()

    def close(self) -> None:
        self._close()

    def _close(self) -> None:
        for conn in (self.data, self.control):
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()


@dataclass
class _Prepare(PendingCommit):
    """An upsert writer's prepare of ``checkpoint_id``, done on the snapshot thread: its
    records (checked already) sent, then ``PREPARE TRANSACTION``. It uses the ``data``
    connection only, which the subtask's thread leaves alone meanwhile (:meth:`_may_wait`)."""

    writer: PostgresWriter
    checkpoint_id: int
    records: list[pa.Table]

    def complete(self) -> list[tuple[int, str]] | None:
        try:
            refused = self.writer._send(self.records)
            if refused:  # (too late to put aside: what the check's copy of the table lacks)
                raise SinkError(
                    f"{refused[0]}; record {refused[0].record!r} (checked in a copy of the "
                    "table, it broke what the copy does not have: a foreign key, a unique "
                    "index, a trigger)"
                )
            return self.writer._prepare(self.checkpoint_id)
        finally:
            self.writer.preparing.remove(self.checkpoint_id)


def _runs(batches: list[pa.RecordBatch] | list[pa.Table]) -> list[pa.Table]:
    """``batches`` as tables of one schema each, in order (a statement writes one schema)."""
    runs: list[list[pa.RecordBatch | pa.Table]] = []
    for batch in batches:
        if not batch.num_rows:
            continue
        if runs and runs[-1][0].schema == batch.schema:
            runs[-1].append(batch)
        else:
            runs.append([batch])
    return [
        pa.concat_tables(
            [pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b for b in run]
        ).combine_chunks()
        for run in runs
    ]
