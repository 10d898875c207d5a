"""Avro values of Kafka records: decoded and encoded by fastavro, plain (the Avro binary body
alone, of the schema the job is given) or in the Confluent Schema Registry's wire format
(byte 0, the writer's schema id in 4 bytes big-endian, then the Avro body), the writer's
schema fetched by id with confluent-kafka's own ``SchemaRegistryClient`` (which caches it).

An Avro schema becomes Arrow columns: a record's fields are the columns (another type at the
top: one ``value`` column), each of the type :func:`arrow_type` maps it to. With a registry,
each record is resolved from its writer's schema to the reader's (Avro's schema resolution:
fields added with defaults, removed, promoted), so every record has the reader's columns.

Why not confluent-kafka's ``AvroDeserializer``: it expands the reader's schema and runs its
rule engine for every message; the batch path here fetches and parses each writer's schema
once per process and calls fastavro's ``schemaless_reader`` directly.
"""

from __future__ import annotations

import functools
import io
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fastavro
import pyarrow as pa
from fastavro.read import SchemaResolutionError
from fastavro.validation import validate

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

MAGIC = 0
"""The first byte of a value in the Schema Registry's wire format."""

PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}

LOGICAL: dict[tuple[str, str], pa.DataType] = {
    ("long", "timestamp-millis"): pa.timestamp("ms", tz="UTC"),
    ("long", "timestamp-micros"): pa.timestamp("us", tz="UTC"),
    ("long", "local-timestamp-millis"): pa.timestamp("ms"),
    ("long", "local-timestamp-micros"): pa.timestamp("us"),
    ("int", "date"): pa.date32(),
    ("int", "time-millis"): pa.time32("ms"),
    ("long", "time-micros"): pa.time64("us"),
    ("string", "uuid"): pa.string(),
}
"""Avro's logical types (on their base type) and their Arrow types; ``decimal`` is
``decimal128(precision, scale)``; another logical type is its base type."""


class NotAvro(ValueError):
    """A value that does not decode (the record's fault: dead letters, or the job fails)."""


class RegistryUnavailable(RuntimeError):
    """The Schema Registry does not answer (not the record's fault: the job restarts)."""


# ------------------------------------------------------------------------ schemas


