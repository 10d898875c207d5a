"""Writing mirrors reading, in whole jobs: ``write_parquet`` with a codec and Hive-style
partitions, and ``write_csv``, each exactly once across a restart from a checkpoint; what
``write_csv`` writes, ``read_csv`` reads back; and what cannot be written is refused when the
job is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from test_runtime_jobs import (
    PARALLELISM,
    FailAfterCheckpoint,
    environment,
    mark_checkpoints,
    no_pending_output,
    run,
)

from cutline import SourceHold, testing
from cutline.runtime.io.sinks import PENDING
from cutline.runtime.task.local import ThreadLauncher

REGIONS = ["eu", "us", "asia/pacific"]


def sale(record: dict[str, int]) -> dict[str, Any]:
    v = record["value"]
    return {"region": REGIONS[v % 3], "year": 2020 + v % 2, "amount": v * 10, "index": v}


def failing_job(tmp_path: Path, parallelism: int, n: int) -> Any:
    """An environment and the stream of its sales, which fails once, on its first record after
    a checkpoint completed (the sources hold half-way until one has)."""
    marker, flag = tmp_path / "checkpointed", tmp_path / "failed-once"
    env = environment(tmp_path, parallelism, batch_size=4)
    stream = env.from_sequence(0, n).map(sale).map(FailAfterCheckpoint(str(marker), str(flag)))
    options = {
        "launcher": ThreadLauncher(),
        "listener": mark_checkpoints(marker),
        "hold_sources": SourceHold(records=n // (2 * parallelism)),
    }
    return env, stream, options


def parts(out: Path) -> list[Path]:
    return [p for p in out.rglob("part-*") if PENDING not in p.relative_to(out).parts]


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_partitioned_compressed_parquet_is_exact_across_a_restart(
    tmp_path: Path, parallelism: int
) -> None:
    n, out = 600, tmp_path / "out"
    env, stream, options = failing_job(tmp_path, parallelism, n)
    stream.write_parquet(out, partition_by=["region", "year"], compression="zstd")
    result = testing.execute(env, **options)
    assert len(result.restarts) == 1
    assert result.restarts[0].restored_from is not None, "the restart restored a checkpoint"
    schema = pa.schema([("region", pa.string()), ("year", pa.int64())])
    partitioning = ds.partitioning(schema, flavor="hive")
    table = ds.dataset(str(out), format="parquet", partitioning=partitioning).to_table()
    rows = table.to_pylist()
    assert len(rows) == n
    assert sorted(rows, key=lambda r: r["index"]) == [sale({"value": v}) for v in range(n)]
    folders = {p.parent.relative_to(out).as_posix() for p in parts(out)}
    assert folders == {
        f"region={r}/year={y}" for r in ("eu", "us", "asia%2Fpacific") for y in (2020, 2021)
    }
    for part in parts(out):
        metadata = pq.ParquetFile(part).metadata
        assert pq.ParquetFile(part).schema_arrow.names == ["amount", "index"]
        assert {metadata.row_group(0).column(i).compression for i in range(2)} == {"ZSTD"}
        region, year = (s.split("=")[1] for s in part.parent.relative_to(out).parts)
        rows = pq.read_table(part).to_pylist()
        assert all(sale({"value": r["index"]})["year"] == int(year) for r in rows)
        assert all(REGIONS[r["index"] % 3].replace("/", "%2F") == region for r in rows)
    assert no_pending_output(out)


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_csv_output_is_exact_across_a_restart_and_read_csv_reads_it_back(
    tmp_path: Path, parallelism: int
) -> None:
    n, out = 600, tmp_path / "out"
    env, stream, options = failing_job(tmp_path, parallelism, n)
    stream.write_csv(out, delimiter=";", null_value="-")
    result = testing.execute(env, **options)
    assert len(result.restarts) == 1 and result.restarts[0].restored_from is not None
    assert no_pending_output(out)
    assert all(p.read_text().startswith('"region";"year";"amount";"index"\n') for p in parts(out))
    reader = environment(tmp_path / "reader", 2)
    reader.read_csv(out, delimiter=";", null_values=["-"]).collect()
    rows = run(reader).output
    assert sorted(rows, key=lambda r: r["index"]) == [sale({"value": v}) for v in range(n)]


def test_nulls_and_quotes_come_back_through_read_csv(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = environment(tmp_path, 1)

    def odd(record: dict[str, int]) -> dict[str, Any]:
        v = record["value"]
        return {"v": v, "text": None if v % 2 else f'"{v}", line\nbreak', "x": v / 4}

    env.from_sequence(0, 10).map(odd).write_csv(out)
    run(env)
    reader = environment(tmp_path / "reader", 1)
    reader.read_csv(out, schema={"text": "string"}).collect()
    assert sorted(run(reader).output, key=lambda r: r["v"]) == [
        odd({"value": v}) for v in range(10)
    ]


def test_a_partitioned_job_writes_nothing_outside_its_folders(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = environment(tmp_path, 2)
    env.from_sequence(0, 30).map(sale).write_parquet(out, partition_by=["region"])
    run(env)
    assert sorted(p.name for p in out.iterdir()) == [
        PENDING,
        "region=asia%2Fpacific",
        "region=eu",
        "region=us",
    ]


def numbers(tmp_path: Path) -> Any:
    return environment(tmp_path).from_sequence(0, 3)  # its columns are known: value (int64)


@pytest.mark.parametrize(
    ("partition_by", "error", "message"),
    [
        (["nope"], ValueError, r"partition_by=\['nope'\]: the records have no column 'nope' "),
        (["value"], ValueError, "partition_by takes every column: the files would hold none"),
        (["value", "value"], ValueError, "partition_by names 'value' twice"),
        ("value", TypeError, "partition_by must be a list of column names, not 'value'"),
    ],
)
def test_partition_columns_are_checked_when_the_job_is_built(
    tmp_path: Path, partition_by: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=rf"write_parquet\(.*out\): {message}"):
        numbers(tmp_path).write_parquet(tmp_path / "out", partition_by=partition_by)


def test_a_column_that_cannot_name_folders_is_refused_when_the_job_is_built(
    tmp_path: Path,
) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"price": [1.5], "n": [1]}), tmp_path / "in" / "a.parquet")
    stream = environment(tmp_path).read_parquet(tmp_path / "in")
    with pytest.raises(ValueError, match=r"cannot partition by 'price', a column of double"):
        stream.write_parquet(tmp_path / "out", partition_by=["price"])


def test_an_unknown_codec_is_refused_when_the_job_is_built(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"write_parquet\(.*\): compression must be one of"):
        numbers(tmp_path).write_parquet(tmp_path / "out", compression="lzo")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"delimiter": ";;"}, "delimiter must be one ASCII character other than a line break"),
        ({"delimiter": '"'}, "the quote and the delimiter are both"),
        ({"header": "yes"}, "header must be True or False, not 'yes'"),
        ({"null_value": "a,b"}, "null_value must be text without the delimiter"),
        ({"null_value": '"'}, "null_value must be text without the delimiter"),
    ],
)
def test_csv_options_are_checked_when_the_job_is_built(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=rf"write_csv\(.*out\): {message}"):
        numbers(tmp_path).write_csv(tmp_path / "out", **options)


def test_nested_columns_are_refused_by_write_csv_when_known(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"tags": [["a"]], "n": [1]}), tmp_path / "in" / "a.parquet")
    stream = environment(tmp_path).read_parquet(tmp_path / "in")
    with pytest.raises(ValueError, match=r"CSV holds no nested values, and column 'tags' is list"):
        stream.write_csv(tmp_path / "out")


def test_two_file_sinks_cannot_share_a_directory(tmp_path: Path) -> None:
    stream = numbers(tmp_path)
    stream.write_csv(tmp_path / "out")
    with pytest.raises(ValueError, match="two sinks write to"):
        stream.write_parquet(tmp_path / "out", partition_by=None)
