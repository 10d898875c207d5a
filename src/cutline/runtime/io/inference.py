"""The schema of a file input, when the user gave none: inferred on the driver from the head of
every file, one for the whole input, with notes on what was decided (a column of numbers and
text, a widened type)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cutline.runtime.io.csv import CsvFile, CsvParser
from cutline.runtime.io.formats import (
    SAMPLE_BYTES,
    SAMPLE_LEAST,
    SAMPLE_ROWS,
    SAMPLE_TOTAL,
    CsvOptions,
    FileInput,
    SourceError,
)
from cutline.runtime.io.jsonl import KINDS, JsonParser, kind_of
from cutline.runtime.io.rows import Refused, cut_blocks, cut_records, json_blank, settle, show_value


def infer_schema(source: FileInput, files: list[str]) -> tuple[pa.Schema, list[str]]:
    fs, _ = source.filesystem()
    budget = max(SAMPLE_LEAST, min(SAMPLE_BYTES, SAMPLE_TOTAL // max(len(files), 1)))
    if source.format == "parquet":
        return _infer_parquet(fs, files), []
    if source.format == "csv":
        return _infer_csv(source.csv, fs, files, budget)
    return _infer_jsonl(fs, files, budget)


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


def _infer_parquet(fs: Any, files: list[str]) -> pa.Schema:
    merged: dict[str, tuple[pa.DataType, str]] = {}
    for path in files:
        for column in parquet_schema(fs, path):
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
    return pa.schema([(name, kind) for name, (kind, _) in merged.items()])


_LADDER = (
    pa.int64(),
    pa.float64(),
    pa.bool_(),
    pa.date32(),
    pa.timestamp("us"),
    pa.timestamp("us", tz="UTC"),
)

_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"


def _text_type(values: pa.ChunkedArray) -> pa.DataType:
    """The first of int64, double, bool, date32, timestamp[us] (without, then with a time
    zone) that every value casts to; else string (also when there are none)."""
    present = pc.utf8_trim_whitespace(values.drop_null())
    if len(present) == 0:
        return pa.string()
    for kind in _LADDER:
        try:
            present.cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        return kind
    return pa.string()


@dataclass
class _Sampled:
    """The values of one column in the samples, file by file, with their lines."""

    parts: list[tuple[str, Any, list[int]]] = field(default_factory=list)


def _infer_csv(
    options: CsvOptions, fs: Any, files: list[str], budget: int
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
    """``schema={...}`` with the columns of ``changed`` of its types."""
    if len(schema) > 8:
        changes = ", ".join(f"{n!r}: {k!r}" for n, k in changed.items())
        return f"schema= with {{{changes}}} and the other columns' types"
    types = ", ".join(f"{f.name!r}: {changed.get(f.name, str(f.type))!r}" for f in schema)
    return f"schema={{{types}}}"


def _infer_jsonl(fs: Any, files: list[str], budget: int) -> tuple[pa.Schema, list[str]]:
    merged: dict[str, pa.DataType | None] = {}  # None: a conflict
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
        for schema in _json_schemas(records):
            for column in schema:
                if column.name not in merged:
                    merged[column.name] = column.type
                else:
                    before = merged[column.name]
                    merged[column.name] = None if before is None else _unify(before, column.type)
    fields = [pa.field(name, _settled(kind or pa.string())) for name, kind in merged.items()]
    schema = pa.schema(fields)
    conflicts = [name for name, kind in merged.items() if kind is None]
    return schema, _kinds_notes(schema, conflicts, samples) if conflicts else []


def _json_schemas(records: list[tuple[int, bytes]]) -> list[pa.Schema]:
    """The schemas pyarrow infers for the records (for runs of them, if not all agree);
    records that are no JSON object are left out."""
    if not records:
        return []
    parser = JsonParser(None)
    try:
        return [parser.table(b"\n".join(r[1] for r in records) + b"\n").schema]
    except (pa.ArrowException, UnicodeDecodeError):
        pass
    normal = [n for n, _ in (parser.normalize(r[1]) for r in records) if n is not None]

    def attempt(group: list[bytes]) -> pa.Schema:
        try:
            return parser.table(b"\n".join(group) + b"\n").schema
        except (pa.ArrowException, UnicodeDecodeError):
            raise Refused("") from None

    return [schema for _, schema, reason in settle(normal, attempt) if reason is None]


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
    seen: dict[str, dict[str, tuple[Any, str, int]]] = {name: {} for name in conflicts}
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
                if kind == "null":
                    continue
                seen[name].setdefault(kind, (found, path, line))
                if kind == "number" and not isinstance(found, int):
                    numbers[name] = False
    notes = []
    for name in conflicts:
        kinds = seen[name]
        if len(kinds) < 2:
            continue  # text of several looks (timestamps and other text): text it is
        if "number" in kinds and "text" in kinds:
            value, path, line = kinds["text"]
            kind = "int64" if numbers[name] else "double"
            notes.append(_mixed_note(schema, name, kind, value, path, line))
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
