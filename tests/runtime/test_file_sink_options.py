"""The file sink's options: Hive-style partition folders (published when their checkpoint
completes, recovered and withdrawn as unpartitioned parts are), Parquet's codec, and CSV as
``read_csv`` reads it back."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from test_runtime_sinks import open_sink

from cutline.runtime.io.file_formats import (
    PARQUET,
    PARQUET_CODECS,
    PICKLE,
    CsvFormat,
    ParquetFormat,
)
from cutline.runtime.io.formats import CsvOptions
from cutline.runtime.io.partitions import folder_name, split
from cutline.runtime.io.sinks import PENDING, FileSink, SinkError


def sales(rows: list[tuple[str | None, int, int]]) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "region": pa.array([r for r, _, _ in rows], pa.string()),
            "year": pa.array([y for _, y, _ in rows], pa.int64()),
            "amount": pa.array([a for _, _, a in rows], pa.int64()),
        }
    )


def files(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Each published part file (its path under ``out``) and its rows, as the file holds them."""
    return {
        str(p.relative_to(out)): pq.read_table(p).to_pylist()
        for p in sorted(out.rglob("*.parquet"))
        if PENDING not in p.parts
    }


def read_back(out: Path) -> list[tuple[Any, ...]]:
    """The rows a reader of Hive-style partitions sees, sorted."""
    if not any(p for p in out.rglob("*.parquet") if PENDING not in p.parts):
        return []
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    return sorted(((r["region"], r["year"], r["amount"]) for r in table.to_pylist()), key=str)


ROWS = [("eu", 2024, 1), ("us", 2024, 2), ("eu", 2025, 3), ("eu", 2024, 4), (None, 2025, 5)]


def test_partitioned_parts_are_published_in_folders_of_their_values(tmp_path: Path) -> None:
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out), partition_by=("region", "year")), 0, 0)
    writer.write(sales(ROWS[:3]))
    writer.write(sales(ROWS[3:]))
    state = writer.pre_commit(1)
    assert read_back(out) == []  # pending until the checkpoint completes
    folders = sorted(p["folder"] for p in state["pending"])
    assert folders == [
        "region=__HIVE_DEFAULT_PARTITION__/year=2025/",
        "region=eu/year=2024/",
        "region=eu/year=2025/",
        "region=us/year=2024/",
    ]
    assert len(list((out / PENDING).iterdir())) == 4  # flat: a file per partition
    published = writer.commit(1)
    assert sorted(published) == sorted(p["name"] for p in state["pending"])
    assert {path.rsplit("/", 1)[0]: rows for path, rows in files(out).items()} == {
        "region=__HIVE_DEFAULT_PARTITION__/year=2025": [{"amount": 5}],
        "region=eu/year=2024": [{"amount": 1}, {"amount": 4}],  # in the order they came
        "region=eu/year=2025": [{"amount": 3}],
        "region=us/year=2024": [{"amount": 2}],
    }
    assert read_back(out) == sorted(ROWS, key=str)
    assert list((out / PENDING).iterdir()) == []


def test_an_unpartitioned_sink_s_state_is_as_it_was(tmp_path: Path) -> None:
    """No "folder" in the state of an unpartitioned sink: checkpoints of before restore."""
    writer = open_sink(FileSink(str(tmp_path / "out")), 0, 0)
    writer.write(sales(ROWS))
    (part,) = writer.pre_commit(1)["pending"]
    assert set(part) == {"checkpoint", "name"}


def test_recovery_publishes_the_restored_partitioned_parts_once_and_withdraws_later_ones(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    sink = FileSink(str(out), partition_by=("region",))
    first = open_sink(sink, 0, generation=0)
    first.write(sales(ROWS[:2]))
    first.pre_commit(1)
    first.commit(1)
    first.write(sales(ROWS[2:4]))
    restored = json.loads(json.dumps(first.pre_commit(2)))  # 2 completes, its commit is lost
    first.write(sales(ROWS[4:]))
    first.pre_commit(3)
    first.commit(3)  # published by the failed attempt: a checkpoint the restore goes back on
    assert len(read_back(out)) == 5
    second = open_sink(sink, 0, generation=1, state=restored)
    assert read_back(out) == sorted(ROWS[:4], key=str)  # 2's published, 3's withdrawn
    assert list((out / PENDING).iterdir()) == []
    open_sink(sink, 0, generation=2, state=restored)  # again: nothing published twice
    assert read_back(out) == sorted(ROWS[:4], key=str)
    second.write(sales(ROWS[4:]))
    second.pre_commit(3)
    second.commit(3)
    assert read_back(out) == sorted(ROWS, key=str)


def test_folder_names_of_every_kind_of_value() -> None:
    assert folder_name(None) == "__HIVE_DEFAULT_PARTITION__"
    assert folder_name("a/b c=d%") == "a%2Fb%20c%3Dd%25"
    assert folder_name("") == ""
    assert folder_name(True) == "true"
    assert folder_name(-7) == "-7"
    assert folder_name(dt.date(2024, 2, 29)) == "2024-02-29"


def test_text_values_come_back_as_they_were(tmp_path: Path) -> None:
    out = tmp_path / "out"
    values = ["a/b", "x=y", "", "é ü", "100%"]
    writer = open_sink(FileSink(str(out), partition_by=("tag",)), 0, 0)
    writer.write(pa.record_batch({"tag": values, "n": list(range(5))}))
    writer.pre_commit(1)
    writer.commit(1)
    schema = pa.schema([("tag", pa.string())])
    partitioning = ds.partitioning(schema, flavor="hive")
    table = ds.dataset(str(out), format="parquet", partitioning=partitioning).to_table()
    assert sorted((r["tag"], r["n"]) for r in table.to_pylist()) == sorted(
        zip(values, range(5), strict=True)
    )


def test_dates_and_bools_name_folders() -> None:
    batch = pa.record_batch(
        {"day": [dt.date(2024, 1, 2), dt.date(2024, 1, 2)], "ok": [True, False], "n": [1, 2]}
    )
    parts = split(batch, ("day", "ok"))
    assert [(f, b.to_pylist()) for f, b in parts] == [
        ("day=2024-01-02/ok=true/", [{"n": 1}]),
        ("day=2024-01-02/ok=false/", [{"n": 2}]),
    ]


def test_a_column_all_null_so_far_goes_to_the_null_folder() -> None:
    batch = pa.record_batch({"k": pa.nulls(2), "n": [1, 2]})
    assert [(f, b.to_pylist()) for f, b in split(batch, ("k",))] == [
        ("k=__HIVE_DEFAULT_PARTITION__/", [{"n": 1}, {"n": 2}])
    ]


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (pa.record_batch({"n": [1]}), r"cannot partition by 'k': the records have no such column"),
        (pa.record_batch({"k": [1.5], "n": [1]}), r"cannot partition by 'k', a column of double"),
    ],
)
def test_records_that_cannot_be_partitioned_fail_the_writer(
    tmp_path: Path, batch: pa.RecordBatch, message: str
) -> None:
    writer = open_sink(FileSink(str(tmp_path / "out"), partition_by=("k",)), 0, 0)
    with pytest.raises(SinkError, match=message):
        writer.write(batch)


