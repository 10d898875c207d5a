"""Kafka in and out (confluent-kafka): :class:`KafkaSource` (exactly once: the offsets are in
cutline's checkpoints) and :class:`KafkaSink` (at least once: an idempotent producer flushed
at every checkpoint), with JSON, Avro (:class:`AvroFormat`, fastavro; Confluent's Schema
Registry) or raw values, headers and tombstones. ``env.read_kafka`` and ``stream.write_kafka``
build them.

Its names are imported when first used (``cutline.connectors.kafka.names``, the names the API
takes, imports no client library: the API names them when it is imported)."""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cutline.connectors.kafka.avro import AvroFormat as AvroFormat
    from cutline.connectors.kafka.reader import KafkaReader as KafkaReader
    from cutline.connectors.kafka.sink import KafkaSink as KafkaSink
    from cutline.connectors.kafka.sink import KafkaWriter as KafkaWriter
    from cutline.connectors.kafka.sink import kafka_sink as kafka_sink
    from cutline.connectors.kafka.source import KafkaSource as KafkaSource
    from cutline.connectors.kafka.source import kafka_source as kafka_source
    from cutline.connectors.kafka.values import KAFKA_FIELDS as KAFKA_FIELDS
    from cutline.connectors.kafka.values import ValueFormat as ValueFormat

_WHERE = {
    "KAFKA_FIELDS": "values",
    "AvroFormat": "avro",
    "KafkaReader": "reader",
    "KafkaSink": "sink",
    "KafkaSource": "source",
    "KafkaWriter": "sink",
    "ValueFormat": "values",
    "kafka_sink": "sink",
    "kafka_source": "source",
}
"""Each name, and the module of this package it lives in."""

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
