"""An Apache Iceberg table, appended to exactly once:
``stream.write_iceberg("db.sums", catalog={...})``.

Flink's Iceberg sink, on cutline's connector API (:mod:`cutline.connectors.sink`) and the
part-file writer it shares with the Delta Lake sink (:mod:`cutline.connectors.tables`):

1. each subtask's :class:`IcebergWriter` (``writer.py``) reads the table at its first batch
   (its schema, with the field ids, and its partition spec), makes its records fit it and
   hands them, a row group at a time, to a thread of its own, which encodes them into open
   Parquet **part files** in the table's data location (as the table's location provider
   places them: ``data/column=value/`` when partitioned), written through the table's FileIO
   with the field ids of its columns, named
   ``part-<job>-<sink>-<subtask>-<checkpoint>-<uuid>.zstd.parquet``;
2. at the barrier of checkpoint ``n`` that thread closes the interval's files; the committable
   stored in the checkpoint (:class:`IcebergCommittable`) holds what a manifest entry says of
   each (``files.py``: its location, size, partition and the column statistics pyiceberg's own
   writer takes from the Parquet footer);
3. once checkpoint ``n`` is complete, the driver's :class:`IcebergCommitter`
   (``committer.py``) adds every subtask's files in **one snapshot** (a fast append), whose
   summary holds ``cutline.job``, ``cutline.sink`` and ``cutline.checkpoint``: the table
   itself knows the checkpoints it holds.

Why every row is in the table once:

* after a failure the committer is called again for the restored checkpoint, which it may
  have committed. Before every commit it reads the table anew and looks through the current
  snapshot's ancestors for the newest snapshot of the job's sink: a checkpoint at or before
  the one it names is not committed again. The job's id (``SinkContext.job``) is the same for
  the runs that resume a checkpoint directory (``restore_from="latest"``); a fresh start has
  a new one.
* a job may restore an *older* checkpoint than the newest it committed (one restored by hand,
  or the newest damaged): the rows of the checkpoints after it come again. The committer,
  called for the restored one, **withdraws** the files the job added for those (one snapshot
  removing them, its summary naming the restored checkpoint).
* another writer committing at the same time makes the commit fail (pyiceberg's
  ``CommitFailedException``, after its own retries): the committer reads the table again,
  looks for its checkpoint again, and tries again (:data:`~committer.ATTEMPTS` times).
* files written by an attempt that failed before their checkpoint completed are **orphans**:
  in no snapshot, so no reader sees them. The restored attempt's writers delete those of their
  subtasks (named for checkpoints after the newest the table holds), through Arrow's FileIO
  (pyiceberg's default); with another FileIO, Iceberg's removal of orphan files does.

The table (and its namespace) is made from the records' columns, when the job is built if the
stream's columns are known then, else by the first writer that has a batch (the catalog
tells the others it exists); ``partition_by`` makes identity partitions. An existing table is
read when the job is built, if the stream's columns are known, and by every writer at its
first batch: a column the table lacks, a required one the records lack, or one of another
type (but for widening: a smaller integer into a larger one, a number into a double, a
timestamp of another unit) fails with a :class:`SinkError` naming the table, the column and
both types; so does a value that does not fit its column. The catalog is pyiceberg's
(``catalog=`` its properties, or the name of one in ``~/.pyiceberg.yaml``, resolved on the
driver); the sink is picklable, and every worker loads the catalog from those properties.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cutline.connectors.iceberg.committer import IcebergCommitter, newest_checkpoint
from cutline.connectors.iceberg.files import IcebergCommittable, IcebergFile
from cutline.connectors.iceberg.target import IcebergTarget, file_schema, fit_plan
from cutline.connectors.iceberg.writer import IcebergWriter
from cutline.connectors.sink import Sink, SinkContext

__all__ = [
    "IcebergCommittable",
    "IcebergCommitter",
    "IcebergFile",
    "IcebergSink",
    "IcebergTarget",
    "IcebergWriter",
    "newest_checkpoint",
]


@dataclass(frozen=True)
class IcebergSink(IcebergTarget, Sink):
    """Append to the Iceberg table ``table`` (``"namespace.table"``) of ``catalog`` (a dict
    of pyiceberg catalog properties, or the name of a catalog in ``~/.pyiceberg.yaml``),
    exactly once. ``partition_by``: the identity partition columns of a table it makes (an
    existing table keeps its own, which these must equal if given)."""

    columnar = True

    def global_committer(self) -> IcebergCommitter:
        return IcebergCommitter(self)

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> IcebergWriter:
        return IcebergWriter(self, context, restored)

    def check(self, records: pa.Schema | None) -> None:
        """On the driver, when the job is built: the catalog loads; the table, if there is
        one, is partitioned as asked and fits ``records`` (the stream's columns, if known);
        if there is none and the columns are known, it is made now."""
        catalog = self.load_catalog()
        table = self.load(catalog)
        if table is None:
            if records is not None:
                self.create(catalog, records)
            return
        self.check_partitions(table)
        if records is not None:
            fit_plan(self.where, table.schema(), file_schema(table.schema()), records)
