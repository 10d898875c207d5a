"""Sending rows into the table, in the open transaction of a connection, and finding the rows
the server refuses (:class:`Rows`).

Inserts are sent by ``COPY``; upserts by one ``INSERT ... SELECT FROM unnest(...) ON CONFLICT
DO UPDATE`` per batch, of the newest row of each key (a statement may not touch a row twice;
an older row of a key that a newer one replaces is never sent). Each statement runs under a
savepoint. When the server refuses it because of a row (a value its column cannot take, a
constraint the row breaks: SQLSTATE classes 22 and 23, a type that does not cast, a trigger's
``RAISE``), it is rolled back to the savepoint and its rows are sent again in halves, and
halves of those, each under a savepoint of its own, until every row that can be written is and
each row refused is known (a key whose newest row is refused gets its next newest). A refused
row becomes a :class:`~cutline.connectors.RecordError` with its record, naming the table, the
column and the value: the column the server names, the one its ``COPY`` context names, or the
first whose value alone does not cast to its type; else the constraint the row breaks, with
its columns' values. Its message is the same each time the record comes (no line numbers, no
transaction ids). Anything else (the connection lost, the server gone) is raised as it is.

Before anything is sent, a batch's fields are matched to their columns by type
(:func:`~cutline.connectors.postgres.table.refusal`): a record with a value in a field whose
type cannot go into its column (text into numbers) is refused at once.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from psycopg import sql
from psycopg.types.json import Jsonb

from cutline.connectors.postgres.server import Target
from cutline.connectors.postgres.table import Table
from cutline.connectors.sink import RecordError

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
REFUSED_STATES = frozenset({"42804", "42846", "428C9", "P0001"})
"""Besides classes 22 (data) and 23 (integrity): a datatype mismatch, a type that cannot be
cast, a column generated always, a trigger's ``RAISE``: a row's fault, not the server's."""
CHECKED_IN = "cutline_check"
CHECKS = sql.Identifier("pg_temp", CHECKED_IN)
"""The temporary copy of the table that rows are checked in (:meth:`Rows.check`)."""


def refused_by_row(exc: psycopg.Error) -> bool:
    """Whether the server (or psycopg, adapting a value) refused a statement because of the
    rows it was given, rather than failing as a whole."""
    state = exc.sqlstate
    if state is None:  # (psycopg's own: a value it cannot send, not a statement it got wrong)
        adapting = isinstance(exc, psycopg.ProgrammingError) and str(exc).startswith("cannot ad")
        return isinstance(exc, psycopg.DataError) or adapting
    return state[:2] in ("22", "23") or state in REFUSED_STATES


