"""The Kafka source: a topic's partitions are its splits; their offsets live in cutline's
checkpoints and are the only truth.

* **Splits**: one per partition, id ``topic/partition``, ordinal ``crc32(topic) + partition``
  (so a topic's partitions are dealt round-robin, and two topics start at different
  subtasks, as Flink's Kafka source deals them). Partitions added to a topic while the job
  runs are found every ``discovery_interval`` and read from their beginning.
* **Topics by pattern** (``re.compile("clicks-.*")``, Flink's ``setTopicPattern``): the topics
  whose whole name it matches, listed on the driver when the job is built; an unbounded
  source finds the topics created later with new partitions (every ``discovery_interval``)
  and reads them from their beginning. None matching: an error if bounded (it would read
  nothing), a warning if not (they may come).
* **Positions**: the offset of the next record to read. A restore hands each partition to its
  reader from there, so records after the checkpoint are read again and none before it:
  exactly once with a sink that commits with the checkpoints. Consumer-group commits are only
  for monitoring (``group_id=``): made once a checkpoint completes, of that checkpoint's
  offsets, never read back.
* **Positions no longer there**: a partition that no longer holds a position (its records
  deleted by retention, or the topic deleted and made again: it ends before the position) is
  never read on from silently; the job fails naming the topic, the partition and both offsets,
  or reads on where ``on_offset_out_of_range`` says, counting the records skipped
  (:mod:`cutline.connectors.kafka.ranges`).
* **Where to start** (``start=``): ``"earliest"``, ``"latest"``, a time (a ``datetime`` or
  epoch milliseconds: the first record at or after it) or explicit offsets
  (``{partition: offset}``, or ``{"topic/partition": offset}``). ``"latest"`` and a time are
  resolved to offsets once, on the driver when the job is built, so every attempt of the job
  starts from the same records.
* **Bounded** (``bounded=True``, Flink's ``setBounded(OffsetsInitializer.latest())``): every
  partition ends at the offset it had reached when the job was built; the job ends when all
  are read. A partition found to hold records past its end, or to end before it (made
  again), is said in a warning naming it.
* **Event time**: the record timestamp is ``_timestamp``; with ``event_time="_timestamp"``
  each partition makes its own watermark, and a partition without records for
  ``idle_timeout`` stops holding the job's watermark back (see ``env.read_kafka``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from cutline.connectors.kafka.avro import (
    AvroFormat,
    NotAvro,
    RegistryUnavailable,
    avro_format,
    latest_schema,
)
from cutline.connectors.kafka.metadata import (
    check_start,
    client,
    listed_partitions,
    offset_range,
    others,
    parse_split,
    partition_split,
    resolve_start,
    sample_values,
    split_id,
    topic_partitions,
)
from cutline.connectors.kafka.ranges import OFFSET_POLICIES
from cutline.connectors.kafka.reader import KafkaReader
from cutline.connectors.kafka.values import (
    KAFKA_FIELDS,
    Deserializer,
    ValueFormat,
    Values,
    infer_schema,
    keys_named,
    values_named,
)
from cutline.connectors.source import Source, SourceContext, SourceError
from cutline.protocol.splits import Split


@dataclass(frozen=True)
class KafkaSource(Source):
    """Reads Kafka topics (see the module's docstring). Build it with ``env.read_kafka``, or
    pass one to ``env.from_source``."""

    topics: tuple[str, ...]
    bootstrap_servers: str
    value: ValueFormat = field(default_factory=ValueFormat)
    start: Any = "earliest"
    bounded: bool = False
    group_id: str | None = None
    """Consumer group whose offsets are committed, once each checkpoint completes, for
    monitoring (lag dashboards); never read back. ``None``: none committed."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """More librdkafka settings (security: ``security.protocol``, ``sasl.*``, ``ssl.*``)."""
    discovery_interval: float | None = 5.0
    starts: Mapping[str, int] | None = None
    """Where each partition known when the job was built starts (resolved by
    :meth:`prepare`); a partition not in it starts at its beginning."""
    ends: Mapping[str, int] | None = None
    """Bounded: where each partition ends (resolved by :meth:`prepare`)."""
    types: pa.Schema | None = None
    """JSON values: the types of the fields it names (``schema=`` as a dict); the others are
    inferred from the first records by :meth:`prepare`, as without it."""
    on_offset_out_of_range: str = "fail"
    """What a reader does with a position its partition no longer holds (one of
    :data:`~cutline.connectors.kafka.ranges.OFFSET_POLICIES`: see that module)."""
    pattern: re.Pattern[str] | None = None
    """The topics whose whole name it matches, instead of ``topics`` (then empty)."""

    def __post_init__(self) -> None:
        if isinstance(self.topics, str):
            object.__setattr__(self, "topics", (self.topics,))
        if self.pattern is not None:
            if not isinstance(self.pattern, re.Pattern) or self.topics:
                raise ValueError(
                    "read_kafka: topics are names or one re.Pattern, not both: "
                    f"{self.topics!r}, {self.pattern!r}"
                )
        elif not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise ValueError(
                "read_kafka: topics must be topic names or a re.Pattern of them, not "
                f"{self.topics!r}"
            )
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers:
            raise ValueError(
                "read_kafka: bootstrap_servers must say where the brokers are, e.g. "
                f"'127.0.0.1:9092', not {self.bootstrap_servers!r}"
            )
        if (self.value.value_format is Values.AVRO) != (self.value.avro is not None):
            raise ValueError(
                "read_kafka: value_format='avro' needs schema= (an Avro schema) or "
                "schema_registry=, and they are for Avro values only"
            )
        for schema in (self.value.schema, self.types):
            if schema is None:
                continue
            taken = sorted(set(schema.names) & set(KAFKA_FIELDS))
            if taken:
                raise ValueError(
                    f"read_kafka: the value's fields {taken} would hide Kafka's own "
                    f"({', '.join(KAFKA_FIELDS)}): rename them"
                )
        check_start(self.start)
        if self.on_offset_out_of_range not in OFFSET_POLICIES:
            raise ValueError(
                "read_kafka: on_offset_out_of_range must be one of "
                f"{', '.join(map(repr, OFFSET_POLICIES))}, not {self.on_offset_out_of_range!r}"
            )
        if self.bounded:
            object.__setattr__(self, "discovery_interval", None)

    # ------------------------------------------------------------------ driver

    @property
    def named(self) -> str:
        """The topics, as a message names them."""
        if self.pattern is not None:
            return f"the topics matching {self.pattern.pattern!r}"
        return f"topic(s) {', '.join(self.topics)}"

    def prepare(self) -> tuple[KafkaSource, list[str]]:
        """On the driver: the topics exist (a pattern's: some, if bounded), ``start`` (and
        ``bounded``'s ends) as offsets, a JSON value's schema inferred from the first records
        when none was given, an Avro value's from the registry."""
        notes: list[str] = []
        with client(self) as consumer:
            partitions = topic_partitions(consumer, self, check=True)
            if self.pattern is not None and not partitions:
                if self.bounded:
                    raise SourceError(
                        f"no topic on the Kafka brokers at {self.bootstrap_servers} matches "
                        f"{self.pattern.pattern!r}, and a bounded source reads only those there "
                        "when the job is built" + others(consumer)
                    )
                notes.append(
                    f"no topic matches {self.pattern.pattern!r} yet: the job reads those "
                    f"created while it runs, found every {self.discovery_interval} s"
                )
            starts = resolve_start(consumer, self, partitions)
            ends = None
            if self.bounded:
                ends = {split_id(t, p): offset_range(consumer, t, p)[1] for t, p in partitions}
            value = self.value
            if value.avro is not None:
                value = self._avro_schema(value, value.avro, sorted({t for t, _ in partitions}))
            if value.value_format is Values.JSON and value.schema is None:
                sample = sample_values(consumer, partitions, starts)
                inferred = infer_schema(sample, self.types)
                if self.types is not None and inferred is None:
                    notes.append(
                        f"{self.named} have no JSON record to infer the "
                        "value's other fields from: the records have the fields schema= names "
                        f"only ({', '.join(self.types.names)}); pass a pyarrow.Schema to say "
                        "that it is the whole value"
                    )
                    inferred = self.types
                value = replace(value, schema=inferred)
                if value.schema is None:
                    notes.append(
                        f"{self.named} have no JSON record to infer the "
                        "schema from: records are read as dicts (pass schema= to read them "
                        "as Arrow columns, which is faster)"
                    )
                else:
                    taken = sorted(set(value.schema.names) & set(KAFKA_FIELDS))
                    if taken:
                        raise SourceError(
                            f"the JSON values of {self.named} have fields {taken}, "
                            f"which would hide Kafka's own: pass a schema= without them"
                        )
        return replace(self, starts=starts, ends=ends, value=value), notes

    def _avro_schema(self, value: ValueFormat, avro: AvroFormat, topics: list[str]) -> ValueFormat:
        """Avro values: the registry answers; without ``schema=``, the reader's schema is the
        latest of subject ``<topic>-value`` (the same for every topic), fetched now."""
        registry = avro.registry
        found: dict[str, str | None] = {}
        if registry is not None:
            for topic in topics if avro.schema is None else topics[:1]:
                try:
                    found[topic] = latest_schema(registry, f"{topic}-value")
                except (RegistryUnavailable, NotAvro, ValueError) as exc:
                    raise SourceError(str(exc)) from None
        text = avro.schema
        if text is None:
            missing = [t for t, schema in found.items() if schema is None]
            if not found or missing:
                subjects = ", ".join(f"{t}-value" for t in missing) or "<topic>-value"
                raise SourceError(
                    f"the Schema Registry at {dict(registry or ()).get('url')} has no schema "
                    f"under subject {subjects} to read {self.named} with: pass schema= (the "
                    "reader's Avro schema)"
                )
            texts = set(found.values())
            if len(texts) > 1:
                raise SourceError(
                    f"the latest schemas of subjects {', '.join(f'{t}-value' for t in found)} "
                    "differ: pass schema= (the reader's Avro schema), which each record is "
                    "resolved to"
                )
            text = texts.pop()
            avro = replace(avro, schema=text)
        columns = avro.arrow_schema()
        taken = sorted(set(columns.names) & set(KAFKA_FIELDS))
        if taken:
            raise SourceError(
                f"the Avro values of {self.named} have fields {taken}, which would hide Kafka's "
                "own: pass a schema= without them (Avro's resolution drops them)"
            )
        return replace(value, avro=avro, schema=columns)

    def record_schema(self) -> pa.Schema | None:
        return self.value.record_schema()

    # --------------------------------------------------------------- every subtask

    def splits(self) -> Iterable[Split]:
        """The partitions: a bounded source's, as the driver found them; an unbounded
        source's as this process last listed them (the first time, now: unreachable brokers
        fail the subtask), listed again meanwhile on a thread of its own, so that the
        subtask never waits for brokers that do not answer, and a listing that fails keeps
        the partitions known."""
        if self.bounded and self.ends is not None:
            return [partition_split(*parse_split(s)) for s in self.ends]
        return [partition_split(t, p) for t, p in listed_partitions(self)]

    def reader(self, context: SourceContext) -> KafkaReader:
        return KafkaReader(self, context)


def kafka_source(
    topics: str | tuple[str, ...] | list[str] | re.Pattern[str],
    bootstrap_servers: str,
    *,
    value_format: str | Deserializer = "json",
    schema: pa.Schema | None = None,
    types: pa.Schema | None = None,
    avro_schema: Any = None,
    schema_registry: str | Mapping[str, Any] | None = None,
    key_format: str = "string",
    start: Any = "earliest",
    bounded: bool = False,
    group_id: str | None = None,
    config: Mapping[str, Any] | None = None,
    discovery_interval: float | None = 5.0,
    on_offset_out_of_range: str = "fail",
) -> KafkaSource:
    """A :class:`KafkaSource` from ``env.read_kafka``'s arguments (``schema``: the whole
    value's; ``types``: those of some of a JSON value's fields, the others inferred;
    ``avro_schema``: an Avro value's, as a dict or JSON text; ``schema_registry``: Avro values
    in the Schema Registry's wire format, its URL or client settings)."""
    pattern = topics if isinstance(topics, re.Pattern) else None
    names: tuple[str, ...] = ()
    if pattern is None:
        names = (topics,) if isinstance(topics, str) else tuple(topics)  # type: ignore[arg-type]
    avro = avro_format(value_format, avro_schema, schema_registry, "read_kafka")
    if avro is not None and avro.schema is not None:
        schema = avro.arrow_schema()
    return KafkaSource(
        names,
        bootstrap_servers,
        ValueFormat(values_named(value_format), schema, keys_named(key_format), avro),
        start,
        bounded,
        group_id,
        dict(config or {}),
        discovery_interval,
        types=types,
        on_offset_out_of_range=on_offset_out_of_range,
        pattern=pattern,
    )