def schema_text(schema: Any, where: str) -> str:
    """An Avro schema (a dict, a list, or its JSON text) as JSON text, checked by fastavro;
    a ``ValueError`` naming ``where`` and what is wrong."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema) if schema.lstrip()[:1] in ("{", "[", '"') else schema
        except ValueError as exc:
            raise ValueError(
                f"{where}: schema= is not JSON text of an Avro schema: {exc}"
            ) from None
    if not isinstance(schema, dict | list | str):
        raise ValueError(
            f"{where}: schema= must be an Avro schema (a dict, or its JSON text), not "
            f"{type(schema).__name__}"
        )
    try:
        fastavro.parse_schema(schema)
    except (fastavro.schema.SchemaParseException, ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            f"{where}: schema= is not a valid Avro schema: {type(exc).__name__}: {exc}"
        ) from None
    text = json.dumps(schema, separators=(",", ":"))
    arrow_schema(text, where)  # (every type has an Arrow column type)
    return text


@functools.cache
def parsed(text: str) -> Any:
    """The schema of JSON ``text``, parsed by fastavro (once per process)."""
    return fastavro.parse_schema(json.loads(text))


def arrow_schema(text: str, where: str = "the Avro schema") -> pa.Schema:
    """The Arrow columns of the records of an Avro schema: a record's fields, or one
    ``value`` column of another type."""
    named: dict[str, Any] = {}
    schema = fastavro.parse_schema(json.loads(text), named_schemas=named)
    if isinstance(schema, dict) and schema.get("type") == "record":
        return pa.schema(
            [
                (f["name"], arrow_type(f["type"], named, (), f"{where}: field {f['name']!r}"))
                for f in schema["fields"]
            ]
        )
    return pa.schema([("value", arrow_type(schema, named, (), f"{where}: the value"))])


def arrow_type(schema: Any, named: Mapping[str, Any], seen: tuple[str, ...], where: str) -> Any:
    """The Arrow type of an Avro type (parsed by fastavro: ``named`` holds its named types);
    a ``ValueError`` naming ``where`` for a type that has none here (a union of several
    types besides null, a recursive record)."""
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return PRIMITIVES[schema]
        if schema in seen:
            raise ValueError(f"{where}: the recursive type {schema!r} has no Arrow column type")
        return arrow_type(named[schema], named, (*seen, schema), where)
    if isinstance(schema, list):  # a union: null and one other type (a nullable column)
        others = [t for t in schema if t != "null"]
        if len(others) != 1:
            names = ", ".join(_name(t) for t in others)
            raise ValueError(
                f"{where}: a union of several types ({names}) has no Arrow column type here: "
                "only a union of null and one type (an optional field) has"
            )
        return arrow_type(others[0], named, seen, where)
    kind = schema["type"]
    logical = schema.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        return (pa.decimal128 if precision <= 38 else pa.decimal256)(precision, scale)
    if isinstance(kind, str) and (kind, logical) in LOGICAL:
        return LOGICAL[(kind, logical)]
    match kind:
        case "record" | "error":
            inner = (*seen, schema["name"])
            return pa.struct(
                [
                    (f["name"], arrow_type(f["type"], named, inner, f"{where}.{f['name']}"))
                    for f in schema["fields"]
                ]
            )
        case "array":
            return pa.list_(arrow_type(schema["items"], named, seen, f"{where}[]"))
        case "map":
            return pa.map_(pa.string(), arrow_type(schema["values"], named, seen, f"{where}{{}}"))
        case "enum":
            return pa.string()
        case "fixed":
            return pa.binary(int(schema["size"]))
        case _:
            return arrow_type(kind, named, seen, where)


def _name(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("type"))
    return "union"


def _has_maps(schema: Any, named: Mapping[str, Any], seen: frozenset[str] = frozenset()) -> bool:
    """Whether the Avro type has a map in it (Arrow gives a map as (key, value) pairs, which
    fastavro writes only as a dict)."""
    if isinstance(schema, str):
        if schema in PRIMITIVES or schema in seen or schema not in named:
            return False
        return _has_maps(named[schema], named, seen | {schema})
    if isinstance(schema, list):
        return any(_has_maps(t, named, seen) for t in schema)
    match schema.get("type"):
        case "map":
            return True
        case "record" | "error":
            return any(_has_maps(f["type"], named, seen) for f in schema["fields"])
        case "array":
            return _has_maps(schema["items"], named, seen)
        case _:
            return False


def _as_dicts(value: Any, schema: Any, named: Mapping[str, Any]) -> Any:
    """``value`` of an Arrow row with each map's (key, value) pairs made a dict."""
    if value is None:
        return None
    if isinstance(schema, str):
        return _as_dicts(value, named[schema], named) if schema in named else value
    if isinstance(schema, list):
        others = [t for t in schema if t != "null"]
        return _as_dicts(value, others[0], named) if len(others) == 1 else value
    match schema.get("type"):
        case "map":
            pairs = value.items() if isinstance(value, Mapping) else value
            return {k: _as_dicts(v, schema["values"], named) for k, v in pairs}
        case "record" | "error" if isinstance(value, Mapping):
            fields = {f["name"]: f["type"] for f in schema["fields"]}
            return {
                k: _as_dicts(v, fields[k], named) if k in fields else v for k, v in value.items()
            }
        case "array" if isinstance(value, list):
            return [_as_dicts(v, schema["items"], named) for v in value]
        case _:
            return value


# ---------------------------------------------------------------------- the registry


Registry = tuple[tuple[str, Any], ...]
"""A ``SchemaRegistryClient``'s configuration (``url`` and the others), hashable."""


def registry_config(registry: str | Mapping[str, Any], where: str) -> Registry:
    """``schema_registry=``: its URL, or the client's settings (``{"url": ...,
    "basic.auth.user.info": ...}``)."""
    config = {"url": registry} if isinstance(registry, str) else dict(registry)
    url = config.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(
            f"{where}: schema_registry must be the registry's URL (http://... or https://...) "
            f"or a dict of its client's settings with one as 'url', not {registry!r:.100}"
        )
    return tuple(sorted(config.items()))


def url(registry: Registry) -> str:
    return str(dict(registry)["url"])


_CLIENTS: dict[Registry, SchemaRegistryClient] = {}
_CLIENTS_LOCK = threading.Lock()


