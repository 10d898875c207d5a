"""Kafka positions a partition no longer holds, against a real broker (Tansu on loopback): the
job never reads on past them silently. It fails naming the topic, the partition and both
offsets, or reads on where ``on_offset_out_of_range`` says, the records it skips counted and
told; a bounded read whose partitions hold records past their ends, or end before them, says
so.

Tansu keeps its topics in memory: a restart of the broker loses them, and the topic made again
ends before the offsets a checkpoint holds (the user's report: the job read the new partitions
but never those whose saved offsets were past their new ends, without a word). Every fault is
made by construction: at a checkpoint the job's listener heard of, or while no job runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st
from test_kafka import (
    Feeder,
    Row,
    click,
    environment,
    positions,
    published,
    put,
    run,
    running_sums,
)
from test_savepoints import endpoints_of

from cutline import FixedDelay, JobFailedError, SourceError
from cutline.connectors.kafka import KafkaSource
from cutline.connectors.kafka import metadata as kafka_metadata
from cutline.connectors.kafka import reader as kafka_reader
from cutline.connectors.kafka.ranges import honoured, reposition
from cutline.connectors.source import SourceContext
from cutline.examples.servers import KafkaBroker, free_port
from cutline.protocol.splits import Split

pytestmark = pytest.mark.connectors


class Heard:
    """A listener that keeps what the job said, and passes it on to ``then`` once it heard
    ``skips`` records skipped (the records that come later cannot be among them)."""

    def __init__(self, then: Any = None, skips: int = 0) -> None:
        self.then, self.skips = then, skips
        self.said: list[tuple[str, str]] = []

    def __call__(self, kind: str, message: str) -> None:
        self.said.append((kind, message))
        if self.then is not None and len(self.of("skipped")) >= self.skips:
            self.then(kind, message)

    def of(self, kind: str) -> list[str]:
        return [message for k, message in self.said if k == kind]


def summing(tmp_path: Path, broker: KafkaBroker, ck: str, out: str, **options: Any) -> Any:
    env = environment(tmp_path, 2, checkpoint_dir=tmp_path / ck, restart_strategy=FixedDelay(0))
    env.read_kafka(
        "clicks",
        bootstrap_servers=broker.bootstrap_servers,
        schema={"user": "string", "amount": "int64"},
        discovery_interval="20ms",
        name="clicks",
        **options,
    ).key_by("user").sum("amount", name="sums").write_parquet(tmp_path / out, name="out")
    return env


def first_run(
    tmp_path: Path, broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch, rows: list[Row]
) -> str:
    """A job reads ``rows`` (30 a checkpoint) from topic ``clicks`` of 2 partitions and stops
    with a savepoint holding each partition's end: its folder."""
    broker.create_topic("clicks", 2)
    chunks = [rows[i : i + 30] for i in range(0, len(rows), 30)]
    ends = {f"clicks/{p}": 0 for p in range(2)}
    feeder = Feeder(
        broker, "clicks", chunks[1:], 2, tmp_path / "ck1", endpoints_of(monkeypatch), ends
    )
    feeder.feed(chunks[0])
    run(summing(tmp_path, broker, "ck1", "out1"), listener=feeder)
    return feeder.savepoint()


def made_again(broker: KafkaBroker, rows: list[Row]) -> None:
    """The broker restarts (Tansu loses its topics) and topic ``clicks`` is made again, with
    ``rows``: its partitions end before the offsets the job reached."""
    broker.restart()
    broker.create_topic("clicks", 2)
    put(broker, "clicks", rows, 2)


