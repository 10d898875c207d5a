"""The Kafka source: a topic's partitions are its splits; their offsets live in cutline's
checkpoints and are the only truth.

* **Splits**: one per partition, id ``topic/partition``, ordinal ``crc32(topic) + partition``
  (so a topic's partitions are dealt round-robin, and two topics start at different
  subtasks, as Flink's Kafka source deals them). Partitions added to a topic while the job
  runs are found every ``discovery_interval`` and read from their beginning.
* **Positions**: the offset of the next record to read. A restore hands each partition to its
  reader from there, so records after the checkpoint are read again and none before it:
  exactly once with a sink that commits with the checkpoints. Consumer-group commits are only
  for monitoring (``group_id=``): made once a checkpoint completes, of that checkpoint's
  offsets, never read back.
* **Where to start** (``start=``): ``"earliest"``, ``"latest"``, a time (a ``datetime`` or
  epoch milliseconds: the first record at or after it) or explicit offsets
  (``{partition: offset}``, or ``{"topic/partition": offset}``). ``"latest"`` and a time are
  resolved to offsets once, on the driver when the job is built, so every attempt of the job
  starts from the same records.
* **Bounded** (``bounded=True``, Flink's ``setBounded(OffsetsInitializer.latest())``): every
  partition ends at the offset it had reached when the job was built; the job ends when all
  are read.
* **Event time**: the record timestamp is ``_timestamp``; with ``event_time="_timestamp"``
  each partition makes its own watermark, and a partition without records for
  ``idle_timeout`` stops holding the job's watermark back (see ``env.read_kafka``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from cutline.connectors.kafka.values import (
    KAFKA_FIELDS,
    VALUE_FORMATS,
    Deserializer,
    Message,
    Rejected,
    ValueFormat,
    infer_schema,
)
from cutline.connectors.source import (
    Finished,
    Nothing,
    ReadResult,
    Records,
    Source,
    SourceContext,
    SourceError,
    SplitReader,
)
from cutline.protocol.splits import Split

LOG = logging.getLogger("cutline.connectors.kafka")
METADATA_TIMEOUT = 10.0
"""Seconds a look-up of the brokers' metadata (topics, partitions, offsets) may take."""
SAMPLE = 500
"""At most this many records are read on the driver to infer a JSON value's schema."""


