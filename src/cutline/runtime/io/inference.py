"""The schema of a file input, when the user gave none (or only some columns' types): inferred
on the driver from the head of every file, one for the whole input, with notes on what was
decided (a column of numbers and text, a widened type).

Text of ISO-8601 date-times (``2024-05-01T12:00:30Z``, ``2024-05-01T12:00:30.5+02:00``,
``2024-05-01 12:00:31``, mixed in one column: :mod:`cutline.runtime.io.times`) is inferred
as ``timestamp[us]``, in CSV as in JSON-lines: UTC wall times without a time zone (an offset
shifted to UTC, a value without a zone taken as UTC), which is how pyarrow.json reads such
text and how event time reads a column without a time zone; ``timestamp[ns]`` when a value
has more digits of a second than microseconds hold. ``schema={"ts": "timestamp[us,
tz=UTC]"}`` reads the same instants with a time zone."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cutline.connectors.source import with_types
from cutline.runtime.io.csv import CsvFile, CsvParser
from cutline.runtime.io.formats import (
    SAMPLE_BYTES,
    SAMPLE_LEAST,
    SAMPLE_ROWS,
    SAMPLE_TOTAL,
    CsvOptions,
    SourceError,
)
from cutline.runtime.io.jsonl import KINDS, JsonKind, JsonParser, kind_of
from cutline.runtime.io.parquet import check_castable
from cutline.runtime.io.rows import Refused, cut_blocks, cut_records, json_blank, settle, show_value
from cutline.runtime.io.times import DIGITS, time_unit

Sampler: TypeAlias = Callable[[Any, list[str], int, pa.Schema], tuple[pa.Schema, list[str]]]
"""A format's schema of the heads of files: ``(fs, files, budget, types)`` -> the schema and
notes, each file sampled up to ``budget`` bytes, the columns of ``types`` of their types
(:meth:`~cutline.runtime.io.file_formats.InputFormat.sample`)."""


def infer_schema(
    sample: Sampler, fs: Any, files: list[str], types: pa.Schema | None
) -> tuple[pa.Schema, list[str]]:
    """The schema of ``files`` as a format ``sample`` s them, and notes for the user. The
    columns of ``types`` (a ``schema=`` dict) have the types given, and are added after the
    others (with a note) when no file has them."""
    budget = max(SAMPLE_LEAST, min(SAMPLE_BYTES, SAMPLE_TOTAL // max(len(files), 1)))
    given = types if types is not None else pa.schema([])
    schema, notes = sample(fs, files, budget, given)
    return _with_types(schema, given, files, notes)


def _with_types(
    schema: pa.Schema, types: pa.Schema, files: list[str], notes: list[str]
) -> tuple[pa.Schema, list[str]]:
    """``schema`` with the columns of ``types`` of their types; those it lacks added at its
    end, with a note when there were files to find them in."""
    missing = [f for f in types if f.name not in schema.names]
    if missing and files:
        names = ", ".join(repr(f.name) for f in missing)
        notes = [
            *notes,
            f"schema= gives the type of {names}, which the heads of the {len(files)} input "
            f"file(s) do not have (their columns: {', '.join(schema.names) or 'none'}): it is "
            "read as null where a row lacks it",
        ]
    return with_types(schema, types), notes


def _sample(fs: Any, path: str) -> Any:
    try:
        return fs.open(path, "rb")
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _unify(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """One type for values of types ``a`` and ``b`` (int64 and double: double; null and any:
    the other; structs field by field), or ``None``: a real conflict."""
    if a == b:
        return a
    try:
        merged = pa.unify_schemas(
            [pa.schema([("c", a)]), pa.schema([("c", b)])], promote_options="permissive"
        )
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return merged.field(0).type


def parquet_schema(fs: Any, path: str) -> pa.Schema:
    """A Parquet file's schema, from its footer."""
    stream = _sample(fs, path)
    try:
        return pq.read_schema(stream)
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{path} is not a valid parquet file: {exc}") from exc
    finally:
        stream.close()


def infer_parquet(
    fs: Any, files: list[str], budget: int, types: pa.Schema
) -> tuple[pa.Schema, list[str]]:
    """The union of the files' schemas, each column's types unified; a column of ``types``
    is not unified but checked to cast from every file's type."""
    merged: dict[str, tuple[pa.DataType, str]] = {}
    for path in files:
        present = parquet_schema(fs, path)
        check_castable(present, types, path)
        for column in present:
            if column.name in types.names:
                merged.setdefault(column.name, (types.field(column.name).type, path))
                continue
            if column.name not in merged:
                merged[column.name] = (column.type, path)
                continue
            kind, first = merged[column.name]
            unified = _unify(kind, column.type)
            if unified is None:
                raise SourceError(
                    f"column {column.name!r} is {kind} in {first} but {column.type} in {path}: "
                    "give schema= to read every file with one type (a file whose column cannot "
                    "be cast to it is an error; rows whose values do not fit are rejected)"
                )
            merged[column.name] = (unified, first)
    return pa.schema([(name, kind) for name, (kind, _) in merged.items()]), []


