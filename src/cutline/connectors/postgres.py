"""The PostgreSQL sink (psycopg 3): insert or upsert, **exactly once**, by two-phase commit.

Each subtask writes the rows of a checkpoint interval in one transaction of its own (batched:
``COPY`` for inserts, one ``INSERT ... SELECT FROM unnest(...) ON CONFLICT`` per batch for
upserts). At the checkpoint's barrier it **prepares** the transaction
(``PREPARE TRANSACTION``): the rows are on disk, invisible, and survive a crash of the
writer or of the server. When the checkpoint is complete it commits it
(``COMMIT PREPARED``). The transaction's id names the job, the sink, the subtask and the
checkpoint: ``cutline:<job>:<sink>:<subtask>:<checkpoint>``.

After a restore each writer looks up the prepared transactions of its job's sink in
``pg_prepared_xacts`` (those of the old subtasks it takes over): it commits the ones the
restored checkpoint holds (their checkpoint completed; the commit may not have happened) and
rolls back every other one (prepared for a checkpoint that never completed). So no row is
lost, none is written twice, and no transaction is left holding locks.

The server must allow prepared transactions: ``max_prepared_transactions`` at least the
sink's parallelism times the checkpoints that may be in flight (PostgreSQL's default is 0).
"""

from __future__ import annotations

import contextlib
import io
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cutline.connectors.sink import PendingCommit, Sink, SinkContext, SinkError, SinkWriter
from cutline.connectors.source import Batch

CONNECT_TIMEOUT = 10
"""Seconds a connection to the server may take."""
BATCH_ROWS = 20_000
"""Rows buffered before they are sent into the checkpoint's open transaction."""

_CSV_TYPES = (
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_boolean,
    pa.types.is_timestamp,
    pa.types.is_date,
    pa.types.is_decimal,
)


@dataclass(frozen=True)
class PostgresSink(Sink):
    """Writes records into a PostgreSQL table, exactly once (see the module's docstring).
    Build it with ``stream.write_postgres``, or pass one to ``stream.sink_to``."""

    dsn: str
    """A libpq connection string or URL, ``postgresql://user@host:5432/database``."""
    table: str
    """The table, ``name`` or ``schema.name``; it must exist, with a column per field."""
    key: tuple[str, ...] | None = None
    """Upsert on these columns (a primary key or unique constraint of the table): a record
    replaces the row of its key. ``None``: every record is inserted."""
    batch_rows: int = BATCH_ROWS
    columns: tuple[str, ...] | None = None
    """The fields written (each a column of the table); ``None``: every field of the
    records."""
    connect: Mapping[str, Any] = field(default_factory=dict)
    """More psycopg connection arguments."""

    columnar = True

    def __post_init__(self) -> None:
        if isinstance(self.key, str):
            object.__setattr__(self, "key", (self.key,))
        if self.key is not None:
            object.__setattr__(self, "key", tuple(self.key))
            if not self.key or not all(isinstance(k, str) and k for k in self.key):
                raise ValueError(f"write_postgres: key must be column names, not {self.key!r}")
        if not isinstance(self.table, str) or not re.fullmatch(r"[^.]+(\.[^.]+)?", self.table):
            raise ValueError(
                f"write_postgres: table must be 'name' or 'schema.name', not {self.table!r}"
            )
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))
            if not self.columns or not all(isinstance(c, str) and c for c in self.columns):
                raise ValueError(
                    f"write_postgres: columns must be field names, not {self.columns!r}"
                )
        if type(self.batch_rows) is not int or self.batch_rows < 1:
            raise ValueError(
                f"write_postgres: batch_rows must be 1 or more, not {self.batch_rows!r}"
            )

    @property
    def where(self) -> str:
        """The server and database, for messages (never the password)."""
        try:
            parts = conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError:
            return "the database"
        host, port = parts.get("host", "localhost"), parts.get("port", "5432")
        return f"{host}:{port}/{parts.get('dbname', '')}"

    def describe(self) -> str:
        return f"write_postgres({self.table} at {self.where})"

    def check(self) -> None:
        """On the driver, when the job is built: the server answers, takes prepared
        transactions, and has the table (with the key's unique constraint). A
        :class:`SinkError` says what is wrong and where."""
        with _connect(self) as conn:
            check_prepared_transactions(self, conn)
            Table.read(self, conn)

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> PostgresWriter:
        return PostgresWriter(self, context, restored)


