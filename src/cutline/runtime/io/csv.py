"""CSV input: blocks of a file parsed by pyarrow with the job's options, a row that does not parse
refused naming its line."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv

from cutline.runtime.io.formats import CsvOptions, SourceError, first_duplicate
from cutline.runtime.io.rows import (
    Block,
    Refused,
    Rows,
    arrow_message,
    csv_blank,
    cut_blocks,
    cut_records,
    settle_rows,
    text_blocks,
)


class CsvParser:
    """Parses CSV records as text, one column per name, with the user's options."""

    trim = True
    utf8 = False  # (pyarrow.csv checks it)

    def __init__(self, options: CsvOptions, names: list[str]) -> None:
        self.names = names
        self.quote = options.quote.encode() if options.quote else None
        self.options = options
        self.read_options = pa_csv.ReadOptions(column_names=names, use_threads=False)
        self.convert = pa_csv.ConvertOptions(
            column_types={n: pa.string() for n in names},
            null_values=list(options.null_values),
            strings_can_be_null=True,
            quoted_strings_can_be_null=True,
        )

    def strings(self, data: bytes) -> tuple[pa.Table, list[Any]]:
        """The records of ``data`` as text, and the malformed ones (pyarrow's ``InvalidRow``)."""
        invalid: list[Any] = []

        def handler(row: Any) -> str:
            invalid.append(row)
            return "skip"

        if not data.strip(b"\r\n"):
            return pa.table({n: pa.array([], pa.string()) for n in self.names}), invalid
        table = pa_csv.read_csv(
            io.BytesIO(data),
            read_options=self.read_options,
            parse_options=_csv_parse_options(self.options, handler),
            convert_options=self.convert,
        )
        return table, invalid

    def rows(self, block: bytes, first_line: int, lines: bool) -> Rows:
        """The rows of a block as text, at once (with the line of each row if ``lines`` or
        when some are malformed: pyarrow numbers those by record, which places them); when
        pyarrow and the records of :func:`cut_records` do not agree, record by record."""
        records: list[tuple[int, bytes]] | None = None
        try:
            table, invalid = self.strings(block)
        except (pa.ArrowException, UnicodeDecodeError):
            table, invalid = None, []
        if table is not None:
            if not invalid and not lines:
                return Rows(table)
            records = cut_records(block, first_line, self.quote, csv_blank)
            placed = self._place(table, invalid, records)
            if placed is not None:
                return placed
        return self._by_record(records or cut_records(block, first_line, self.quote, csv_blank))

    def locate(self, table: pa.Table, block: bytes, first_line: int) -> Rows:
        """The lines of the rows of ``table``, a clean parse of ``block`` (or, if its records
        do not agree with it, the block record by record)."""
        records = cut_records(block, first_line, self.quote, csv_blank)
        return self._place(table, [], records) or self._by_record(records)

    def _place(
        self, table: pa.Table, invalid: list[Any], records: list[tuple[int, bytes]]
    ) -> Rows | None:
        """The rows of ``table`` and the ``invalid`` ones among ``records``, or ``None`` if
        they do not add up (a record pyarrow reads otherwise)."""
        if len(records) != table.num_rows + len(invalid):
            return None
        malformed: dict[int, str] = {}
        for row in invalid:
            index = (row.number or 0) - 1
            if not 0 <= index < len(records) or index in malformed:
                return None
            if row.text.encode() != records[index][1].removesuffix(b"\r"):
                return None
            malformed[index] = _fields(row)
        good = [r for i, r in enumerate(records) if i not in malformed]
        bad = [(records[i][0], records[i][1], why) for i, why in sorted(malformed.items())]
        return Rows(table, [r[0] for r in good], [r[1] for r in good], bad)

    def _by_record(self, records: list[tuple[int, bytes]]) -> Rows:
        def attempt(group: list[tuple[int, bytes]]) -> pa.Table:
            try:
                table, invalid = self.strings(b"\n".join(r[1] for r in group) + b"\n")
            except (pa.ArrowException, UnicodeDecodeError) as exc:
                raise Refused(f"not valid CSV: {arrow_message(exc)}") from None
            if invalid:
                raise Refused(_fields(invalid[0]))
            if table.num_rows != len(group):
                raise Refused(f"{table.num_rows} CSV records in one line")
            return table

        return settle_rows(records, attempt, lambda: self.strings(b"")[0])


def _fields(row: Any) -> str:
    """Why pyarrow found a CSV record malformed."""
    return f"{row.actual_columns} field(s) where the columns are {row.expected_columns}"


def _csv_parse_options(options: CsvOptions, handler: Any = None) -> Any:
    return pa_csv.ParseOptions(
        delimiter=options.delimiter,
        quote_char=options.quote or False,
        newlines_in_values=options.quote is not None,
        invalid_row_handler=handler,
    )


class CsvFile:
    """A CSV file's columns (from its header, the user's names, or its first record's
    width) and its blocks after the header."""

    def __init__(
        self, stream: Any, path: str, options: CsvOptions, size: int, limit: int | None = None
    ) -> None:
        quote = options.quote.encode() if options.quote else None
        self.blocks = cut_blocks(stream, size, quote, limit)
        self.first: tuple[int, bytes] | None = None  # what is left of the block of the header
        record, record_line = None, 0
        for line, block in self.blocks:
            record, record_line, rest_line, rest = _first_record(block, line, quote)
            if record is not None:
                self.first = (rest_line, rest) if options.header else (line, block)
                break
        self.names: list[str] = []
        if options.column_names is not None:
            self.names = list(options.column_names)
        elif record is not None:
            parse = _csv_parse_options(options)
            try:
                head = pa_csv.read_csv(
                    io.BytesIO(record + b"\n"),
                    read_options=pa_csv.ReadOptions(
                        use_threads=False, autogenerate_column_names=not options.header
                    ),
                    parse_options=parse,
                )
            except (pa.ArrowException, UnicodeDecodeError) as exc:
                what = "header" if options.header else "first record"
                raise SourceError(
                    f"{path}:{record_line}: cannot read its {what}: {arrow_message(exc)}"
                ) from exc
            self.names = list(head.column_names)
            twice = first_duplicate(self.names)
            if twice is not None:
                raise SourceError(f"{path}:{record_line}: the header names {twice!r} twice")

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        if self.first is not None and self.first[1]:
            yield self.first
        yield from self.blocks


def _first_record(
    block: bytes, first_line: int, quote: bytes | None
) -> tuple[bytes | None, int, int, bytes]:
    """The first record of a block (blank lines before it skipped) and its line, and the rest
    of the block and its first line."""
    pos, line = 0, first_line
    while pos < len(block):
        end = block.find(b"\n", pos)
        end = len(block) if end < 0 else end
        if csv_blank(block[pos:end]):
            pos, line = end + 1, line + 1
            continue
        start = pos
        odd = quote is not None and block.count(quote, pos, end) % 2
        while odd and end < len(block):
            following = block.find(b"\n", end + 1)
            following = len(block) if following < 0 else following
            odd ^= block.count(quote, end + 1, following) % 2  # type: ignore[arg-type]
            end = following
        record = block[start:end]
        after = line + record.count(b"\n") + 1
        return record.removesuffix(b"\r"), line, after, block[end + 1 :]
    return None, line, line, b""


def csv_blocks(
    stream: Any, path: str, options: CsvOptions, schema: pa.Schema, block_size: int
) -> Iterator[Block]:
    try:
        file = CsvFile(stream, path, options, block_size)
        yield from text_blocks(iter(file), CsvParser(options, file.names), schema, path)
    finally:
        stream.close()
