"""The Kafka, PostgreSQL, Delta Lake and Apache Iceberg examples of the connectors' pages
(``docs/connectors/*.md``, the blocks marked ``<!-- test: elsewhere NAME -->``), as they are
written there, against real servers (their ``broker = ...`` and ``dsn = ...`` lines pointed at
the test's), in a folder of their own, with slots as threads: each does what its page says it
does."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable
from pyiceberg.catalog import load_catalog
from schema_registry import SchemaRegistry
from test_kafka import read_topic
from test_kafka_avro import avro

from cutline.examples.servers import KafkaBroker, PostgresServer, produce

from docs_examples import docs_example, run_example

pytestmark = pytest.mark.connectors


def clicks(broker: KafkaBroker, n: int = 300) -> list[dict[str, Any]]:
    broker.create_topic("clicks", 2)
    rows = [{"user": f"u{i % 4}", "amount": i} for i in range(n)]
    for p in range(2):  # (user u in partition u % 2, its clicks in order)
        produce(broker, "clicks", [json.dumps(r) for i, r in enumerate(rows) if i % 2 == p], p)
    return rows


def test_the_kafka_example(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clicks(kafka_broker)
    kafka_broker.create_topic("clicks-per-minute", 1)
    run_example(
        docs_example("kafka-clicks"), tmp_path, monkeypatch, broker=kafka_broker.bootstrap_servers
    )
    written = [json.loads(m.value()) for m in read_topic(kafka_broker, "clicks-per-minute", 1)]
    # (the clicks were produced within a minute or two: per user, its clicks in its windows)
    per_user: Counter[str] = Counter()
    for r in written:
        per_user[r["user"]] += r["count"]
    assert per_user == {f"u{u}": 75 for u in range(4)}


def test_the_kafka_changelog_example(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Account changes in Avro (the registry's wire format, a registry the test starts: an
    HTTP server of its own on a loopback port) in two topics named ``accounts-...`` and one
    that is not: the valid ones, and every delete, with their headers and timestamps, are in
    ``valid-accounts``."""
    code = docs_example("kafka-accounts")
    account = {
        "type": "record",
        "name": "Account",
        "fields": [{"name": "owner", "type": "string"}, {"name": "balance", "type": "long"}],
    }
    with SchemaRegistry() as registry:
        schema_id = registry.register("accounts-value", account)
        sent: list[tuple[bytes, int | None, list[Any], int]] = []
        for t, topic in enumerate(["accounts-eu", "accounts-us", "archive"]):
            kafka_broker.create_topic(topic, 1)
            changes = []
            for i in range(12):
                key, at = f"{topic}-{i % 4}".encode(), 1_700_000_000_000 + 100 * t + i
                balance = None if i % 5 == 4 else (i - 3) * 10  # (deletes; negatives)
                value = (
                    None
                    if balance is None
                    else avro(account, {"owner": "o", "balance": balance}, schema_id)
                )
                headers = [("change", str(i).encode())]
                changes.append(((key, value), at, headers))
                if topic != "archive" and (balance is None or balance >= 0):
                    sent.append((key, balance, headers, at))
            produce(
                kafka_broker,
                topic,
                [c[0] for c in changes],
                timestamps=[c[1] for c in changes],
                headers=[c[2] for c in changes],
            )
        kafka_broker.create_topic("valid-accounts", 1)
        run_example(
            code,
            tmp_path,
            monkeypatch,
            broker=kafka_broker.bootstrap_servers,
            registry=registry.url,
        )
        (written_id,) = registry.subjects["valid-accounts-value"]
    written = [
        (
            m.key(),
            None if m.value() is None else decoded(account, m.value(), written_id),
            m.headers(),
            m.timestamp()[1],
        )
        for m in consume(kafka_broker, "valid-accounts", len(sent))
    ]
    assert Counter(map(repr, written)) == Counter(map(repr, sent))