def _connect(sink: PostgresSink) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(
            sink.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, **dict(sink.connect)
        )
    except psycopg.OperationalError as exc:
        raise SinkError(f"{sink.describe()}: cannot connect: {_first_line(exc)}") from None


def check_prepared_transactions(sink: PostgresSink, conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SHOW max_prepared_transactions").fetchone()
    if row is None or int(row[0]) == 0:
        raise SinkError(
            f"{sink.describe()}: the server has max_prepared_transactions = 0, and the "
            "exactly-once sink prepares a transaction per subtask and checkpoint. Set it to at "
            "least twice the sink's parallelism (e.g. ALTER SYSTEM SET "
            "max_prepared_transactions = 64, or max_prepared_transactions = 64 in "
            "postgresql.conf; -c max_prepared_transactions=64 for a server started by hand) and "
            "restart the server"
        )


@dataclass(frozen=True)
class Table:
    """A table's columns as the server has them."""

    name: sql.Composable
    columns: dict[str, tuple[str, bool]]
    """Column -> (its type as SQL, whether it must have a value: NOT NULL without default)."""

    @classmethod
    def read(cls, sink: PostgresSink, conn: psycopg.Connection[Any]) -> Table:
        schema, _, name = sink.table.rpartition(".")
        rows = conn.execute(
            """
            SELECT a.attname, format_type(a.atttypid, a.atttypmod),
                   a.attnotnull AND NOT a.atthasdef AND a.attidentity = ''
            FROM pg_attribute a
            WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum
            """,
            (str(_qualified(schema, name).as_string(conn)),),
        ).fetchall()
        if not rows:
            raise SinkError(
                f"{sink.describe()}: table {sink.table!r} does not exist (or this user cannot "
                "see it): create it with a column per field of the records"
            )
        table = cls(_qualified(schema, name), {r[0]: (r[1], bool(r[2])) for r in rows})
        if sink.key is not None:
            table._check_key(sink, conn)
        return table

    def _check_key(self, sink: PostgresSink, conn: psycopg.Connection[Any]) -> None:
        assert sink.key is not None
        missing = [k for k in sink.key if k not in self.columns]
        if missing:
            raise SinkError(
                f"{sink.describe()}: key column(s) {missing} are not in the table (columns: "
                f"{', '.join(self.columns)})"
            )
        unique = conn.execute(
            """
            SELECT array_agg(a.attname::text ORDER BY a.attname)
            FROM pg_index i JOIN pg_attribute a
              ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
            WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL
            GROUP BY i.indexrelid
            """,
            (self.name.as_string(conn),),
        ).fetchall()
        if sorted(sink.key) not in [sorted(r[0]) for r in unique]:
            raise SinkError(
                f"{sink.describe()}: an upsert on key {list(sink.key)} needs a primary key or "
                f"unique constraint on exactly those columns (ALTER TABLE {sink.table} ADD "
                f"PRIMARY KEY ({', '.join(sink.key)}))"
            )

    def check_fields(self, sink: PostgresSink, names: Sequence[str]) -> None:
        """The records' fields fit the table: each is a column, and every column that must
        have a value gets one."""
        unknown = [n for n in names if n not in self.columns]
        if unknown:
            raise SinkError(
                f"{sink.describe()}: the records' field(s) {unknown} are not columns of the "
                f"table (its columns: {', '.join(self.columns)}); write only some fields with "
                "columns=[...]"
            )
        needed = [c for c, (_, required) in self.columns.items() if required and c not in names]
        if needed:
            raise SinkError(
                f"{sink.describe()}: column(s) {needed} are NOT NULL without a default, and the "
                f"records have no such field (their fields: {', '.join(names)})"
            )
        if sink.key is not None:
            absent = [k for k in sink.key if k not in names]
            if absent:
                raise SinkError(
                    f"{sink.describe()}: the records have no key field(s) {absent} to upsert on"
                )


def _qualified(schema: str, name: str) -> sql.Composable:
    if schema:
        return sql.Identifier(schema, name)
    return sql.Identifier(name)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def transaction_prefix(job: str, sink_uid: str) -> str:
    """Every transaction id of one job's sink begins with this."""
    return f"cutline:{job}:{zlib.crc32(sink_uid.encode()):08x}:"


def transaction_id(job: str, sink_uid: str, subtask: int, checkpoint_id: int) -> str:
    return f"{transaction_prefix(job, sink_uid)}{subtask}:{checkpoint_id}"


class PostgresWriter(SinkWriter):
    """One subtask's transactions: the open one (rows since the last barrier) on ``data``,
    the prepared ones (awaiting their checkpoint's completion) committed on ``control``."""

    def __init__(
        self, sink: PostgresSink, context: SinkContext, restored: Mapping[int, Any]
    ) -> None:
        self.sink, self.context = sink, context
        self.prefix = transaction_prefix(context.job, context.uid)
        self.control = _connect(sink)
        self.data: psycopg.Connection[Any] | None = None
        try:
            check_prepared_transactions(sink, self.control)
            self.table = Table.read(sink, self.control)
            self._recover(restored)
            self.data = _connect(sink)
        except BaseException:
            self._close()
            raise
        self.buffer: list[pa.RecordBatch] = []
        self.buffered = 0
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
                f"{self.sink.describe()}: {command} {gid!r} failed: {_first_line(exc)}"
            ) from None

    # ----------------------------------------------------------------- writes

    def write(self, batch: Batch) -> None:
        if not isinstance(batch, pa.RecordBatch):  # (a columnar sink gets Arrow batches)
            batch = pa.RecordBatch.from_pylist(list(batch))
        if not batch.num_rows:
            return
        if self.sink.columns is not None:
            missing = [c for c in self.sink.columns if c not in batch.schema.names]
            if missing:
                raise SinkError(
                    f"{self.sink.describe()}: the records have no field(s) {missing} (their "
                    f"fields: {', '.join(batch.schema.names)})"
                )
            batch = batch.select(list(self.sink.columns))
        names = list(batch.schema.names)
        if names != self.fields:
            self.table.check_fields(self.sink, names)
            self.fields = names
        self.buffer.append(batch)
        self.buffered += batch.num_rows
        if self.buffered >= self.sink.batch_rows and not self._may_wait():
            self._flush(self._take())

    def _may_wait(self) -> bool:
        """Whether writing now could wait for row locks of a transaction still prepared:
        an upsert of a key that one wrote waits until it is committed, which this thread
        does (:meth:`commit`) once told its checkpoint completed, so it must not wait."""
        return self.sink.key is not None and bool(self.prepared or self.preparing)

    def _take(self) -> list[pa.RecordBatch]:
        batches, self.buffer, self.buffered = self.buffer, [], 0
        return batches

    def _flush(self, batches: list[pa.RecordBatch]) -> None:
        if not batches:
            return
        runs: list[list[pa.RecordBatch]] = []  # (a statement writes batches of one schema)
        for batch in batches:
            if runs and runs[-1][0].schema == batch.schema:
                runs[-1].append(batch)
            else:
                runs.append([batch])
        assert self.data is not None
        try:
            if not self.open:
                self.data.execute("BEGIN")
                self.open = True
            for run in runs:
                table = pa.Table.from_batches(run).combine_chunks()
                if self.sink.key is None:
                    self._copy(table)
                else:
                    self._upsert(table)
        except psycopg.Error as exc:
            raise SinkError(
                f"{self.sink.describe()}: writing rows failed: {_describe(exc)}"
            ) from None

    def _copy(self, table: pa.Table) -> None:
        assert self.data is not None
        columns = sql.SQL(", ").join(sql.Identifier(n) for n in table.schema.names)
        if all(any(test(f.type) for test in _CSV_TYPES) for f in table.schema):
            copy = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(self.table.name, columns)
            text = io.BytesIO()
            options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
            pacsv.write_csv(table, text, options)
            with self.data.cursor().copy(copy) as out:
                out.write(text.getvalue())
            return
        copy = sql.SQL("COPY {} ({}) FROM STDIN").format(self.table.name, columns)
        with self.data.cursor().copy(copy) as out:
            for row in zip(*(c.to_pylist() for c in table.columns), strict=True):
                out.write_row(row)

    def _upsert(self, table: pa.Table) -> None:
        """One statement per batch: the batch's newest row per key (a statement may not touch
        a row twice), from arrays, with ``ON CONFLICT ... DO UPDATE``."""
        assert self.data is not None and self.sink.key is not None
        names = table.schema.names
        rows = {}
        columns = [c.to_pylist() for c in table.columns]
        at = [names.index(k) for k in self.sink.key]
        for row in zip(*columns, strict=True):
            rows[tuple(row[i] for i in at)] = row  # (the newest of each key wins)
        values = list(zip(*rows.values(), strict=True))
        arrays = sql.SQL(", ").join(
            sql.SQL("{}::{}[]").format(sql.Placeholder(), sql.SQL(self.table.columns[n][0]))
            for n in names
        )
        rest = [n for n in names if n not in self.sink.key]
        action = (
            sql.SQL("DO UPDATE SET ")
            + sql.SQL(", ").join(
                sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(n), sql.Identifier(n))
                for n in rest
            )
            if rest
            else sql.SQL("DO NOTHING")
        )
        statement = (
            sql.SQL("INSERT INTO {} ({}) SELECT * FROM unnest({}) ON CONFLICT ({}) ").format(
                self.table.name,
                sql.SQL(", ").join(sql.Identifier(n) for n in names),
                arrays,
                sql.SQL(", ").join(sql.Identifier(k) for k in self.sink.key),
            )
            + action
        )
        self.data.execute(statement, [list(v) for v in values])

    # ------------------------------------------------------------ checkpoints

    def prepare_commit(self, checkpoint_id: int) -> list[tuple[int, str]] | PendingCommit | None:
        """The barrier: the interval's rows are sent and their transaction prepared. The
        committable: every transaction prepared and not known to be committed. Upserts that
        could wait for an earlier checkpoint's prepared transaction (its completion may come
        after this barrier) are sent by the snapshot thread, while this one goes on (and
        commits that transaction when told)."""
        if self._may_wait():
            self.preparing.append(checkpoint_id)
            return _Prepare(self, checkpoint_id, self._take())
        return self._prepare(checkpoint_id, self._take())

    def _prepare(
        self, checkpoint_id: int, batches: list[pa.RecordBatch]
    ) -> list[tuple[int, str]] | None:
        self._flush(batches)
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
                    f"{checkpoint_id} failed: {_describe(exc)}"
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
        self.buffer, self.buffered = [], 0
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
    """An upsert writer's prepare of ``checkpoint_id``, done on the snapshot thread."""

    writer: PostgresWriter
    checkpoint_id: int
    batches: list[pa.RecordBatch]

    def complete(self) -> list[tuple[int, str]] | None:
        try:
            return self.writer._prepare(self.checkpoint_id, self.batches)
        finally:
            self.writer.preparing.remove(self.checkpoint_id)


def _describe(exc: psycopg.Error) -> str:
    diag = exc.diag
    parts = [diag.message_primary or _first_line(exc)]
    if diag.message_detail:
        parts.append(diag.message_detail)
    if diag.context:
        parts.append(diag.context.strip().splitlines()[0])
    if diag.column_name:
        parts.append(f"column {diag.column_name}")
    return "; ".join(parts)
