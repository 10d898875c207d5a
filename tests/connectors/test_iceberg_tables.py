"""The Iceberg sink's tables (``cutline.connectors.iceberg``): the table it makes and the one it
finds, what does not fit it and where that is said (when the job is built, when the stream's
columns are known), the catalog and the table's name, partitions, and the statistics of the
files (those pyiceberg's own writer gives)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType
from test_iceberg import TABLE, rows, sqlite_catalog, staged, sums_job, table

from cutline import FixedDelay, JobFailedError, StreamEnvironment, testing
from cutline.connectors import SinkContext, SinkError, tables
from cutline.connectors.iceberg import IcebergCommittable, IcebergSink
from cutline.runtime.task.local import ThreadLauncher

from ledger import Ledger


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return sqlite_catalog(tmp_path, monkeypatch)


def make(catalog: dict[str, str], schema: Schema | pa.Schema, **options: Any) -> None:
    made = load_catalog("default", **catalog)
    made.create_namespace_if_not_exists("db")
    made.create_table(TABLE, schema=schema, **options)


def test_a_table_of_other_columns_is_refused_when_the_job_is_built(
    tmp_path: Path, catalog: dict[str, str]
) -> None:
    """The stream's columns are known (the ledger's, summed): the table is read at once."""
    make(catalog, pa.schema([("account", pa.string()), ("entry", pa.int64()),
                             ("amount", pa.string()), ("ts", pa.int64())]))  # fmt: skip
    message = rf"Iceberg table {TABLE}: column 'amount' is string in the table, int64 in the rec"
    with pytest.raises(SinkError, match=message):
        sums_job(tmp_path, catalog, Ledger(accounts=2, per_account=100))
    assert table(catalog).snapshots() == []


def test_a_table_of_other_columns_fails_the_job_at_its_first_batch_when_they_are_unknown(
    tmp_path: Path, catalog: dict[str, str]
) -> None:
    make(catalog, pa.schema([("account", pa.string()), ("entry", pa.int64()),
                             ("amount", pa.string()), ("ts", pa.int64())]))  # fmt: skip
    env = StreamEnvironment(1, checkpoint_dir=tmp_path / "ck", restart_strategy=FixedDelay(0))
    ledger = Ledger(accounts=2, per_account=100)
    env.from_source(ledger).map(lambda r: r).write_iceberg(TABLE, catalog=catalog)  # (unknown)
    message = rf"Iceberg table {TABLE}: column 'amount' is string in the table, int64 in the rec"
    with pytest.raises(JobFailedError, match=message):
        testing.execute(env, launcher=ThreadLauncher())
    assert table(catalog).snapshots() == []
    assert not list((tmp_path / "warehouse").rglob("*.parquet"))  # (no file written either)


def test_a_table_is_made_when_the_job_is_built_if_the_columns_are_known(
    tmp_path: Path, catalog: dict[str, str]
) -> None:
    sums_job(tmp_path, catalog, Ledger(accounts=2, per_account=100))  # (not run)
    made = table(catalog)
    assert [(f.name, str(f.field_type)) for f in made.schema().fields] == [
        ("account", "string"), ("entry", "long"), ("amount", "long"), ("ts", "long"),
    ]  # fmt: skip
    assert made.snapshots() == [] and made.spec().is_unpartitioned()
    message = rf"Iceberg table {TABLE} is not partitioned \(partition_by=\['account'\]\)"
    with pytest.raises(SinkError, match=message):
        IcebergSink(TABLE, catalog, partition_by=["account"]).check(None)


def test_a_bad_catalog_or_table_name_is_an_error_when_the_job_is_built(
    tmp_path: Path, catalog: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = StreamEnvironment(1, checkpoint_dir=tmp_path / "ck")
    stream = env.from_sequence(0, 10)
    with pytest.raises(ValueError, match=r"the table must be named 'namespace.table', not 'sums'"):
        stream.write_iceberg("sums", catalog=catalog)
    missing = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'none' / 'catalog.db'}"}
    message = r"Iceberg table db.t: cannot load the Iceberg catalog 'default' \(type=sql, uri="
    with pytest.raises(SinkError, match=message):
        stream.write_iceberg("db.t", catalog=missing)
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))  # (no .pyiceberg.yaml there)
    with pytest.raises(SinkError, match=r"no catalog named 'nowhere' in ~/.pyiceberg.yaml"):
        stream.write_iceberg("db.t", catalog="nowhere")
    with pytest.raises(ValueError, match=r"catalog must be a dict of pyiceberg catalog prop"):
        stream.write_iceberg("db.t", catalog=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"compression must be one of zstd, snappy, .*'zip'"):
        stream.write_iceberg("db.t", catalog=catalog, compression="zip")


def test_a_catalog_named_in_the_configuration_is_resolved_on_the_driver(
    tmp_path: Path, catalog: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its properties go to the workers with the sink: they need no configuration file."""
    config = tmp_path / "config"
    config.mkdir()
    lines = "".join(f"    {k}: {v}\n" for k, v in catalog.items())
    (config / ".pyiceberg.yaml").write_text(f"catalog:\n  lake:\n{lines}")
    monkeypatch.setenv("PYICEBERG_HOME", str(config))
    env = StreamEnvironment(2, checkpoint_dir=tmp_path / "ck")
    env.from_sequence(0, 100).write_iceberg(TABLE, catalog="lake")
    (config / ".pyiceberg.yaml").unlink()
    testing.execute(env, launcher=ThreadLauncher())
    made = load_catalog("lake", **catalog).load_table(TABLE)
    assert sorted(r["value"] for r in made.scan().to_arrow().to_pylist()) == list(range(100))