def consume(broker: KafkaBroker, topic: str, count: int) -> list[Any]:
    """The records of partition 0 of ``topic``, once ``count`` have come (the example's
    producer batches records, after which Tansu's high watermark cannot be trusted: the
    records are counted), with those that come in half a second more."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "check"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[Any] = []
        for _ in range(100):  # (10 s at most)
            got += [m for m in consumer.consume(count, timeout=0.1) if m.error() is None]
            if len(got) >= count:
                more = [m for m in consumer.consume(count, timeout=0.5) if m.error() is None]
                return got + more  # (none more, if the example wrote each record once)
        raise AssertionError(f"{topic} has {len(got)} records, not {count}")
    finally:
        consumer.close()


def decoded(schema: dict[str, Any], value: bytes, schema_id: int) -> int:
    import io

    import fastavro

    assert value[:5] == b"\x00" + schema_id.to_bytes(4, "big")
    return int(fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, None)["balance"])  # type: ignore[call-overload, index]


def test_the_postgresql_example(
    kafka_broker: KafkaBroker,
    postgres: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = clicks(kafka_broker)
    code = docs_example("postgres-sums")
    ddl = re.search(r"^# (CREATE TABLE .*)$", code.code, re.M).group(1)  # type: ignore[union-attr]
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        for statement in ddl.split(";"):
            conn.execute(statement)
    run_example(
        code, tmp_path, monkeypatch, broker=kafka_broker.bootstrap_servers, dsn=postgres.dsn
    )
    totals: dict[str, int] = {}
    sums: Counter[tuple[str, int]] = Counter()
    for r in rows:
        totals[r["user"]] = totals.get(r["user"], 0) + r["amount"]
        sums[(r["user"], totals[r["user"]])] += 1
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        assert Counter(conn.execute('SELECT "user", amount FROM sums').fetchall()) == sums
        assert dict(conn.execute('SELECT "user", amount FROM totals').fetchall()) == totals


def test_the_delta_lake_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_example(docs_example("delta-sums"), tmp_path, monkeypatch)
    table = DeltaTable(str(tmp_path / "tables" / "sums")).to_pyarrow_table().to_pylist()
    # (each user's numbers come from both source subtasks, in either order: its running sums
    # vary, its count of them and its total do not)
    assert Counter(r["user"] for r in table) == {f"u{u}": 10_000 for u in range(10)}
    highest: dict[str, int] = {}
    for r in table:
        highest[r["user"]] = max(highest.get(r["user"], 0), r["amount"])
    assert highest == {f"u{u}": sum(range(u, 100_000, 10)) for u in range(10)}


def test_the_apache_iceberg_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_example(docs_example("iceberg-sums"), tmp_path, monkeypatch)
    lake = tmp_path / "lake"
    catalog = {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db", "warehouse": f"file://{lake}"}
    made = load_catalog("default", **catalog).load_table("shop.sums")
    table = made.scan().to_arrow().to_pylist()
    # (as the Delta Lake example's: each user's count of running sums and its total)
    assert Counter(r["user"] for r in table) == {f"u{u}": 10_000 for u in range(10)}
    highest: dict[str, int] = {}
    for r in table:
        highest[r["user"]] = max(highest.get(r["user"], 0), r["amount"])
    assert highest == {f"u{u}": sum(range(u, 100_000, 10)) for u in range(10)}
    assert all(s.summary["cutline.checkpoint"] for s in made.snapshots())


def test_the_delta_lake_reading_example_reads_back_what_the_first_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running sums the first example wrote, read back (the table's snapshot, then the
    job ends): each user's highest is its total."""
    both = docs_example("delta-sums").code + docs_example("delta-read").code
    run_example(both, tmp_path, monkeypatch)
    totals = ds.dataset(str(tmp_path / "totals"), format="parquet").to_table().to_pylist()
    assert len(totals) == 100_000 and set(totals[0]) == {"user", "amount"}
    highest: dict[str, int] = {}
    for r in totals:
        highest[r["user"]] = max(highest.get(r["user"], 0), r["amount"])
    assert highest == {f"u{u}": sum(range(u, 100_000, 10)) for u in range(10)}