_LADDER = (pa.int64(), pa.float64(), pa.bool_(), pa.date32())

_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"


def _text_type(values: pa.ChunkedArray) -> pa.DataType:
    """The first of int64, double, bool and date32 that every value casts to, else
    timestamp[us] (or [ns]) when every value is an ISO-8601 date or date-time, with a zone
    or not (see the module); else string (also when there are none)."""
    present = pc.utf8_trim_whitespace(values.drop_null())
    if len(present) == 0:
        return pa.string()
    for kind in _LADDER:
        try:
            present.cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        return kind
    unit = time_unit(present.combine_chunks())
    return pa.string() if unit is None else pa.timestamp(unit)


@dataclass
class _Sampled:
    """The values of one column in the samples, file by file, with their lines."""

    parts: list[tuple[str, Any, list[int]]] = field(default_factory=list)


def infer_csv(
    options: CsvOptions, fs: Any, files: list[str], budget: int, types: pa.Schema
) -> tuple[pa.Schema, list[str]]:
    columns: dict[str, _Sampled] = {}
    for path in files:
        stream = _sample(fs, path)
        try:
            file = CsvFile(stream, path, options, budget, limit=budget)
            csv = CsvParser(options, file.names)
            for line, block in file:
                rows = csv.rows(block, line, lines=True)
                assert rows.lines is not None
                table = rows.table.slice(0, SAMPLE_ROWS)
                for name in file.names:
                    sampled = columns.setdefault(name, _Sampled())
                    sampled.parts.append((path, table.column(name), rows.lines))
            for name in file.names:
                columns.setdefault(name, _Sampled())
        finally:
            stream.close()
    fields, mixed = [], {}
    for name, sampled in columns.items():
        if name in types.names:
            fields.append(types.field(name))
            continue
        chunks = [c for _, values, _ in sampled.parts for c in values.chunks]
        kind = _text_type(pa.chunked_array(chunks, pa.string()))
        fields.append(pa.field(name, kind))
        if kind == pa.string():
            found = _numbers_and_text(sampled)
            if found is not None:
                mixed[name] = found
    schema = pa.schema(fields)
    return schema, [_mixed_note(schema, name, *found) for name, found in mixed.items()]


def _numbers_and_text(sampled: _Sampled) -> tuple[str, Any, str, int] | None:
    """For a text column holding numbers too: the numbers' type, and its first value that
    is not a number with its file and line."""
    numbers: list[Any] = []
    example: tuple[Any, str, int] | None = None
    for path, values, lines in sampled.parts:
        trimmed = pc.utf8_trim_whitespace(values.combine_chunks())
        number = pc.match_substring_regex(trimmed, _NUMBER)
        numbers.append(trimmed.filter(number))
        if example is None:
            text = pc.and_(pc.invert(number), pc.is_valid(trimmed))
            found = pc.index(text, True).as_py()
            if found >= 0:
                example = (values[found].as_py(), path, lines[found])
    if example is None or not sum(len(n) for n in numbers):
        return None
    every = pa.chunked_array(numbers, pa.string())
    try:
        every.cast(pa.int64())
        kind = "int64"
    except pa.ArrowInvalid:
        kind = "double"
    return (kind, *example)


def _mixed_note(schema: pa.Schema, name: str, kind: str, value: Any, path: str, line: int) -> str:
    return (
        f"column {name!r} mixes numbers and text ({show_value(value)} at {path}:{line}): it is read "
        "as text (so sum, min and max would work on strings). To read it as numbers, give "
        f"{_suggest(schema, {name: kind})}: the rows whose value is not a number are then "
        "rejected (sent to the dead letters with on_error='dead_letter')"
    )


def _suggest(schema: pa.Schema, changed: dict[str, str]) -> str:
    """``schema={...}`` with the columns of ``changed`` of its types: every column's when
    there are few (to see them all), else those of ``changed`` only (a dict sets the types of
    the columns it names, the others inferred as now)."""
    if len(schema) > 8:
        changes = ", ".join(f"{n!r}: {k!r}" for n, k in changed.items())
        return f"schema={{{changes}}}"
    types = ", ".join(f"{f.name!r}: {changed.get(f.name, str(f.type))!r}" for f in schema)
    return f"schema={{{types}}}"