def test_a_column_of_only_nulls_cannot_make_a_table(
    tmp_path: Path, catalog: dict[str, str]
) -> None:
    env = StreamEnvironment(1, checkpoint_dir=tmp_path / "ck", restart_strategy=FixedDelay(0))
    env.from_sequence(0, 5).map(lambda r: {"n": r["value"], "x": None}).write_iceberg(
        TABLE, catalog=catalog
    )
    message = r"column 'x' holds only nulls so far, so its type is not known: make the table"
    with pytest.raises(JobFailedError, match=message):
        testing.execute(env, launcher=ThreadLauncher())


def test_records_are_made_to_fit_and_a_value_that_does_not_names_the_table_and_the_column(
    catalog: dict[str, str],
) -> None:
    schema = Schema(
        NestedField(1, "n", LongType(), required=True),
        NestedField(2, "x", DoubleType(), required=False),
        NestedField(3, "note", StringType(), required=False),
    )
    make(catalog, schema)
    writer = IcebergSink(TABLE, catalog).writer(SinkContext("sums", 0, 1, 1, "r1", job="j1"), {})
    writer.write(pa.RecordBatch.from_pylist([{"n": 2, "x": 3}]))  # (an integer into a double)
    where = f"Iceberg table {TABLE}"
    with pytest.raises(SinkError, match=rf"{where}: column 'n' is long in the table, string in"):
        writer.write(pa.RecordBatch.from_pylist([{"n": "three", "x": 3.5}]))
    with pytest.raises(SinkError, match=r"a value of column 'x' does not fit its type double"):
        writer.write(pa.RecordBatch.from_pylist([{"n": 4, "x": 2**62 + 1}]))
    with pytest.raises(SinkError, match=rf"{where} has no column 'y', which the records have"):
        writer.write(pa.RecordBatch.from_pylist([{"n": 4, "x": 2.0, "y": 1}]))
    with pytest.raises(SinkError, match=rf"{where}: the records have no column 'n'"):
        writer.write(pa.RecordBatch.from_pylist([{"x": 2.0}]))
    with pytest.raises(SinkError, match=rf"{where}: a null in column 'n', which is required"):
        writer.write(pa.RecordBatch.from_pylist([{"n": None, "x": 2.0}]))
    writer.write(pa.RecordBatch.from_pylist([{"n": 5, "note": "five"}]))  # (x: optional)
    committable = writer.prepare_commit(1).complete()
    IcebergSink(TABLE, catalog).global_committer().commit(1, [committable])
    assert sorted(rows(catalog), key=lambda r: r["n"]) == [
        {"n": 2, "x": 3.0, "note": None},
        {"n": 5, "x": None, "note": "five"},
    ]


def test_a_partitioned_table_is_made_and_written_in_its_partitions(
    tmp_path: Path, catalog: dict[str, str]
) -> None:
    sink = IcebergSink(TABLE, catalog, partition_by=["city", "day"])
    records = [
        {"city": "a b", "day": date(2024, 1, 2), "n": 4},
        {"city": "a b", "day": date(2024, 1, 2), "n": -1},
        {"city": "x/y", "day": date(2024, 1, 3), "n": 7},
        {"city": None, "day": date(2024, 1, 3), "n": 0},
    ]
    [committable] = staged(sink, "j1", {1: records})
    assert isinstance(committable, IcebergCommittable) and len(committable.files) == 3
    sink.global_committer().commit(1, [committable])
    assert sorted(rows(catalog), key=lambda r: r["n"]) == sorted(records, key=lambda r: r["n"])
    made = table(catalog)
    assert [f.name for f in made.spec().fields] == ["city", "day"]
    folders = {str(p.parent.relative_to(tmp_path / "warehouse" / "db" / "sums" / "data"))
               for p in (tmp_path / "warehouse").rglob("*.parquet")}  # fmt: skip
    assert folders == {"city=a+b/day=2024-01-02", "city=x%2Fy/day=2024-01-03",
                       "city=null/day=2024-01-03"}  # fmt: skip
    by_city = {f.partition[0]: f for f in committable.files}
    assert by_city["a b"].partition == ("a b", 19724) and by_city["a b"].stats["record_count"] == 2
    # a scan filtered on the partition reads its files alone
    assert [r["n"] for r in made.scan(row_filter="city == 'x/y'").to_arrow().to_pylist()] == [7]
    with pytest.raises(SinkError, match=rf"Iceberg table {TABLE} is partitioned by \['city', 'd"):
        IcebergSink(TABLE, catalog, partition_by=["n"]).check(None)


