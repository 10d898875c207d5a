"""Kafka records beyond their value, against a real broker (Tansu, started by the test on
loopback), in real jobs (slots as threads): headers read as ``_headers`` and written from a
column or as constants; tombstones (null values) read as records with ``_tombstone`` true and
written for records marked as deletes, so that a compacted changelog topic is read and written
exactly as it is; record timestamps written from a field; topics by pattern, with a topic
created while the job runs (after a checkpoint completed, by construction) found and read from
its beginning; and clear errors for what cannot be sent.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_kafka import FailOnce, environment, positions, published, read_topic, run, running_sums
from test_savepoints import StopWithSavepoint, endpoints_of

from cutline import FixedDelay, JobFailedError, KeyedProcessFunction, SourceError
from cutline.examples.servers import KafkaBroker, produce
from cutline.runtime.driver.client import JobEndpoint
from cutline.runtime.io.formats import InputWarning
from cutline.runtime.keyed_operators import ProcessContext

pytestmark = pytest.mark.connectors

Row = dict[str, Any]
BASE = 1_700_000_000_000
"""The records' timestamps: BASE + their number, in milliseconds."""
ONE_A_BATCH = {"batch.num.messages": 1}
"""``write_kafka``'s producer settings when a test reads the topic back: one record a batch, as
Tansu's high watermarks are wrong after a batch of several records (``produce``'s note)."""


def changes(n: int = 90, accounts: int = 7) -> list[Row]:
    """A changelog: event i sets account ``a{i % accounts}``'s amount to i; every third event
    of an account after its first deletes it (a tombstone), and the event after sets it
    again. Each event has a header ``seq`` (its number) and, if even, a second one
    ``parity`` with no value."""
    events: list[Row] = []
    for i in range(n):
        k = i % accounts
        nth = i // accounts
        headers = [("seq", str(i).encode())] + ([("parity", None)] if i % 2 == 0 else [])
        deleted = nth % 3 == 2
        events.append(
            {
                "key": f"a{k}",
                "amount": None if deleted else i,
                "deleted": deleted,
                "headers": headers,
                "at": BASE + i,
                "partition": k % 3,
            }
        )
    return events


def put_changes(broker: KafkaBroker, topic: str, events: list[Row]) -> dict[int, list[Row]]:
    """The events into ``topic`` (3 partitions, account k's in partition k % 3, keyed by the
    account); returns each partition's events in offset order."""
    broker.create_topic(topic, 3)
    by_partition: dict[int, list[Row]] = {}
    for p in range(3):
        mine = by_partition[p] = [e for e in events if e["partition"] == p]
        produce(
            broker,
            topic,
            [
                (e["key"], None if e["deleted"] else json.dumps({"amount": e["amount"]}))
                for e in mine
            ],
            partition=p,
            timestamps=[e["at"] for e in mine],
            headers=[e["headers"] for e in mine],
        )
    return by_partition


def as_read(headers: list[tuple[str, bytes | None]]) -> list[Row]:
    return [{"key": k, "value": v} for k, v in headers]


