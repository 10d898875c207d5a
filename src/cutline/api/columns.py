"""The columns a stream's records have, when the job knows them as it is built, and the checks
that use them: a key, a field to sum, an event-time column that is not there (or not of a
type that works) is refused when the job is built, naming the columns there are, instead of
failing the job on its first record.

A source that knows its records' schema before reading (``Source.record_schema()``: the file
sources, ``from_sequence``, Kafka with a value schema) gives its stream one; operators that
keep the records' columns keep it (``filter``, ``key_by``, ``assign_timestamps`` of a
column, a union of streams of one schema, the rolling aggregations), the built-in window
aggregations make theirs; any other operator (``map``, a user's function) makes it unknown,
and nothing is checked after it.
"""

from __future__ import annotations

import pyarrow as pa

from cutline.runtime.eventtime.timestamps import TimeColumn


def has_column(schema: pa.Schema | None, column: str, what: str) -> None:
    """Refuse ``column`` when the records are known not to have it."""
    if schema is not None and schema.get_field_index(column) < 0:
        raise ValueError(
            f"{what}: the records have no column {column!r} (columns: "
            f"{', '.join(schema.names) or 'none'})"
        )


def numeric_column(schema: pa.Schema | None, column: str, what: str, kind: str) -> None:
    """Refuse ``column`` when the records are known not to have it, or to hold no numbers
    (``kind``: the aggregation that needs numbers)."""
    has_column(schema, column, what)
    if schema is None:
        return
    found = schema.field(column).type
    if not (pa.types.is_integer(found) or pa.types.is_floating(found)):
        numbers = [
            f.name for f in schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
        ]
        raise ValueError(
            f"{what}: column {column!r} is {found}, but {kind} needs numbers (numeric "
            f"columns: {', '.join(numbers) or 'none'})"
        )


def check_flat(schema: pa.Schema | None, what: str) -> None:
    """Refuse records known to hold nested values (lists, dicts), which CSV cannot write."""
    if schema is None:
        return
    nested = [f.name for f in schema if pa.types.is_nested(f.type)]
    if nested:
        raise ValueError(
            f"{what}: CSV holds no nested values, and column {nested[0]!r} is "
            f"{schema.field(nested[0]).type} (write_parquet or write_jsonl keep them)"
        )


def with_count(schema: pa.Schema | None) -> pa.Schema | None:
    """The columns of a rolling ``count``: the records' and ``count``."""
    if schema is None:
        return None
    if schema.get_field_index("count") >= 0:
        return schema.set(schema.get_field_index("count"), pa.field("count", pa.int64()))
    return schema.append(pa.field("count", pa.int64()))


def with_float(schema: pa.Schema | None, column: str) -> pa.Schema | None:
    """The columns of a rolling ``mean`` of ``column``: the records', that one a float."""
    if schema is None or schema.get_field_index(column) < 0:
        return schema
    return schema.set(schema.get_field_index(column), pa.field(column, pa.float64()))


def window_result_schema(
    schema: pa.Schema | None, key: object, kind: str, field: str | None, time: TimeColumn
) -> pa.Schema | None:
    """The columns of a built-in window aggregation's results: the key (a key column's
    type), ``window_start`` and ``window_end`` (the event-time column's type) and the result
    (``count``, or the field: integers as int64, numbers with a fraction and means as
    float64)."""
    if schema is None or not isinstance(key, str) or schema.get_field_index(key) < 0:
        return None
    times = time.to_column([]).type
    if kind == "count":
        result = pa.field("count", pa.int64())
    else:
        assert field is not None
        floating = pa.types.is_floating(schema.field(field).type)
        result = pa.field(field, pa.float64() if kind == "mean" or floating else pa.int64())
    key_field = pa.field(key, schema.field(key).type)
    names = [key_field, pa.field("window_start", times), pa.field("window_end", times), result]
    return pa.schema(names)