def test_the_statistics_are_those_pyiceberg_writes_of_the_same_rows(
    catalog: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken from the Parquet footer (several row groups here), the value and null counts and
    the bounds of every column equal those of pyiceberg's own writer for the same rows."""
    monkeypatch.setattr(tables.writer, "ROW_GROUP_ROWS", 3)
    utc = pa.timestamp("us", tz="UTC")
    columns = {
        "i": pa.array([5, -3, None, 9, 0, 2, 7], pa.int64()),
        "small": pa.array([1, 2, 3, 4, 5, 6, None], pa.int32()),
        "f": pa.array([0.5, 2.5, -1.0, None, 3.0, 1.0, 0.0]),
        "s": pa.array(["m", "b", None, "z" * 40, "a" * 40, "q", "c"]),
        "b": pa.array([True, False, True, None, True, True, True]),
        "d": pa.array([19000, 18000, 20000, None, 19500, 1, 19999], pa.date32()),
        "t": pa.array([10**15, 2 * 10**15, None, 1, 5 * 10**14, 3, 10**12], utc),
        "nan": pa.array([1.0, float("nan"), 2.0, 3.0, 4.0, 5.0, 6.0]),
        "raw": pa.array([b"x", b"y", None, b"z", b"w", b"v", b"u"]),
        "l": pa.array([[1], [2, 3], None, [], [4], [5], [6]]),
    }
    records = pa.table(columns)
    sink = IcebergSink(TABLE, catalog)
    writer = sink.writer(SinkContext("sums", 0, 1, 1, "r1", job="j1"), {})
    for batch in records.to_batches(max_chunksize=3):
        writer.write(batch)
    committable = writer.prepare_commit(1).complete()
    assert isinstance(committable, IcebergCommittable) and len(committable.files) == 1
    [ours] = committable.files
    assert pq.ParquetFile(ours.path.removeprefix("file://")).metadata.num_row_groups == 3
    sink.global_committer().commit(1, [committable])
    made = table(catalog)
    theirs = load_catalog("default", **catalog).create_table("db.theirs", schema=made.schema())
    theirs.append(records.cast(theirs.schema().as_arrow()))
    [ours_file] = [task.file for task in made.scan().plan_files()]
    [their_file] = [task.file for task in theirs.scan().plan_files()]
    for kind in ("record_count", "value_counts", "null_value_counts", "lower_bounds",
                 "upper_bounds"):  # fmt: skip
        assert getattr(ours_file, kind) == getattr(their_file, kind), kind
    assert ours_file.lower_bounds[made.schema().find_field("s").field_id] == b"a" * 16
    assert repr(rows(catalog)) == repr(records.to_pylist())  # (NaN: by its text)


def test_timestamps_of_any_unit_go_into_a_table_of_microseconds(catalog: dict[str, str]) -> None:
    sink = IcebergSink(TABLE, catalog)
    stamps = [datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)]
    batch = pa.RecordBatch.from_pydict({"t": pa.array(stamps, pa.timestamp("ms", tz="UTC"))})
    writer = sink.writer(SinkContext("sums", 0, 1, 1, "r1", job="j1"), {})
    writer.write(batch)
    writer.write(pa.RecordBatch.from_pydict({"t": pa.array(stamps, pa.timestamp("ns", "UTC"))}))
    sink.global_committer().commit(1, [writer.prepare_commit(1).complete()])
    assert str(table(catalog).schema().find_field("t").field_type) == "timestamptz"
    assert [r["t"] for r in rows(catalog)] == stamps * 2
    fine = pa.array([1], pa.timestamp("ns", "UTC"))  # (a nanosecond: lost as microseconds)
    with pytest.raises(SinkError, match=r"a value of column 't' does not fit its type timest"):
        writer.write(pa.RecordBatch.from_pydict({"t": fine}))
