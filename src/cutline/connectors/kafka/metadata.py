"""What the Kafka brokers say, for the source: topics (named, or those a pattern matches) and
their partitions, offsets, a sample of values; the partitions of a source as this process last
listed them; the checks of ``start=``. Every look-up has a deadline (:data:`METADATA_TIMEOUT`)."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
import threading
import time
import zlib
from collections.abc import Mapping
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from cutline.connectors.source import SourceError
from cutline.protocol.splits import Split


class Brokers(Protocol):
    """What the look-ups need of a Kafka source (:class:`~cutline.connectors.kafka.KafkaSource`
    is one): where its brokers are, how to reach them, and which topics it reads."""

    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def config(self) -> Mapping[str, Any]: ...
    @property
    def topics(self) -> tuple[str, ...]: ...
    @property
    def pattern(self) -> re.Pattern[str] | None: ...
    @property
    def start(self) -> Any: ...


LOG = logging.getLogger("cutline.connectors.kafka")
"""Where librdkafka's own log lines go (every client of the connector is given it), each
problem once (:class:`OncePerProblem`)."""
METADATA_TIMEOUT = 10.0
"""Seconds a look-up of the brokers' metadata (topics, partitions, offsets) may take."""
SAMPLE = 500
"""At most this many records are read on the driver to infer a JSON value's schema."""


REPEAT_EVERY = 300.0
"""Seconds after which a problem librdkafka goes on saying is let through again."""


class OncePerProblem(logging.Filter):
    """librdkafka says a problem again at every retry: a broker that is down, a line every
    few hundred milliseconds per client. This lets the first line of each problem through,
    and another every :data:`REPEAT_EVERY` seconds while it goes on, with how many were held
    back; a problem is its line without numbers and without the client's name."""

    def __init__(self) -> None:
        super().__init__()
        self.said: dict[str, tuple[float, int]] = {}
        """Problem -> when it was last let through, and the lines held back since."""
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 3:  # (facility, client, text)
            problem = f"{args[0]} {re.sub(r'[0-9]+', '#', str(args[2]))}"
        else:
            problem = re.sub(r"[0-9]+", "#", record.getMessage())
        now = time.monotonic()
        with self.lock:
            said, held = self.said.get(problem, (-REPEAT_EVERY, 0))
            if now - said < REPEAT_EVERY:
                self.said[problem] = (said, held + 1)
                return False
            if len(self.said) > 1000:
                self.said.clear()
            self.said[problem] = (now, 0)
        if held:
            record.msg = f"{record.msg} (said {held} times more in the last %.0f s)"
            record.args = (*(args if isinstance(args, tuple) else ()), now - said)
        return True


LOG.addFilter(OncePerProblem())


