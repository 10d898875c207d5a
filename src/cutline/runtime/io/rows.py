"""Blocks of rows read from a file: cut into records at line ends (quotes respected), parsed where
they parse, the rest refused one by one with its reason, and conformed to the job's schema (a
value that does not fit is refused naming its column)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.io.formats import SourceError
from cutline.runtime.io.times import halving, to_timestamps


@dataclass
class Reject:
    before: int
    """How many good rows of its block come before it."""
    where: str
    """``path:line`` (``path, row n`` for Parquet)."""
    record: Any
    """What goes to the dead letters: the line's text (the row for Parquet)."""
    reason: str


@dataclass
class Block:
    """A block of a file, parsed: its good rows in the job's schema, and the rejected ones."""

    batch: pa.RecordBatch
    rejects: list[Reject]
    row: int = 0
    """The next good row to hand out."""
    reject: int = 0
    """The next reject to consume."""

    def reject_due(self) -> Reject | None:
        """The next reject, if it comes before the next good row."""
        if self.reject < len(self.rejects) and self.rejects[self.reject].before <= self.row:
            return self.rejects[self.reject]
        return None


def conform(
    table: pa.Table, schema: pa.Schema, path: str, trim: bool = False, utf8: bool = False
) -> tuple[pa.RecordBatch, dict[int, str]]:
    """``table``'s rows in ``schema``: its columns by name (one it lacks is null, one more is
    left out), each cast to its type (``trim``: text without the spaces around it, for a
    column that is not text; ``utf8``: text checked to be UTF-8, which pyarrow.json does
    not; text to a timestamp: ISO-8601 with a zone or not, :func:`to_timestamps`). Returns
    the rows that fit, and for each row that does not (by index) why. A column whose type
    cannot be cast at all is an error naming the file."""
    rows = table.num_rows
    names = set(table.column_names)
    failed: dict[int, str] = {}
    arrays: list[Any] = []
    for target in schema:
        if target.name not in names:
            arrays.append(pa.nulls(rows, target.type))
            continue
        column = table.column(target.name).combine_chunks()
        if utf8:
            for i in halving(column, _validate):
                failed.setdefault(i, f"column {target.name!r}: not UTF-8 text")
        if column.type == target.type:
            arrays.append(column)
            continue
        if trim and pa.types.is_string(column.type):
            column = pc.utf8_trim_whitespace(column)
        if pa.types.is_timestamp(target.type) and _is_text(column.type):
            stamps, refused = to_timestamps(column.cast(pa.string()), target.type, target.name)
            arrays.append(stamps)
            for i, reason in refused.items():
                value = show_value(column[i].as_py())
                failed.setdefault(i, f"column {target.name!r}: {value} {reason}")
            continue
        arrays.append(column)
        try:
            arrays[-1] = column.cast(target.type)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SourceError(
                f"{path}: column {target.name!r} holds {column.type} values, which cannot be "
                f"read as {target.type} ({exc})"
            ) from exc
        except pa.ArrowInvalid:
            for i in halving(column, _caster(target.type)):
                if i not in failed:
                    value = show_value(column[i].as_py())
                    failed[i] = f"column {target.name!r}: {value} is not {a_or_an(target.type)}"
    if failed:
        keep = np.ones(rows, dtype=bool)
        keep[list(failed)] = False
        mask = pa.array(keep)
        arrays = [
            a.filter(mask) if a.type == t.type else a.filter(mask).cast(t.type)
            for a, t in zip(arrays, schema, strict=True)
        ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema), failed


