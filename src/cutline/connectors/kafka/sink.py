"""The Kafka sink: an idempotent producer, flushed at every checkpoint. **At least once.**

Every record is sent as it comes (JSON, or its ``value`` column's bytes or text), keyed by
``key=`` if given. At a checkpoint's barrier the writer waits until the brokers acknowledged
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

from cutline.connectors.kafka.metadata import LOG, reason
from cutline.connectors.sink import Sink, SinkContext, SinkError, SinkWriter
from cutline.connectors.source import Batch

FLUSH_TIMEOUT = 60.0
"""Seconds a checkpoint's flush may wait for the brokers' acknowledgements; then the
checkpoint fails (and the job restarts) rather than complete over records not written."""


@dataclass(frozen=True)
class KafkaSink(Sink):
    """Writes records to a Kafka topic, at least once (see the module's docstring). Build it
    with ``stream.write_kafka``, or pass one to ``stream.sink_to``."""

    topic: str
    bootstrap_servers: str
    key: str | None = None
    """The column whose value keys each record (text, bytes, or anything made text);
    ``None``: records without a key (spread over the partitions by the client)."""
    value_format: str = "json"
    """``"json"``: the record (every column) as a JSON object; ``"raw"``/``"string"``: the
    ``value`` column's bytes or text."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """More librdkafka producer settings (security, ``compression.type``, ``linger.ms``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise ValueError(f"write_kafka: topic must be a topic's name, not {self.topic!r}")
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers:
            raise ValueError(
                "write_kafka: bootstrap_servers must say where the brokers are, e.g. "
                f"'127.0.0.1:9092', not {self.bootstrap_servers!r}"
            )
        if self.value_format not in ("json", "raw", "string"):
            raise ValueError(
                "write_kafka: value_format must be 'json', 'raw' or 'string', not "
                f"{self.value_format!r}"
            )

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> KafkaWriter:
        return KafkaWriter(self, context)


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
            value = self._value(row)
            key = _bytes(row.get(sink.key)) if sink.key is not None else None
            while True:
                try:
                    produce(sink.topic, value, key, on_delivery=self._delivered)
                    break
                except BufferError:  # the client's queue is full: let it send
                    self.producer.poll(0.1)
                    self._raise_failures()
                except KafkaException as exc:
                    raise SinkError(f"write_kafka({sink.topic}): {reason(exc)}") from None
        self.producer.poll(0)

    def _value(self, row: Mapping[str, Any]) -> bytes | None:
        if self.sink.value_format == "json":
            return json.dumps(row, default=_plain, separators=(",", ":")).encode()
        if "value" not in row:
            raise SinkError(
                f"write_kafka({self.sink.topic}, value_format={self.sink.value_format!r}): "
                f"a record has no 'value' field: {dict(row)!r:.100}"
            )
        return _bytes(row["value"])

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