@pytest.mark.parametrize("value_format", ["json", "schema", "raw", "deserializer"])
def test_headers_and_tombstones_are_read_as_records(
    kafka_broker: KafkaBroker, tmp_path: Path, value_format: str
) -> None:
    """Every record, a tombstone too, with its headers (in order, a null value kept) and its
    timestamp: a JSON value's fields (inferred, or of a schema) or a deserializer's are null
    in a tombstone, and ``_tombstone`` says which it is; a raw ``value`` is null."""
    events = changes(30)
    by_partition = put_changes(kafka_broker, "changes", events)
    env = environment(tmp_path)
    options: dict[str, Any] = {
        "json": {},
        "schema": {"schema": pa.schema([("amount", pa.int64())])},
        "raw": {"value_format": "raw"},
        "deserializer": {"value_format": amounts},
    }[value_format]
    env.read_kafka(
        "changes", bootstrap_servers=kafka_broker.bootstrap_servers, bounded=True, **options
    ).collect()
    out = sorted(run(env).output, key=lambda r: (r["_partition"], r["_offset"]))
    expected = []
    for p, mine in by_partition.items():
        for offset, e in enumerate(mine):
            row: Row = {
                "_key": e["key"],
                "_partition": p,
                "_offset": offset,
                "_timestamp": dt.datetime.fromtimestamp(e["at"] / 1000, dt.UTC),
                "_headers": as_read(e["headers"]),
                "_tombstone": e["deleted"],
            }
            if value_format == "raw":
                value = None if e["deleted"] else json.dumps({"amount": e["amount"]}).encode()
                row["value"] = value
            elif value_format != "deserializer" or not e["deleted"]:
                row["amount"] = e["amount"]  # (a deserializer's tombstone: Kafka's fields only)
            expected.append(row)
    assert out == expected
    assert sum(r["_tombstone"] for r in out) == sum(e["deleted"] for e in events) > 0


def amounts(value: bytes) -> Row:
    return {"amount": json.loads(value)["amount"]}


class Table(KeyedProcessFunction):
    """A table of the changelog: per key, its amount (value state), cleared by a tombstone;
    emits each change with the amount it replaced."""

    def open(self, ctx: ProcessContext) -> None:
        self.amount = ctx.value_state("amount")

    def process(self, record: Row, ctx: ProcessContext) -> list[Row]:
        previous = self.amount.get()
        if record["_tombstone"]:
            self.amount.clear()
        else:
            self.amount.update(record["amount"])
        return [
            {
                "key": ctx.key,
                "amount": record["amount"],
                "previous": previous,
                "deleted": record["_tombstone"],
                "headers": record["_headers"],
                "at": record["_timestamp"],
            }
        ]


def table_changes(events: list[Row]) -> Counter[tuple[Any, ...]]:
    table: dict[str, int] = {}
    out: Counter[tuple[Any, ...]] = Counter()
    for e in events:
        previous = table.pop(e["key"], None) if e["deleted"] else table.get(e["key"])
        if not e["deleted"]:
            table[e["key"]] = e["amount"]
        out[(e["key"], e["amount"], previous, e["deleted"])] += 1
    return out