def split_id(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def parse_split(split: str) -> tuple[str, int]:
    topic, _, partition = split.rpartition("/")
    return topic, int(partition)


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

    def __post_init__(self) -> None:
        if isinstance(self.topics, str):
            object.__setattr__(self, "topics", (self.topics,))
        if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise ValueError(f"read_kafka: topics must be topic names, not {self.topics!r}")
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers:
            raise ValueError(
                "read_kafka: bootstrap_servers must say where the brokers are, e.g. "
                f"'127.0.0.1:9092', not {self.bootstrap_servers!r}"
            )
        fmt = self.value.value_format
        if not callable(fmt) and fmt not in VALUE_FORMATS:
            raise ValueError(
                f"read_kafka: value_format must be one of {', '.join(VALUE_FORMATS)} or a "
                f"function of a value's bytes to a dict of fields, not {fmt!r}"
            )
        if self.value.key_format not in ("string", "raw"):
            raise ValueError(
                f"read_kafka: key_format must be 'string' or 'raw', not {self.value.key_format!r}"
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
        _check_start(self.start)
        if self.bounded:
            object.__setattr__(self, "discovery_interval", None)

    # ------------------------------------------------------------------ driver

    def prepare(self) -> tuple[KafkaSource, list[str]]:
        """On the driver: the topics exist, ``start`` (and ``bounded``'s ends) as offsets, a
        JSON value's schema inferred from the first records when none was given."""
        notes: list[str] = []
        with _client(self) as consumer:
            partitions = _partitions(consumer, self, check=True)
            starts = _resolve_start(consumer, self, partitions)
            ends = None
            if self.bounded:
                ends = {split_id(t, p): _watermarks(consumer, t, p)[1] for t, p in partitions}
            value = self.value
            if value.value_format == "json" and value.schema is None:
                sample = _sample(consumer, partitions, starts)
                inferred = infer_schema(sample, self.types)
                if self.types is not None and inferred is None:
                    notes.append(
                        f"topic(s) {', '.join(self.topics)} have no JSON record to infer the "
                        "value's other fields from: the records have the fields schema= names "
                        f"only ({', '.join(self.types.names)}); pass a pyarrow.Schema to say "
                        "that it is the whole value"
                    )
                    inferred = self.types
                value = replace(value, schema=inferred)
                if value.schema is None:
                    notes.append(
                        f"topic(s) {', '.join(self.topics)} have no JSON record to infer the "
                        "schema from: records are read as dicts (pass schema= to read them "
                        "as Arrow columns, which is faster)"
                    )
                else:
                    taken = sorted(set(value.schema.names) & set(KAFKA_FIELDS))
                    if taken:
                        raise SourceError(
                            f"the JSON values of {', '.join(self.topics)} have fields {taken}, "
                            f"which would hide Kafka's own: pass a schema= without them"
                        )
        return replace(self, starts=starts, ends=ends, value=value), notes

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
            return [_split(*parse_split(s)) for s in self.ends]
        key = (self.bootstrap_servers, self.topics, tuple(sorted(map(str, self.config.items()))))
        with _LISTINGS_LOCK:
            listing = _LISTINGS.setdefault(key, _Listing())
        return [_split(t, p) for t, p in listing.get(self)]

    def reader(self, context: SourceContext) -> KafkaReader:
        return KafkaReader(self, context)


class _Listing:
    """The partitions of one source's topics as this process last listed them."""

    def __init__(self) -> None:
        self.partitions: list[tuple[str, int]] | None = None
        self.refreshing: threading.Thread | None = None
        self.lock = threading.Lock()

    def get(self, source: KafkaSource) -> list[tuple[str, int]]:
        with self.lock:
            known = self.partitions
            if known is not None:
                if self.refreshing is None or not self.refreshing.is_alive():
                    self.refreshing = threading.Thread(
                        target=self._refresh, args=(source,), daemon=True
                    )
                    self.refreshing.start()
                return known
        found = _list(source)  # (the first time: now)
        with self.lock:
            self.partitions = _more(self.partitions, found)
            return self.partitions

    def _refresh(self, source: KafkaSource) -> None:
        try:
            found = _list(source)
        except SourceError:
            return  # (the brokers do not answer: the partitions known stay)
        with self.lock:
            self.partitions = _more(self.partitions, found)


def _list(source: KafkaSource) -> list[tuple[str, int]]:
    with _client(source) as consumer:
        return _partitions(consumer, source, check=False)


def _more(
    known: list[tuple[str, int]] | None, found: list[tuple[str, int]]
) -> list[tuple[str, int]]:
    """Partitions are never removed from a topic: a listing adds to what is known."""
    return sorted(set(known or ()) | set(found))


_LISTINGS: dict[tuple[Any, ...], _Listing] = {}
_LISTINGS_LOCK = threading.Lock()


def _split(topic: str, partition: int) -> Split:
    return Split(split_id(topic, partition), zlib.crc32(topic.encode()) + partition)


def _check_start(start: Any) -> None:
    if start in ("earliest", "latest") or isinstance(start, dt.datetime):
        return
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return
    if isinstance(start, Mapping) and all(
        isinstance(k, int | str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in start.items()
    ):
        return
    raise ValueError(
        "read_kafka: start must be 'earliest', 'latest', a time (a datetime, or epoch "
        "milliseconds) or offsets ({partition: offset} or {'topic/partition': offset}), not "
        f"{start!r:.100}"
    )


# ----------------------------------------------------------------- metadata


def _client(source: KafkaSource) -> contextlib.closing[Consumer]:
    """A consumer for metadata look-ups, closed after use."""
    return contextlib.closing(Consumer(_consumer_config(source, group=None)))


def _consumer_config(source: KafkaSource, group: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": source.bootstrap_servers,
        "logger": LOG,  # (librdkafka's messages through Python's logging, not on stderr)
        "group.id": group or "cutline",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # an offset no longer on the broker (retention deleted it) is an error, not a jump
        "auto.offset.reset": "error",
        "enable.partition.eof": False,
        "socket.connection.setup.timeout.ms": int(METADATA_TIMEOUT * 1000),
    }
    config.update(source.config)
    return config


def _partitions(consumer: Consumer, source: KafkaSource, *, check: bool) -> list[tuple[str, int]]:
    """Every partition of the source's topics; with ``check``, a :class:`SourceError` naming
    a topic that does not exist or brokers that cannot be reached."""
    where = source.bootstrap_servers
    found: list[tuple[str, int]] = []
    for topic in source.topics:
        try:
            metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT)
        except KafkaException as exc:
            raise SourceError(
                f"cannot reach the Kafka brokers at {where} to read topic {topic!r}: {reason(exc)}"
            ) from None
        entry = metadata.topics.get(topic)
        error = entry.error if entry is not None else None
        if entry is None or error is not None or not entry.partitions:
            if not check:
                continue
            if error is not None and error.code() in (
                KafkaError.TOPIC_AUTHORIZATION_FAILED,
                KafkaError.SASL_AUTHENTICATION_FAILED,
            ):
                raise SourceError(f"the brokers at {where} refuse topic {topic!r}: {error.str()}")
            raise SourceError(
                f"topic {topic!r} does not exist on the Kafka brokers at {where}"
                + _others(consumer)
            )
        found += [(topic, p) for p in sorted(entry.partitions)]
    return found


def _others(consumer: Consumer) -> str:
    try:
        names = sorted(
            t
            for t in consumer.list_topics(timeout=METADATA_TIMEOUT).topics
            if not t.startswith("__")
        )
    except KafkaException:
        return ""
    if not names:
        return " (it has no topic)"
    return f" (its topics: {', '.join(names[:20])}{', ...' if len(names) > 20 else ''})"


def reason(exc: KafkaException) -> str:
    """What a client exception says (its error's text)."""
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


def _watermarks(consumer: Consumer, topic: str, partition: int) -> tuple[int, int]:
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=METADATA_TIMEOUT
        )
    except KafkaException as exc:
        raise SourceError(
            f"cannot read the offsets of {split_id(topic, partition)}: {reason(exc)}"
        ) from None
    return int(low), int(high)


def _resolve_start(
    consumer: Consumer, source: KafkaSource, partitions: list[tuple[str, int]]
) -> dict[str, int]:
    """Where each partition starts, as offsets (``"earliest"``: none given: its beginning)."""
    start = source.start
    if start == "earliest":
        return {}
    if start == "latest":
        return {split_id(t, p): _watermarks(consumer, t, p)[1] for t, p in partitions}
    if isinstance(start, Mapping):
        offsets: dict[str, int] = {}
        known = {split_id(t, p) for t, p in partitions}
        for key, offset in start.items():
            if isinstance(key, int):
                if len(source.topics) != 1:
                    raise SourceError(
                        f"start={{{key}: {offset}}}: with several topics, name the partition "
                        "as 'topic/partition'"
                    )
                key = split_id(source.topics[0], key)
            if key not in known:
                raise SourceError(f"start names partition {key!r}, which does not exist")
            offsets[key] = offset
        return offsets
    millis = int(start.timestamp() * 1000) if isinstance(start, dt.datetime) else int(start)
    asked = [TopicPartition(t, p, millis) for t, p in partitions]
    try:
        found = consumer.offsets_for_times(asked, timeout=METADATA_TIMEOUT)
    except KafkaException as exc:
        raise SourceError(f"cannot find the offsets at time {start}: {reason(exc)}") from None
    offsets = {}
    for tp in found:
        offset = tp.offset
        if offset < 0:  # no record at or after that time: from the end
            offset = _watermarks(consumer, tp.topic, tp.partition)[1]
        offsets[split_id(tp.topic, tp.partition)] = int(offset)
    return offsets


def _sample(
    consumer: Consumer, partitions: list[tuple[str, int]], starts: Mapping[str, int]
) -> list[bytes]:
    """Up to :data:`SAMPLE` values from where the partitions start (at most a few seconds)."""
    assigned = [
        TopicPartition(t, p, starts.get(split_id(t, p), OFFSET_BEGINNING)) for t, p in partitions
    ]
    ends = {}
    for t, p in partitions:
        low, high = _watermarks(consumer, t, p)
        if high > max(low, starts.get(split_id(t, p), low)):
            ends[(t, p)] = high
    if not ends:
        return []
    consumer.assign([tp for tp in assigned if (tp.topic, tp.partition) in ends])
    values: list[bytes] = []
    deadline = time.monotonic() + 3.0
    while len(values) < SAMPLE and time.monotonic() < deadline:
        got = consumer.consume(SAMPLE, timeout=0.2)
        for message in got:
            value = message.value()
            if message.error() is None and value is not None:
                values.append(value)
        if values and not got:  # (what there was came: the rest may be far behind)
            break
    consumer.unassign()
    return values[:SAMPLE]


# ------------------------------------------------------------------ the reader


class KafkaReader(SplitReader):
    """One subtask's partitions, read by one consumer with ``assign()`` (no group
    rebalancing: cutline decides who reads what)."""

    def __init__(self, source: KafkaSource, context: SourceContext) -> None:
        self.source = source
        self.context = context
        self.consumer = Consumer(
            {**_consumer_config(source, source.group_id), "error_cb": self._on_error}
        )
        self.next: dict[str, int | None] = {}
        """Split -> offset of the next record to give (``None``: from its beginning)."""
        self.waiting: deque[tuple[str, list[Any]]] = deque()
        """Messages consumed and not given yet, per split, in order."""
        self.finished: deque[str] = deque()
        self.assigned: set[str] = set()
        """The splits assigned to the consumer."""
        self.taken: dict[int, dict[str, Any]] = {}
        """Checkpoint -> the positions it holds, to publish when it completes (group_id)."""
        self.ended: dict[str, int] = {}
        """Where the partitions finished since the last checkpoint ended (group_id)."""
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._warned_down = False

    def add_split(self, split: Split, position: Any) -> None:
        topic, partition = parse_split(split.id)
        start = position
        if start is None and self.source.starts is not None:
            start = self.source.starts.get(split.id)
        end = self._end(split.id)
        if end is not None and (start or 0) >= end:
            self.next[split.id] = start
            self.finished.append(split.id)
            return
        self.next[split.id] = start
        offset = OFFSET_BEGINNING if start is None else int(start)
        self.consumer.incremental_assign([TopicPartition(topic, partition, offset)])
        self.assigned.add(split.id)

    def _end(self, split: str) -> int | None:
        return None if self.source.ends is None else self.source.ends.get(split)

    def position(self, split: str) -> Any:
        return self.next[split]

    def read(self, max_records: int) -> ReadResult:
        self._raise_errors()
        if self.finished:
            return self._finish(self.finished.popleft())
        if not self.waiting:
            if not self.next:
                return Nothing(0.05)
            self._consume(max_records)
            if not self.waiting:
                return Nothing(0.0) if not self.finished else self.read(max_records)
        split, messages = self.waiting.popleft()
        if split not in self.next:  # (finished meanwhile)
            return Nothing(0.0)
        end = self._end(split)
        if end is not None:
            kept = [m for m in messages if m.offset() < end]
            if len(kept) < len(messages) or (kept and kept[-1].offset() + 1 >= end):
                self.finished.append(split)
            messages = kept
            if not messages:
                return self.read(max_records)
        self.next[split] = messages[-1].offset() + 1
        return self._records(split, messages)

    def _consume(self, max_records: int) -> None:
        """Consume what the client has (waiting a little for more), grouped by split."""
        batch = self.consumer.consume(max(1, min(max_records, 100_000)), timeout=0.01)
        grouped: dict[str, list[Any]] = {}
        for message in batch:
            error = message.error()
            if error is not None:
                self._message_error(message, error)
                continue
            where = split_id(str(message.topic()), int(message.partition() or 0))
            grouped.setdefault(where, []).append(message)
        self.waiting.extend(grouped.items())

    def _message_error(self, message: Any, error: KafkaError) -> None:
        where = split_id(message.topic() or "?", message.partition() or 0)
        if (
            error.code() == KafkaError._AUTO_OFFSET_RESET
            or error.code() == KafkaError.OFFSET_OUT_OF_RANGE
        ):
            at = self.next.get(where)
            raise SourceError(
                f"source {self.context.name}: partition {where} has no record at offset {at} any "
                f"more (the broker's retention deleted it?): the records between the restored "
                f"checkpoint and the partition's beginning are lost to this job ({error.str()})"
            )
        if error.code() in (
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
        ):
            raise SourceError(f"source {self.context.name}: partition {where}: {error.str()}")
        if not error.retriable():
            raise SourceError(f"source {self.context.name}: reading {where} failed: {error.str()}")

    def _records(self, split: str, messages: list[Any]) -> ReadResult:
        decoded = [
            Message(
                m.topic(),
                m.partition(),
                m.offset(),
                m.key(),
                m.value(),
                m.timestamp()[1],
            )
            for m in messages
        ]
        batch, rejected = self.source.value.decode(decoded)
        for reject in rejected:
            self._reject(reject)
        if not len(batch):
            return Nothing(0.0)
        return Records(batch, split)

    def _reject(self, reject: Rejected) -> None:
        if self.context.rejected is None:
            raise SourceError(
                f"source {self.context.name}: a record does not decode, {reject.describe()} "
                "(read_kafka(on_error='dead_letter') keeps such records aside instead)"
            )
        self.context.rejected(reject.record(), reject.why)

    def _finish(self, split: str) -> ReadResult:
        topic, partition = parse_split(split)
        end = self.next.pop(split, None)
        if end is not None and self.source.group_id is not None:
            self.ended[split] = end
        self.waiting = deque((s, m) for s, m in self.waiting if s != split)
        if split in self.assigned:
            self.assigned.discard(split)
            self.consumer.incremental_unassign([TopicPartition(topic, partition)])
        return Finished(split)

    def caught_up(self) -> list[str]:
        """The partitions read to the end the client last heard of (their high watermark)."""
        done = []
        for split in self.assigned:
            at = self.next.get(split)
            try:
                _, high = self.consumer.get_watermark_offsets(
                    TopicPartition(*parse_split(split)), cached=True
                )
            except KafkaException:
                continue
            if high >= 0 and (at or 0) >= high and not any(s == split for s, _ in self.waiting):
                done.append(split)
        return done

    # ------------------------------------------------------------ checkpoints

    def positions_taken(self, checkpoint_id: int, positions: Mapping[str, Any]) -> None:
        if self.source.group_id is not None:  # (with the ends of those finished since)
            self.taken[checkpoint_id] = {**self.ended, **positions}
            self.ended = {}

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Publish the completed checkpoint's offsets to the consumer group (monitoring)."""
        positions = self.taken.pop(checkpoint_id, None)
        for older in [c for c in self.taken if c < checkpoint_id]:
            del self.taken[older]
        if positions is None:
            return
        offsets = [
            TopicPartition(*parse_split(split), int(offset))
            for split, offset in positions.items()
            if offset is not None
        ]
        if offsets:
            try:
                self.consumer.commit(offsets=offsets, asynchronous=True)
            except KafkaException as exc:  # (monitoring only: the job goes on)
                if self.context.warn is not None:
                    self.context.warn(
                        f"committing offsets to group {self.source.group_id!r} failed: {reason(exc)}"
                    )

    def close(self) -> None:
        self.consumer.close()

    # ----------------------------------------------------------------- errors

    def _on_error(self, error: KafkaError) -> None:
        """librdkafka's errors (on its threads): brokers down are retried by the client and
        told to the user once; an error it gives up on fails the subtask at its next read."""
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            if not self._warned_down and self.context.warn is not None:
                self._warned_down = True
                self.context.warn(
                    f"the Kafka brokers at {self.source.bootstrap_servers} do not answer: "
                    "reading waits for them"
                )
            return
        if error.fatal() or error.code() in (
            KafkaError._AUTHENTICATION,
            KafkaError.SASL_AUTHENTICATION_FAILED,
        ):
            with self._lock:
                self._errors.append(error.str())

    def _raise_errors(self) -> None:
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise SourceError(
                f"source {self.context.name}: the Kafka client at "
                f"{self.source.bootstrap_servers} failed: {'; '.join(errors)}"
            )


def kafka_source(
    topics: str | tuple[str, ...] | list[str],
    bootstrap_servers: str,
    *,
    value_format: str | Deserializer = "json",
    schema: pa.Schema | None = None,
    types: pa.Schema | None = None,
    key_format: str = "string",
    start: Any = "earliest",
    bounded: bool = False,
    group_id: str | None = None,
    config: Mapping[str, Any] | None = None,
    discovery_interval: float | None = 5.0,
) -> KafkaSource:
    """A :class:`KafkaSource` from ``env.read_kafka``'s arguments (``schema``: the whole
    value's; ``types``: those of some of a JSON value's fields, the others inferred)."""
    names = (topics,) if isinstance(topics, str) else tuple(topics)
    return KafkaSource(
        names,
        bootstrap_servers,
        ValueFormat(value_format, schema, key_format),
        start,
        bounded,
        group_id,
        dict(config or {}),
        discovery_interval,
        types=types,
    )
