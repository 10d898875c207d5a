"""A table as the PostgreSQL sink sees it (:class:`Table`): its columns, each with its type,
whether it must be given a value and whether it can be written at all, and its key's unique
constraint; and which fields of the records can go into which column (:func:`refusal`), by
their Arrow type: checked when the job is built when the records' columns are known, and for
every batch as it comes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from cutline.connectors.postgres.server import Target
from cutline.connectors.sink import SinkError

INTEGERS = frozenset({"int2", "int4", "int8"})


@dataclass(frozen=True)
class ColumnType:
    """A column's type: as the table says it (``sql``, ``bigint``, ``varchar(20)``), and what
    it is made of (a domain's base type): ``name`` (``int8``, ``varchar``, ``jsonb``...),
    ``category`` (PostgreSQL's ``typcategory``: ``N`` numbers, ``S`` text, ``B`` booleans,
    ``D`` dates and times, ``T`` intervals, ``A`` arrays, ``U`` the others: json, uuid,
    bytea...), and an array's ``element``."""

    sql: str
    name: str
    category: str
    element: ColumnType | None = None

    @property
    def json(self) -> bool:
        return self.name in ("json", "jsonb")


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType
    required: bool
    """NOT NULL without a default (nor an identity): a row must give it a value."""
    generated: bool
    """GENERATED ALWAYS (a generated column, or an identity): a row cannot give it one."""


@dataclass(frozen=True)
class Table:
    """A table's columns as the server has them."""

    name: sql.Composable
    columns: dict[str, Column]

    @classmethod
    def read(cls, sink: Target, conn: psycopg.Connection[Any]) -> Table:
        schema, _, name = sink.table.rpartition(".")
        qualified = sql.Identifier(schema, name) if schema else sql.Identifier(name)
        generated = "a.attgenerated <> ''" if conn.info.server_version >= 120000 else "false"
        rows = conn.execute(
            sql.SQL(
                """
                SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.atttypid::int,
                       a.attnotnull AND NOT a.atthasdef AND a.attidentity = '',
                       a.attidentity = 'a' OR {}
                FROM pg_attribute a
                WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
                ORDER BY a.attnum
                """
            ).format(sql.SQL(generated)),
            (str(qualified.as_string(conn)),),
        ).fetchall()
        if not rows:
            raise SinkError(
                f"{sink.describe()}: table {sink.table!r} does not exist (or this user cannot "
                "see it): create it with a column per field of the records"
            )
        types = _types(conn, {r[2]: r[1] for r in rows})
        columns = {r[0]: Column(r[0], types[r[2]], bool(r[3]), bool(r[4])) for r in rows}
        table = cls(qualified, columns)
        if sink.key is not None:
            table._check_key(sink, conn)
        return table

    def _check_key(self, sink: Target, conn: psycopg.Connection[Any]) -> None:
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

    def check_fields(self, sink: Target, names: Sequence[str]) -> None:
        """The fields written fit the table: each is a column that can be written, and every
        column that must have a value gets one."""
        unknown = [n for n in names if n not in self.columns]
        if unknown:
            raise SinkError(
                f"{sink.describe()}: the records' field(s) {unknown} are not columns of the "
                f"table (its columns: {', '.join(self.columns)}); write only some fields with "
                "columns=[...]"
            )
        generated = [n for n in names if self.columns[n].generated]
        if generated:
            raise SinkError(
                f"{sink.describe()}: column(s) {generated} are GENERATED ALWAYS (the server "
                "makes their values): leave the field(s) out with columns=[...]"
            )
        needed = [c for c, column in self.columns.items() if column.required and c not in names]
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

    def check_types(self, sink: Target, schema: pa.Schema, names: Sequence[str]) -> None:
        """When the job is built: every field written goes into its column, by its type."""
        for name in names:
            column = self.columns[name]
            why = refusal(schema.field(name).type, column.type)
            if why is not None:
                raise SinkError(
                    f"{sink.describe()}: the records' field {name!r} is "
                    f"{schema.field(name).type}, and column {name} is {column.type.sql}: {why}"
                )

    def refusals(self, schema: pa.Schema, names: Sequence[str]) -> dict[str, str]:
        """The fields of a batch (of ``schema``) whose type cannot go into their column, and
        why: every record with a value there is refused."""
        found = {}
        for name in names:
            why = refusal(schema.field(name).type, self.columns[name].type)
            if why is not None:
                found[name] = why
        return found


def _types(conn: psycopg.Connection[Any], columns: dict[int, str]) -> dict[int, ColumnType]:
    """The columns' types (oid -> its type as ``format_type`` says it), each resolved to its
    base type (through domains), an array's to its element's."""
    known: dict[int, tuple[str, str, str, int, int]] = {}
    wanted = set(columns)
    while missing := sorted(wanted - known.keys()):
        rows = conn.execute(
            "SELECT oid::int, typname::text, typtype::text, typcategory::text, typelem::int, "
            "typbasetype::int FROM pg_type WHERE oid = ANY(%s)",
            (missing,),
        ).fetchall()
        for oid, name, kind, category, element, base in rows:
            known[oid] = (name, kind, category, element, base)
            if kind == "d":  # a domain: its base type
                wanted.add(base)
            elif category == "A" and element:  # an array: its items' type
                wanted.add(element)
        if not rows:
            break

    def resolved(oid: int, shown: str) -> ColumnType:
        name, kind, category, element, base = known.get(oid, ("", "", "X", 0, 0))
        while kind == "d" and base in known:
            name, kind, category, element, base = known[base]
        items = resolved(element, shown.removesuffix("[]")) if category == "A" else None
        return ColumnType(shown, name, category, items)

    return {oid: resolved(oid, shown) for oid, shown in columns.items()}


def refusal(value: pa.DataType, column: ColumnType) -> str | None:
    """Why values of Arrow type ``value`` cannot go into a column of type ``column`` (``None``:
    they can, as far as their types tell; a value too large for its column is the server's to
    refuse). Text goes into anything but numbers, booleans and bytes (dates, uuids, json and
    enums are written as text); numbers into numbers and text; lists into arrays and json."""
    if pa.types.is_dictionary(value):
        value = value.value_type
    kind = column.category
    if pa.types.is_null(value):
        return None
    if kind == "A":
        if _is_list(value):
            assert column.element is not None
            why = refusal(value.value_type, column.element)
            return None if why is None else f"its items: {why}"
        return "the column is an array, and the field holds no lists"
    if _is_list(value) or pa.types.is_struct(value) or pa.types.is_map(value):
        return None if column.json else "lists and structs go into an array or a json column"
    if pa.types.is_integer(value):
        return None if kind in "NS" else "numbers go into a column of numbers or text"
    if pa.types.is_floating(value) or pa.types.is_decimal(value):
        fraction = not pa.types.is_decimal(value) or value.scale > 0
        if column.name in INTEGERS and fraction:
            return "numbers with a fraction do not go into a column of integers"
        return None if kind in "NS" else "numbers go into a column of numbers or text"
    if pa.types.is_boolean(value):
        return None if kind in "BS" else "true and false go into a boolean or text column"
    if pa.types.is_string(value) or pa.types.is_large_string(value):
        if kind in "NB" or column.name == "bytea":
            what = {"N": "numbers", "B": "booleans"}.get(kind, "bytes")
            return (
                f"text does not go into a column of {what} (convert the field before the "
                "sink, or make the column text)"
            )
        return None
    if pa.types.is_binary(value) or pa.types.is_large_binary(value):
        return None if column.name == "bytea" else "bytes go into a bytea column"
    if pa.types.is_timestamp(value) or pa.types.is_date(value) or pa.types.is_time(value):
        return None if kind in "DS" else "dates and times go into a date, time or text column"
    if pa.types.is_duration(value):
        return None if kind in "TS" else "durations go into an interval or text column"
    return None  # (another type: the server judges each value)


def _is_list(value: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(value)
        or pa.types.is_large_list(value)
        or pa.types.is_fixed_size_list(value)
    )
