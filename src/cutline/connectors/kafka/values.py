"""What a Kafka record becomes: its value decoded (JSON, Avro, raw bytes, a string, or a
function of the user's) and Kafka's own fields beside it (``_key``, ``_partition``,
``_offset``, ``_timestamp``, ``_headers``, ``_tombstone``).

One read of a partition is decoded at once. JSON values with a schema take the fast path, every
value of the read parsed by Arrow in one go; a read that Arrow cannot take whole (a value that
is not one JSON object on one line, a field of another type) is decoded record by record, so
that each record that does not decode is named, with its topic, partition and offset, and goes
to the dead letters or fails the job, as the source was told: never a crash, never a silent
drop. Avro values are decoded record by record by fastavro (:mod:`.avro`).

A **tombstone** (a record whose value is null: a delete in a compacted changelog topic) is a
record like the others, ``_tombstone`` true: its value fields are all null (``value`` is null
with ``"raw"`` and ``"string"``); its key, partition, offset, timestamp and headers are its own.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, assert_never

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from cutline.connectors.kafka.avro import AvroFormat, NotAvro, RegistryUnavailable
from cutline.connectors.source import SourceError, with_types

KAFKA_FIELDS = ("_key", "_partition", "_offset", "_timestamp", "_headers", "_tombstone")
"""The fields a Kafka record adds to its value's."""

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
"""``_headers``: the record's headers in order, each a ``{"key": str, "value": bytes}`` (a
value may be null; a key may come several times), as Spark's Kafka source gives them
(``array<struct<key: string, value: binary>>``); a record without headers has an empty list."""

KAFKA_SCHEMA = pa.schema(
    [
        ("_key", pa.string()),
        ("_partition", pa.int32()),
        ("_offset", pa.int64()),
        ("_timestamp", pa.timestamp("ms", tz="UTC")),
        ("_headers", HEADERS),
        ("_tombstone", pa.bool_()),
    ]
)
"""Their Arrow types with ``key_format="string"`` (``"raw"``: ``_key`` is binary)."""


class Values(StrEnum):
    """What a record's value is, as ``value_format=`` names it (reading, a function of the
    user's is one more way: a :data:`Deserializer`)."""

    JSON = "json"
    """A JSON object: its fields."""
    AVRO = "avro"
    """An Avro record: its fields (an :class:`~cutline.connectors.kafka.avro.AvroFormat`
    says how)."""
    RAW = "raw"
    """Bytes: a ``value`` column of them."""
    STRING = "string"
    """UTF-8 text: a ``value`` column of it."""


class Keys(StrEnum):
    """What a record's key is read as (``key_format=``): ``_key`` as text, or its bytes."""

    STRING = "string"
    RAW = "raw"


VALUE_FORMATS = tuple(str(v) for v in Values)


def values_named(given: Any) -> Values | Deserializer:
    """``read_kafka``'s ``value_format=``: a :class:`Values` (or its name), or a function of
    a value's bytes to a dict of fields; a ``ValueError`` naming what works else."""
    if callable(given):
        return given  # type: ignore[no-any-return]
    if given not in VALUE_FORMATS:
        raise ValueError(
            f"read_kafka: value_format must be one of {', '.join(VALUE_FORMATS)} or a "
            f"function of a value's bytes to a dict of fields, not {given!r}"
        )
    return Values(given)


def keys_named(given: Any) -> Keys:
    """``read_kafka``'s ``key_format=``: a :class:`Keys` (or its name); a ``ValueError``
    else."""
    if given not in tuple(Keys):
        raise ValueError(f"read_kafka: key_format must be 'string' or 'raw', not {given!r}")
    return Keys(given)


Header = tuple[str, bytes | None]

Deserializer = Callable[[bytes], dict[str, Any]]
"""A user's deserializer: a value's bytes to the record's fields (a dict); what it raises
rejects that record."""