def test_a_compacted_changelog_through_a_failure_and_back_into_a_topic(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A changelog of upserts and deletes read into a keyed table (a failure injected once,
    part-way): every change once, each with the amount it replaced (a delete leaves none);
    the changes written to a compacted-style topic keyed by account, a delete as a tombstone,
    with the headers and timestamps they were read with. The topic's latest record per key
    is the table (the sink is at least once: after the failure some changes come twice, in
    their order)."""
    events = changes(90)
    put_changes(kafka_broker, "accounts", events)
    kafka_broker.create_topic("latest", 2)
    env = environment(tmp_path, batch_size=8)
    table = (
        env.read_kafka(
            "accounts",
            bootstrap_servers=kafka_broker.bootstrap_servers,
            bounded=True,
            schema={"amount": "int64"},
        )
        .map(FailOnce(45, str(tmp_path / "failed")), name="fail_once")
        .key_by("_key")
        .process(Table(), name="table")
    )
    table.collect()
    table.write_kafka(
        "latest",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        key="key",
        delete="deleted",
        headers="headers",
        timestamp="at",
        config=ONE_A_BATCH,
    )
    result = run(env)
    assert len(result.restarts) == 1
    assert Counter(
        (r["key"], r["amount"], r["previous"], r["deleted"]) for r in result.output
    ) == table_changes(events)
    written = read_topic(kafka_broker, "latest", 2)
    sent = {int(dict(m.headers())["seq"]): m for m in written}
    assert set(sent) == set(range(90))  # (every change, some twice)
    for i, message in sent.items():
        e = events[i]
        assert message.key() == e["key"].encode()
        assert message.timestamp()[1] == e["at"]
        assert message.headers() == e["headers"]
        if e["deleted"]:
            assert message.value() is None
        else:  # (the JSON value: every field but the headers' and delete='s)
            value = json.loads(message.value())
            assert value == {
                "key": e["key"],
                "amount": e["amount"],
                "previous": value["previous"],
                "at": dt.datetime.fromtimestamp(e["at"] / 1000, dt.UTC).isoformat(),
            }
    latest: dict[str, int | None] = {}
    for m in sorted(written, key=lambda m: (m.partition(), m.offset())):
        latest[m.key().decode()] = None if m.value() is None else json.loads(m.value())["amount"]
    final: dict[str, int] = {}
    for e in events:
        if e["deleted"]:
            final.pop(e["key"], None)
        else:
            final[e["key"]] = e["amount"]
    assert {k: v for k, v in latest.items() if v is not None} == final
    assert {k for k, v in latest.items() if v is None} == {e["key"] for e in events} - set(final)


def test_constant_headers_and_epoch_millisecond_timestamps(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    kafka_broker.create_topic("out", 1)
    env = environment(tmp_path, parallelism=1)
    env.from_sequence(0, 5).map(lambda r: {"n": r["value"], "ms": BASE + r["value"]}).write_kafka(
        "out",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        headers={"source": "cutline", "empty": None},
        timestamp="ms",
        config=ONE_A_BATCH,
    )
    run(env)
    written = read_topic(kafka_broker, "out", 1)
    assert [(json.loads(m.value())["n"], m.timestamp()[1]) for m in written] == [
        (n, BASE + n) for n in range(5)
    ]
    assert all(m.headers() == [("source", b"cutline"), ("empty", None)] for m in written)


def test_what_write_kafka_cannot_send_is_an_error(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    kafka_broker.create_topic("out", 1)
    broker = kafka_broker.bootstrap_servers
    env = environment(tmp_path, parallelism=1)
    numbers = env.from_sequence(0, 5)
    with pytest.raises(ValueError, match=r"delete='gone' needs key=: a tombstone deletes its key"):
        numbers.write_kafka("out", bootstrap_servers=broker, delete="gone")
    with pytest.raises(
        ValueError, match=r"write_kafka\(out\): timestamp=: the records have no column 'at'"
    ):
        numbers.write_kafka("out", bootstrap_servers=broker, timestamp="at")
    with pytest.raises(
        ValueError, match=r"headers= has a header that is not a key and a value: 'text'"
    ):
        numbers.write_kafka("out", bootstrap_servers=broker, headers=["text"])  # type: ignore[list-item]
    cases = {
        "a record's field 'at' \\(timestamp=\\) is 'soon', not a time after 1970": (
            {"k": "a", "at": "soon"},
            {"timestamp": "at"},
        ),
        "a record to delete \\('gone' is true\\) has a null key \\('k'\\)": (
            {"k": None, "gone": True},
            {"key": "k", "delete": "gone"},
        ),
        "a record's field 'h' \\(headers=\\) has a header whose key is not text: 1": (
            {"h": [(1, b"x")]},
            {"headers": "h"},
        ),
    }
    for i, (message, (record, options)) in enumerate(cases.items()):
        env = environment(
            tmp_path, 1, checkpoint_dir=tmp_path / f"ck{i}", restart_strategy=FixedDelay(0)
        )
        env.from_sequence(0, 1).map(lambda r, record=record: record).write_kafka(
            "out", bootstrap_servers=broker, **options
        )
        with pytest.raises(JobFailedError, match=message):
            run(env)


# ------------------------------------------------------------------------- patterns


def clicks(prefix: str, n: int) -> list[Row]:
    return [{"user": f"{prefix}{i % 4}", "amount": i} for i in range(n)]


def put(broker: KafkaBroker, topic: str, rows: list[Row], partitions: int) -> dict[str, int]:
    """Row i into partition i % partitions (a user's rows in one partition); the ends."""
    ends = {}
    for p in range(partitions):
        mine = [json.dumps(r) for i, r in enumerate(rows) if i % partitions == p]
        ends[f"{topic}/{p}"] = produce(broker, topic, mine, partition=p)[-1] + 1
    return ends


def test_a_pattern_reads_the_topics_it_matches_when_the_job_is_built(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    for topic in ("clicks-web", "clicks-app", "clicks", "old-clicks-web"):
        kafka_broker.create_topic(topic, 2)
        put(kafka_broker, topic, clicks(topic, 10), 2)
    env = environment(tmp_path)
    env.read_kafka(
        re.compile("clicks-.*"), bootstrap_servers=kafka_broker.bootstrap_servers, bounded=True
    ).collect()
    out = run(env).output
    assert Counter(r["user"][:-1] for r in out) == {"clicks-web": 10, "clicks-app": 10}
    broker = kafka_broker.bootstrap_servers
    none = environment(tmp_path, checkpoint_dir=tmp_path / "ck2")
    with pytest.raises(
        SourceError,
        match=r"read_kafka\('views-.\*'\): no topic on the Kafka brokers at .* matches "
        r"'views-.\*', and a bounded source reads only those there when the job is built",
    ):
        none.read_kafka(re.compile("views-.*"), bootstrap_servers=broker, bounded=True)
    with pytest.warns(InputWarning, match=r"no topic matches 'views-.\*' yet"):
        none.read_kafka(
            re.compile("views-.*"), bootstrap_servers=broker, schema=pa.schema([("n", pa.int64())])
        )
    with pytest.raises(SourceError, match="name the partition as 'topic/partition'"):
        none.read_kafka(re.compile("clicks-.*"), bootstrap_servers=broker, start={0: 1})


class CreateTopic(StopWithSavepoint):
    """The job's listener: once the first checkpoint completed, topic ``clicks-new`` is
    created with rows in it; once a checkpoint holds every partition's end (``ends``, those
    of the new topic's with them) as the source's positions, the job is asked to stop with
    a savepoint."""

    def __init__(
        self,
        broker: KafkaBroker,
        rows: list[Row],
        checkpoints: Path,
        endpoints: list[JobEndpoint],
        ends: dict[str, int],
    ) -> None:
        super().__init__(checkpoints, endpoints)
        self.broker, self.rows, self.ends = broker, rows, ends
        self.created_after: int | None = None

    def __call__(self, kind: str, message: str) -> None:
        if kind != "checkpoint" or self.stopping:
            return
        checkpoint = int(message.split()[0])
        if self.created_after is None:
            self.created_after = checkpoint
            self.broker.create_topic("clicks-new", 2)
            self.ends.update(put(self.broker, "clicks-new", self.rows, 2))
        elif positions(self.checkpoints, checkpoint, "clicks") == self.ends:
            self.stop()


def test_a_topic_created_while_the_job_runs_is_found_and_read_from_its_beginning(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kafka_broker.create_topic("clicks-old", 2)
    kafka_broker.create_topic("views", 1)
    old, new = clicks("old", 40), clicks("new", 40)
    ends = put(kafka_broker, "clicks-old", old, 2)
    put(kafka_broker, "views", clicks("view", 10), 1)
    listener = CreateTopic(kafka_broker, new, tmp_path / "ck", endpoints_of(monkeypatch), ends)
    env = environment(tmp_path, 2, checkpoint_dir=tmp_path / "ck")
    env.read_kafka(
        re.compile(r"clicks-\w+"),
        bootstrap_servers=kafka_broker.bootstrap_servers,
        schema={"user": "string", "amount": "int64"},
        discovery_interval="20ms",
        name="clicks",
    ).key_by("user").sum("amount", name="sums").write_parquet(tmp_path / "out", name="out")
    run(env, listener=listener)
    listener.savepoint()
    assert listener.created_after is not None
    assert set(ends) == {"clicks-old/0", "clicks-old/1", "clicks-new/0", "clicks-new/1"}
    assert published(tmp_path / "out") == running_sums(old) + running_sums(new)
