"""Where a stream goes besides files: Kafka, PostgreSQL, Delta Lake and Apache Iceberg
(``DataStream``'s ``write_kafka``, ``write_postgres``, ``write_delta``, ``write_iceberg``). Each builds a connector of
:mod:`cutline.connectors` and adds its sink operator; each says its guarantee."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cutline.api.columns import has_column
from cutline.connectors.sink import Sink
from cutline.runtime.eventtime.logic import WindowLogic
from cutline.runtime.graph import Edge, KeySelector, Operator, Partitioning
from cutline.runtime.keyed_operators import RollingLogic
from cutline.runtime.operators import Logic
from cutline.runtime.sink_operator import SinkLogic


class Outputs:
    """The writers of :class:`~cutline.api.DataStream` to external systems."""

    def transform(
        self, label: str, logic: Logic, *, name: str | None = None, on_error: str = "fail"
    ) -> Any:
        raise NotImplementedError  # (DataStream's)

    operator: Operator  # (DataStream's)
    schema: pa.Schema | None  # (DataStream's: its records' columns, when known)

    def _schema(self) -> pa.Schema | None:
        raise NotImplementedError  # (DataStream's)

    def _through(
        self, edge: Edge, label: str, logic: Logic, name: str | None, on_error: str
    ) -> Any:
        raise NotImplementedError  # (DataStream's)

    def _write(
        self,
        label: str,
        sink: Sink,
        name: str | None,
        key: tuple[str, ...] | None = None,
        on_error: str = "fail",
    ) -> None:
        """The sink operator ``label`` (its id, unless named, comes from it: two sinks of
        one stream into two tables have two). With ``key``, its subtasks get the records
        hashed by those fields, unless each key's records come from one subtask already."""
        if key is None or _keyed_by(self.operator, key):
            self.transform(label, SinkLogic(sink), name=name, on_error=on_error)
            return
        edge = Edge(self.operator.uid, Partitioning.HASH, _selector(key))
        self._through(edge, label, SinkLogic(sink), name, on_error)

    def write_kafka(
        self,
        topic: str,
        *,
        bootstrap_servers: str,
        key: str | None = None,
        value_format: str = "json",
        headers: str | Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        timestamp: str | None = None,
        delete: str | None = None,
        schema: Any = None,
        schema_registry: str | Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        """Send the records to Kafka ``topic``, **at least once**: an idempotent producer,
        flushed at every checkpoint (a checkpoint completes only once the brokers have every
        record before it); after a failure the records since the restored checkpoint are
        sent again. Each record is a JSON object (``value_format="json"``: every field but
        ``headers``'s and ``delete``'s), an Avro record of ``schema`` (``"avro"``), or its
        ``value`` field's bytes or text (``"raw"``, ``"string"``). ``docs/connectors.md``
        says why not exactly once, and what a reader does.

        :param key: the field that keys each record.
        :param headers: a field holding each record's headers (a list of ``{"key": str,
            "value": bytes}`` as ``_headers`` is read, of ``(key, value)`` pairs, or a dict),
            or the headers of every record (a dict or pairs; text values as UTF-8).
        :param timestamp: the field of each record's timestamp (a datetime, or epoch
            milliseconds); ``None``: the time it is sent.
        :param delete: a boolean field: a record where it is true is sent as a tombstone (its
            key and a null value: a delete in a compacted topic); needs ``key``.
        :param schema: with ``value_format="avro"``, the Avro schema (a dict or its JSON text).
        :param schema_registry: Avro in Confluent's wire format: the Schema Registry's URL (or
            its client's settings); the schema is registered under subject ``<topic>-value``
            when the job is built (``schema=None``: that subject's latest is used)."""
        from cutline.connectors.kafka.sink import kafka_sink

        sink = kafka_sink(
            topic,
            bootstrap_servers,
            key=key,
            value_format=value_format,
            config=config,
            headers=headers,
            timestamp=timestamp,
            delete=delete,
            schema=schema,
            schema_registry=schema_registry,
        )
        fields = {"key": key, "timestamp": timestamp, "delete": delete, "headers": headers}
        for argument, column in fields.items():
            if isinstance(column, str):
                has_column(self._schema(), column, f"write_kafka({topic}): {argument}=")
        self._write(f"write_kafka({topic})", sink, name)

    def write_postgres(
        self,
        dsn: str,
        *,
        table: str,
        key: str | Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        batch_rows: int = 20_000,
        name: str | None = None,
        on_error: str = "fail",
    ) -> None:
        """Write the records into PostgreSQL ``table``, **exactly once**: a transaction per
        subtask and checkpoint, prepared at the barrier and committed when the checkpoint
        completes (two-phase commit; the server needs ``max_prepared_transactions`` > 0).
        Inserts every record (``COPY``), or with ``key=`` upserts on those columns (a
        primary key or unique constraint): a record replaces its key's row. The table must
        exist with a column per field (``columns=``: only those fields are written). Checked
        now, on the driver, with the server: the table, the key's constraint, and, when the
        fields written are known (``columns=``, or the stream's columns), that each is a
        column, every NOT NULL column without a default is given, and each field's type goes
        into its column's. A record the server refuses (a value its column cannot take, a
        constraint it breaks) fails the job naming the table, the column, the value and the
        record, or with ``on_error="dead_letter"`` goes to the dead letters while the job
        goes on. Upserts of one key all go through one subtask (the records are hashed by
        ``key`` on their way to the sink, unless they come from a ``key_by`` of those fields
        already)."""
        from cutline.connectors.postgres import PostgresSink

        keys = None if key is None else ((key,) if isinstance(key, str) else tuple(key))
        chosen = None if columns is None else tuple(columns)
        sink = PostgresSink(dsn, table, keys, batch_rows, chosen)
        sink.check(self.schema)
        # upserts of one key from two subtasks would wait for each other's prepared
        # transactions, each committed only once a checkpoint the other holds up completes:
        # each key is upserted by one subtask
        self._write(f"write_postgres({table})", sink, name, keys, on_error)

    def write_delta(
        self,
        path: str | os.PathLike[str],
        *,
        partition_by: Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        compression: str = "zstd",
        name: str | None = None,
    ) -> None:
        """Append the records to the Delta Lake table at ``path`` (made if missing),
        **exactly once**: each subtask writes Parquet files while the records come and
        closes them at the barrier, and the driver commits them all in one Delta commit per
        checkpoint, which records the job and the checkpoint (an application transaction)
        so that no checkpoint is committed twice. ``compression``: the files' Parquet codec
        (``zstd``, ``snappy``, ``lz4``, ``gzip``, ``brotli`` or ``none``)."""
        from cutline.connectors.delta import DeltaSink

        where = os.fspath(path)
        sink = DeltaSink(
            where,
            storage_options=dict(storage_options) if storage_options else None,
            partition_by=list(partition_by) if partition_by else None,
            compression=compression,
        )
        self._write(f"write_delta({where})", sink, name)

    def write_iceberg(
        self,
        table: str,
        *,
        catalog: Mapping[str, Any] | str,
        partition_by: Sequence[str] | None = None,
        compression: str = "zstd",
        name: str | None = None,
    ) -> None:
        """Append the records to the Apache Iceberg table ``table`` (``"namespace.table"``)
        of ``catalog`` (a dict of pyiceberg catalog properties, e.g. ``{"type": "sql",
        "uri": "sqlite:////abs/catalog.db", "warehouse": "file:///abs/warehouse"}``, or the
        name of a catalog in ``~/.pyiceberg.yaml``), **exactly once**: each subtask writes
        Parquet data files while the records come and closes them at the barrier, and the
        driver commits them all in one Iceberg snapshot per checkpoint, whose summary names
        the job and the checkpoint so that no checkpoint is committed twice. The catalog is
        loaded now, on the driver; the table is made if missing (now, if the stream's
        columns are known, with ``partition_by`` as identity partitions), and an existing
        one is checked against the columns. ``compression``: the files' Parquet codec."""
        from cutline.connectors.iceberg import IcebergSink

        sink = IcebergSink(
            table,
            catalog,
            partition_by=list(partition_by) if partition_by else None,
            compression=compression,
        )
        sink.check(self.schema)
        self._write(f"write_iceberg({table})", sink, name)


@dataclass(frozen=True)
class Fields:
    """A key of several fields: the tuple of their values (picklable, compared by value)."""

    names: tuple[str, ...]

    def __call__(self, record: Any) -> tuple[Any, ...]:
        return tuple(record[n] for n in self.names)


def _selector(key: tuple[str, ...]) -> KeySelector:
    return key[0] if len(key) == 1 else Fields(key)


def _keyed_by(operator: Operator, key: tuple[str, ...]) -> bool:
    """Whether the records of ``operator`` of one value of ``key`` all come from one subtask:
    it reads its input hashed by those fields and keeps them (a rolling sum, min, max or
    count, or a window, of ``key_by`` those fields)."""
    if len(operator.inputs) != 1:
        return False
    edge, logic = operator.inputs[0], operator.logic
    keeps = isinstance(logic, WindowLogic) or (
        isinstance(logic, RollingLogic) and logic.how != "reduce"
    )
    return keeps and edge.partitioning is Partitioning.HASH and edge.key == _selector(key)
