"""The Kafka source's reader: one subtask's partitions, read by one consumer."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from cutline.connectors.kafka.metadata import (
    Brokers,
    consumer_config,
    offset_range,
    parse_split,
    reason,
    split_id,
)
from cutline.connectors.kafka.ranges import Reposition, honoured, reposition
from cutline.connectors.kafka.values import Message, Rejected, ValueFormat
from cutline.connectors.source import (
    Finished,
    Nothing,
    ReadResult,
    Records,
    SourceContext,
    SourceError,
    SplitReader,
)
from cutline.protocol.splits import Split


class Reading(Brokers, Protocol):
    """What a reader needs of its source (:class:`~cutline.connectors.kafka.KafkaSource` is
    one), beyond its brokers: how to decode, where partitions start and end, the group it
    publishes offsets to, what to do with a position no longer held."""

    @property
    def value(self) -> ValueFormat: ...
    @property
    def starts(self) -> Mapping[str, int] | None: ...
    @property
    def ends(self) -> Mapping[str, int] | None: ...
    @property
    def group_id(self) -> str | None: ...
    @property
    def on_offset_out_of_range(self) -> str: ...


RANGE_CHECK_INTERVAL = 1.0
"""Seconds between two looks at whether each partition still holds the position read from
(and a bounded one its end), from the offsets the client last heard of: no request, unless
one looks wrong (:mod:`cutline.connectors.kafka.ranges`)."""


class KafkaReader(SplitReader):
    """One subtask's partitions, read by one consumer with ``assign()`` (no group
    rebalancing: cutline decides who reads what)."""

    def __init__(self, source: Reading, context: SourceContext) -> None:
        self.source = source
        self.context = context
        self.consumer = Consumer(
            {**consumer_config(source, source.group_id), "error_cb": self._on_error}
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
        self.ends: dict[str, int] = dict(source.ends or {})
        """Bounded: where each partition ends (the end the brokers said when the job was
        built, or the lower one they say now, when the partition ends before it)."""
        self._check_at = 0.0
        self._said_past_end: set[str] = set()
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
        return self.ends.get(split)

    def position(self, split: str) -> Any:
        return self.next[split]

    def read(self, max_records: int) -> ReadResult:
        self._raise_errors()
        self._check_ranges()
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
            if len(kept) < len(messages):
                self._past_end(split, end, messages[-1].offset())
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
            if where not in self.next:  # (finished meanwhile)
                return
            low, high = offset_range(self.consumer, *parse_split(where))
            if not self._honour(where, low, high):
                raise SourceError(
                    f"source {self.context.name}: reading partition {where} from offset "
                    f"{self.next[where]} failed ({error.str()}), though the brokers say it "
                    f"holds offsets {low} to {high}"
                )
        if error.code() in (
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
        ):
            raise SourceError(f"source {self.context.name}: partition {where}: {error.str()}")
        if not error.retriable():
            raise SourceError(f"source {self.context.name}: reading {where} failed: {error.str()}")

    # ------------------------------------------------------------- offset ranges

    def _check_ranges(self) -> None:
        """Every :data:`RANGE_CHECK_INTERVAL`: whether each partition still holds the
        position read from (and a bounded one its end), as the client last heard; a doubt
        is put to the brokers (:meth:`_honour`)."""
        now = time.monotonic()
        if now < self._check_at:
            return
        self._check_at = now + RANGE_CHECK_INTERVAL
        for split in sorted(self.assigned):
            try:
                low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(*parse_split(split)), cached=True
                )
            except KafkaException:
                continue
            if high < 0:  # (not heard of yet)
                continue
            at, end = self.next.get(split), self.ends.get(split)
            gone = at is not None and (at > high or (low >= 0 and at < low))
            if gone or (end is not None and end > high):
                try:  # (the brokers' own word: what the client last heard may be old)
                    low, high = offset_range(self.consumer, *parse_split(split))
                except SourceError:
                    continue  # (they do not answer: looked at again later)
                self._honour(split, low, high)

    def _honour(self, split: str, low: int, high: int) -> bool:
        """``split`` holds offsets ``low`` to ``high``: a position it no longer holds is failed
        on or moved, as ``on_offset_out_of_range`` says, and a bounded end past its end
        lowered to it, with a warning. Whether either was needed."""
        topic, partition = parse_split(split)
        at, changed = self.next.get(split), False
        if at is not None and not honoured(at, low, high):
            policy = self.source.on_offset_out_of_range
            self._move(reposition(self.context.name, split, at, low, high, policy))
            at, changed = self.next[split], True
        end = self.ends.get(split)
        if end is not None and end > high:
            self.ends[split] = max(high, at if at is not None else low)
            self._tell(
                f"the bounded read of topic {topic!r} partition {partition} was to end at offset "
                f"{end}, where the partition ended when the job was built, but it ends at "
                f"{high} now (the topic deleted and made again, or the partition truncated): "
                f"the read ends at {self.ends[split]}"
            )
            if (at if at is not None else low) >= self.ends[split]:
                self.finished.append(split)
            changed = True
        return changed

    def _move(self, move: Reposition) -> None:
        """Read ``move.split`` on from ``move.offset``, reporting what that skips."""
        topic, partition = parse_split(move.split)
        self.waiting = deque((s, m) for s, m in self.waiting if s != move.split)
        if move.split in self.assigned:
            self.consumer.incremental_unassign([TopicPartition(topic, partition)])
        self.consumer.incremental_assign([TopicPartition(topic, partition, move.offset)])
        self.assigned.add(move.split)
        self.next[move.split] = move.offset
        if self.context.skipped is not None:
            self.context.skipped(move.split, move.skipped, move.why)
        else:
            self._tell(f"{move.why}: {move.skipped:,} records skipped")

    def _past_end(self, split: str, end: int, seen: int) -> None:
        """A bounded partition holds records past the end it reads to: said once."""
        if split in self._said_past_end:
            return
        self._said_past_end.add(split)
        topic, partition = parse_split(split)
        self._tell(
            f"the bounded read of topic {topic!r} partition {partition} ends at offset {end}, "
            f"where the brokers said the partition ended when the job was built, but it holds "
            f"records past it (offset {seen} at least), which are not read: records written "
            "after the job was built, or a broker that said its end short (Tansu, the broker "
            "of cutline.examples.servers, does after a produce batch of several records)"
        )

    def _tell(self, message: str) -> None:
        if self.context.warn is not None:
            self.context.warn(f"source {self.context.name}: {message}")

    def _records(self, split: str, messages: list[Any]) -> ReadResult:
        decoded = [
            Message(
                m.topic(),
                m.partition(),
                m.offset(),
                m.key(),
                m.value(),
                m.timestamp()[1],
                m.headers(),
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
                "(read_kafka(on_error='dead_letter') keeps such records aside instead)",
                record=reject.record(),
            )
        self.context.rejected(reject.record(), reject.why)

    def _finish(self, split: str) -> ReadResult:
        topic, partition = parse_split(split)
        end = self.ends.get(split)
        if end is not None and split in self.assigned:
            with contextlib.suppress(KafkaException):  # (what the client last heard)
                _, high = self.consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), cached=True
                )
                if high > end:
                    self._past_end(split, end, high - 1)
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
