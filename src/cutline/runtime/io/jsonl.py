"""JSON-lines input: one object a line, each checked against the job's schema, a line that is not
one refused naming its line."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json

from cutline.runtime.io.rows import (
    Block,
    Refused,
    Rows,
    a_or_an,
    arrow_message,
    cut_blocks,
    cut_records,
    json_blank,
    settle_rows,
    show_value,
    text_blocks,
)


class JsonParser:
    """Parses JSON lines into the job's schema (pyarrow.json; line by line for a block that
    fails)."""

    trim = False
    utf8 = True

    def __init__(self, schema: pa.Schema | None) -> None:
        self.schema = schema
        options: dict[str, Any] = {"unexpected_field_behavior": "infer"}
        self.text: set[str] = set()
        if schema is not None and len(schema):
            # dates and timestamps are read as text and converted with the other formats'
            # rules (pyarrow.json does not convert dates, and reads a time zone its own way)
            read = pa.schema(
                [pa.field(f.name, pa.string()) if _as_text(f.type) else f for f in schema]
            )
            options = {"explicit_schema": read, "unexpected_field_behavior": "ignore"}
            self.text = {
                f.name
                for f in schema
                if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            }
        self.options = options
        self.parse = pa_json.ParseOptions(**options)

    def table(self, data: bytes, parse: Any = None) -> pa.Table:
        size = min(max(len(data) + 1, 1 << 16), 2**31 - 1)
        return pa_json.read_json(
            io.BytesIO(data),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=size),
            parse_options=parse or self.parse,
        )

    def rows(self, block: bytes, first_line: int, lines: bool) -> Rows:
        """The rows of a block: at once (with their lines if ``lines``), or, if it does not
        parse, line by line."""
        if not block.strip():
            return Rows(self._empty())
        try:
            table = self.table(block)
        except (pa.ArrowException, UnicodeDecodeError):
            return self._by_record(cut_records(block, first_line, None, json_blank))
        return self.locate(table, block, first_line) if lines else Rows(table)

    def locate(self, table: pa.Table, block: bytes, first_line: int) -> Rows:
        """The lines of the rows of ``table``, a parse of ``block`` (or, if its lines do not
        agree with it, the block line by line)."""
        records = cut_records(block, first_line, None, json_blank)
        if len(records) == table.num_rows:
            return Rows(table, [r[0] for r in records], [r[1] for r in records])
        return self._by_record(records)

    def _empty(self) -> pa.Table:
        schema = self.options.get("explicit_schema", pa.schema([]))
        return schema.empty_table()

    def normalize(self, raw: bytes) -> tuple[bytes | None, str]:
        """The line as pyarrow reads it (values of text columns that are not text as their
        JSON text), or why it is no JSON object."""
        try:
            value = json.loads(raw.decode())
        except UnicodeDecodeError:
            return None, "not UTF-8 text"
        except ValueError as exc:  # (json.JSONDecodeError)
            column = f" (column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            return None, f"malformed JSON: {message}{column}"
        except RecursionError:
            return None, "malformed JSON: nested too deeply"
        if not isinstance(value, dict):
            return None, f"not a JSON object but {KINDS[kind_of(value)][1]}"
        changed = False
        for name in self.text:
            found = value.get(name)
            if found is not None and not isinstance(found, str):
                value[name] = json.dumps(found)
                changed = True
        return (json.dumps(value).encode() if changed else raw), ""

    def why(self, line: bytes, exc: BaseException) -> str:
        """Why one (normalized) line does not fit the schema: its first column that does not."""
        value = json.loads(line)
        read = self.options.get("explicit_schema")
        for target in read if read is not None else ():
            found = value.get(target.name)
            if found is None:
                continue
            alone = pa_json.ParseOptions(
                explicit_schema=pa.schema([target]), unexpected_field_behavior="ignore"
            )
            try:
                self.table(json.dumps({target.name: found}).encode(), alone)
            except (pa.ArrowException, UnicodeDecodeError):
                assert self.schema is not None
                wanted = self.schema.field(target.name).type
                return f"column {target.name!r}: {show_value(found)} is not {a_or_an(wanted)}"
        return f"cannot read it: {arrow_message(exc)}"

    def _by_record(self, records: list[tuple[int, bytes]]) -> Rows:
        items: list[tuple[int, bytes, bytes]] = []
        bad: list[tuple[int, bytes, str]] = []
        for line, raw in records:
            normal, why = self.normalize(raw)
            if normal is None:
                bad.append((line, raw, why))
            else:
                items.append((line, raw, normal))

        def attempt(group: list[tuple[int, bytes, bytes]]) -> pa.Table:
            try:
                table = self.table(b"\n".join(i[2] for i in group) + b"\n")
            except (pa.ArrowException, UnicodeDecodeError) as exc:
                raise Refused(self.why(group[0][2], exc) if len(group) == 1 else "") from None
            if table.num_rows != len(group):
                raise Refused(f"{table.num_rows} JSON values in one line")
            return table

        return settle_rows(items, attempt, self._empty, bad)


def _as_text(kind: pa.DataType) -> bool:
    """Whether a column of this type is read as text, then converted (see ``conform``)."""
    return bool(pa.types.is_date(kind) or pa.types.is_timestamp(kind))


class JsonKind(StrEnum):
    """What a JSON value is (for what is said of a column whose values are of several)."""

    NUMBER = "number"
    TEXT = "text"
    BOOLEAN = "boolean"
    OBJECT = "object"
    ARRAY = "array"
    NULL = "null"


KINDS: dict[JsonKind, tuple[str, str]] = {
    JsonKind.NUMBER: ("numbers", "a number"),
    JsonKind.TEXT: ("text", "text"),
    JsonKind.BOOLEAN: ("booleans", "a boolean"),
    JsonKind.OBJECT: ("objects", "an object"),
    JsonKind.ARRAY: ("arrays", "an array"),
    JsonKind.NULL: ("nulls", "null"),
}
"""How messages say each kind: of many values, of one."""


def kind_of(value: Any) -> JsonKind:
    """The kind of a value ``json.loads`` made."""
    if value is None:
        return JsonKind.NULL
    if isinstance(value, bool):
        return JsonKind.BOOLEAN
    if isinstance(value, int | float):
        return JsonKind.NUMBER
    if isinstance(value, str):
        return JsonKind.TEXT
    return JsonKind.OBJECT if isinstance(value, dict) else JsonKind.ARRAY


def jsonl_blocks(stream: Any, path: str, schema: pa.Schema, block_size: int) -> Iterator[Block]:
    try:
        blocks = cut_blocks(stream, block_size, None)
        yield from text_blocks(blocks, JsonParser(schema), schema, path)
    finally:
        stream.close()