def client(registry: Registry) -> SchemaRegistryClient:
    """This process's client of the registry (one per configuration, kept: it caches the
    schemas it fetched)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    with _CLIENTS_LOCK:
        found = _CLIENTS.get(registry)
        if found is None:
            found = _CLIENTS[registry] = SchemaRegistryClient(dict(registry))
        return found


def _registry_error(registry: Registry, doing: str, exc: Exception) -> RegistryUnavailable:
    return RegistryUnavailable(
        f"the Schema Registry at {url(registry)} failed {doing}: {type(exc).__name__}: {exc}"
    )


def _not_found(exc: Exception) -> bool:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    return isinstance(exc, SchemaRegistryError) and exc.http_status_code == 404


def latest_schema(registry: Registry, subject: str) -> str | None:
    """The text of the latest schema of ``subject`` (``None``: no such subject); a
    :class:`RegistryUnavailable` when the registry does not answer."""
    try:
        found = client(registry).get_latest_version(subject)
    except Exception as exc:
        if _not_found(exc):
            return None
        raise _registry_error(
            registry, f"to give subject {subject!r}'s latest schema", exc
        ) from None
    schema = found.schema
    if schema is None or schema.schema_str is None:
        return None
    _check_avro(schema, f"subject {subject!r}'s latest schema")
    return schema_text(schema.schema_str, f"subject {subject!r}'s latest schema")


def register(registry: Registry, subject: str, text: str) -> int:
    """Register the Avro schema ``text`` under ``subject`` (the same schema again: its id);
    a :class:`RegistryUnavailable` naming the registry's refusal (an incompatible schema)."""
    from confluent_kafka.schema_registry import Schema

    try:
        return int(client(registry).register_schema(subject, Schema(text, "AVRO")))
    except Exception as exc:
        raise _registry_error(registry, f"to register the schema under {subject!r}", exc) from None


def _check_avro(schema: Any, what: str) -> None:
    kind = schema.schema_type or "AVRO"
    if kind != "AVRO":
        raise NotAvro(f"{what} is a {kind} schema, not Avro")
    if schema.references:
        raise NotAvro(f"{what} refers to other schemas (references), which cutline does not read")


def avro_format(
    value_format: Any, schema: Any, registry: str | Mapping[str, Any] | None, where: str
) -> AvroFormat | None:
    """The Avro values ``read_kafka`` or ``write_kafka`` (``where``) were asked for, from
    their arguments: ``None`` for another value format; a ``ValueError`` when the arguments
    do not go together (a registry without Avro values, Avro values without a schema or a
    registry)."""
    if value_format != "avro" and schema is None and registry is None:
        return None
    if value_format != "avro":
        raise ValueError(f"{where}: schema_registry= is for value_format='avro' (Avro values) only")
    if schema is None and registry is None:
        raise ValueError(
            f"{where}: value_format='avro' needs schema= (the Avro schema, a dict or its JSON "
            "text), or schema_registry= (the writer's schema of each record by its id; writing: "
            "the latest of subject '<topic>-value')"
        )
    text = None if schema is None else schema_text(schema, where)
    return AvroFormat(text, None if registry is None else registry_config(registry, where))


# ---------------------------------------------------------------- decoding, encoding


@dataclass(frozen=True)
class AvroFormat:
    """Avro values (picklable: it travels with its source or sink): the reader's schema (the
    writer's too without a registry) and the registry's client settings, if any."""

    schema: str | None
    """The schema as JSON text (``None`` until the job is built: the latest of the topic's
    subject in the registry)."""
    registry: Registry | None = None
    schema_id: int | None = None
    """Writing with a registry: the id the schema is registered under."""

    def arrow_schema(self) -> pa.Schema:
        assert self.schema is not None
        return arrow_schema(self.schema)

    def decode(self, value: bytes) -> dict[str, Any]:
        """The fields of one value; :class:`NotAvro` says why not."""
        return _decoder(self).decode(value)

    def encode(self, row: Mapping[str, Any]) -> bytes:
        """One record's fields (a record schema) or its ``value`` field (another) as Avro, in
        the registry's wire format when there is one; a ``ValueError`` says what does not fit."""
        return _encoder(self).encode(row)


