"""The driver's global committer of an Iceberg sink: one snapshot per checkpoint, once (see
:mod:`cutline.connectors.iceberg`)."""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from cutline.connectors.iceberg.files import IcebergCommittable
from cutline.connectors.iceberg.target import IcebergTarget
from cutline.connectors.sink import GlobalCommitter, SinkError
from cutline.connectors.tables.parts import file_prefix, line, named

JOB, SINK, CHECKPOINT = "cutline.job", "cutline.sink", "cutline.checkpoint"
"""The properties of the summary of every snapshot the sink commits: the job, the sink and
the newest checkpoint of theirs committed to the table."""
RESTORED = "cutline.restored"
"""... and of one that withdraws the files of the checkpoints after a restored one: that
checkpoint."""
ATTEMPTS = 10
"""Commits tried per checkpoint while others commit to the table at the same time (each
after pyiceberg's own retries, ``commit.retry.num-retries``), the table read again each
time."""


def newest_checkpoint(table: Table, job: str, sink: str) -> int | None:
    """The newest checkpoint of ``job``'s sink ``sink`` that ``table`` holds: the one of the
    newest snapshot of theirs among the current snapshot's ancestors (``None``: none)."""
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary
        if summary is not None and summary[JOB] == job and summary[SINK] == sink:
            return int(summary[CHECKPOINT] or -1)
    return None


class IcebergCommitter(GlobalCommitter):
    """The driver's committer: one Iceberg snapshot (an append) per checkpoint, once."""

    def __init__(self, target: IcebergTarget) -> None:
        self.target = target
        self.catalog: Catalog | None = None

    def commit(self, checkpoint_id: int, committables: list[Any]) -> None:
        jobs: dict[tuple[str, str], list[IcebergCommittable]] = {}
        for c in committables:
            if isinstance(c, IcebergCommittable):
                jobs.setdefault((c.job, c.sink), []).append(c)
        for (job, sink), group in jobs.items():
            self._commit(job, sink, checkpoint_id, group)

    def _commit(
        self, job: str, sink: str, checkpoint_id: int, group: list[IcebergCommittable]
    ) -> None:
        where = self.target.where
        for _ in range(ATTEMPTS):
            table = self._table()
            if table is None:
                if any(c.files for c in group):
                    raise SinkError(f"{where} is gone: it was dropped since the files were written")
                return
            done = newest_checkpoint(table, job, sink)
            if done is not None and done > checkpoint_id:
                if self._withdraw(table, job, sink, checkpoint_id, done):
                    return
                continue
            if done == checkpoint_id:
                return  # committed before: a replay after a failure
            after = -1 if done is None else done
            files = {f.path: f for c in group for f in c.files if f.checkpoint > after}
            if not files:
                return
            uuid = str(table.metadata.table_uuid)
            if any(c.table_uuid not in (None, uuid) for c in group if c.files):
                raise SinkError(
                    f"{where} was made again since its files were written (another table "
                    "uuid): they are not committed"
                )
            summary = {JOB: job, SINK: sink, CHECKPOINT: str(checkpoint_id)}
            if self._append(table, [f.data_file() for f in files.values()], summary):
                return
        raise SinkError(
            f"{where}: the commit of checkpoint {checkpoint_id} failed {ATTEMPTS} times, others "
            "committing to the table meanwhile each time"
        )

    def _append(self, table: Table, files: list[DataFile], summary: dict[str, str]) -> bool:
        """One snapshot adding ``files``, its summary holding ``summary``; ``False``: another
        commit came first (the table is read again and the checkpoint looked for)."""
        doing = f"the commit of checkpoint {summary[CHECKPOINT]} failed"
        return self._snapshot(table, summary, files, [], doing)

    def _snapshot(
        self,
        table: Table,
        summary: dict[str, str],
        added: list[DataFile],
        removed: list[DataFile],
        failed: str,
    ) -> bool:
        """One snapshot adding ``added`` (a fast append) or removing ``removed`` (an
        overwrite), its summary holding ``summary``; ``False``: another commit came first. What
        else goes wrong is a :class:`SinkError` saying ``failed``."""
        try:
            with table.transaction() as transaction:
                update = transaction.update_snapshot(snapshot_properties=summary)
                if added:
                    with update.fast_append() as append:
                        for data_file in added:
                            append.append_data_file(data_file)
                else:
                    with update.overwrite() as overwrite:
                        for data_file in removed:
                            overwrite.delete_data_file(data_file)
            return True
        except CommitFailedException:
            return False
        except Exception as exc:
            raise SinkError(f"{self.target.where}: {failed}: {line(exc)}") from None

    def _withdraw(self, table: Table, job: str, sink: str, checkpoint_id: int, done: int) -> bool:
        """The job restored checkpoint ``checkpoint_id``, older than the newest it committed,
        ``done`` (a run resumed from its checkpoint directory after a savepoint; the newest
        checkpoint damaged): the rows of the newer ones come again. One snapshot removes their
        files (none the second time: nothing is committed then); ``False``: another commit
        came first."""
        prefix = file_prefix(job, sink)
        snapshot = table.current_snapshot()
        assert snapshot is not None
        newer: list[DataFile] = []
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                name = entry.data_file.file_path.rsplit("/", 1)[-1]
                if (named(name, prefix) or (0, -1))[1] > checkpoint_id:
                    newer.append(entry.data_file)
        if not newer:
            return True
        summary = {JOB: job, SINK: sink, CHECKPOINT: str(done), RESTORED: str(checkpoint_id)}
        doing = f"cannot withdraw the files of the checkpoints after {checkpoint_id}"
        return self._snapshot(table, summary, [], newer, doing)

    def _table(self) -> Table | None:
        """The table, read anew (its newest snapshot); the catalog loaded once."""
        if self.catalog is None:
            self.catalog = self.target.load_catalog()
        return self.target.load(self.catalog)