def test_a_restore_past_the_end_of_a_partition_made_again_fails_naming_both_offsets(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [click(i, users=4) for i in range(120)]
    savepoint = first_run(tmp_path, kafka_broker, monkeypatch, rows)
    made_again(kafka_broker, [click(i, users=4) for i in range(1000, 1020)])
    with pytest.raises(JobFailedError) as failed:
        run(summing(tmp_path, kafka_broker, "ck2", "out2"), restore_from=savepoint)
    message = str(failed.value)
    assert "topic 'clicks' partition " in message
    assert "ends at offset 10 now, before the position 60" in message
    assert "on_offset_out_of_range='earliest'" in message
    assert not published(tmp_path / "out2")


@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_a_policy_reads_on_from_where_it_says_and_counts_what_it_skips(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """Restored past the ends of a topic made again: ``"earliest"`` reads the new records
    (none skipped), ``"latest"`` skips them (20, counted); either way the job says so, once a
    partition, in its listener and its result."""
    rows = [click(i, users=4) for i in range(120)]
    savepoint = first_run(tmp_path, kafka_broker, monkeypatch, rows)
    again = [click(i, users=4) for i in range(1000, 1020)]
    made_again(kafka_broker, again)
    later = [click(i, users=4) for i in range(2000, 2030)]
    ends = {f"clicks/{p}": 10 for p in range(2)}
    feeder = Feeder(
        kafka_broker, "clicks", [later], 2, tmp_path / "ck2", endpoints_of(monkeypatch), ends
    )
    heard = Heard(feeder, skips=2)
    job = summing(tmp_path, kafka_broker, "ck2", "out2", on_offset_out_of_range=policy)
    result = run(job, listener=heard, restore_from=savepoint)
    feeder.savepoint()
    skips = heard.of("skipped")
    assert len(skips) == 2, skips
    for p in range(2):
        (said,) = [s for s in skips if f"of clicks/{p} skipped" in s]
        assert f"partition {p} ends at offset 10 now, before the position 60" in said
    read_again = again if policy == "earliest" else []
    assert published(tmp_path / "out2") == running_sums(rows + read_again + later) - running_sums(
        rows
    )
    skipped = 0 if policy == "earliest" else 20
    assert result.metrics.skipped == {"clicks": skipped}
    assert result.summary().skipped == {"clicks": skipped}
    assert f"{skipped} records skipped (clicks {skipped})" in repr(result)


def test_a_topic_made_again_while_the_job_runs_fails_it_naming_the_partition(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """The topic is lost and made again with fewer records while the job runs (at a
    checkpoint, by construction): the readers find their positions past its new ends."""
    kafka_broker.create_topic("clicks", 2)
    put(kafka_broker, "clicks", [click(i) for i in range(60)], 2)
    done: list[int] = []

    def listener(kind: str, message: str) -> None:
        checkpoint = int(message.split()[0]) if kind == "checkpoint" else None
        if checkpoint is None or done:
            return
        if positions(tmp_path / "ck", checkpoint, "clicks") == {"clicks/0": 30, "clicks/1": 30}:
            done.append(checkpoint)  # (every record read: the topic is lost, made again)
            made_again(kafka_broker, [click(i) for i in range(1000, 1004)])

    with pytest.raises(JobFailedError) as failed:
        run(summing(tmp_path, kafka_broker, "ck", "out"), listener=listener)
    assert "ends at offset 2 now, before the position 30" in str(failed.value)


@dataclass(frozen=True)
class Ending(KafkaSource):
    """A bounded source whose ends are ``by`` past (or, negative, before) those the broker
    said when the job was built."""

    by: int = 0

    def prepare(self) -> tuple[KafkaSource, list[str]]:
        prepared, notes = super().prepare()
        assert prepared.ends is not None
        ends = {split: end + self.by for split, end in prepared.ends.items()}
        return replace(prepared, ends=ends), notes


@pytest.mark.parametrize("by", [-3, 5])
def test_a_bounded_read_says_so_when_its_ends_are_not_the_partitions(
    kafka_broker: KafkaBroker, tmp_path: Path, by: int
) -> None:
    """Ends short of what the partitions hold (a broker that said them short, as Tansu does
    after a batched produce): the records past them are not read, and the job says so per
    partition. Ends past what they hold (the partitions ended before them): the read ends
    at the partitions' ends, with a warning, rather than wait for ever."""
    kafka_broker.create_topic("clicks", 2)
    rows = [click(i) for i in range(40)]
    put(kafka_broker, "clicks", rows, 2)
    env = environment(tmp_path, 2)
    source = Ending(("clicks",), kafka_broker.bootstrap_servers, bounded=True, by=by)
    env.from_source(source, name="clicks").collect()
    heard = Heard()
    out = run(env, listener=heard).output
    assert sorted(r["amount"] for r in out) == sorted(
        r["amount"] for i, r in enumerate(rows) if i // 2 < 20 + min(by, 0)
    )
    warnings = heard.of("warning")
    for p in range(2):
        if by < 0:
            said = [w for w in warnings if f"partition {p} ends at offset 17," in w]
            assert said and "holds records past it" in said[0], warnings
        else:
            said = [w for w in warnings if f"partition {p} was to end at offset 25" in w]
            assert said and "but it ends at 20 now" in said[0], warnings


class Retained:
    """A consumer whose partitions start at offset 5, as the client hears (a stand-in for
    retention, which Tansu does not do); the rest is the real consumer's."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer

    def get_watermark_offsets(self, tp: TopicPartition, **options: Any) -> tuple[int, int]:
        return 5, 10

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


def test_a_position_below_the_partitions_start_fails_naming_the_records_lost(
    kafka_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader restored at offset 2 of a partition that now starts at 5 (its first records
    deleted by retention: Tansu keeps every record, so the brokers' answer is played here);
    the client's own view of the partition is the real one."""
    kafka_broker.create_topic("clicks", 1)
    put(kafka_broker, "clicks", [click(i) for i in range(10)], 1)
    monkeypatch.setattr(kafka_reader, "offset_range", lambda consumer, t, p: (5, 10))
    source = KafkaSource(("clicks",), kafka_broker.bootstrap_servers, discovery_interval=None)
    reader = kafka_reader.KafkaReader(source, SourceContext("clicks", 0, 1))
    reader.consumer = Retained(reader.consumer)  # type: ignore[assignment]
    try:
        reader.add_split(Split("clicks/0", 0), 2)
        with pytest.raises(SourceError) as failed:
            for _ in range(1000):
                reader.read(100)
    finally:
        reader.close()
    assert "topic 'clicks' partition 0 starts at offset 5 now, after the position 2" in str(
        failed.value
    )
    assert "the 3 records at offsets 2 to 4 were deleted" in str(failed.value)


# --------------------------------------------------------------- the rule, alone

offsets = st.integers(0, 10**6)


@given(at=offsets, low=offsets, span=offsets, policy=st.sampled_from(["earliest", "latest"]))
def test_a_reposition_lands_in_the_range_and_counts_what_it_skips(
    at: int, low: int, span: int, policy: str
) -> None:
    high = low + span
    if honoured(at, low, high):
        return
    move = reposition("s", "t/0", at, low, high, policy)
    assert honoured(move.offset, low, high)
    assert move.offset == (low if policy == "earliest" else high)
    never_read = set(range(at, low)) if at < low else set()  # (deleted before being read)
    if policy == "latest":  # (and those it held that it reads past)
        never_read |= set(range(max(at, low) if at < low else low, high))
    assert move.skipped == len(never_read)
    assert str(at) in move.why and (str(low) if at < low else str(high)) in move.why


@given(at=offsets, low=offsets, span=offsets)
def test_fail_names_the_topic_the_partition_and_both_offsets(at: int, low: int, span: int) -> None:
    high = low + span
    if honoured(at, low, high):
        return
    with pytest.raises(SourceError) as failed:
        reposition("clicks", "t/3", at, low, high, "fail")
    text = str(failed.value)
    assert "source clicks: topic 't' partition 3" in text
    assert f"position {at} " in text and f"offset {low if at < low else high} " in text


# ------------------------------------------------------- no broker: one clear line


def test_no_broker_is_said_once_and_fails_the_build_without_waiting_it_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With nothing listening at ``bootstrap_servers``, librdkafka says "connection refused"
    at every retry (a user counted 194 lines): its log holds that problem once, and the
    build fails saying no broker answers, before the look-up's whole deadline."""
    env = environment(tmp_path)
    for once in kafka_metadata.LOG.filters:  # (what this process said before: said again)
        if isinstance(once, kafka_metadata.OncePerProblem):
            once.said.clear()
    caplog.set_level(logging.DEBUG, logger="cutline.connectors.kafka")
    with pytest.raises(SourceError, match="no broker answers there") as failed:
        env.read_kafka("clicks", bootstrap_servers=f"127.0.0.1:{free_port()}")
    assert "cannot reach the Kafka brokers at 127.0.0.1:" in str(failed.value)
    refused = [r for r in caplog.records if "Connection refused" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in caplog.records]


def test_a_problem_is_let_through_once_then_again_with_what_was_held_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(kafka_metadata.time, "monotonic", lambda: now[0])
    once = kafka_metadata.OncePerProblem()

    def line(port: int, after: int) -> logging.LogRecord:
        text = f"127.0.0.1:{port}/bootstrap: Connect failed: refused (after {after}ms)"
        return logging.LogRecord("k", 30, "", 0, "%s [%s] %s", ("FAIL", "rdkafka#c-1", text), None)

    assert once.filter(line(9092, 0))
    assert not any(once.filter(line(9092, after)) for after in range(1, 100))
    assert once.filter(
        logging.LogRecord("k", 30, "", 0, "%s [%s] %s", ("REQTMOUT", "c", "x"), None)
    )
    now[0] += kafka_metadata.REPEAT_EVERY
    again = line(9092, 7)
    assert once.filter(again)
    assert again.getMessage().endswith("(said 99 times more in the last 300 s)")
