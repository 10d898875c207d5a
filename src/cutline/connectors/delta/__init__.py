"""Delta Lake tables: appended to exactly once (``stream.sink_to(DeltaSink("s3://b/sums"))``,
``stream.write_delta``), and read as a stream (:class:`DeltaSource`, ``env.read_delta``: the
table's snapshot, then what every later version adds, as Spark's Delta streaming source reads
it; ``source.py``, which says how).

The sink is Flink's Delta sink, on cutline's connector API (:mod:`cutline.connectors.sink`):

1. each subtask's :class:`DeltaWriter` (``writer.py``, on the part-file writer that the
   Iceberg sink shares, :mod:`cutline.connectors.tables`) makes its records fit the table's
   schema and hands them, every :data:`~cutline.connectors.tables.writer.ROW_GROUP_ROWS`
   rows, to a thread of its own, which encodes them as a row group of an open Parquet **part
   file** in the table's directory (one per ``column=value/`` folder when partitioned), named
   ``part-<job>-<sink>-<subtask>-<checkpoint>-<uuid>.zstd.parquet`` (``compression=`` chooses
   the codec; ``files.py``): the files are written while records flow, on another core;
2. at the barrier of checkpoint ``n`` that thread closes the interval's files; the subtask's
   snapshot thread waits for them, and the committable stored in the checkpoint
   (:class:`DeltaCommittable`) holds what Delta's add action needs of each, its statistics
   taken from the Parquet footer just written;
3. once checkpoint ``n`` is complete, the driver's :class:`DeltaCommitter` (``committer.py``)
   adds every subtask's files in **one Delta commit**, which also records the application
   transaction ``(cutline-<job>-<sink>, n)``: the table itself knows the checkpoints it
   holds.

Why every row is in the table once:

* after a failure the committer is called again for the restored checkpoint, which it may
  have committed. Before every commit it reads ``transaction_version(app_id)`` and skips a
  checkpoint recorded there (delta-rs itself would accept the same commit again). The job's id
  (``SinkContext.job``) is the same for the runs that resume a checkpoint directory
  (``restore_from="latest"``): they go on with the same app id; a fresh start has a new one.
* a job may restore an *older* checkpoint than the newest it committed: one restored by hand
  (``restore_from=`` an older checkpoint's or savepoint's folder), or a run resumed from its
  checkpoint directory whose newest checkpoint is damaged. The rows of the checkpoints after
  the restored one come again: the committer, called for the restored one, **withdraws** the
  files the job added for those (one commit of remove actions; the app's transaction keeps
  the newest checkpoint it committed).
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
written through delta-rs's own object store (``deltalake.fs.DeltaStorageHandler``), so every
store it knows works, local paths too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cutline.connectors.delta.committer import DeltaCommitter
from cutline.connectors.delta.files import DataFile, DeltaCommittable, DeltaTarget, app_id
from cutline.connectors.delta.source import DeltaReader, DeltaSource
from cutline.connectors.delta.writer import DeltaWriter
from cutline.connectors.sink import Sink, SinkContext

__all__ = [
    "DataFile",
    "DeltaCommittable",
    "DeltaCommitter",
    "DeltaReader",
    "DeltaSink",
    "DeltaSource",
    "DeltaTarget",
    "DeltaWriter",
    "app_id",
]


@dataclass(frozen=True)
class DeltaSink(DeltaTarget, Sink):
    """Append to the Delta table at ``path`` (a local path, or a URI delta-rs knows), exactly
    once. ``partition_by``: the partition columns (strings, integers or dates) of a table it
    creates (an existing table keeps its own, which these must equal if given)."""

    columnar = True

    def global_committer(self) -> DeltaCommitter:
        return DeltaCommitter(self)

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> DeltaWriter:
        return DeltaWriter(self, context, restored)
