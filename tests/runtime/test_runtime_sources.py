"""Replayable sources: every record exactly once across subtasks, and exactly the rest after
a restore from any checkpoint, at any parallelism. The built-in sources are read as any
connector is: through :class:`~cutline.runtime.source_operator.SourceOperator`, which deals
their splits, keeps their positions and makes their watermarks."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.connectors import SourceContext
from cutline.protocol.splits import SplitState
from cutline.runtime.io.file_formats import input_format
from cutline.runtime.io.formats import SourceError
from cutline.runtime.io.sources import FileSource, SequenceSource
from cutline.runtime.source_operator import SourceOperator, merge_source_states


def open_source(
    source: Any,
    subtask: int = 0,
    parallelism: int = 1,
    state: Any = None,
    rejected: Any = None,
    strategy: Any = None,
) -> SourceOperator:
    """Subtask ``subtask`` of ``source``, restored from ``state`` (what a checkpoint holds:
    pickled, as the state file does)."""
    if state is not None:
        state = pickle.loads(pickle.dumps(state))
    context = SourceContext("source", subtask, parallelism, rejected)
    return SourceOperator(source, context, state, strategy)


def read_all(
    running: SourceOperator, max_rows: int = 7, limit: int | None = None
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    idle = 0
    while (limit is None or len(rows) < limit) and not running.exhausted:
        batch = running.read(max_rows)
        if batch is None:
            idle = idle + 1 if running.wait else 0
            if idle > 3:  # an unbounded source with nothing now
                break
            continue
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
    source, _ = FileSource(str(tmp_path / "in"), input_format(fmt)).prepare()
    got = []
    for subtask in range(parallelism):
        got += read_all(open_source(source, subtask, parallelism))
    assert sorted(r["value"] for r in got) == [r["value"] for r in expected]
    assert all(r in expected for r in got)


def test_files_are_dealt_from_the_listing_made_when_the_job_was_built(tmp_path: Path) -> None:
    """Every subtask deals the files of the one listing (``prepare``, on the driver): a file
    that arrives while the subtasks open moves no other file (each subtask listing for itself
    dealt by position in its own listing: one that saw a new file first could skip or repeat
    another)."""
    expected = write_inputs(tmp_path / "in", "parquet", files=4, rows=3)
    source, _ = FileSource(str(tmp_path / "in")).prepare()
    first = open_source(source, 0, 2)
    pq.write_table(
        pa.table({"key": ["late"], "value": [-1]}), tmp_path / "in" / "part-000a.parquet"
    )
    second = open_source(source, 1, 2)
    got = read_all(first) + read_all(second)
    assert sorted(r["value"] for r in got) == [r["value"] for r in expected]


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(["parquet", "csv", "jsonl"]),
    cut=st.integers(0, 120),
    max_rows=st.integers(1, 30),
)
def test_a_restore_from_any_position_replays_exactly_the_rest(
    tmp_path_factory: pytest.TempPathFactory, fmt: str, cut: int, max_rows: int
) -> None:
    folder = tmp_path_factory.mktemp("in")
    write_inputs(folder, fmt)
    source, _ = FileSource(str(folder), input_format(fmt)).prepare()
    full = read_all(open_source(source, 0, 2), max_rows)
    first = open_source(source, 0, 2)
    before = read_all(first, max_rows, limit=cut)
    after = read_all(open_source(source, 0, 2, first.snapshot()), max_rows)
    assert before + after == full


def test_a_finished_file_is_not_opened_again_after_a_restore(tmp_path: Path) -> None:
    write_inputs(tmp_path / "in", "parquet", files=3, rows=4)
    source, _ = FileSource(str(tmp_path / "in")).prepare()
    first = open_source(source)
    read_all(first, 4, limit=8)  # the first file, then the second
    state = first.snapshot()
    finished = [s for s, split in state["splits"].items() if split.finished]
    assert finished and finished[0].endswith("part-000.parquet")
    Path(finished[0]).unlink()  # gone: a restore must not need it
    assert [r["value"] for r in read_all(open_source(source, 0, 1, state), 4)] == list(range(8, 12))


def test_sequence_is_dealt_round_robin_and_bounded() -> None:
    source = SequenceSource(start=10, end=31)
    parts = [read_all(open_source(source, i, 3), max_rows=4) for i in range(3)]
    assert parts[0] == [{"value": v} for v in range(10, 31, 3)]
    assert sorted(r["value"] for p in parts for r in p) == list(range(10, 31))


@given(cut=st.integers(0, 50), max_rows=st.integers(1, 9), parallelism=st.integers(1, 4))
def test_sequence_restores_exactly(cut: int, max_rows: int, parallelism: int) -> None:
    source = SequenceSource(end=57)
    for subtask in range(parallelism):
        full = read_all(open_source(source, subtask, parallelism), max_rows)
        running = open_source(source, subtask, parallelism)
        before = read_all(running, max_rows, limit=cut)
        after = read_all(open_source(source, subtask, parallelism, running.snapshot()), max_rows)
        assert before + after == full


def test_an_unbounded_sequence_never_ends() -> None:
    running = open_source(SequenceSource())
    values = []
    for _ in range(100):
        batch = running.read(1000)
        assert batch is not None
        values += batch.column(0).to_pylist()
    assert values == list(range(100_000))  # one subtask reads every split, in order
    positions = {s: state.position for s, state in running.snapshot()["splits"].items()}
    assert sum(positions.values()) == 100_000
    assert set(positions.values()) == {781, 782}  # 100,000 = 128 * 781 + 32
    assert not running.exhausted


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
    """Positions per split: the new subtasks read every value the old ones had not, once."""
    source = SequenceSource(end=end, slices=8)
    old = [open_source(source, i, before) for i in range(before)]
    seen: list[int] = []
    for i, rows in enumerate(reads):
        batch = old[i % before].read(rows)
        seen += batch.column(0).to_pylist() if batch is not None else []
    state = merge_source_states([r.snapshot() for r in old], "sequence")
    limit = 600 if end is None else end
    rest: list[int] = []
    for i in range(after):
        running = open_source(source, i, after, state)
        while not running.exhausted:
            batch = running.read(max_rows)
            if batch is None:
                continue
            rest += [v for v in batch.column(0).to_pylist() if v < limit]
            if end is None and batch.column(0).to_pylist()[-1] >= limit:
                break
    assert sorted(seen + rest)[:limit] == list(range(limit))
    assert len(set(seen + rest)) == len(seen + rest)


def test_file_positions_restore_at_another_parallelism(tmp_path: Path) -> None:
    write_inputs(tmp_path / "in", "parquet", files=5, rows=7)
    source, _ = FileSource(str(tmp_path / "in")).prepare()
    full = sorted(map(str, read_all(open_source(source), 3)))
    old = [open_source(source, i, 2) for i in range(2)]
    seen = [r for running in old for r in read_all(running, 3, limit=4)]
    state = merge_source_states([r.snapshot() for r in old], "files")
    rest = [r for i in range(3) for r in read_all(open_source(source, i, 3, state), 3)]
    assert sorted(map(str, seen + rest)) == full


def test_positions_of_checkpoints_before_the_connector_api_restore_exactly(
    tmp_path: Path,
) -> None:
    """The built-in sources' offsets as the checkpoints of cutline before its connector API
    hold them (per split, the count read) restore at the same and at another parallelism."""
    source = SequenceSource(end=40, slices=4)
    legacy = [{"splits": {"0": 3, "2": 5}}, {"splits": {"1": 10, "3": 0}}]
    merged = merge_source_states(legacy, "sequence")
    assert merged["splits"]["1"] == SplitState(1, 10)
    rest = [r["value"] for i in range(3) for r in read_all(open_source(source, i, 3, merged))]
    read = {0: 3, 1: 10, 2: 5, 3: 0}
    assert sorted(rest) == sorted(v for v in range(40) if v // 4 >= read[v % 4])
    write_inputs(tmp_path / "in", "parquet", files=2, rows=5)
    files, _ = FileSource(str(tmp_path / "in")).prepare()
    assert files.listed is not None
    own = {"rows": {files.listed[0]: 5, files.listed[1]: 2}}
    assert [r["value"] for r in read_all(open_source(files, 0, 1, own))] == [7, 8, 9]


def test_a_source_state_that_cannot_be_read_names_the_problem() -> None:
    with pytest.raises(SourceError, match="source numbers: the checkpoint holds a source state"):
        SourceOperator(SequenceSource(), SourceContext("numbers", 0, 1), {"emitted": 5}, None)


def test_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        FileSource(str(tmp_path / "missing")).list_files()
    with pytest.raises(ValueError, match="unknown file format 'xml'"):
        input_format("xml")
    with pytest.raises(TypeError, match="format must be an InputFormat"):
        FileSource(str(tmp_path), "parquet")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.parquet").write_bytes(b"this is not parquet")
    with pytest.raises(SourceError, match=r"a\.parquet is not a valid parquet file"):
        open_source(FileSource(str(bad), schema={"a": "int64"})).read(10)
    with pytest.raises(ValueError, match="subtask 2 of parallelism 2 does not exist"):
        SequenceSource().reader(SourceContext("s", 2, 2))


def test_a_position_beyond_a_file_means_the_file_changed(tmp_path: Path) -> None:
    write_inputs(tmp_path / "in", "parquet", files=1, rows=5)
    source, _ = FileSource(str(tmp_path / "in")).prepare()
    assert source.listed is not None
    (path,) = source.listed
    with pytest.raises(SourceError, match="the file changed since the checkpoint"):
        read_all(open_source(source, 0, 1, {"rows": {path: 9}}))


# ------------------------------------------------------------- rejected rows and offsets

CSV_SCHEMA = {"user": "string", "value": "int64"}

KINDS = ["good", "good", "good", "text", "short", "long", "blank", "quoted", "quoted_text"]
line_kinds = st.sampled_from([*KINDS, "crlf", "latin1"])


def csv_line(kind: str, i: int) -> str:
    """One line of a CSV file of ``user,value`` rows, good or rejected."""
    return {
        "good": f"u{i % 3},{i}",
        "text": f"u{i % 3},x{i}",  # not an int64
        "short": f"u{i % 3}",  # one field
        "long": f'u{i % 3},{i},"extra, field"',  # three fields
        "blank": "" if i % 2 else "\r",
        "quoted": f'"u{i % 3}\n""two"", lines",{i}',  # a record of two lines
        "quoted_text": f'"u{i % 3}\nsecond line",x{i}',
        "crlf": f"u{i % 3},{i}\r",
        "latin1": f"caf\udce9{i},{i}",  # (byte 0xE9: not UTF-8)
    }[kind]


def json_line(kind: str, i: int) -> str:
    return {
        "good": json.dumps({"user": f"u{i % 3}", "value": i, "ignored": [i]}),
        "text": json.dumps({"user": f"u{i % 3}", "value": f"x{i}"}),
        "short": json.dumps({"user": f"u{i % 3}"})[:-1] + ', "value": ',  # malformed
        "long": f"[{i}]",  # not an object
        "blank": "   ",
        "quoted": json.dumps({"user": f'u{i % 3}\n"two", lines', "value": i}),
        "quoted_text": json.dumps({"user": f"u{i % 3}", "value": 1.5}),  # not an int64
        "crlf": json.dumps({"user": f"u{i % 3}", "value": i}) + "\r",
        "latin1": f'{{"user": "caf\udce9", "value": {i}}}',
    }[kind]


def write_files(
    folder: Path, fmt: str, files: list[list[str]]
) -> tuple[list[dict[str, Any]], list[tuple[str, int]]]:
    """The files (lists of line kinds); returns the good rows in order, and where each rejected
    row is (file, 1-based line)."""
    folder.mkdir(exist_ok=True)
    good: list[dict[str, Any]] = []
    rejected: list[tuple[str, int]] = []
    n = 0
    for f, kinds in enumerate(files):
        path = folder / f"part-{f}.{fmt}"
        text = "user,value\n" if fmt == "csv" else ""
        for kind in kinds:
            n += 1
            line = text.count("\n") + 1
            text += (csv_line(kind, n) if fmt == "csv" else json_line(kind, n)) + "\n"
            if kind in ("good", "crlf"):
                good.append({"user": f"u{n % 3}", "value": n})
            elif kind == "quoted":
                user = f'u{n % 3}\n"two", lines'
                good.append({"user": user, "value": n})
            elif kind != "blank":
                rejected.append((str(path), line))
        path.write_bytes(text.encode(errors="surrogateescape"))
    return good, rejected


def where(error: str) -> tuple[str, int]:
    path, line, _ = error.split(":", 2)
    return path, int(line)


@settings(max_examples=60, deadline=None)
@given(
    fmt=st.sampled_from(["csv", "jsonl"]),
    files=st.lists(st.lists(line_kinds, max_size=25), min_size=1, max_size=3),
    block_size=st.integers(1, 120),
    max_rows=st.integers(1, 9),
    cut=st.integers(0, 80),
)
def test_rejected_rows_are_consumed_once_and_offsets_replay_exactly(
    tmp_path_factory: pytest.TempPathFactory,
    fmt: str,
    files: list[list[str]],
    block_size: int,
    max_rows: int,
    cut: int,
) -> None:
    """Whatever the block size and where the reader stops (also just after a rejected row),
    the good rows come out once in order, each rejected row is rejected once with its file and
    line, and a reader opened at the offset goes on exactly from there."""
    folder = tmp_path_factory.mktemp("in")
    good, bad = write_files(folder, fmt, files)
    source = FileSource(str(folder), input_format(fmt), schema=CSV_SCHEMA, block_size=block_size)
    errors: list[str] = []

    def collect(record: Any, error: str) -> None:
        assert isinstance(record, str)
        errors.append(error)

    first = open_source(source, rejected=collect)
    before = read_all(first, max_rows, limit=cut)
    state = first.snapshot()
    after = read_all(open_source(source, 0, 1, state, rejected=collect), max_rows)
    assert before + after == good
    assert [where(e) for e in errors] == bad


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_rejected_row_fails_the_reader_naming_its_file_and_line(tmp_path: Path, fmt: str) -> None:
    _, bad = write_files(tmp_path / "in", fmt, [["good", "good", "text", "good"]])
    source = FileSource(str(tmp_path / "in"), input_format(fmt), schema=CSV_SCHEMA)
    reader = open_source(source)
    assert reader.read(2) is not None  # the two good rows before it
    path, line = bad[0]
    with pytest.raises(SourceError, match=rf"^{path}:{line}: column 'value': 'x3' is not an int64"):
        reader.read(10)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_batches_have_the_job_schema_whatever_the_block(tmp_path: Path, fmt: str) -> None:
    good, _ = write_files(tmp_path / "in", fmt, [["good"] * 10, ["text", "good", "blank", "good"]])
    source = FileSource(str(tmp_path / "in"), input_format(fmt), schema=CSV_SCHEMA, block_size=16)
    reader = open_source(source, rejected=lambda record, error: None)
    rows = []
    while not reader.exhausted:
        batch = reader.read(4)
        if batch is None:
            continue
        assert batch.schema == pa.schema([("user", pa.string()), ("value", pa.int64())])
        assert batch.num_rows > 0
        rows += batch.to_pylist()
    assert rows == good


# ------------------------------------------------------------------ event time per file


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_text_file_not_started_holds_the_watermark_where_its_first_records_allow(
    tmp_path: Path, fmt: str
) -> None:
    """A CSV or JSON-lines file has no statistics: until a subtask starts it, it holds the
    watermark at what its first records and the out-of-orderness bound allow (the lowest of
    them, or their highest minus the bound), not at the minimum, so that windows of the files
    before it fire before it starts."""
    from cutline.protocol.watermarks import EmitWatermark
    from cutline.runtime.eventtime.timestamps import TimeColumn
    from cutline.runtime.eventtime.watermarks import WatermarkStrategy

    files = {"a": [1_000, 1_500, 1_999], "b": [5_000, 4_950, 9_000], "c": [20_000, 20_100]}
    for name, times in files.items():
        rows = [{"ts": t, "n": i} for i, t in enumerate(times)]
        path = tmp_path / f"{name}.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            path.write_text("ts,n\n" + "".join(f"{r['ts']},{r['n']}\n" for r in rows))
    source, _ = FileSource(str(tmp_path), input_format(fmt)).prepare()
    strategy = WatermarkStrategy(TimeColumn("ts"), bound_ms=100)
    running = open_source(source, strategy=strategy)
    assert running.generator is not None
    # a's first records: 1,000 (lowest) and 1,999 - 100; b's: 4,950 and 9,000 - 100; c's:
    # 20,000 and 20,100 - 100
    marks = [a.watermark for a in running.take_watermarks() if isinstance(a, EmitWatermark)]
    while not running.exhausted:
        running.read(2)
        actions = running.take_watermarks()
        marks += [a.watermark for a in actions if isinstance(a, EmitWatermark)]
    # each file's own bounded watermark, held back only by the files not started yet at
    # their lowest (b at 4,949, c at 19,999): without their first records, the watermark
    # would stay at the minimum until c started; and the end once every file finished
    assert marks == [1_399, 1_898, 4_949, 8_899, 19_999, 2**63 - 1]
