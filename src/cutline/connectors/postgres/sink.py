"""``PostgresSink``: where the rows go (the server, the table, the key, the fields written),
and what is checked of it when the job is built, on the driver (:meth:`PostgresSink.check`);
the connections, and the names of the transactions."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow as pa
from psycopg.conninfo import conninfo_to_dict

from cutline.connectors.postgres.server import check_prepared_transactions, connect
from cutline.connectors.postgres.table import Table
from cutline.connectors.postgres.writer import PostgresWriter
from cutline.connectors.sink import Sink, SinkContext, SinkError

BATCH_ROWS = 20_000
"""Rows buffered before they are sent into the checkpoint's open transaction."""


@dataclass(frozen=True)
class PostgresSink(Sink):
    """Writes records into a PostgreSQL table, exactly once (see the package's docstring).
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

    def written(self, fields: list[str]) -> list[str]:
        """The fields written of records with ``fields``: ``columns``, or all of them. A
        :class:`SinkError` when ``columns`` names one they do not have."""
        if self.columns is None:
            return fields
        missing = [c for c in self.columns if c not in fields]
        if missing:
            raise SinkError(
                f"{self.describe()}: the records have no field(s) {missing} (their fields: "
                f"{', '.join(fields) or 'none'})"
            )
        return list(self.columns)

    def check(self, schema: pa.Schema | None = None) -> None:
        """On the driver, when the job is built: the server answers, takes prepared
        transactions, and has the table (with the key's unique constraint). When the fields
        written are known (``columns``, or ``schema``: the records' columns, when the job
        knows them), each must be a column that can be written, every NOT NULL column without
        a default must be among them, and with ``schema`` each field's type must go into its
        column's (a possible overflow is left to the server, when the rows come). A
        :class:`SinkError` says what is wrong and where."""
        with connect(self) as conn:
            check_prepared_transactions(self, conn)
            table = Table.read(self, conn)
        fields = list(self.columns) if self.columns is not None else None
        if schema is not None:
            fields = self.written(list(schema.names))
        if fields is not None:
            table.check_fields(self, fields)
        if schema is not None and fields is not None:
            table.check_types(self, schema, fields)

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> PostgresWriter:
        return PostgresWriter(self, context, restored)
