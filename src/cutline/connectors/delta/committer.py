"""The driver's global committer of a Delta sink: one Delta commit per checkpoint, once (see
:mod:`cutline.connectors.delta`)."""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from cutline.connectors.delta.files import DeltaCommittable, DeltaTarget, app_id, partition_value
from cutline.connectors.sink import GlobalCommitter, SinkError
from cutline.connectors.tables.parts import file_prefix, line, named, now
from cutline.connectors.tables.writer import mismatch


class DeltaCommitter(GlobalCommitter):
    """The driver's committer: one Delta commit per checkpoint, once."""

    def __init__(self, target: DeltaTarget) -> None:
        self.target = target

    def commit(self, checkpoint_id: int, committables: list[Any]) -> None:
        apps: dict[str, list[DeltaCommittable]] = {}
        for c in committables:
            if isinstance(c, DeltaCommittable):
                apps.setdefault(app_id(c.job, c.sink), []).append(c)
        for app, group in apps.items():
            self._commit(app, checkpoint_id, group)

    def _commit(self, app: str, checkpoint_id: int, group: list[DeltaCommittable]) -> None:
        path = self.target.path
        for attempt in range(2):
            table = self.target.table()
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
                        storage_options=self.target.options(),
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
                    f"{line(exc)}"
                ) from None

    def _withdraw(self, table: DeltaTable, restored: DeltaCommittable, checkpoint_id: int) -> None:
        """The job restored checkpoint ``checkpoint_id``, older than the newest it committed (a
        run resumed from its checkpoint directory after a savepoint; the newest checkpoint
        damaged): the rows of the newer ones come again. Remove their files from the table,
        at once (idempotently: none are left the second time)."""
        prefix, at = file_prefix(restored.job, restored.sink), now()
        removes: list[AddAction | RemoveAction] = []
        for add in pa.table(table.get_add_actions(flatten=False)).to_pylist():
            path = unquote(add["path"])  # (as stored; the log URI-encodes it)
            if (named(path.rsplit("/", 1)[-1], prefix) or (0, -1))[1] > checkpoint_id:
                values = {c: partition_value(v) for c, v in (add.get("partition") or {}).items()}
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
                    f"Delta table {self.target.path}: cannot withdraw the files of the checkpoints "
                    f"after {checkpoint_id}: {line(exc)}"
                ) from None


def _common_schema(group: list[DeltaCommittable], where: str) -> pa.Schema:
    """The schema of a new table: its files' schemas, unified (a null column takes a type)."""
    schemas = [pa.ipc.read_schema(pa.py_buffer(c.schema)) for c in group]
    try:
        return pa.unify_schemas(schemas, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise SinkError(f"{where}: the subtasks' records differ: {line(exc)}") from None


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
                raise SinkError(mismatch(where, column.name, column.type, given))