class Rows:
    """The rows of one sink's writer: checked by type, sent, and those refused named."""

    def __init__(self, sink: Target, table: Table) -> None:
        self.sink, self.table = sink, table
        self._fits: dict[pa.Schema, dict[str, str]] = {}
        self._constraints: dict[str, list[str]] = {}
        self._checks_for: tuple[str, ...] | None = None
        """The fields the temporary copy of the table was made for."""

    # ------------------------------------------------------------------- types

    def fitting(
        self, batch: pa.RecordBatch, names: Sequence[str]
    ) -> tuple[pa.RecordBatch, list[RecordError]]:
        """The records of ``batch`` whose values can go into their columns by type, and the
        others, refused (a field of text for a column of numbers)."""
        why = self._fits.get(batch.schema)
        if why is None:
            why = self._fits.setdefault(batch.schema, self.table.refusals(batch.schema, names))
        if not why:
            return batch, []
        has = [pc.is_valid(batch.column(name)) for name in why]
        out = has[0]
        for more in has[1:]:
            out = pc.or_(out, more)
        refused = []
        for index in pc.indices_nonzero(out).to_pylist():
            record = batch.slice(index, 1).to_pylist()[0]
            name = next(n for n in why if record[n] is not None)
            column = self.table.columns[name]
            refused.append(
                RecordError(
                    f"{self.sink.describe()}: column {name} ({column.type.sql}) cannot take "
                    f"{record[name]!r}: {why[name]}",
                    record,
                )
            )
        return batch.filter(pc.invert(out)), refused

    # ----------------------------------------------------------------- sending

    def send(
        self, conn: psycopg.Connection[Any], records: pa.Table, names: Sequence[str]
    ) -> list[RecordError]:
        """Write ``records`` (their fields ``names``) into the table, in the open transaction
        of ``conn``: every row the server takes; those it refuses are returned."""
        if self.sink.key is None:
            found = self._copied(conn, records.select(list(names)))
        else:
            found = self._inserted(conn, records, names, self.table.name, upsert=True)
        return [self._named(conn, records, names, index, exc) for index, exc in found]

    def check(
        self, conn: psycopg.Connection[Any], records: pa.Table, names: Sequence[str]
    ) -> tuple[pa.Table, list[RecordError]]:
        """Write ``records`` into a temporary copy of the table (its columns, types, NOT NULL
        and CHECK constraints; not its keys, foreign keys or triggers) in a transaction of
        ``conn`` (autocommit) rolled back: the records it takes, and those refused. For rows
        sent later where a refused one can no longer be put aside."""
        self._make_checks(conn, names)
        conn.execute("BEGIN")
        try:
            found = self._inserted(conn, records, names, CHECKS, upsert=False)
            refused = [self._named(conn, records, names, index, exc) for index, exc in found]
        finally:
            conn.execute("ROLLBACK")
        keep = [True] * records.num_rows
        for index, _ in found:
            keep[index] = False
        return records.filter(pa.array(keep, pa.bool_())), refused

    def _make_checks(self, conn: psycopg.Connection[Any], names: Sequence[str]) -> None:
        if self._checks_for == tuple(names):
            return
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(CHECKS))
        conn.execute(
            sql.SQL("CREATE TEMP TABLE {} (LIKE {} INCLUDING CONSTRAINTS)").format(
                CHECKS, self.table.name
            )
        )
        others = [c for c in self.table.columns if c not in names]  # (their defaults: not here)
        if others:
            conn.execute(
                sql.SQL("ALTER TABLE {} ").format(CHECKS)
                + sql.SQL(", ").join(
                    sql.SQL("ALTER COLUMN {} DROP NOT NULL").format(sql.Identifier(c))
                    for c in others
                )
            )
        self._checks_for = tuple(names)

    def _copied(
        self, conn: psycopg.Connection[Any], values: pa.Table
    ) -> list[tuple[int, psycopg.Error]]:
        """Inserts: ``COPY`` (as CSV when every column's type allows)."""
        names = values.schema.names
        columns = sql.SQL(", ").join(sql.Identifier(n) for n in names)
        as_csv = not any(self.table.columns[n].type.json for n in names) and all(
            any(test(f.type) for test in _CSV_TYPES) for f in values.schema
        )
        if as_csv:
            statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
                self.table.name, columns
            )
            options = pacsv.WriteOptions(include_header=False, quoting_style="needed")

            def write(lo: int, hi: int) -> None:
                text = io.BytesIO()
                pacsv.write_csv(values.slice(lo, hi - lo), text, options)
                with conn.cursor().copy(statement) as out:
                    out.write(text.getvalue())

            return _write_all(conn, values.num_rows, write)
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(self.table.name, columns)
        python = self._python(values)

        def write_rows(lo: int, hi: int) -> None:
            with conn.cursor().copy(statement) as out:
                for i in range(lo, hi):
                    out.write_row([column[i] for column in python])

        return _write_all(conn, values.num_rows, write_rows)

    def _inserted(
        self,
        conn: psycopg.Connection[Any],
        records: pa.Table,
        names: Sequence[str],
        into: sql.Composable,
        *,
        upsert: bool,
    ) -> list[tuple[int, psycopg.Error]]:
        """``INSERT`` of the newest row of each key (or of every row, without a key), from
        arrays (``unnest``), or row by row when a column is itself an array; ``upsert``: ``ON
        CONFLICT`` the key ``DO UPDATE``. A key whose newest row is refused is sent again
        with its next newest, until one is taken or none is left."""
        python = self._python(records.select(list(names)))
        statement, by_rows = self._insert_statement(into, names, upsert)
        at = [list(names).index(k) for k in self.sink.key or ()]

        def key(i: int) -> Any:
            return tuple(python[a][i] for a in at) if at else i

        refused: list[tuple[int, psycopg.Error]] = []
        candidates = list(range(records.num_rows))
        while candidates:
            newest = {key(i): i for i in candidates}
            order = list(newest.values())

            def write(lo: int, hi: int, order: list[int] = order) -> None:
                picks = order[lo:hi]
                if by_rows:
                    rows = [tuple(column[i] for column in python) for i in picks]
                    conn.cursor().executemany(statement, rows)
                else:
                    conn.execute(statement, [[column[i] for i in picks] for column in python])

            found = [(order[p], exc) for p, exc in _write_all(conn, len(order), write)]
            refused += found
            gone = {i for i, _ in found}
            again = {key(i) for i in gone}
            candidates = [i for i in candidates if key(i) in again and i not in gone]
        return sorted(refused, key=lambda found: found[0])

    def _insert_statement(
        self, into: sql.Composable, names: Sequence[str], upsert: bool
    ) -> tuple[sql.Composed, bool]:
        """The statement, and whether it takes one row at a time (a column is an array:
        ``unnest`` would flatten it)."""
        columns = sql.SQL(", ").join(sql.Identifier(n) for n in names)
        by_rows = any(self.table.columns[n].type.category == "A" for n in names)
        if by_rows:
            values = sql.SQL(", ").join(sql.Placeholder() for _ in names)
            statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(into, columns, values)
        else:
            arrays = sql.SQL(", ").join(
                sql.SQL("{}::{}[]").format(
                    sql.Placeholder(), sql.SQL(self.table.columns[n].type.sql)
                )
                for n in names
            )
            statement = sql.SQL("INSERT INTO {} ({}) SELECT * FROM unnest({})").format(
                into, columns, arrays
            )
        if not upsert:
            return statement, by_rows
        assert self.sink.key is not None
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
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.sink.key)
        return statement + sql.SQL(" ON CONFLICT ({}) ").format(keys) + action, by_rows

    def _python(self, values: pa.Table) -> list[list[Any]]:
        """Each column's values as psycopg takes them (a json column's lists and dicts as
        JSON)."""
        columns = []
        for name, column in zip(values.schema.names, values.columns, strict=True):
            python = column.to_pylist()
            if self.table.columns[name].type.json:
                python = [v if v is None or isinstance(v, str) else Jsonb(v) for v in python]
            columns.append(python)
        return columns

    # ----------------------------------------------------------- refused rows

    def _named(
        self,
        conn: psycopg.Connection[Any],
        records: pa.Table,
        names: Sequence[str],
        index: int,
        exc: psycopg.Error,
    ) -> RecordError:
        """Row ``index`` of ``records``, refused with ``exc``: what was wrong, and where."""
        record = records.slice(index, 1).to_pylist()[0]
        diag = exc.diag
        said = diag.message_primary or str(exc).strip().splitlines()[0]
        if diag.message_detail:
            said += f" ({diag.message_detail})"
        bare = self.sink.table.rpartition(".")[2]  # (as the table itself would have said it)
        said = said.replace(f'relation "{CHECKED_IN}"', f'relation "{bare}"')
        where = self.sink.describe()
        column = self._column_of(conn, exc, names, record)
        if column is not None:
            shown = self.table.columns[column].type.sql
            message = f"{where}: column {column} ({shown}) cannot take {record[column]!r}: {said}"
        elif diag.constraint_name:
            columns = [c for c in self._constraint(conn, diag.constraint_name) if c in names]
            values = ", ".join(f"{c} = {record[c]!r}" for c in columns)
            on = f" on {values}" if values else ""
            message = f"{where}: the row breaks {diag.constraint_name}{on}: {said}"
        else:
            message = f"{where}: the row is refused: {said}"
        return RecordError(message, record)

    def _column_of(
        self,
        conn: psycopg.Connection[Any],
        exc: psycopg.Error,
        names: Sequence[str],
        record: dict[str, Any],
    ) -> str | None:
        """The column whose value the server refused: the one it names, the one its
        ``COPY`` context names, or the first whose value alone does not cast to its type
        (``None``: the row as a whole, a constraint)."""
        diag = exc.diag
        if diag.column_name in names:
            return diag.column_name
        said = re.search(r'\bcolumn ("(?:[^"]|"")+"|[^\s:,]+)', diag.context or "")
        if said is not None:
            name = said.group(1)
            name = name[1:-1].replace('""', '"') if name.startswith('"') else name
            if name in names:
                return name
        if diag.constraint_name:
            return None
        for name in names:
            value = record[name]
            if value is None:
                continue
            if self.table.columns[name].type.json and not isinstance(value, str):
                value = Jsonb(value)
            probe = sql.SQL("SELECT ({}::{}[])[1]").format(
                sql.Placeholder(), sql.SQL(self.table.columns[name].type.sql)
            )
            if _write_all(conn, 1, _probe(conn, probe, value)):
                return name
        return None

    def _constraint(self, conn: psycopg.Connection[Any], name: str) -> list[str]:
        """The columns of the table's constraint (or unique index) ``name``."""
        if name not in self._constraints:
            table = self.table.name.as_string(conn)
            rows = conn.execute(
                """
                SELECT a.attname::text, a.attnum FROM pg_constraint c JOIN pg_attribute a
                  ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
                WHERE c.conrelid = to_regclass(%(t)s) AND c.conname = %(n)s
                UNION
                SELECT a.attname::text, a.attnum FROM pg_index i
                  JOIN pg_class x ON x.oid = i.indexrelid
                  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                WHERE i.indrelid = to_regclass(%(t)s) AND x.relname = %(n)s
                ORDER BY 2
                """,
                {"t": table, "n": name},
            ).fetchall()
            self._constraints[name] = [r[0] for r in rows]
        return self._constraints[name]