def split_id(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def parse_split(split: str) -> tuple[str, int]:
    topic, _, partition = split.rpartition("/")
    return topic, int(partition)


DOWN_FOR = 2.0
"""Seconds a look-up goes on while every broker refuses connections (none listens there)
before it fails, rather than wait its whole :data:`METADATA_TIMEOUT`."""


class MetadataConsumer(Consumer):
    """A consumer for metadata look-ups, which hears the client's errors: so that a look-up
    fails as soon as it is clear that no broker is there (:meth:`topic`)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.down_since: float | None = None
        super().__init__({**config, "error_cb": self._error})

    def _error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self.down_since = self.down_since or time.monotonic()

    def topic(self, name: str | None, where: str) -> Any:
        """The brokers' metadata of topic ``name`` (``None``: of every topic); a
        :class:`SourceError` once the look-up took :data:`METADATA_TIMEOUT`, or every broker
        refused connections for :data:`DOWN_FOR`."""
        deadline = time.monotonic() + METADATA_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            try:
                return self.list_topics(name, timeout=max(0.01, min(0.5, left)))
            except KafkaException as exc:
                self.poll(0)  # (hears the client's errors)
                down = self.down_since is not None and time.monotonic() - self.down_since
                if left <= 0.5 or (down and down >= DOWN_FOR):
                    what = f"topic {name!r}" if name is not None else "its topics"
                    if down:
                        why = "no broker answers there (connection refused, or none listens)"
                    else:
                        why = reason(exc)
                    raise SourceError(
                        f"cannot reach the Kafka brokers at {where} to read {what}: {why}"
                    ) from None


def client(source: Brokers) -> contextlib.closing[MetadataConsumer]:
    """A consumer for metadata look-ups, closed after use."""
    return contextlib.closing(MetadataConsumer(consumer_config(source, group=None)))


def consumer_config(source: Brokers, group: str | None) -> dict[str, Any]:
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


def topic_partitions(
    consumer: MetadataConsumer, source: Brokers, *, check: bool
) -> list[tuple[str, int]]:
    """Every partition of the source's topics (named, or matching its pattern now); with
    ``check``, a :class:`SourceError` naming a topic that does not exist or brokers that
    cannot be reached."""
    if source.pattern is not None:
        return pattern_partitions(consumer, source)
    where = source.bootstrap_servers
    found: list[tuple[str, int]] = []
    for topic in source.topics:
        entry = consumer.topic(topic, where).topics.get(topic)
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
                f"topic {topic!r} does not exist on the Kafka brokers at {where}" + others(consumer)
            )
        found += [(topic, p) for p in sorted(entry.partitions)]
    return found


def pattern_partitions(consumer: Consumer, source: Brokers) -> list[tuple[str, int]]:
    """The partitions of the topics whose whole name the source's pattern matches (as Java's
    ``Pattern.matches``, which Flink's ``setTopicPattern`` uses), but Kafka's internal ones
    (``__consumer_offsets``...)."""
    assert source.pattern is not None
    try:
        metadata = consumer.list_topics(timeout=METADATA_TIMEOUT)
    except KafkaException as exc:
        raise SourceError(
            f"cannot reach the Kafka brokers at {source.bootstrap_servers} to list the topics "
            f"matching {source.pattern.pattern!r}: {reason(exc)}"
        ) from None
    found: list[tuple[str, int]] = []
    for topic, entry in sorted(metadata.topics.items()):
        if topic.startswith("__") or not source.pattern.fullmatch(topic):
            continue
        if entry.error is None and entry.partitions:
            found += [(topic, p) for p in sorted(entry.partitions)]
    return found


def others(consumer: Consumer) -> str:
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


def offset_range(consumer: Consumer, topic: str, partition: int) -> tuple[int, int]:
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=METADATA_TIMEOUT
        )
    except KafkaException as exc:
        raise SourceError(
            f"cannot read the offsets of {split_id(topic, partition)}: {reason(exc)}"
        ) from None
    return int(low), int(high)


def resolve_start(
    consumer: Consumer, source: Brokers, partitions: list[tuple[str, int]]
) -> dict[str, int]:
    """Where each partition starts, as offsets (``"earliest"``: none given: its beginning)."""
    start = source.start
    if start == "earliest":
        return {}
    if start == "latest":
        return {split_id(t, p): offset_range(consumer, t, p)[1] for t, p in partitions}
    if isinstance(start, Mapping):
        offsets: dict[str, int] = {}
        known = {split_id(t, p) for t, p in partitions}
        for key, offset in start.items():
            if isinstance(key, int):
                if len(source.topics) != 1 or source.pattern is not None:
                    raise SourceError(
                        f"start={{{key}: {offset}}}: with several topics or a pattern, name the partition "
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
            offset = offset_range(consumer, tp.topic, tp.partition)[1]
        offsets[split_id(tp.topic, tp.partition)] = int(offset)
    return offsets


def sample_values(
    consumer: Consumer, partitions: list[tuple[str, int]], starts: Mapping[str, int]
) -> list[bytes]:
    """Up to :data:`SAMPLE` values from where the partitions start (at most a few seconds)."""
    assigned = [
        TopicPartition(t, p, starts.get(split_id(t, p), OFFSET_BEGINNING)) for t, p in partitions
    ]
    ends = {}
    for t, p in partitions:
        low, high = offset_range(consumer, t, p)
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


# ------------------------------------------------------------------ listings


class _Listing:
    """The partitions of one source's topics as this process last listed them."""

    def __init__(self) -> None:
        self.partitions: list[tuple[str, int]] | None = None
        self.refreshing: threading.Thread | None = None
        self.lock = threading.Lock()

    def get(self, source: Brokers) -> list[tuple[str, int]]:
        with self.lock:
            known = self.partitions
            if known is not None:
                if self.refreshing is None or not self.refreshing.is_alive():
                    self.refreshing = threading.Thread(
                        target=self._refresh, args=(source,), daemon=True
                    )
                    self.refreshing.start()
                return known
        found = list_partitions(source)  # (the first time: now)
        with self.lock:
            self.partitions = more_partitions(self.partitions, found)
            return self.partitions

    def _refresh(self, source: Brokers) -> None:
        try:
            found = list_partitions(source)
        except SourceError:
            return  # (the brokers do not answer: the partitions known stay)
        with self.lock:
            self.partitions = more_partitions(self.partitions, found)


def list_partitions(source: Brokers) -> list[tuple[str, int]]:
    with client(source) as consumer:
        return topic_partitions(consumer, source, check=False)


def more_partitions(
    known: list[tuple[str, int]] | None, found: list[tuple[str, int]]
) -> list[tuple[str, int]]:
    """Partitions are never removed from a topic: a listing adds to what is known."""
    return sorted(set(known or ()) | set(found))


_LISTINGS: dict[tuple[Any, ...], _Listing] = {}
_LISTINGS_LOCK = threading.Lock()


def partition_split(topic: str, partition: int) -> Split:
    return Split(split_id(topic, partition), zlib.crc32(topic.encode()) + partition)


def listed_partitions(source: Brokers) -> list[tuple[str, int]]:
    """The partitions of ``source``'s topics as this process last listed them (the first
    time: now), listed again meanwhile on a thread of its own."""
    pattern = None if source.pattern is None else (source.pattern.pattern, source.pattern.flags)
    config = tuple(sorted(map(str, source.config.items())))
    key = (source.bootstrap_servers, source.topics, pattern, config)
    with _LISTINGS_LOCK:
        listing = _LISTINGS.setdefault(key, _Listing())
    return listing.get(source)


def check_start(start: Any) -> None:
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