@dataclass(frozen=True)
class Message:
    """The parts of a consumed Kafka message a record is made of."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    """Epoch milliseconds (the producer's create time or the broker's log-append time)."""
    headers: Sequence[Header] | None = None


@dataclass(frozen=True)
class Rejected:
    """A message whose value did not decode, and why."""

    message: Message
    why: str

    def record(self) -> dict[str, Any]:
        """What the dead letters keep of it: where it was, and its bytes as text."""
        m = self.message
        return {
            "topic": m.topic,
            "partition": m.partition,
            "offset": m.offset,
            "key": None if m.key is None else m.key.decode("utf-8", "backslashreplace"),
            "value": None if m.value is None else m.value.decode("utf-8", "backslashreplace"),
        }

    def describe(self) -> str:
        m = self.message
        return f"topic {m.topic!r} partition {m.partition} offset {m.offset}: {self.why}"


@dataclass(frozen=True)
class ValueFormat:
    """How one source decodes its records (picklable: it travels with the source).

    ``value_format``: ``"json"`` (an object per value: its fields), ``"avro"`` (a record per
    value: its fields; ``avro`` says how), ``"raw"`` (a ``value`` column of bytes),
    ``"string"`` (``value`` as UTF-8 text), or a deserializer of the user's. ``schema``: the
    value's fields as Arrow types (JSON, Avro, or a deserializer's dicts); ``None`` with a
    deserializer, or JSON on an empty topic: records are Python dicts.
    """

    value_format: Values | Deserializer = Values.JSON
    """(Given as its name, it is made the :class:`Values`.)"""
    schema: pa.Schema | None = None
    key_format: Keys = Keys.STRING
    """(Given as its name, it is made the :class:`Keys`.)"""
    avro: AvroFormat | None = None
    """Avro values: the reader's schema and the Schema Registry, if any."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "value_format", values_named(self.value_format))
        object.__setattr__(self, "key_format", keys_named(self.key_format))

    def record_schema(self) -> pa.Schema | None:
        """The columns of the records, when they are Arrow batches."""
        value = self.value_schema()
        if value is None:
            return None
        return pa.schema([*value, *self.kafka_schema()])

    def value_schema(self) -> pa.Schema | None:
        match self.value_format:
            case Values.RAW:
                return pa.schema([("value", pa.binary())])
            case Values.STRING:
                return pa.schema([("value", pa.string())])
            case _:  # (JSON, Avro, a deserializer: the fields of ``schema``)
                return self.schema

    def kafka_schema(self) -> pa.Schema:
        match self.key_format:
            case Keys.RAW:
                return KAFKA_SCHEMA.set(0, pa.field("_key", pa.binary()))
            case Keys.STRING:
                return KAFKA_SCHEMA
            case unknown:
                assert_never(unknown)

    def decode(
        self, messages: Sequence[Message]
    ) -> tuple[pa.RecordBatch | list[Any], list[Rejected]]:
        """The records of ``messages`` (one partition's, in order) and those rejected; a
        tombstone is a record of null value fields."""
        if self.value_format is Values.RAW or self.value_format is Values.STRING:
            return self._plain(messages)
        schema = self.schema
        if schema is None:  # (records as dicts: a deserializer's, or JSON of an empty topic)
            rows: list[dict[str, Any]] = []
            rejected: list[Rejected] = []
            for message in messages:
                try:
                    row = {} if message.value is None else self._one(message)
                except _Undecodable as exc:
                    rejected.append(Rejected(message, str(exc)))
                    continue
                row.update(self._fields(message))
                rows.append(row)
            return rows, rejected
        present = [m for m in messages if m.value is not None]
        columns, kept, rejected = self._columns(present, schema)
        if len(present) < len(messages):
            columns, kept = _with_tombstones(columns, kept, messages)
        return self._with_kafka_fields(columns, kept), rejected

    def _columns(
        self, messages: list[Message], schema: pa.Schema
    ) -> tuple[pa.Table, list[Message], list[Rejected]]:
        """The value columns of ``messages`` (none a tombstone), those kept and those not."""
        if self.value_format is Values.JSON:
            fast = _json_at_once(messages, schema)
            if fast is not None:
                return fast, messages, []
        rows: list[dict[str, Any]] = []
        kept: list[Message] = []
        rejected: list[Rejected] = []
        for message in messages:
            try:
                rows.append(self._one(message))
                kept.append(message)
            except _Undecodable as exc:
                rejected.append(Rejected(message, str(exc)))
        columns, fit = _fit(rows, kept, schema, rejected)
        rejected.sort(key=lambda r: r.message.offset)
        return columns, fit, rejected

    def _one(self, message: Message) -> dict[str, Any]:
        value = message.value
        assert value is not None  # (tombstones are not decoded)
        if self.avro is not None:
            try:
                return self.avro.decode(value)
            except NotAvro as exc:
                raise _Undecodable(str(exc)) from None
            except RegistryUnavailable as exc:  # (not the record's fault: the job restarts)
                raise SourceError(
                    f"topic {message.topic!r} partition {message.partition} offset "
                    f"{message.offset}: {exc}"
                ) from None
        if callable(self.value_format):
            try:
                row = self.value_format(value)
            except Exception as exc:
                raise _Undecodable(f"the deserializer raised {type(exc).__name__}: {exc}") from None
            if not isinstance(row, dict):
                raise _Undecodable(
                    f"the deserializer returned {type(row).__name__}, not a dict of fields"
                )
            return dict(row)
        try:
            row = json.loads(value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Undecodable(f"its value is not JSON ({exc}): {value[:80]!r}") from None
        if not isinstance(row, dict):
            raise _Undecodable(f"its value is JSON {type(row).__name__}, not an object")
        return row

    def _plain(self, messages: Sequence[Message]) -> tuple[pa.RecordBatch, list[Rejected]]:
        if self.value_format is Values.RAW:
            values = pa.array([m.value for m in messages], pa.binary())
            return self._with_kafka_fields(pa.table({"value": values}), messages), []
        texts: list[str | None] = []
        kept: list[Message] = []
        rejected: list[Rejected] = []
        for m in messages:
            try:
                texts.append(None if m.value is None else m.value.decode("utf-8"))
                kept.append(m)
            except UnicodeDecodeError as exc:
                rejected.append(Rejected(m, f"its value is not UTF-8 text ({exc})"))
        table = pa.table({"value": pa.array(texts, pa.string())})
        return self._with_kafka_fields(table, kept), rejected

    def _key(self, key: bytes | None) -> str | bytes | None:
        """``_key``: as given (``key_format="raw"``), or as text."""
        if key is None or self.key_format is Keys.RAW:
            return key
        return key.decode("utf-8", "backslashreplace")

    def _fields(self, message: Message) -> dict[str, Any]:
        return {
            "_key": self._key(message.key),
            "_partition": message.partition,
            "_offset": message.offset,
            "_timestamp": dt.datetime.fromtimestamp(message.timestamp / 1000, dt.UTC),
            "_headers": _headers(message),
            "_tombstone": message.value is None,
        }

    def _with_kafka_fields(self, table: pa.Table, messages: Sequence[Message]) -> pa.RecordBatch:
        kafka = self.kafka_schema()
        arrays = [
            pa.array([self._key(m.key) for m in messages], kafka.field("_key").type),
            pa.array([m.partition for m in messages], pa.int32()),
            pa.array([m.offset for m in messages], pa.int64()),
            pa.array([m.timestamp for m in messages], pa.int64()).cast(
                kafka.field("_timestamp").type
            ),
            _headers_array(messages),
            pa.array([m.value is None for m in messages], pa.bool_()),
        ]
        columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
        return pa.RecordBatch.from_arrays(
            [*columns, *arrays], schema=pa.schema([*table.schema, *kafka])
        )


def _headers(message: Message) -> list[dict[str, Any]]:
    return [{"key": key, "value": value} for key, value in message.headers or ()]


def _headers_array(messages: Sequence[Message]) -> pa.Array:
    """``_headers`` of ``messages`` (without a header among them: empty lists, made at once)."""
    if any(m.headers for m in messages):
        return pa.array([_headers(m) for m in messages], HEADERS)
    offsets = pa.array(np.zeros(len(messages) + 1, np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array([], HEADERS.value_type))


def _with_tombstones(
    columns: pa.Table, kept: list[Message], messages: Sequence[Message]
) -> tuple[pa.Table, list[Message]]:
    """``columns`` (of the ``kept`` values) with a row of nulls for each tombstone among
    ``messages``, in the messages' order."""
    row = {m.offset: i for i, m in enumerate(kept)}
    indices: list[int | None] = []
    order: list[Message] = []
    for message in messages:
        if message.value is None:
            indices.append(None)
        elif message.offset in row:
            indices.append(row[message.offset])
        else:
            continue  # (rejected)
        order.append(message)
    return columns.take(pa.array(indices, pa.int64())), order


class _Undecodable(Exception):
    pass


def _json_at_once(messages: Sequence[Message], schema: pa.Schema) -> pa.Table | None:
    """Every value parsed by Arrow at once, if each is one JSON object on one line and every
    field fits ``schema``; ``None``: decode them one by one."""
    values = [m.value for m in messages]
    if not values or any(v is None or not v.strip() or b"\n" in v or b"\r" in v for v in values):
        return None
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    data = b"\n".join(values)  # type: ignore[arg-type]
    block = max(1 << 20, len(data) + 1)  # (one block: the rows stay in order, one per value)
    try:
        table = pj.read_json(
            pa.BufferReader(data),
            read_options=pj.ReadOptions(block_size=block),
            parse_options=options,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(values):
        return None
    return table.select(schema.names)


def _fit(
    rows: list[dict[str, Any]],
    messages: list[Message],
    schema: pa.Schema,
    rejected: list[Rejected],
) -> tuple[pa.Table, list[Message]]:
    """``rows`` as a table of ``schema``; a row whose fields do not fit is rejected (named)."""
    try:
        return pa.Table.from_pylist(rows, schema=schema), messages
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        pass
    kept_rows: list[dict[str, Any]] = []
    kept: list[Message] = []
    for row, message in zip(rows, messages, strict=True):
        try:
            pa.Table.from_pylist([row], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
            rejected.append(Rejected(message, f"a field does not fit the schema: {exc}"))
            continue
        kept_rows.append(row)
        kept.append(message)
    return pa.Table.from_pylist(kept_rows, schema=schema), kept


def infer_schema(values: Sequence[bytes], types: pa.Schema | None = None) -> pa.Schema | None:
    """The Arrow schema of sample JSON values (objects), as Arrow's JSON reader infers it,
    with the types ``types`` gives the fields it names (the sample's values of those are not
    looked at); ``None``: no value to infer from. Values whose fields cannot share a type with
    the others' (``1`` in one, ``"abc"`` in another) do not count: they fail when read (the
    dead letters, with ``on_error="dead_letter"``)."""
    given = set(types.names) if types is not None else set()
    rows = []
    for value in values:
        try:
            row = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(row, dict):
            rows.append({k: None if k in given else v for k, v in row.items()})
    if not rows:
        return None
    try:
        lines = b"\n".join(json.dumps(r).encode() for r in rows)
        inferred = pj.read_json(pa.BufferReader(lines)).schema
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        inferred = _row_by_row(rows)
        if inferred is None:
            return None
    return inferred if types is None else with_types(inferred, types)


def _row_by_row(rows: list[dict[str, Any]]) -> pa.Schema | None:
    """The schema of sample rows that Arrow cannot read at once: row by row, each unified with
    those before it (ints widen to floats, nulls take a type), those that cannot be skipped."""
    found: pa.Schema | None = None
    for row in rows:
        try:
            one = pa.Table.from_pylist([row]).schema
            found = (
                one
                if found is None
                else pa.unify_schemas([found, one], promote_options="permissive")
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            continue
    return found