class _Decoder:
    """One process's decoder of an :class:`AvroFormat`: writer schemas parsed once per id."""

    def __init__(self, avro: AvroFormat) -> None:
        assert avro.schema is not None
        self.avro = avro
        self.reader = parsed(avro.schema)
        self.record = isinstance(self.reader, dict) and self.reader.get("type") == "record"
        self.writers: dict[int, Any] = {}
        self.unknown: dict[int, str] = {}
        self.lock = threading.Lock()

    def decode(self, value: bytes) -> dict[str, Any]:
        if self.avro.registry is None:
            body, writer = io.BytesIO(value), self.reader
        else:
            if len(value) < 5 or value[0] != MAGIC:
                raise NotAvro(
                    "its value is not in the Schema Registry's wire format (byte 0, a schema id "
                    f"of 4 bytes, the Avro body): it starts {value[:8]!r}"
                )
            writer = self._writer(int.from_bytes(value[1:5], "big"))
            body = io.BytesIO(value[5:])
        try:
            decoded = fastavro.schemaless_reader(body, writer, self.reader)
        except SchemaResolutionError as exc:
            raise NotAvro(
                f"its writer's schema (id {int.from_bytes(value[1:5], 'big')}) does not resolve "
                f"to the reader's: {exc}"
            ) from None
        except Exception as exc:  # (fastavro raises what the bytes make it: EOF, index, ...)
            raise NotAvro(
                f"its value is not Avro of the schema: {type(exc).__name__}: {exc}"
            ) from None
        left = len(body.getbuffer()) - body.tell()
        if left:
            raise NotAvro(
                f"its value is not Avro of the schema: {left} bytes past the record's end"
            )
        if self.record:
            return decoded  # type: ignore[return-value]
        return {"value": decoded}

    def _writer(self, schema_id: int) -> Any:
        """The writer's schema of id ``schema_id``, parsed; fetched once (the lock held: the
        subtasks of a process wait for one fetch rather than each make one)."""
        with self.lock:
            if schema_id in self.writers:
                return self.writers[schema_id]
            if schema_id in self.unknown:
                raise NotAvro(self.unknown[schema_id])
            registry = self.avro.registry
            assert registry is not None
            try:
                schema = client(registry).get_schema(schema_id)
            except Exception as exc:
                if not _not_found(exc):
                    raise _registry_error(registry, f"to give schema id {schema_id}", exc) from None
                why = f"its schema id {schema_id} is not in the Schema Registry at {url(registry)}"
                self.unknown[schema_id] = why
                raise NotAvro(why) from None
            _check_avro(schema, f"its schema id {schema_id}")
            writer = fastavro.parse_schema(json.loads(schema.schema_str or "null"))
            self.writers[schema_id] = writer
            return writer


class _Encoder:
    def __init__(self, avro: AvroFormat) -> None:
        assert avro.schema is not None
        named: dict[str, Any] = {}
        self.schema = fastavro.parse_schema(json.loads(avro.schema), named_schemas=named)
        self.named = named
        self.record = isinstance(self.schema, dict) and self.schema.get("type") == "record"
        self.maps = _has_maps(self.schema, named)
        self.prefix = b""
        if avro.schema_id is not None:
            self.prefix = bytes([MAGIC]) + avro.schema_id.to_bytes(4, "big")

    def encode(self, row: Mapping[str, Any]) -> bytes:
        datum: Any = row if self.record else row.get("value")
        if self.maps:
            datum = _as_dicts(datum, self.schema, self.named)
        out = io.BytesIO()
        out.write(self.prefix)
        try:
            fastavro.schemaless_writer(out, self.schema, datum)
        except Exception as exc:
            raise ValueError(self._why(datum, exc)) from None
        return out.getvalue()

    def _why(self, datum: Any, exc: Exception) -> str:
        try:
            validate(datum, self.schema, raise_errors=True)
        except Exception as invalid:  # (fastavro's ValidationError names the fields)
            errors = getattr(invalid, "errors", None) or [str(invalid)]
            return f"it does not fit the Avro schema: {'; '.join(map(str, errors))}"
        return f"it does not fit the Avro schema: {type(exc).__name__}: {exc}"


@functools.cache
def _decoder(avro: AvroFormat) -> _Decoder:
    return _Decoder(avro)


@functools.cache
def _encoder(avro: AvroFormat) -> _Encoder:
    return _Encoder(avro)