@pytest.mark.parametrize("codec", PARQUET_CODECS)
def test_parquet_parts_are_written_with_the_codec_asked_for(tmp_path: Path, codec: str) -> None:
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out), ParquetFormat(codec.upper())), 0, 0)  # type: ignore[arg-type]
    writer.write(sales(ROWS))
    writer.pre_commit(1)
    writer.commit(1)
    (part,) = out.glob("*.parquet")
    metadata = pq.ParquetFile(part).metadata
    found = {metadata.row_group(0).column(i).compression for i in range(3)}
    assert found == {"UNCOMPRESSED" if codec == "none" else codec.upper()}
    assert pq.read_table(part).to_batches()[0].equals(sales(ROWS))


def test_the_default_codec_is_snappy_as_before(tmp_path: Path) -> None:
    assert FileSink(str(tmp_path)).format == PARQUET == ParquetFormat("snappy")


def test_an_unknown_codec_or_a_partitioned_pickle_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="compression must be one of snappy, zstd, gzip, brotli"):
        ParquetFormat("lzo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pickle output cannot be partitioned"):
        FileSink(str(tmp_path), PICKLE, partition_by=("k",))


def csv_part(out: Path) -> str:
    (part,) = out.glob("*.csv")
    return part.read_text()


def test_csv_parts_have_a_header_quote_what_needs_it_and_write_nulls_as_asked(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    sink = FileSink(str(out), CsvFormat(CsvOptions(delimiter=";", null_values=("NA",))))
    writer = open_sink(sink, 0, 0)
    when = dt.datetime(2024, 5, 1, 12, 0, 30, 250000)
    writer.write(
        pa.record_batch(
            {
                "id": [1, 2, 3],
                "text": ['say "hi"', "a;b", None],
                "at": pa.array([when, None, when], pa.timestamp("ms")),
                "x": [0.5, None, -2.0],
            }
        )
    )
    writer.pre_commit(1)
    writer.commit(1)
    assert csv_part(out) == (
        '"id";"text";"at";"x"\n'
        '1;"say ""hi""";2024-05-01 12:00:30.250;0.5\n'
        '2;"a;b";NA;NA\n'
        "3;NA;2024-05-01 12:00:30.250;-2\n"
    )


def test_csv_without_a_header(tmp_path: Path) -> None:
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out), CsvFormat(CsvOptions(header=False))), 0, 0)
    writer.write(pa.record_batch({"a": [1, 2], "b": ["x", None]}))
    writer.pre_commit(1)
    writer.commit(1)
    assert csv_part(out) == '1,"x"\n2,\n'


def test_a_record_csv_cannot_hold_fails_the_writer_naming_the_file(tmp_path: Path) -> None:
    writer = open_sink(FileSink(str(tmp_path / "out"), CsvFormat()), 0, 0)
    writer.write(pa.record_batch({"a": pa.array([[1, 2]], pa.list_(pa.int64()))}))
    with pytest.raises(SinkError, match=r"cannot write .*_pending/part-00000-0000000001.*\.csv"):
        writer.pre_commit(1)


def test_what_csv_parts_hold_reads_back_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out), CsvFormat()), 0, 0)
    batch = pa.record_batch({"n": [1, None, 3], "s": ["x,y", "", None], "f": [1.25, 2.0, None]})
    writer.write(batch)
    writer.pre_commit(1)
    writer.commit(1)
    convert = pa_csv.ConvertOptions(
        column_types=batch.schema, strings_can_be_null=True, quoted_strings_can_be_null=False
    )
    table = pa_csv.read_csv(io.BytesIO(csv_part(out).encode()), convert_options=convert)
    assert table.to_pylist() == batch.to_pylist()
