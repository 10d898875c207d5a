"""Avro values of Kafka records against a real broker (Tansu, started by the test on loopback),
in real jobs (slots as threads): plain Avro of a schema the job is given, and Confluent's
Schema Registry wire format with a registry that the test starts itself (``SchemaRegistry``
of ``schema_registry.py``: a real HTTP server on a loopback port speaking the part of
Confluent's REST API the client uses, since no Schema Registry server can be installed here).
Every Avro type the columns map is read exact; records of an older or newer writer's schema
are resolved to the reader's; each writer's schema is fetched once; ``write_kafka`` writes
Avro (registering its subject) that reads back exact; values that do not decode (not Avro, an
unknown schema id, no wire-format header) go to the dead letters or fail the job naming their
topic, partition and offset.

The test's own values are encoded by fastavro directly (``schemaless_writer``), not by cutline.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from schema_registry import SchemaRegistry
from test_kafka import environment, read_topic, run
from test_kafka_records import ONE_A_BATCH
from test_runtime_jobs import dead_letters

from cutline import FixedDelay, JobFailedError, SourceError
from cutline.examples.servers import KafkaBroker, free_port, produce

pytestmark = pytest.mark.connectors

Row = dict[str, Any]

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "int"}},
        {
            "name": "ship_to",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": "int"}],
            },
        },
        {"name": "bill_to", "type": ["null", "Address"], "default": None},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}},
        {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 2}},
        {"name": "weight", "type": "float"},
        {"name": "gift", "type": "boolean"},
    ],
}

ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("user", pa.string()),
        ("note", pa.string()),
        ("at", pa.timestamp("ms", tz="UTC")),
        ("day", pa.date32()),
        ("price", pa.decimal128(9, 2)),
        ("tags", pa.list_(pa.string())),
        ("counts", pa.map_(pa.string(), pa.int32())),
        ("ship_to", pa.struct([("city", pa.string()), ("zip", pa.int32())])),
        ("bill_to", pa.struct([("city", pa.string()), ("zip", pa.int32())])),
        ("state", pa.string()),
        ("code", pa.binary(2)),
        ("weight", pa.float32()),
        ("gift", pa.bool_()),
    ]
)


def order(i: int) -> Row:
    return {
        "id": i,
        "user": f"u{i % 3}",
        "note": None if i % 2 else f"note {i}",
        "at": dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC) + dt.timedelta(milliseconds=i),
        "day": dt.date(2024, 5, 1) + dt.timedelta(days=i),
        "price": Decimal(f"{i}.25"),
        "tags": [f"t{j}" for j in range(i % 3)],
        "counts": {f"c{j}": j for j in range(i % 2 + 1)},
        "ship_to": {"city": f"city {i}", "zip": 1000 + i},
        "bill_to": None if i % 3 else {"city": "billing", "zip": i},
        "state": "PAID" if i % 2 else "NEW",
        "code": bytes([65 + i % 26, 66]),
        "weight": 0.5 * i,
        "gift": i % 4 == 0,
    }


def as_read(row: Row) -> Row:
    """What a record's fields read back as (Arrow gives a map as (key, value) pairs)."""
    return {**row, "counts": list(row["counts"].items())}


def avro(schema: Any, row: Any, schema_id: int | None = None) -> bytes:
    """``row`` in Avro (fastavro's own), framed with ``schema_id`` as the registry's wire
    format when given."""
    out = io.BytesIO()
    if schema_id is not None:
        out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), row)
    return out.getvalue()


@pytest.fixture
def registry() -> Iterator[SchemaRegistry]:
    """A Schema Registry (the tests' own HTTP server) on a loopback port."""
    with SchemaRegistry() as running:
        yield running


