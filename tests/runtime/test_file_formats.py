"""The file formats as objects (:mod:`cutline.runtime.io.file_formats`): each knows its
suffixes, the schema of its files' heads, how a file is read as blocks and how a part file is
written; the names a user gives are made objects once, and what a source's id takes of its
format is what it took before the formats were objects."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline.runtime.io.file_formats import (
    JSONL,
    PARQUET,
    PICKLE,
    CsvFormat,
    InputFormat,
    OutputFormat,
    input_format,
    output_format,
)
from cutline.runtime.io.formats import CsvOptions
from cutline.runtime.io.sources import FileSource

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])
ROWS = [{"user": "a", "n": 1}, {"user": "b", "n": 2}]


def test_names_are_made_the_formats_once() -> None:
    assert input_format("parquet") is PARQUET
    assert input_format("jsonl") is JSONL
    assert input_format("csv") == CsvFormat(CsvOptions())
    assert output_format("pickle") is PICKLE
    with pytest.raises(ValueError, match="unknown file format 'orc': use one of parquet, csv"):
        input_format("orc")
    with pytest.raises(ValueError, match="unknown output format 'csv': use one of parquet"):
        output_format("csv")


def test_each_format_knows_its_suffixes_and_its_name() -> None:
    assert PARQUET.suffixes == (".parquet", ".pq") and PARQUET.suffix == ".parquet"
    assert CsvFormat().suffixes == (".csv",)
    assert JSONL.suffixes == (".jsonl", ".json") and JSONL.suffix == ".jsonl"
    assert [str(f) for f in (PARQUET, CsvFormat(), JSONL, PICKLE)] == [
        "parquet",
        "csv",
        "jsonl",
        "pickle",
    ]
    assert isinstance(PARQUET, InputFormat) and isinstance(PARQUET, OutputFormat)
    assert not isinstance(CsvFormat(), OutputFormat)
    assert not PICKLE.columnar and PARQUET.columnar and JSONL.columnar


def test_a_source_id_takes_of_its_format_what_it_took_of_its_csv_options() -> None:
    """``read_csv``'s operator id holds ``repr(CsvOptions)`` as it always did (a savepoint of
    an earlier version restores), the other formats nothing."""
    options = CsvOptions(delimiter=";", header=False)
    assert CsvFormat(options).detail() == repr(options)
    assert PARQUET.detail() == JSONL.detail() == ""


def test_a_csv_file_without_header_is_named_by_the_schema() -> None:
    named = CsvFormat(CsvOptions(header=False)).named_by(SCHEMA)
    assert named == CsvFormat(CsvOptions(header=False, column_names=("user", "n")))
    assert CsvFormat().named_by(SCHEMA) is None  # (the header names them)
    assert PARQUET.named_by(SCHEMA) is None and JSONL.named_by(SCHEMA) is None


def test_what_a_format_writes_it_reads_back(tmp_path: Path) -> None:
    batch = pa.RecordBatch.from_pylist(ROWS, schema=SCHEMA)
    fs = fsspec.filesystem("file")
    for fmt in (PARQUET, JSONL):
        path = tmp_path / f"part{fmt.suffix}"
        with open(path, "wb") as out:
            fmt.write(out, [batch])
        blocks = list(fmt.blocks(fs.open(str(path), "rb"), str(path), SCHEMA, 1 << 20))
        assert [r for b in blocks for r in b.batch.to_pylist()] == ROWS
        assert not [r for b in blocks for r in b.rejects]
    assert pq.read_table(tmp_path / "part.parquet").to_pylist() == ROWS
    lines = (tmp_path / "part.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == ROWS
    out = io.BytesIO()
    PICKLE.write(out, [[{"any": "record"}], [3]])
    assert pickle.loads(out.getvalue()) == [{"any": "record"}, 3]


def test_only_parquet_tells_a_file_s_lowest_time_from_its_footer(tmp_path: Path) -> None:
    table = pa.table({"ts": pa.array([5_000, 2_000, 9_000], pa.timestamp("ms"))})
    pq.write_table(table, tmp_path / "t.parquet")
    fs = fsspec.filesystem("file")
    assert PARQUET.lowest_timestamp(fs, str(tmp_path / "t.parquet"), "ts") == 2_000
    assert JSONL.lowest_timestamp(fs, str(tmp_path / "t.parquet"), "ts") is None


def test_a_parquet_file_that_cannot_be_read_as_the_schema_is_refused_before_the_job(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table({"n": pa.array(["x"], pa.string())}), folder / "a.parquet")
    source = FileSource(str(folder), PARQUET, schema={"n": pa.list_(pa.int64())})
    with pytest.raises(Exception, match=r"a\.parquet: column 'n' is string in this file"):
        source.prepare()


def test_a_source_or_sink_is_given_a_format_object_not_a_name() -> None:
    from cutline.runtime.io.sinks import FileSink

    with pytest.raises(TypeError, match="format must be an InputFormat"):
        FileSource("/tmp/in", "csv")
    with pytest.raises(TypeError, match="format must be an OutputFormat"):
        FileSink("/tmp/out", "parquet")
