"""The file formats as objects (Flink's ``StreamFormat`` and ``BulkFormat``, and the encoders of
its file sink): a format is chosen once, where the user names it (``read_csv``,
``write_parquet``), and the file sources and sinks only ever call it.

* :class:`InputFormat` — a format the file sources read: the suffixes of its files in a
  directory, the schema the heads of its files show (:meth:`~InputFormat.sample`), how one file
  is read as blocks of records of the job's schema (:meth:`~InputFormat.blocks`), and what it
  can tell before reading (a Parquet footer: whether a file's columns can be read as the job's
  schema, a column's lowest value);
* :class:`OutputFormat` — a format a file sink writes part files in: its suffix, whether it
  takes columns (Arrow batches) or records as they are, and how a part file is written
  (:meth:`~OutputFormat.write`).

:data:`PARQUET` (both), :class:`CsvFormat` (its :class:`~cutline.runtime.io.formats.CsvOptions`
with it), :data:`JSONL` (both) and :data:`PICKLE` (the collect sink's lists of Python records);
:func:`input_format` and :func:`output_format` find one by its name.
"""

from __future__ import annotations

import json
import pickle
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import IO, Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq

from cutline.connectors.sink import SinkError
from cutline.runtime.io.csv import csv_blocks
from cutline.runtime.io.formats import CsvOptions
from cutline.runtime.io.inference import infer_csv, infer_jsonl, infer_parquet, parquet_schema
from cutline.runtime.io.jsonl import jsonl_blocks
from cutline.runtime.io.parquet import check_castable, lowest_timestamp, parquet_blocks
from cutline.runtime.io.rows import Block


class InputFormat(ABC):
    """A file format the file sources read (see the module's docstring)."""

    name: ClassVar[str]
    """How messages and labels call it (``read_{name}``)."""
    suffixes: ClassVar[tuple[str, ...]]
    """The ends of the names of its files (lower case): a directory's other files are not
    read."""

    @abstractmethod
    def sample(
        self, fs: Any, files: list[str], budget: int, types: pa.Schema
    ) -> tuple[pa.Schema, list[str]]:
        """The schema of the heads of ``files`` (at most ``budget`` bytes of each), the columns
        of ``types`` of the types given, and notes for the user (a column of numbers and
        text)."""

    @abstractmethod
    def blocks(self, stream: Any, path: str, schema: pa.Schema, block_size: int) -> Iterator[Block]:
        """The records of the file open as ``stream`` (at ``path``, for messages), in order,
        a block at a time (``block_size`` bytes of text, or a Parquet row group), of exactly
        ``schema``'s columns; a record that does not fit is a reject of its block, naming
        ``file:line``. Closes ``stream`` when done."""

    def named_by(self, schema: pa.Schema) -> InputFormat | None:
        """This format reading files whose columns ``schema`` names, in its order, when the
        files do not name them (CSV without a header or ``column_names``); ``None``: the
        files name their columns."""
        return None

    def check(self, fs: Any, files: list[str], schema: pa.Schema) -> None:
        """Before the job runs: refuse (:class:`~cutline.connectors.SourceError`, naming the
        file and the column) a file whose columns cannot be read as ``schema``, when the
        format can tell without reading it (Parquet, from its footer); by default nothing
        is told before reading."""
        return

    def lowest_timestamp(self, fs: Any, path: str, column: str) -> int | None:
        """The lowest value of ``column`` in file ``path`` (epoch ms) when the format tells it
        without reading the rows (a Parquet footer); ``None``: it cannot."""
        return None

    def detail(self) -> str:
        """Its options as a source's id takes them (two sources of the same files read with
        other options are other operators); empty: it has none."""
        return ""

    def __str__(self) -> str:
        return self.name


class OutputFormat(ABC):
    """A file format a file sink writes its part files in (see the module's docstring)."""

    name: ClassVar[str]
    """How messages and labels call it (``write_{name}``)."""
    suffix: ClassVar[str]
    """The end of its part files' names."""
    columnar: ClassVar[bool] = True
    """It writes Arrow record batches (records as dicts become columns before it); ``False``:
    records as they are."""

    @abstractmethod
    def write(self, out: IO[bytes], batches: list[Any]) -> None:
        """Write ``batches`` (record batches of one schema, or lists of records when not
        :attr:`columnar`) to ``out`` as one file. A record that cannot be encoded raises."""

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class ParquetFormat(InputFormat, OutputFormat):
    """Parquet: read a row group's batch at a time, the schema from the footers, every file's
    columns checked against the job's before the job runs; written a table per part file."""

    name: ClassVar[str] = "parquet"
    suffixes: ClassVar[tuple[str, ...]] = (".parquet", ".pq")
    suffix: ClassVar[str] = ".parquet"

    def sample(
        self, fs: Any, files: list[str], budget: int, types: pa.Schema
    ) -> tuple[pa.Schema, list[str]]:
        return infer_parquet(fs, files, budget, types)

    def blocks(self, stream: Any, path: str, schema: pa.Schema, block_size: int) -> Iterator[Block]:
        return parquet_blocks(stream, path, schema)

    def check(self, fs: Any, files: list[str], schema: pa.Schema) -> None:
        for path in files:
            check_castable(parquet_schema(fs, path), schema, path)

    def lowest_timestamp(self, fs: Any, path: str, column: str) -> int | None:
        return lowest_timestamp(fs, path, column)

    def write(self, out: IO[bytes], batches: list[Any]) -> None:
        pq.write_table(one_table(batches), out)


