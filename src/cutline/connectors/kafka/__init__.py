"""Kafka in and out (confluent-kafka): :class:`KafkaSource` (exactly once: the offsets are in
cutline's checkpoints) and :class:`KafkaSink` (at least once: an idempotent producer flushed
at every checkpoint), with JSON, Avro (:class:`AvroFormat`, fastavro; Confluent's Schema
Registry) or raw values, headers and tombstones. ``env.read_kafka`` and ``stream.write_kafka``
build them."""

from cutline.connectors.kafka.avro import AvroFormat
from cutline.connectors.kafka.reader import KafkaReader
from cutline.connectors.kafka.sink import KafkaSink, KafkaWriter, kafka_sink
from cutline.connectors.kafka.source import KafkaSource, kafka_source
from cutline.connectors.kafka.values import KAFKA_FIELDS, ValueFormat

__all__ = [
    "KAFKA_FIELDS",
    "AvroFormat",
    "KafkaReader",
    "KafkaSink",
    "KafkaSource",
    "KafkaWriter",
    "ValueFormat",
    "kafka_sink",
    "kafka_source",
]
