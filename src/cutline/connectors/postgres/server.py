"""The server, as every part of the PostgreSQL sink reaches it: what a part needs of the sink
(:class:`Target`, :class:`Destination`: the sink is both), a connection, the check that the
server takes prepared transactions, the transactions' ids, and what the server said of an
error."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any, Protocol

import psycopg

from cutline.connectors.sink import SinkError

CONNECT_TIMEOUT = 10
"""Seconds a connection to the server may take."""


class Target(Protocol):
    """What reading the table and naming what it refuses need of a sink: the table, the
    upsert key, and how messages name the sink."""

    @property
    def table(self) -> str: ...
    @property
    def key(self) -> tuple[str, ...] | None: ...
    def describe(self) -> str: ...


class Destination(Target, Protocol):
    """What a writer needs of its sink, beyond its :class:`Target`: where the server is, how
    many rows to send at once, which fields are written."""

    @property
    def dsn(self) -> str: ...
    @property
    def connect(self) -> Mapping[str, Any]: ...
    @property
    def batch_rows(self) -> int: ...
    def written(self, fields: list[str]) -> list[str]: ...


def connect(sink: Destination) -> psycopg.Connection[Any]:
    """A connection of ``sink``'s (autocommit: transactions are begun by hand)."""
    try:
        return psycopg.connect(
            sink.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, **dict(sink.connect)
        )
    except psycopg.OperationalError as exc:
        raise SinkError(f"{sink.describe()}: cannot connect: {first_line(exc)}") from None


def check_prepared_transactions(sink: Destination, conn: psycopg.Connection[Any]) -> None:
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


def transaction_prefix(job: str, sink_uid: str) -> str:
    """Every transaction id of one job's sink begins with this."""
    return f"cutline:{job}:{zlib.crc32(sink_uid.encode()):08x}:"


def transaction_id(job: str, sink_uid: str, subtask: int, checkpoint_id: int) -> str:
    return f"{transaction_prefix(job, sink_uid)}{subtask}:{checkpoint_id}"


def first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def described(exc: psycopg.Error) -> str:
    """What the server said: its message, detail, where (its context's first line) and the
    column it names."""
    diag = exc.diag
    parts = [diag.message_primary or first_line(exc)]
    if diag.message_detail:
        parts.append(diag.message_detail)
    if diag.context:
        parts.append(diag.context.strip().splitlines()[0])
    if diag.column_name:
        parts.append(f"column {diag.column_name}")
    return "; ".join(parts)
