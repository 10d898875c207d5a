"""The Kafka sink: an idempotent producer, flushed at every checkpoint. **At least once.**

Every record is sent as it comes (JSON, Avro, or its ``value`` column's bytes or text), keyed
by ``key=`` if given, with the headers ``headers=`` gives (a column of them, or the same for
every record), the timestamp of field ``timestamp=`` (else the producer's clock), and as a
tombstone (its key and a null value) when its field ``delete=`` is true. At a checkpoint's
barrier the writer waits until the brokers acknowledged
everything sent before it (``acks=all``): a checkpoint never completes over a record that is
not in the topic. The producer is idempotent, so the client's own retries within a run add no
duplicate.

Why not exactly once: Kafka's exactly-once sink (Flink's) writes each checkpoint's records in a
producer transaction and commits it when the checkpoint completes; after a failure, the
restored job must commit a transaction that a dead process prepared, which needs the
producer's id and epoch of that process. librdkafka (and so confluent-kafka) cannot resume
another process's transaction, so a restored job could only abort it, losing its records.
cutline therefore gives at least once: after a failure the records between the restored
checkpoint and the failure are sent again. A reader that must see each record once
deduplicates: by a key of the record (an upsert into a table, a compacted topic keyed by it),
or by keeping, per key, the newest event time it has seen.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

from cutline.connectors.kafka.avro import (
    AvroFormat,
    NotAvro,
    RegistryUnavailable,
    avro_format,
    latest_schema,
    register,
)
from cutline.connectors.kafka.metadata import LOG, reason
from cutline.connectors.kafka.values import VALUE_FORMATS, Values
from cutline.connectors.sink import Sink, SinkContext, SinkError, SinkWriter
from cutline.connectors.source import Batch

FLUSH_TIMEOUT = 60.0
"""Seconds a checkpoint's flush may wait for the brokers' acknowledgements; then the
checkpoint fails (and the job restarts) rather than complete over records not written."""


Header = tuple[str, str | bytes | None]


@dataclass(frozen=True)
class KafkaSink(Sink):
    """Writes records to a Kafka topic, at least once (see the module's docstring). Build it
    with ``stream.write_kafka``, or pass one to ``stream.sink_to``."""

    topic: str
    bootstrap_servers: str
    key: str | None = None
    """The column whose value keys each record (text, bytes, or anything made text);
    ``None``: records without a key (spread over the partitions by the client)."""
    value_format: Values = Values.JSON
    """(Given as its name, it is made the :class:`~cutline.connectors.kafka.values.Values`.)
    ``"json"``: the record (every column but ``headers`` and ``delete``'s) as a JSON
    object; ``"avro"``: the fields of ``avro``'s schema; ``"raw"``/``"string"``: the
    ``value`` column's bytes or text."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """More librdkafka producer settings (security, ``compression.type``, ``linger.ms``)."""
    headers: str | tuple[Header, ...] | None = None
    """A column of each record's headers (a list of ``{"key", "value"}`` as ``_headers`` is
    read, of ``(key, value)`` pairs, or a dict), or the headers of every record."""
    timestamp: str | None = None
    """The column of each record's timestamp (a datetime, or epoch milliseconds)."""
    delete: str | None = None
    """The boolean column that makes a record a tombstone (its key, a null value)."""
    avro: AvroFormat | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise ValueError(f"write_kafka: topic must be a topic's name, not {self.topic!r}")
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers:
            raise ValueError(
                "write_kafka: bootstrap_servers must say where the brokers are, e.g. "
                f"'127.0.0.1:9092', not {self.bootstrap_servers!r}"
            )
        object.__setattr__(self, "value_format", _values(self.value_format))
        if (self.value_format is Values.AVRO) != (self.avro is not None):
            raise ValueError(
                "write_kafka: value_format='avro' needs schema= (an Avro schema) or "
                "schema_registry=, and they are for Avro values only"
            )
        for name in ("key", "timestamp", "delete"):
            column = getattr(self, name)
            if column is not None and (not isinstance(column, str) or not column):
                raise ValueError(f"write_kafka: {name}= must be a column's name, not {column!r}")
        if self.delete is not None and self.key is None:
            raise ValueError(
                f"write_kafka: delete={self.delete!r} needs key=: a tombstone deletes its key"
            )
        if self.headers is not None and not isinstance(self.headers, str):
            object.__setattr__(self, "headers", _constant_headers(self.headers))

    def prepare(self) -> KafkaSink:
        """On the driver, with a Schema Registry: the Avro schema (given, or the latest of
        subject ``<topic>-value``) registered under ``<topic>-value``, its id kept to frame
        every value with."""
        avro = self.avro
        if avro is None or avro.registry is None:
            return self
        subject = f"{self.topic}-value"
        try:
            text = avro.schema
            if text is None:
                text = latest_schema(avro.registry, subject)
                if text is None:
                    raise SinkError(
                        f"write_kafka({self.topic}): the Schema Registry at "
                        f"{dict(avro.registry)['url']} has no schema under subject {subject!r}: "
                        "pass schema= (the Avro schema to write with)"
                    )
            schema_id = register(avro.registry, subject, text)
        except (RegistryUnavailable, NotAvro, ValueError) as exc:
            raise SinkError(f"write_kafka({self.topic}): {exc}") from None
        return replace(self, avro=replace(avro, schema=text, schema_id=schema_id))

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> KafkaWriter:
        avro = self.avro
        registered = avro is None or avro.registry is None or avro.schema_id is not None
        return KafkaWriter(self if registered else self.prepare(), context)


def kafka_sink(
    topic: str,
    bootstrap_servers: str,
    *,
    key: str | None = None,
    value_format: str = "json",
    config: Mapping[str, Any] | None = None,
    headers: str | Mapping[str, Any] | Sequence[Header] | None = None,
    timestamp: str | None = None,
    delete: str | None = None,
    schema: Any = None,
    schema_registry: str | Mapping[str, Any] | None = None,
) -> KafkaSink:
    """A :class:`KafkaSink` from ``stream.write_kafka``'s arguments, prepared (its Avro schema
    registered, with a registry)."""
    avro = avro_format(value_format, schema, schema_registry, "write_kafka")
    fixed: str | tuple[Header, ...] | None = None
    if isinstance(headers, str):
        fixed = headers
    elif headers is not None:
        fixed = _constant_headers(headers)
    sink = KafkaSink(
        topic,
        bootstrap_servers,
        key,
        _values(value_format),
        dict(config or {}),
        fixed,
        timestamp,
        delete,
        avro,
    )
    return sink.prepare()


def _values(given: Any) -> Values:
    """``write_kafka``'s ``value_format=``: a :class:`Values` (or its name); a
    ``ValueError`` naming those that work else."""
    if given not in VALUE_FORMATS:
        raise ValueError(
            f"write_kafka: value_format must be 'json', 'avro', 'raw' or 'string', not {given!r}"
        )
    return Values(given)


def _constant_headers(headers: Any) -> tuple[Header, ...]:
    """``headers=`` as (key, value bytes) pairs: a dict, or pairs; a ``ValueError`` else."""
    try:
        return tuple(_headers(headers))
    except SinkError as exc:
        raise ValueError(f"write_kafka: headers= {exc}") from None


class KafkaWriter(SinkWriter):
    def __init__(self, sink: KafkaSink, context: SinkContext) -> None:
        self.sink = sink
        self.context = context
        config: dict[str, Any] = {
            "bootstrap.servers": sink.bootstrap_servers,
            "logger": LOG,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "error_cb": self._on_error,
        }
        config.update(sink.config)
        self.producer = Producer(config)
        self.hidden = {c for c in (sink.delete, sink.headers) if isinstance(c, str)}
        """Columns that are not the JSON value: they say how to send it."""
        self._failed: list[str] = []
        self._lock = threading.Lock()

    def write(self, batch: Batch) -> None:
        self._raise_failures()
        rows = batch.to_pylist() if isinstance(batch, pa.RecordBatch) else batch
        sink, produce = self.sink, self.producer.produce
        for row in rows:
            if not isinstance(row, Mapping):
                raise SinkError(
                    f"write_kafka({sink.topic}): a record is {type(row).__name__}, not a dict of "
                    f"fields: {row!r:.100}"
                )
            key = _bytes(row.get(sink.key)) if sink.key is not None else None
            value = None if self._deleted(row, key) else self._value(row)
            headers = self._headers(row)
            at = self._timestamp(row)
            while True:
                try:
                    produce(
                        sink.topic,
                        value,
                        key,
                        on_delivery=self._delivered,
                        timestamp=at,
                        headers=headers,
                    )
                    break
                except BufferError:  # the client's queue is full: let it send
                    self.producer.poll(0.1)
                    self._raise_failures()
                except KafkaException as exc:
                    raise SinkError(f"write_kafka({sink.topic}): {reason(exc)}") from None
        self.producer.poll(0)

    def _value(self, row: Mapping[str, Any]) -> bytes | None:
        sink = self.sink
        if sink.value_format is Values.JSON:
            if self.hidden:
                row = {k: v for k, v in row.items() if k not in self.hidden}
            return json.dumps(row, default=_plain, separators=(",", ":")).encode()
        if sink.avro is not None:
            try:
                return sink.avro.encode(row)
            except ValueError as exc:
                raise SinkError(
                    f"write_kafka({sink.topic}): a record does not fit the Avro schema, "
                    f"{exc}: {dict(row)!r:.200}"
                ) from None
        if "value" not in row:
            raise SinkError(
                f"write_kafka({sink.topic}, value_format={str(sink.value_format)!r}): "
                f"a record has no 'value' field: {dict(row)!r:.100}"
            )
        return _bytes(row["value"])

    def _deleted(self, row: Mapping[str, Any], key: bytes | None) -> bool:
        """Whether the record is a tombstone: its ``delete`` field is true (it has a key)."""
        sink = self.sink
        if sink.delete is None:
            return False
        flag = self._field(row, sink.delete, "delete")
        if flag is None or flag is False:
            return False
        if flag is not True:
            raise SinkError(
                f"write_kafka({sink.topic}): a record's field {sink.delete!r} (delete=) is "
                f"{flag!r:.50}, not true or false: {dict(row)!r:.100}"
            )
        if key is None:
            raise SinkError(
                f"write_kafka({sink.topic}): a record to delete ({sink.delete!r} is true) has a "
                f"null key ({sink.key!r}): a tombstone deletes its key: {dict(row)!r:.100}"
            )
        return True

    def _headers(self, row: Mapping[str, Any]) -> list[Header] | None:
        headers = self.sink.headers
        if headers is None:
            return None
        if not isinstance(headers, str):
            return list(headers)
        found = self._field(row, headers, "headers")
        if found is None:
            return None
        try:
            return list(_headers(found))
        except SinkError as exc:
            raise SinkError(
                f"write_kafka({self.sink.topic}): a record's field {headers!r} (headers=) {exc}"
            ) from None

    def _timestamp(self, row: Mapping[str, Any]) -> int:
        """The record's timestamp field as epoch milliseconds (0: the producer's clock)."""
        column = self.sink.timestamp
        if column is None:
            return 0
        at = self._field(row, column, "timestamp")
        if isinstance(at, dt.datetime):
            if at.tzinfo is None:  # (a timestamp column without a time zone: UTC)
                at = at.replace(tzinfo=dt.UTC)
            millis = round(at.timestamp() * 1000)
        elif isinstance(at, int) and not isinstance(at, bool):
            millis = at
        else:
            millis = -1
        if millis <= 0:
            raise SinkError(
                f"write_kafka({self.sink.topic}): a record's field {column!r} (timestamp=) is "
                f"{at!r:.50}, not a time after 1970 (a datetime, or epoch milliseconds): "
                f"{dict(row)!r:.100}"
            )
        return millis

    def _field(self, row: Mapping[str, Any], column: str, argument: str) -> Any:
        if column not in row:
            raise SinkError(
                f"write_kafka({self.sink.topic}): a record has no field {column!r} "
                f"({argument}=): {dict(row)!r:.100}"
            )
        return row[column]

    def prepare_commit(self, checkpoint_id: int) -> None:
        """The barrier: everything sent so far is acknowledged before the checkpoint can
        complete."""
        deadline = time.monotonic() + FLUSH_TIMEOUT
        left = self.producer.flush(FLUSH_TIMEOUT)
        while left and time.monotonic() < deadline:
            left = self.producer.flush(max(0.0, deadline - time.monotonic()))
        self._raise_failures()
        if left:
            raise SinkError(
                f"write_kafka({self.sink.topic}): {left} records were not acknowledged by the "
                f"brokers at {self.sink.bootstrap_servers} within {FLUSH_TIMEOUT:.0f} s of "
                f"checkpoint {checkpoint_id}'s barrier"
            )
        return None

    def commit(self, checkpoint_id: int) -> None:
        return None

    def abort(self) -> None:
        self.producer.purge()

    def close(self) -> None:
        self.producer.flush(FLUSH_TIMEOUT)

    def _delivered(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            with self._lock:
                self._failed.append(error.str())

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            with self._lock:
                self._failed.append(error.str())

    def _raise_failures(self) -> None:
        with self._lock:
            failed, self._failed = self._failed, []
        if failed:
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            raise SinkError(
                f"write_kafka({self.sink.topic}): the brokers at {self.sink.bootstrap_servers} "
                f"did not take a record: {failed[0]}{more}"
            )


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return str(value).encode()


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def _headers(value: Any) -> Iterable[Header]:
    """Headers as (key, value bytes) pairs, from a list of ``{"key", "value"}`` (as
    ``_headers`` is read) or of (key, value) pairs, or a dict; a :class:`SinkError` saying
    what they are instead."""
    pairs = value.items() if isinstance(value, Mapping) else value
    if isinstance(pairs, str | bytes) or not isinstance(pairs, Iterable):
        raise SinkError(
            "must be a list of {'key': ..., 'value': ...}, of (key, value) pairs, or a dict, "
            f"not {value!r:.100}"
        )
    for pair in pairs:
        if isinstance(pair, Mapping) and "key" in pair:
            key, data = pair["key"], pair.get("value")
        elif isinstance(pair, tuple | list) and len(pair) == 2:
            key, data = pair
        else:
            raise SinkError(f"has a header that is not a key and a value: {pair!r:.100}")
        if not isinstance(key, str):
            raise SinkError(f"has a header whose key is not text: {key!r:.100}")
        yield key, _bytes(data)