def test_avro_values_of_a_schema_are_read_exact_and_written_back(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Plain Avro values (no registry) of a schema with every type the columns map: read
    exact (a tombstone: its fields null), a value that is not Avro kept aside named; the
    records written back with ``write_kafka(value_format="avro")`` read back the same."""
    kafka_broker.create_topic("orders", 1)
    values: list[bytes | None] = [avro(ORDER, order(i)) for i in range(6)]
    values[3] = b"\x02garbage that is not an order"
    values[4] = None
    produce(kafka_broker, "orders", [(f"k{i}", v) for i, v in enumerate(values)])
    broker = kafka_broker.bootstrap_servers
    env = environment(tmp_path, parallelism=1)
    orders = env.read_kafka(
        "orders",
        bootstrap_servers=broker,
        bounded=True,
        value_format="avro",
        schema=json.dumps(ORDER),  # (JSON text, or the dict)
        on_error="dead_letter",
    )
    assert orders.schema is not None
    assert pa.schema(list(orders.schema)[: len(ARROW)]) == ARROW
    orders.collect()
    kafka_broker.create_topic("orders-copy", 1)
    orders.write_kafka(
        "orders-copy",
        bootstrap_servers=broker,
        key="_key",
        value_format="avro",
        schema=ORDER,
        delete="_tombstone",
        config=ONE_A_BATCH,
    )
    out = run(env).output
    nulls = dict.fromkeys(ARROW.names)
    assert [{n: r[n] for n in ARROW.names} for r in out] == [
        *(as_read(order(i)) for i in range(3)),
        nulls,
        as_read(order(5)),
    ]
    assert [(r["_offset"], r["_tombstone"]) for r in out] == [
        (0, False),
        (1, False),
        (2, False),
        (4, True),
        (5, False),
    ]
    (dead,) = dead_letters(tmp_path / "dead")
    assert json.loads(dead["record"])["offset"] == 3
    assert "its value is not Avro of the schema" in dead["error"]
    copied = read_topic(kafka_broker, "orders-copy", 1)
    assert [m.key() for m in copied] == [b"k0", b"k1", b"k2", b"k4", b"k5"]
    assert [m.value() for m in copied] == [values[0], values[1], values[2], None, values[5]]


CLICK_V1 = {
    "type": "record",
    "name": "Click",
    "fields": [{"name": "user", "type": "string"}, {"name": "n", "type": "int"}],
}
CLICK_V2 = {
    "type": "record",
    "name": "Click",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "n", "type": "long"},  # (promoted)
        {"name": "page", "type": "string", "default": "home"},  # (added)
    ],
}
CLICK_READER = {
    "type": "record",
    "name": "Click",
    "fields": [{"name": "user", "type": "string"}, {"name": "n", "type": "long"}],
}


def test_the_registry_wire_format_resolves_each_writer_to_the_reader(
    kafka_broker: KafkaBroker, registry: SchemaRegistry, tmp_path: Path
) -> None:
    """Records written with two versions of a schema: read with the subject's latest (the
    reader's schema fetched when the job is built), the older records get the added field's
    default; read with a reader's schema without it (``schema=``), the newer lose it. Each
    writer's schema is fetched once by its id (the client caches it)."""
    v1 = registry.register("clicks-value", CLICK_V1)
    v2 = registry.register("clicks-value", CLICK_V2)
    kafka_broker.create_topic("clicks", 2)
    for p in range(2):
        produce(
            kafka_broker,
            "clicks",
            [
                avro(CLICK_V1, {"user": f"u{p}", "n": 1}, v1),
                avro(CLICK_V2, {"user": f"u{p}", "n": 2, "page": "cart"}, v2),
                avro(CLICK_V1, {"user": f"u{p}", "n": 3}, v1),
            ],
            partition=p,
        )
    broker = kafka_broker.bootstrap_servers
    env = environment(tmp_path)
    latest = env.read_kafka(
        "clicks", bootstrap_servers=broker, bounded=True, value_format="avro",
        schema_registry=registry.url,
    )  # fmt: skip
    assert latest.schema is not None
    assert latest.schema.names[:3] == ["user", "n", "page"]
    assert latest.schema.field("n").type == pa.int64()
    latest.collect()
    out = run(env).output
    assert sorted((r["_partition"], r["user"], r["n"], r["page"]) for r in out) == [
        (p, f"u{p}", n, "cart" if n == 2 else "home") for p in range(2) for n in (1, 2, 3)
    ]
    assert registry.fetched(v1) == registry.fetched(v2) == 1
    env = environment(tmp_path, checkpoint_dir=tmp_path / "ck2")
    env.read_kafka(
        "clicks", bootstrap_servers=broker, bounded=True, value_format="avro",
        schema=CLICK_READER, schema_registry={"url": registry.url},
    ).collect()  # fmt: skip
    out = run(env).output
    assert sorted((r["_partition"], r["user"], r["n"]) for r in out) == [
        (p, f"u{p}", n) for p in range(2) for n in (1, 2, 3)
    ]
    assert "page" not in out[0]
    assert registry.fetched(v1) == registry.fetched(v2) == 1


def test_write_kafka_registers_its_subject_and_frames_every_value(
    kafka_broker: KafkaBroker, registry: SchemaRegistry, tmp_path: Path
) -> None:
    kafka_broker.create_topic("counts", 1)
    broker = kafka_broker.bootstrap_servers
    env = environment(tmp_path, parallelism=1)
    env.from_sequence(0, 20).map(lambda r: {"user": f"u{r['value'] % 4}", "n": r["value"]}).write_kafka(
        "counts", bootstrap_servers=broker, value_format="avro", schema=CLICK_V1,
        schema_registry=registry.url, config=ONE_A_BATCH,
    )  # fmt: skip
    run(env)
    (schema_id,) = registry.subjects["counts-value"]
    assert json.loads(registry.schemas[schema_id]) == CLICK_V1
    written = read_topic(kafka_broker, "counts", 1)
    assert [m.value()[:5] for m in written] == [b"\x00" + schema_id.to_bytes(4, "big")] * 20
    env = environment(tmp_path, parallelism=1, checkpoint_dir=tmp_path / "ck2")
    env.read_kafka(
        "counts", bootstrap_servers=broker, bounded=True, value_format="avro",
        schema_registry=registry.url,
    ).collect()  # fmt: skip
    assert [(r["user"], r["n"]) for r in run(env).output] == [(f"u{n % 4}", n) for n in range(20)]


def test_values_that_do_not_decode_are_named(
    kafka_broker: KafkaBroker, registry: SchemaRegistry, tmp_path: Path
) -> None:
    v1 = registry.register("clicks-value", CLICK_V1)
    words = {
        **CLICK_V1,
        "fields": [{"name": "user", "type": "string"}, {"name": "n", "type": "string"}],
    }
    other = registry.register("words-value", words)
    kafka_broker.create_topic("clicks", 1)
    produce(
        kafka_broker,
        "clicks",
        [
            avro(CLICK_V1, {"user": "a", "n": 1}, v1),
            avro(CLICK_V1, {"user": "b", "n": 2}, 99),  # (no schema 99 in the registry)
            avro(CLICK_V1, {"user": "c", "n": 3}),  # (no wire-format header)
            avro(CLICK_V1, {"user": "d", "n": 4}, v1)[:-1],  # (cut short)
            avro(words, {"user": "e", "n": "five"}, other),  # (n: a string, not an int)
            avro(CLICK_V1, {"user": "f", "n": 6}, v1),
        ],
    )
    broker = kafka_broker.bootstrap_servers
    read = {
        "bootstrap_servers": broker,
        "bounded": True,
        "value_format": "avro",
        "schema_registry": registry.url,
    }
    env = environment(tmp_path, parallelism=1)
    env.read_kafka("clicks", on_error="dead_letter", **read).collect()
    assert [(r["user"], r["_offset"]) for r in run(env).output] == [("a", 0), ("f", 5)]
    dead = dead_letters(tmp_path / "dead")
    assert [json.loads(d["record"])["offset"] for d in dead] == [1, 2, 3, 4]
    assert f"its schema id 99 is not in the Schema Registry at {registry.url}" in dead[0]["error"]
    assert "not in the Schema Registry's wire format" in dead[1]["error"]
    assert "its value is not Avro of the schema" in dead[2]["error"]
    assert f"its writer's schema (id {other}) does not resolve to the reader's" in dead[3]["error"]
    env = environment(tmp_path, 1, checkpoint_dir=tmp_path / "ck2", restart_strategy=FixedDelay(0))
    env.read_kafka("clicks", **read).collect()
    with pytest.raises(
        JobFailedError,
        match=r"topic 'clicks' partition 0 offset 1: its schema id 99 is not in the Schema Registry",
    ):
        run(env)


def test_clear_errors_when_the_job_is_built(
    kafka_broker: KafkaBroker, registry: SchemaRegistry, tmp_path: Path
) -> None:
    kafka_broker.create_topic("clicks", 1)
    broker = kafka_broker.bootstrap_servers
    env = environment(tmp_path)
    avro_values = {"bootstrap_servers": broker, "value_format": "avro"}
    with pytest.raises(ValueError, match=r"value_format='avro' needs schema= \(the Avro schema"):
        env.read_kafka("clicks", **avro_values)
    with pytest.raises(ValueError, match=r"schema= is not a valid Avro schema: .*recrd"):
        env.read_kafka("clicks", schema={"type": "recrd", "name": "X"}, **avro_values)
    with pytest.raises(
        ValueError,
        match=r"field 'v': a union of several types \(int, string\) has no Arrow column type",
    ):
        union = {
            "type": "record",
            "name": "U",
            "fields": [{"name": "v", "type": ["int", "string"]}],
        }
        env.read_kafka("clicks", schema=union, **avro_values)
    with pytest.raises(
        SourceError,
        match=rf"the Schema Registry at {registry.url} has no schema under subject clicks-value",
    ):
        env.read_kafka("clicks", schema_registry=registry.url, **avro_values)
    nowhere = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SourceError, match=rf"the Schema Registry at {nowhere} failed"):
        env.read_kafka("clicks", schema_registry={"url": nowhere, "max.retries": 0}, **avro_values)
    with pytest.raises(ValueError, match=r"schema_registry= is for value_format='avro'"):
        env.read_kafka("clicks", bootstrap_servers=broker, schema_registry=registry.url)
    with pytest.raises(ValueError, match=r"write_kafka: value_format='avro' needs schema="):
        env.from_sequence(0, 1).write_kafka("clicks", bootstrap_servers=broker, value_format="avro")
    env = environment(tmp_path, 1, checkpoint_dir=tmp_path / "ck2", restart_strategy=FixedDelay(0))
    env.from_sequence(0, 1).map(lambda r: {"user": 1, "n": 2}).write_kafka(
        "clicks", bootstrap_servers=broker, value_format="avro", schema=CLICK_V1
    )
    with pytest.raises(
        JobFailedError,
        match=r"write_kafka\(clicks\): a record does not fit the Avro schema, .*Click\.user is <1>",
    ):
        run(env)


def test_a_schema_of_another_type_than_a_record_is_one_value_column(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    kafka_broker.create_topic("names", 1)
    produce(kafka_broker, "names", [avro("string", name) for name in ("ada", "grace", "")])
    broker = kafka_broker.bootstrap_servers
    env = environment(tmp_path, parallelism=1)
    names = env.read_kafka(
        "names", bootstrap_servers=broker, bounded=True, value_format="avro", schema="string"
    )
    assert names.schema is not None and names.schema.field("value").type == pa.string()
    names.collect()
    kafka_broker.create_topic("upper", 1)
    names.map(lambda r: {"value": r["value"].upper()}).write_kafka(
        "upper", bootstrap_servers=broker, value_format="avro", schema={"type": "string"},
        config=ONE_A_BATCH,
    )  # fmt: skip
    assert [r["value"] for r in run(env).output] == ["ada", "grace", ""]
    written = read_topic(kafka_broker, "upper", 1)
    assert [m.value() for m in written] == [avro("string", n) for n in ("ADA", "GRACE", "")]