@dataclass(frozen=True)
class CsvFormat(InputFormat):
    """CSV, as :attr:`options` say it is written: read a block of whole records at a time,
    the schema inferred from the text of the files' heads."""

    options: CsvOptions = field(default_factory=CsvOptions)

    name: ClassVar[str] = "csv"
    suffixes: ClassVar[tuple[str, ...]] = (".csv",)

    def sample(
        self, fs: Any, files: list[str], budget: int, types: pa.Schema
    ) -> tuple[pa.Schema, list[str]]:
        return infer_csv(self.options, fs, files, budget, types)

    def blocks(self, stream: Any, path: str, schema: pa.Schema, block_size: int) -> Iterator[Block]:
        return csv_blocks(stream, path, self.options, schema, block_size)

    def named_by(self, schema: pa.Schema) -> CsvFormat | None:
        options = self.options
        if options.header or options.column_names is not None:
            return None
        return replace(self, options=replace(options, column_names=tuple(schema.names)))

    def detail(self) -> str:
        return repr(self.options)


@dataclass(frozen=True)
class JsonLinesFormat(InputFormat, OutputFormat):
    """JSON lines, a JSON object per line: read a block of whole lines at a time, the schema
    inferred from the files' heads; written a line per record."""

    name: ClassVar[str] = "jsonl"
    suffixes: ClassVar[tuple[str, ...]] = (".jsonl", ".json")
    suffix: ClassVar[str] = ".jsonl"

    def sample(
        self, fs: Any, files: list[str], budget: int, types: pa.Schema
    ) -> tuple[pa.Schema, list[str]]:
        return infer_jsonl(fs, files, budget, types)

    def blocks(self, stream: Any, path: str, schema: pa.Schema, block_size: int) -> Iterator[Block]:
        return jsonl_blocks(stream, path, schema, block_size)

    def write(self, out: IO[bytes], batches: list[Any]) -> None:
        for row in one_table(batches).to_pylist():
            out.write(json.dumps(row, default=str).encode() + b"\n")


@dataclass(frozen=True)
class PickleFormat(OutputFormat):
    """The collect sink's part files: the records as they are, a pickled list per file (read
    back by the driver, never by a user)."""

    name: ClassVar[str] = "pickle"
    suffix: ClassVar[str] = ".pickle"
    columnar: ClassVar[bool] = False

    def write(self, out: IO[bytes], batches: list[Any]) -> None:
        records = [r for batch in batches for r in batch]
        pickle.dump(records, out, pickle.HIGHEST_PROTOCOL)


PARQUET = ParquetFormat()
JSONL = JsonLinesFormat()
PICKLE = PickleFormat()

_INPUTS: dict[str, InputFormat] = {f.name: f for f in (PARQUET, CsvFormat(), JSONL)}
_OUTPUTS: dict[str, OutputFormat] = {f.name: f for f in (PARQUET, JSONL, PICKLE)}


def input_format(name: str) -> InputFormat:
    """The format the file sources read files of format ``name`` in (``"parquet"``, ``"csv"``
    with the default options, ``"jsonl"``)."""
    found = _INPUTS.get(name)
    if found is None:
        raise ValueError(f"unknown file format {name!r}: use one of {', '.join(_INPUTS)}")
    return found


def output_format(name: str) -> OutputFormat:
    """The format a file sink writes part files of format ``name`` in (``"parquet"``,
    ``"jsonl"``, ``"pickle"``)."""
    found = _OUTPUTS.get(name)
    if found is None:
        raise ValueError(f"unknown output format {name!r}: use one of {', '.join(_OUTPUTS)}")
    return found


def one_table(batches: list[pa.RecordBatch]) -> pa.Table:
    """One table of ``batches``, unifying schemas that differ only where a column was all null
    in some batch."""
    try:
        return pa.Table.from_batches(batches)
    except pa.ArrowInvalid:
        tables = [pa.Table.from_batches([b]) for b in batches]
        try:
            return pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise SinkError(f"the records do not share one schema: {exc}") from None