def _is_text(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _caster(target: pa.DataType) -> Callable[[Any], Any]:
    options = pc.CastOptions.safe(target)
    return lambda part: pc.call_function("cast", [part], options)


def _validate(part: Any) -> None:
    part.validate(full=True)


def show_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def a_or_an(kind: pa.DataType) -> str:
    name = str(kind)
    return ("an " if name[:1] in ("a", "e", "i", "o") else "a ") + name


@dataclass
class Rows:
    """Rows of a block before the schema is applied, with where each comes from (``lines``,
    ``texts``: ``None`` when not worked out), and the records rejected while parsing."""

    table: pa.Table
    lines: list[int] | None = None
    texts: list[bytes] | None = None
    bad: list[tuple[int, bytes, str]] = field(default_factory=list)


def assemble(rows: Rows, batch: pa.RecordBatch, failed: dict[int, str], path: str) -> Block:
    """The block of ``rows`` (conformed: ``batch``, ``failed``), every rejected record placed
    among the good rows by its line."""
    bad = list(rows.bad)
    good_lines: list[int] = []
    if failed or bad:
        assert rows.lines is not None and rows.texts is not None
        for i, reason in failed.items():
            bad.append((rows.lines[i], rows.texts[i], reason))
        good_lines = [line for i, line in enumerate(rows.lines) if i not in failed]
    rejects = [
        Reject(bisect.bisect_left(good_lines, line), f"{path}:{line}", _text(text), reason)
        for line, text, reason in sorted(bad, key=lambda b: b[0])
    ]
    return Block(batch, rejects)


def _text(record: bytes) -> str:
    return record.decode("utf-8", errors="replace").removesuffix("\r")


def cut_blocks(
    stream: Any, size: int, quote: bytes | None, limit: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """The file in blocks of whole records, each with the number of its first line. A record
    ends at a line break outside quotes (RFC 4180: a quote inside a quoted value is doubled,
    so a record is whole where the quotes are even). With ``limit``, at most that many bytes
    are read and the last incomplete record is left out (a sample)."""
    line, rest, read, first = 1, b"", 0, True
    while True:
        want = size if limit is None else min(size, limit - read)
        if first:  # (at least the 3 bytes of a UTF-8 byte order mark, left out)
            chunk = stream.read(max(want, 3))
            read, first = len(chunk), False
            chunk = chunk.removeprefix(b"\xef\xbb\xbf")
        else:
            chunk = stream.read(want) if want > 0 else b""
            read += len(chunk)
        if not chunk:
            if rest and (limit is None or read < limit):
                yield line, rest
            return
        data = rest + chunk
        end = _record_end(data, quote)
        if end == 0:
            rest = data
            continue
        yield line, data[:end]
        line += data.count(b"\n", 0, end)
        rest = data[end:]


def _record_end(data: bytes, quote: bytes | None) -> int:
    """Where the last whole record of ``data`` ends (after its line break), or 0."""
    pos = data.rfind(b"\n")
    if pos < 0 or quote is None:
        return pos + 1
    odd = data.count(quote, 0, pos) % 2
    while odd:
        previous = data.rfind(b"\n", 0, pos)
        if previous < 0:
            return 0
        odd ^= data.count(quote, previous, pos) % 2
        pos = previous
    return pos + 1


def cut_records(
    block: bytes, first_line: int, quote: bytes | None, blank: Callable[[bytes], bool]
) -> list[tuple[int, bytes]]:
    """The records of a block with the line each starts on; blank lines are no records."""
    records: list[tuple[int, bytes]] = []
    lines = block.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    start, parts = -1, []
    for n, text in enumerate(lines):
        if start >= 0:  # inside a quoted value
            parts.append(text)
            if text.count(quote) % 2:  # type: ignore[arg-type]
                records.append((start, b"\n".join(parts)))
                start = -1
        elif blank(text):
            continue
        elif quote is not None and text.count(quote) % 2:
            start, parts = first_line + n, [text]
        else:
            records.append((first_line + n, text))
    if start >= 0:
        records.append((start, b"\n".join(parts)))
    return records


def csv_blank(line: bytes) -> bool:
    return line in (b"", b"\r")  # as pyarrow.csv: only lines without a character are skipped


def json_blank(line: bytes) -> bool:
    return not line.strip()


class Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def settle(
    items: list[Any], attempt: Callable[[list[Any]], Any]
) -> list[tuple[list[Any], Any, str | None]]:
    """``items`` in runs that ``attempt`` accepts (with its result) and single items it
    refuses (with the reason), in order: the run is halved until it is accepted or one item."""
    settled: list[tuple[list[Any], Any, str | None]] = []

    def visit(lo: int, hi: int) -> None:
        group = items[lo:hi]
        try:
            settled.append((group, attempt(group), None))
            return
        except Refused as refused:
            if hi - lo == 1:
                settled.append((group, None, refused.reason))
                return
        middle = (lo + hi) // 2
        visit(lo, middle)
        visit(middle, hi)

    if items:
        visit(0, len(items))
    return settled


def settle_rows(
    records: list[Any],
    attempt: Callable[[list[Any]], pa.Table],
    empty: Callable[[], pa.Table],
    refused: Iterable[tuple[int, bytes, str]] = (),
) -> Rows:
    """The rows of ``records`` (tuples of a line number, its text, then what ``attempt``
    parses) when a block did not parse whole: :func:`settle` finds the runs ``attempt`` turns
    into a table and the records it refuses, which follow those ``refused`` before (line,
    text, reason). The tables are joined in order, each row knowing its line and text;
    ``empty()`` is the table when no record parsed."""
    bad = list(refused)
    tables: list[pa.Table] = []
    lines: list[int] = []
    texts: list[bytes] = []
    for group, table, reason in settle(records, attempt):
        if reason is None:
            tables.append(table)
            lines += [record[0] for record in group]
            texts += [record[1] for record in group]
        else:
            bad.append((group[0][0], group[0][1], reason))
    table = pa.concat_tables(tables) if tables else empty()
    return Rows(table, lines, texts, bad)


class TextParser(Protocol):
    """A text format's parser (CSV, JSON lines): rows of a block, and where each came from."""

    trim: bool
    utf8: bool

    def rows(self, block: bytes, first_line: int, lines: bool) -> Rows: ...

    def locate(self, table: pa.Table, block: bytes, first_line: int) -> Rows: ...


def arrow_message(exc: BaseException) -> str:
    return str(exc).strip().replace("\n", " ")


def text_blocks(
    blocks: Iterator[tuple[int, bytes]], parser: TextParser, schema: pa.Schema, path: str
) -> Iterator[Block]:
    """The parsed blocks of a CSV or JSON-lines file: a block whose rows all fit the schema
    at once stays vectorized; only a block with a rejected row is looked at row by row."""
    for line, block in blocks:
        rows = parser.rows(block, line, lines=False)
        batch, failed = conform(rows.table, schema, path, parser.trim, parser.utf8)
        if not failed and not rows.bad:
            yield Block(batch, [])
            continue
        if rows.lines is None:  # where the rows come from, from the same parse if it can
            located = parser.locate(rows.table, block, line)
            if located.table is not rows.table:
                batch, failed = conform(located.table, schema, path, parser.trim, parser.utf8)
            rows = located
        yield assemble(rows, batch, failed, path)