def infer_jsonl(
    fs: Any, files: list[str], budget: int, types: pa.Schema
) -> tuple[pa.Schema, list[str]]:
    merged: dict[str, pa.DataType | None] = {}  # None: a conflict
    times = _Times()
    samples: list[tuple[str, list[tuple[int, bytes]]]] = []
    for path in files:
        stream = _sample(fs, path)
        try:
            records: list[tuple[int, bytes]] = []
            for line, block in cut_blocks(stream, budget, None, limit=budget):
                records += cut_records(block, line, None, json_blank)
            records = records[:SAMPLE_ROWS]
        finally:
            stream.close()
        samples.append((path, records))
        for table in _json_tables(records):
            times.see(table)
            for column in table.schema:
                if column.name not in merged:
                    merged[column.name] = column.type
                else:
                    before = merged[column.name]
                    merged[column.name] = None if before is None else _unify(before, column.type)
    fields = []
    for name, kind in merged.items():
        unit = times.unit(name)
        if name in types.names:
            fields.append(types.field(name))
        elif unit is not None:
            fields.append(pa.field(name, pa.timestamp(unit)))
        else:
            fields.append(pa.field(name, _settled(kind or pa.string())))
    schema = pa.schema(fields)
    conflicts = [
        name
        for name, kind in merged.items()
        if kind is None and name not in types.names and times.unit(name) is None
    ]
    return schema, _kinds_notes(schema, conflicts, samples) if conflicts else []


class _Times:
    """Which JSON-lines columns are times: those whose every value in the samples is text
    of an ISO-8601 date-time, or one that pyarrow.json read as a timestamp (it reads those
    to whole seconds, and leaves the others, and mixed columns, as text)."""

    def __init__(self) -> None:
        self.units: dict[str, str | None] = {}
        """Per column, the unit its text needs so far (``None``: it is not all times)."""

    def see(self, table: pa.Table) -> None:
        for column in table.schema:
            kind = column.type
            if pa.types.is_null(kind):
                continue
            if self.units.get(column.name, "us") is None:
                continue
            unit: str | None = None
            if pa.types.is_timestamp(kind):
                unit = "us"
            elif pa.types.is_string(kind):
                unit = time_unit(table.column(column.name).drop_null().combine_chunks())
            before = self.units.get(column.name)  # (not seen yet, or a unit)
            if unit is not None and before is not None and DIGITS[before] > DIGITS[unit]:
                unit = before
            self.units[column.name] = unit

    def unit(self, name: str) -> str | None:
        """The unit of column ``name`` when it is a column of times, else ``None``."""
        return self.units.get(name)


def _json_tables(records: list[tuple[int, bytes]]) -> list[pa.Table]:
    """The tables pyarrow makes of the records, with the types it infers (for runs of them,
    if not all agree); records that are no JSON object are left out."""
    if not records:
        return []
    parser = JsonParser(None)
    try:
        return [parser.table(b"\n".join(r[1] for r in records) + b"\n")]
    except (pa.ArrowException, UnicodeDecodeError):
        pass
    normal = [n for n, _ in (parser.normalize(r[1]) for r in records) if n is not None]

    def attempt(group: list[bytes]) -> pa.Table:
        try:
            return parser.table(b"\n".join(group) + b"\n")
        except (pa.ArrowException, UnicodeDecodeError):
            raise Refused("") from None

    return [table for _, table, reason in settle(normal, attempt) if reason is None]


def _settled(kind: pa.DataType) -> pa.DataType:
    """An inferred type made safe for values beyond the sample: null (nothing seen) is text,
    timestamps are microseconds (pyarrow infers seconds from values without fractions)."""
    if pa.types.is_null(kind):
        return pa.string()
    if pa.types.is_timestamp(kind):
        return pa.timestamp("us", tz=kind.tz)
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _settled(f.type)) for f in kind])
    if pa.types.is_list(kind):
        return pa.list_(_settled(kind.value_type))
    if pa.types.is_large_list(kind):
        return pa.large_list(_settled(kind.value_type))
    return kind


def _kinds_notes(
    schema: pa.Schema, conflicts: list[str], samples: list[tuple[str, list[tuple[int, bytes]]]]
) -> list[str]:
    """For each column read as text because its values do not fit one type: a note when they
    are of different kinds (numbers and text, ...), with an example."""
    seen: dict[str, dict[JsonKind, tuple[Any, str, int]]] = {name: {} for name in conflicts}
    numbers: dict[str, bool] = dict.fromkeys(conflicts, True)  # all whole numbers
    for path, records in samples:
        for line, raw in records:
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            if not isinstance(value, dict):
                continue
            for name in conflicts:
                found = value.get(name)
                kind = kind_of(found)
                if kind is JsonKind.NULL:
                    continue
                seen[name].setdefault(kind, (found, path, line))
                if kind is JsonKind.NUMBER and not isinstance(found, int):
                    numbers[name] = False
    notes = []
    for name in conflicts:
        kinds = seen[name]
        if len(kinds) < 2:
            continue  # text of several looks (timestamps and other text): text it is
        if JsonKind.NUMBER in kinds and JsonKind.TEXT in kinds:
            value, path, line = kinds[JsonKind.TEXT]
            numeric = "int64" if numbers[name] else "double"
            notes.append(_mixed_note(schema, name, numeric, value, path, line))
            continue
        second = list(kinds)[1]
        value, path, line = kinds[second]
        described = " and ".join(KINDS[k][0] for k in kinds)
        notes.append(
            f"column {name!r} mixes {described} ({show_value(value)} at {path}:{line}): it is read "
            "as text (values that are not text as their JSON text); give schema= to read it "
            "as one type, the rows that do not fit being rejected"
        )
    return notes
