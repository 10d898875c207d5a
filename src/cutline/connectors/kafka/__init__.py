"""Kafka in and out (confluent-kafka): :class:`KafkaSource` (exactly once: the offsets are in
cutline's checkpoints) and :class:`KafkaSink` (at least once: an idempotent producer flushed
at every checkpoint). ``env.read_kafka`` and ``stream.write_kafka`` build them."""

from cutline.connectors.kafka.reader import KafkaReader
from cutline.connectors.kafka.sink import KafkaSink, KafkaWriter
from cutline.connectors.kafka.source import KafkaSource, kafka_source
from cutline.connectors.kafka.values import KAFKA_FIELDS, ValueFormat

__all__ = [
    "KAFKA_FIELDS",
    "KafkaReader",
    "KafkaSink",
    "KafkaSource",
    "KafkaWriter",
    "ValueFormat",
    "kafka_source",
]
