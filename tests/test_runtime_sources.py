"""Replayable sources: every record exactly once across subtasks, and exactly the rest after
a restore from any offset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.runtime.sources import FileSource, SequenceSource, SourceError, merge_offsets


def read_all(reader: Any, max_rows: int = 7, limit: int | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    while limit is None or len(rows) < limit:
        batch = reader.read(max_rows)
        if batch is None:
            break
        assert 0 < batch.num_rows <= max_rows
        rows += batch.to_pylist()
    return rows


def write_inputs(folder: Path, fmt: str, files: int = 5, rows: int = 23) -> list[dict[str, Any]]:
    """``files`` input files of ``rows`` rows each; returns every row, in file order."""
    folder.mkdir(exist_ok=True)
    everything = []
    for f in range(files):
        data = [{"key": f"k{(f * rows + i) % 10}", "value": f * rows + i} for i in range(rows)]
        everything += data
        table = pa.Table.from_pylist(data)
        name = folder / f"part-{f:03d}.{fmt}"
        if fmt == "parquet":
            pq.write_table(table, name, row_group_size=5)
        elif fmt == "csv":
            pa_csv.write_csv(table, name)
        else:
            name.write_text("".join(json.dumps(r) + "\n" for r in data))
    (folder / "_SUCCESS").write_text("")  # not an input
    (folder / ".part-999.parquet.crc").write_text("")  # not an input
    return everything


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
@pytest.mark.parametrize("parallelism", [1, 2, 3, 7])
def test_every_row_is_read_exactly_once_across_subtasks(
    tmp_path: Path, fmt: str, parallelism: int
) -> None:
    expected = write_inputs(tmp_path / "in", fmt)
    source = FileSource(str(tmp_path / "in"), fmt)
    got = []
    for subtask in range(parallelism):
        got += read_all(source.open(subtask, parallelism))
    assert sorted(r["value"] for r in got) == [r["value"] for r in expected]
    assert all(r in expected for r in got)


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(["parquet", "csv", "jsonl"]),
    cut=st.integers(0, 120),
    max_rows=st.integers(1, 30),
)
def test_a_restore_from_any_offset_replays_exactly_the_rest(
    tmp_path_factory: pytest.TempPathFactory, fmt: str, cut: int, max_rows: int
) -> None:
    folder = tmp_path_factory.mktemp("in")
    write_inputs(folder, fmt)
    source = FileSource(str(folder), fmt)
    full = read_all(source.open(0, 2), max_rows)
    first = source.open(0, 2)
    before = read_all(first, max_rows, limit=cut)
    offset = json.loads(json.dumps(first.offset()))  # it travels in a checkpoint as JSON
    after = read_all(source.open(0, 2, offset), max_rows)
    assert before + after == full


def test_sequence_is_dealt_round_robin_and_bounded() -> None:
    source = SequenceSource(start=10, end=31)
    parts = [read_all(source.open(i, 3), max_rows=4) for i in range(3)]
    assert parts[0] == [{"value": v} for v in range(10, 31, 3)]
    assert sorted(r["value"] for p in parts for r in p) == list(range(10, 31))


@given(cut=st.integers(0, 50), max_rows=st.integers(1, 9), parallelism=st.integers(1, 4))
def test_sequence_restores_exactly(cut: int, max_rows: int, parallelism: int) -> None:
    source = SequenceSource(end=57)
    for subtask in range(parallelism):
        full = read_all(source.open(subtask, parallelism), max_rows)
        reader = source.open(subtask, parallelism)
        before = read_all(reader, max_rows, limit=cut)
        after = read_all(source.open(subtask, parallelism, reader.offset()), max_rows)
        assert before + after == full


def test_an_unbounded_sequence_never_ends() -> None:
    reader = SequenceSource().open(0, 1)
    values = []
    for _ in range(100):
        batch = reader.read(1000)
        assert batch is not None
        values += batch.column(0).to_pylist()
    assert values == list(range(100_000))  # one subtask reads every split, in order
    positions = reader.offset()["splits"]
    assert sum(positions.values()) == 100_000
    assert set(positions.values()) == {781, 782}  # 100,000 = 128 * 781 + 32


@given(
    end=st.none() | st.integers(0, 600),
    before=st.integers(1, 4),
    after=st.integers(1, 4),
    reads=st.lists(st.integers(1, 70), max_size=4),
    max_rows=st.integers(1, 50),
)
def test_a_sequence_restores_at_another_parallelism_exactly(
    end: int | None, before: int, after: int, reads: list[int], max_rows: int
) -> None:
    """Offsets per split: the new subtasks read every value the old ones had not, once."""
    source = SequenceSource(end=end, splits=8)
    old = [source.open(i, before) for i in range(before)]
    seen: list[int] = []
    for i, rows in enumerate(reads):
        batch = old[i % before].read(rows)
        seen += batch.column(0).to_pylist() if batch is not None else []
    offset = json.loads(json.dumps(merge_offsets([r.offset() for r in old])))
    limit = 600 if end is None else end
    rest: list[int] = []
    for i in range(after):
        reader = source.open(i, after, offset)
        while (batch := reader.read(max_rows)) is not None:
            rest += [v for v in batch.column(0).to_pylist() if v < limit]
            if end is None and batch.column(0).to_pylist()[-1] >= limit:
                break
    assert sorted(seen + rest)[:limit] == list(range(limit))
    assert len(set(seen + rest)) == len(seen + rest)


def test_file_offsets_restore_at_another_parallelism(tmp_path: Path) -> None:
    write_inputs(tmp_path / "in", "parquet", files=5, rows=7)
    source = FileSource(str(tmp_path / "in"))
    full = sorted(map(str, (r for i in range(1) for r in read_all(source.open(0, 1), 3))))
    old = [source.open(i, 2) for i in range(2)]
    seen = [r for reader in old for r in read_all(reader, 3, limit=4)]
    offset = merge_offsets([r.offset() for r in old])
    rest = [r for i in range(3) for r in read_all(source.open(i, 3, offset), 3)]
    assert sorted(map(str, seen + rest)) == full


def test_an_offset_that_is_not_per_split_names_the_problem() -> None:
    with pytest.raises(SourceError, match="not per split"):
        SequenceSource().open(0, 1, {"emitted": 5})


def test_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        FileSource(str(tmp_path / "missing")).files()
    with pytest.raises(ValueError, match="unknown file format 'xml'"):
        FileSource(str(tmp_path), "xml")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.parquet").write_bytes(b"this is not parquet")
    with pytest.raises(SourceError, match=r"a\.parquet is not a valid parquet file"):
        FileSource(str(bad)).open(0, 1).read(10)
    with pytest.raises(ValueError, match="subtask 2 of parallelism 2 does not exist"):
        SequenceSource().open(2, 2)


def test_an_offset_beyond_a_file_means_the_file_changed(tmp_path: Path) -> None:
    write_inputs(tmp_path / "in", "parquet", files=1, rows=5)
    source = FileSource(str(tmp_path / "in"))
    (path,) = source.files()
    with pytest.raises(SourceError, match="the file changed since the checkpoint"):
        read_all(source.open(0, 1, {"rows": {path: 9}}))
