"""Kafka end to end on a real local Spark session, a Python worker SIGKILLed at a random
moment: a topic through a keyed running sum into PostgreSQL is the fault-free answer, row for
row, with no prepared transaction left; a topic through event-time windows into another topic
has every window's result (at least once). The kill lands by construction
(``_execute_killing`` of ``test_event_time_faults.py``): the sources hold part-way until a
checkpoint completed and the killer was told of it."""

from __future__ import annotations

import io
import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import fastavro
import psycopg
import pytest
from test_event_time_faults import _execute_killing
from test_kafka import put, read_topic, running_sums

from cutline import FixedDelay, StreamEnvironment, Tumbling
from cutline.demo import WorkerKiller
from cutline.examples.servers import KafkaBroker, PostgresServer, produce

pytestmark = pytest.mark.connectors

ROWS = 1200
"""Rows of six users over three partitions (user u in partition u % 3): the two subtasks read
one or two partitions, 400 or 800 rows."""


def clicks(n: int = ROWS) -> list[dict[str, Any]]:
    return [{"user": f"u{i % 6}", "amount": i} for i in range(n)]


AVRO = {
    "type": "record",
    "name": "Click",
    "fields": [{"name": "user", "type": "string"}, {"name": "amount", "type": "long"}],
}


def put_avro(broker: KafkaBroker, topic: str, rows: list[dict[str, Any]], partitions: int) -> None:
    """As ``put``, the values in Avro's binary encoding of :data:`AVRO`."""
    schema = fastavro.parse_schema(AVRO)
    for p in range(partitions):
        values = []
        for i, row in enumerate(rows):
            if i % partitions == p:
                out = io.BytesIO()
                fastavro.schemaless_writer(out, schema, row)
                values.append((row["user"], out.getvalue()))
        produce(broker, topic, values, partition=p)


@pytest.mark.parametrize(
    ("seed", "avro"), [(0, False), pytest.param(1, False, marks=pytest.mark.slow), (2, True)]
)  # (seed 1: make soak)
def test_kafka_to_postgres_is_exact_through_a_sigkill_at_a_random_moment(
    spark: Any,
    kafka_broker: KafkaBroker,
    postgres: PostgresServer,
    tmp_path: Path,
    seed: int,
    avro: bool,
) -> None:
    """JSON values from a named topic, or Avro values from topics matched by a pattern."""
    rng = random.Random(f"kafka-postgres-{seed}")
    kafka_broker.create_topic("clicks", 3)
    rows = clicks()
    (put_avro if avro else put)(kafka_broker, "clicks", rows, 3)
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE sums ("user" text NOT NULL, amount bigint NOT NULL)')
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.2,
        checkpoint_dir=str(tmp_path / "ck"),
        restart_strategy=FixedDelay(delay=0),
    )
    values: dict[str, Any] = {"schema": {"user": "string", "amount": "int64"}}
    if avro:
        values = {"value_format": "avro", "schema": AVRO}
    env.read_kafka(
        re.compile("click.") if avro else "clicks",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        bounded=True,
        name="clicks",
        **values,
    ).key_by("user").sum("amount", name="sums").write_postgres(
        postgres.dsn, table="sums", columns=["user", "amount"], name="table"
    )
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.2, 1.5))
    _execute_killing(env, spark, killer, rng.randrange(100, 350))
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        table = Counter(conn.execute('SELECT "user", amount FROM sums').fetchall())
        left = conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
    assert table == running_sums(rows)
    assert left == []


def test_kafka_windows_into_kafka_have_every_result_through_a_sigkill(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Clicks of six users, 20 ms apart in event time, counted per user in one-second
    windows and sent to another topic: every window's count is there (some maybe twice:
    the Kafka sink is at least once)."""
    rng = random.Random("kafka-windows")
    kafka_broker.create_topic("clicks", 3)
    kafka_broker.create_topic("counts", 2)
    base = 1_700_000_000_000
    rows = clicks()
    for p in range(3):  # (row i into partition i % 3, at base + 20 i ms)
        mine = range(p, len(rows), 3)
        values = [json.dumps(rows[i]) for i in mine]
        produce(
            kafka_broker, "clicks", values, partition=p, timestamps=[base + i * 20 for i in mine]
        )
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.2,
        checkpoint_dir=str(tmp_path / "ck"),
        restart_strategy=FixedDelay(delay=0),
    )
    env.read_kafka(
        "clicks",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        schema={"user": "string", "amount": "int64"},
        bounded=True,
        event_time="_timestamp",
        name="clicks",
    ).key_by("user").window(Tumbling("1s")).count(name="per_second").write_kafka(
        "counts", bootstrap_servers=kafka_broker.bootstrap_servers, key="user", name="counts"
    )
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.2, 1.5))
    _execute_killing(env, spark, killer, rng.randrange(100, 350))
    expected: Counter[tuple[str, int]] = Counter()
    for i, row in enumerate(rows):
        expected[(row["user"], (i * 20) // 1000 * 1000)] += 1
    written = [json.loads(m.value()) for m in read_topic(kafka_broker, "counts", 2)]
    found = {(r["user"], _millis(r["window_start"]) - base): r["count"] for r in written}
    assert found == dict(expected)
    # a window written twice has the same count both times (the duplicates of a replay)
    assert len({(r["user"], r["window_start"], r["count"]) for r in written}) == len(found)


def _millis(text: str) -> int:
    import datetime as dt

    return int(dt.datetime.fromisoformat(text).timestamp() * 1000)