def _probe(
    conn: psycopg.Connection[Any], probe: sql.Composed, value: Any
) -> Callable[[int, int], Any]:
    """A cast of ``value`` alone, as a statement sends it (for :func:`_write_all`)."""
    return lambda lo, hi: conn.execute(probe, [[value]])


def _write_all(
    conn: psycopg.Connection[Any], n: int, write: Callable[[int, int], Any]
) -> list[tuple[int, psycopg.Error]]:
    """Rows ``[0, n)`` sent by ``write(lo, hi)`` (in the open transaction of ``conn``), each
    call under a savepoint: every row the server takes is written, in order; the rows it
    refuses alone are left out and returned, with their errors. A failure that is not the
    rows' (:func:`refused_by_row`) is raised."""
    refused: list[tuple[int, psycopg.Error]] = []

    def attempt(lo: int, hi: int) -> psycopg.Error | None:
        conn.execute("SAVEPOINT cutline_rows")
        try:
            write(lo, hi)
        except psycopg.Error as exc:
            if not refused_by_row(exc):
                raise
            conn.execute("ROLLBACK TO SAVEPOINT cutline_rows")
            conn.execute("RELEASE SAVEPOINT cutline_rows")
            return exc
        conn.execute("RELEASE SAVEPOINT cutline_rows")
        return None

    def through(lo: int, hi: int) -> None:
        exc = attempt(lo, hi)
        if exc is None:
            return
        if hi - lo == 1:
            refused.append((lo, exc))
            return
        middle = (lo + hi) // 2
        through(lo, middle)
        through(middle, hi)

    if n:
        through(0, n)
    return refused
