"""The Delta Lake source (``env.read_delta``, ``cutline.connectors.delta.DeltaSource``): a
table's snapshot, then every version appended, each row once, as Spark's Delta streaming
source reads it.

Tables are written with delta-rs (``write_deltalake``) into the test's folder. Version ``n``
appends ``ROWS`` rows ``{"batch": n, "row": i, "user": ...}``; a job counts them per user
(a running count: every row's count once, so a row read twice or never shows). Watched
tables get their versions by construction: the job's listener appends the next one each
time a checkpoint completes, and stops the job with a savepoint once a checkpoint shows
every slice past the last one. Jobs run with slots as threads.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable, write_deltalake
from test_savepoints import StopWithSavepoint, endpoints_of

from cutline import (
    EventTime,
    FixedDelay,
    JobFailedError,
    SourceError,
    StreamEnvironment,
    Tumbling,
    testing,
)
from cutline.connectors import SourceContext, Split
from cutline.connectors.delta import DeltaSource
from cutline.runtime.checkpoint.reader import open_checkpoint
from cutline.runtime.task.local import ThreadLauncher

from ledger import first_time

ROWS = 40
Row = dict[str, Any]


def batch(number: int) -> pa.Table:
    """The rows version ``number`` of a test table appends."""
    return pa.table(
        {
            "batch": pa.array([number] * ROWS, pa.int64()),
            "row": pa.array(range(ROWS), pa.int64()),
            "user": [f"u{(number + i) % 7}" for i in range(ROWS)],
        }
    )


def append(table: Path, number: int, files: int = 1) -> int:
    """Version ``number``'s rows appended in ``files`` data files (one per value of the
    partition column ``part``); the table's new version."""
    rows = batch(number).append_column("part", pa.array([i % files for i in range(ROWS)]))
    write_deltalake(str(table), rows, mode="append", partition_by=["part"])
    return DeltaTable(str(table)).version()


def counted(job_rows: Iterable[Row], batches: Iterable[int]) -> None:
    """``job_rows`` (a running count per user) hold every row of ``batches`` once, each
    user's counts 1..n once each."""
    rows = list(job_rows)
    wanted = [(b, i) for b in batches for i in range(ROWS)]
    assert Counter((r["batch"], r["row"]) for r in rows) == Counter(wanted)
    users = Counter(f"u{(b + i) % 7}" for b, i in wanted)
    assert Counter((r["user"], r["count"]) for r in rows) == Counter(
        (u, c) for u, n in users.items() for c in range(1, n + 1)
    )


def published(*folders: Path) -> list[Row]:
    rows: list[Row] = []
    for folder in folders:
        if folder.exists():
            rows += ds.dataset(str(folder), format="parquet").to_table().to_pylist()
    return rows


def counting_job(
    tmp_path: Path, parallelism: int, out: str, checkpoints: str = "ck", **options: Any
) -> StreamEnvironment:
    env = StreamEnvironment(
        parallelism,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / checkpoints,
        restart_strategy=FixedDelay(delay=0),
        batch_size=16,
    )
    stream = env.read_delta(tmp_path / "table", monitor="20ms", name="orders", **options)
    stream.key_by("user").count(name="per_user").write_parquet(tmp_path / out, name="out")
    return env


def slices_at(checkpoints: Path, checkpoint: int, source: str = "orders") -> list[int]:
    """The version each slice of ``source`` stands at in ``checkpoint``."""
    reader = open_checkpoint(str(checkpoints), checkpoint)
    versions = []
    for subtask, handle in reader.handles.items():
        if source in handle.operators:
            splits = reader.state_file(subtask).operators[source]["splits"]
            versions += [state.position[0] for state in splits.values()]
    return versions


class Appender(StopWithSavepoint):
    """The job's listener: on each complete checkpoint, the next batch of ``numbers`` is
    appended to the table (``files`` data files each, or by ``write(table, number)``); once
    they all are and a checkpoint shows every slice past the version of the last, the job is
    asked to stop with a savepoint. ``warnings``: what the job said."""

    def __init__(
        self,
        table: Path,
        checkpoints: Path,
        numbers: list[int],
        endpoints: Any,
        files: int = 1,
        write: Callable[[Path, int], int] | None = None,
    ) -> None:
        super().__init__(checkpoints, endpoints)
        self.table, self.numbers, self.files = table, list(numbers), files
        self.write = write or (lambda table, number: append(table, number, files))
        self.last = DeltaTable(str(table)).version()
        self.warnings: list[str] = []

    def __call__(self, kind: str, message: str) -> None:
        if kind == "warning":
            self.warnings.append(message)
        if kind != "checkpoint" or self.stopping:
            return
        checkpoint = int(message.split()[0])
        if self.numbers:
            self.last = self.write(self.table, self.numbers.pop(0))
        elif min(slices_at(self.checkpoints, checkpoint)) > self.last:
            self.stop()


def test_the_snapshot_then_every_version_appended_is_read_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two versions there when the job is built (its snapshot), six appended while it runs
    (three files each), a compaction among them (its files are not read again)."""
    table = tmp_path / "table"
    append(table, 0)
    append(table, 1, files=3)
    env = counting_job(tmp_path, 2, "out")
    feeder = Appender(table, tmp_path / "ck", list(range(2, 8)), endpoints_of(monkeypatch), 3)
    original = feeder.__call__

    def with_a_compaction(kind: str, message: str) -> None:
        if kind == "checkpoint" and len(feeder.numbers) == 3 and first_time(str(tmp_path / "o")):
            DeltaTable(str(table)).optimize.compact()  # (a version of its own)
        original(kind, message)

    result = testing.execute(env, launcher=ThreadLauncher(), listener=with_a_compaction)
    assert result.savepoints == [feeder.savepoint()]
    operations = [h["operation"] for h in DeltaTable(str(table)).history()]
    assert "OPTIMIZE" in operations
    counted(published(tmp_path / "out"), range(8))


def test_a_failure_mid_stream_reads_each_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A map fails once, in the middle of version 3: the job restarts from its latest
    checkpoint, each slice from its position (version, file, rows)."""
    table = tmp_path / "table"
    append(table, 0, files=2)
    flag = str(tmp_path / "failed")

    def fail_once(record: Row) -> Row:
        if record["batch"] == 3 and record["row"] == ROWS // 2 and first_time(flag):
            raise RuntimeError("injected failure")
        return record

    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "ck",
        restart_strategy=FixedDelay(delay=0),
        batch_size=8,
    )
    rows = env.read_delta(table, monitor="20ms", name="orders").map(fail_once, name="fail")
    rows.key_by("user").count(name="per_user").write_parquet(tmp_path / "out", name="out")
    feeder = Appender(table, tmp_path / "ck", list(range(1, 6)), endpoints_of(monkeypatch), 2)
    result = testing.execute(env, launcher=ThreadLauncher(), listener=feeder)
    feeder.savepoint()
    assert len(result.restarts) == 1 and "injected failure" in result.restarts[0].cause
    counted(published(tmp_path / "out"), range(6))


def test_a_watched_table_stopped_with_a_savepoint_resumes_at_another_parallelism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped once versions 0-3 are read at parallelism 2; versions appended while no job
    runs and after it resumed at parallelism 3: each row once over the two runs."""
    table = tmp_path / "table"
    append(table, 0, files=3)
    endpoints = endpoints_of(monkeypatch)
    first = Appender(table, tmp_path / "ck", [1, 2, 3], endpoints, files=2)
    testing.execute(counting_job(tmp_path, 2, "out1"), launcher=ThreadLauncher(), listener=first)
    path = first.savepoint()
    for number in (4, 5):  # while no job runs
        append(table, number, files=2)
    second = Appender(table, tmp_path / "ck2", [6, 7], endpoints, files=3)
    result = testing.execute(
        counting_job(tmp_path, 3, "out2", "ck2"),
        launcher=ThreadLauncher(),
        listener=second,
        restore_from=path,
    )
    assert result.restored_from == path
    assert published(tmp_path / "out1") and published(tmp_path / "out2")
    counted(published(tmp_path / "out1", tmp_path / "out2"), range(8))


def bounded_rows(table: Path, **options: Any) -> list[Row]:
    env = StreamEnvironment(2, checkpoint_interval=0.05)
    env.read_delta(table, **options).collect("rows")
    return list(testing.execute(env, launcher=ThreadLauncher()).output)


def batches_of(rows: list[Row]) -> Counter[tuple[int, int]]:
    return Counter((r["batch"], r["row"]) for r in rows)


def every(*numbers: int) -> Counter[tuple[int, int]]:
    return Counter((n, i) for n in numbers for i in range(ROWS))


def test_without_monitor_the_snapshot_of_the_version_when_built_is_read_and_the_job_ends(
    tmp_path: Path,
) -> None:
    """A version appended after the job was built is not read (the version was fixed on the
    driver): the job ends with the snapshot."""
    table = tmp_path / "table"
    for number in range(3):
        append(table, number, files=1 + number)
    env = StreamEnvironment(3, checkpoint_interval=0.05)
    env.read_delta(table, slices=4).collect("rows")
    append(table, 3)
    rows = list(testing.execute(env, launcher=ThreadLauncher()).output)
    assert batches_of(rows) == every(0, 1, 2)
    assert set(rows[0]) == {"batch", "row", "user", "part"}


def test_starting_version_and_timestamp_read_the_versions_from_there_without_a_snapshot(
    tmp_path: Path,
) -> None:
    table = tmp_path / "table"
    for number in range(4):
        append(table, number)
    assert batches_of(bounded_rows(table, starting_version=2)) == every(2, 3)
    assert batches_of(bounded_rows(table, starting_version=0)) == every(0, 1, 2, 3)
    with pytest.warns(UserWarning, match="nothing to read"):
        assert bounded_rows(table, starting_version="latest") == []
    stamps = {h["version"]: h["timestamp"] for h in DeltaTable(str(table)).history()}
    at = datetime.fromtimestamp(stamps[1] / 1000, UTC)
    assert batches_of(bounded_rows(table, starting_timestamp=at)) == every(1, 2, 3)
    text = datetime.fromtimestamp((stamps[1] + 1) / 1000, UTC).isoformat()
    assert batches_of(bounded_rows(table, starting_timestamp=text)) == every(2, 3)
    env = StreamEnvironment(1)
    with pytest.raises(SourceError, match=r"starting_version=9, but its newest version is 3"):
        env.read_delta(table, starting_version=9)
    with pytest.raises(SourceError, match=r"starting_timestamp=.* is after its newest commit"):
        env.read_delta(table, starting_timestamp=date(2999, 1, 1))
    with pytest.raises(ValueError, match="starting_version= or starting_timestamp=, not both"):
        env.read_delta(table, starting_version=1, starting_timestamp=at)
    with pytest.raises(ValueError, match=r"starting_version is a version number .* not -1"):
        env.read_delta(table, starting_version=-1)


def changes(table: Path) -> None:
    """Versions: 0 append, 1 append, 2 DELETE (batch 0's even rows), 3 append, 4 overwrite
    (batch 4 replaces everything), 5 append."""
    append(table, 0)
    append(table, 1)
    DeltaTable(str(table)).delete("batch = 0 AND row % 2 = 0")
    append(table, 3)
    write_deltalake(
        str(table), batch(4).append_column("part", pa.array([0] * ROWS)), mode="overwrite"
    )
    append(table, 5)


def test_a_version_that_removes_data_fails_the_job_naming_it_and_its_operation(
    tmp_path: Path,
) -> None:
    table = tmp_path / "table"
    changes(table)
    env = StreamEnvironment(2, checkpoint_interval=0.05, restart_strategy=FixedDelay(0))
    env.read_delta(table, starting_version=0).collect("rows")
    message = (
        rf"Delta table {table}: version 2 \(DELETE, predicate=batch = 0 AND row % 2 = 0\) "
        r"removes data \(file part=0/.*\.parquet; it adds 1 file\(s\)\): a stream of a Delta "
        r"table reads the rows each "
        r"version adds.*skip_change_commits=True"
    )
    with pytest.raises(JobFailedError, match=message):
        testing.execute(env, launcher=ThreadLauncher())
    # from version 3 on: the overwrite fails it
    env = StreamEnvironment(2, checkpoint_interval=0.05, restart_strategy=FixedDelay(0))
    env.read_delta(table, starting_version=3).collect("rows")
    message = (
        r"version 4 \(WRITE, mode=Overwrite, partitionBy=\[\"part\"\]\) removes data \(file "
        r".*; it adds 1 file\(s\)\)"
    )
    with pytest.raises(JobFailedError, match=message):
        testing.execute(env, launcher=ThreadLauncher())


def test_skip_change_commits_skips_such_versions_whole_and_says_so(tmp_path: Path) -> None:
    """As Spark's ``skipChangeCommits``: the delete is skipped, and so is the overwrite, the
    rows it adds included; the job's listener hears of each once."""
    table = tmp_path / "table"
    changes(table)
    heard: list[str] = []
    env = StreamEnvironment(2, checkpoint_interval=0.05)
    env.read_delta(table, starting_version=0, skip_change_commits=True).collect("rows")
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=lambda kind, message: heard.append(message) if kind == "warning" else None,
    )
    assert batches_of(list(result.output)) == every(0, 1, 3, 5)
    skipped = [m for m in heard if "skip_change_commits=True" in m]
    assert len(skipped) == 2, heard
    assert "version 2 (DELETE, predicate=" in skipped[0], skipped
    assert "version 4 (WRITE, mode=Overwrite" in skipped[1], skipped


def test_a_data_file_gone_on_a_restore_fails_naming_the_file_and_its_version(
    tmp_path: Path,
) -> None:
    """A slice restored in the middle of a file that was vacuumed since (removed by version
    1, then VACUUM with no retention)."""
    table = tmp_path / "table"
    append(table, 0)
    [file] = [a["add"]["path"] for a in log_actions(table, 0) if "add" in a]
    source, _ = DeltaSource(str(table), starting_version=0, slices=4).prepare()
    DeltaTable(str(table)).delete()
    DeltaTable(str(table)).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    reader = source.reader(SourceContext("orders", 0, 1))
    reader.add_split(Split("0/4", 0), (0, False, 0, file, 7))
    with pytest.raises(SourceError, match=rf"data file {file} \(version 0\) is gone"):
        reader.read(10)


def test_a_restore_with_another_number_of_slices_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "table"
    append(table, 0)
    source, _ = DeltaSource(str(table), slices=32).prepare()
    reader = source.reader(SourceContext("orders", 0, 1))
    with pytest.raises(SourceError, match=r"in 64 slices \(split 3/64\), this job in 32"):
        reader.add_split(Split("3/64", 3), (0, True, 3, None, 0))
    with pytest.raises(SourceError, match=r"split 3/32: 'x' is not a position of this source"):
        reader.add_split(Split("3/32", 3), "x")


def test_a_path_without_a_table_is_an_error_when_the_job_is_built(tmp_path: Path) -> None:
    env = StreamEnvironment(1)
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(SourceError, match=rf"read_delta: no Delta table at {path}"):
            env.read_delta(path)
    append(tmp_path / "table", 0)
    with pytest.raises(ValueError, match=r"no column 'nope' \(columns=\); the table's columns"):
        env.read_delta(tmp_path / "table", columns=["row", "nope"])


def test_what_cutlines_own_write_delta_wrote_is_read_back(tmp_path: Path) -> None:
    table = tmp_path / "sums"
    env = StreamEnvironment(2, checkpoint_interval=0.05)
    env.from_sequence(0, 3000).map(
        lambda r: {"user": f"u{r['value'] % 10}", "amount": r["value"]}
    ).key_by("user").sum("amount").write_delta(table, partition_by=["user"])
    testing.execute(env, launcher=ThreadLauncher())
    written = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    read = bounded_rows(table)
    key = lambda r: (r["user"], r["amount"])  # noqa: E731
    assert sorted(read, key=key) == sorted(written, key=key) and len(read) == 3000
    assert set(read[0]) == {"user", "amount"}


def test_partition_columns_come_back_as_columns_of_their_types(tmp_path: Path) -> None:
    table = tmp_path / "table"
    rows = pa.table(
        {
            "n": pa.array(range(6), pa.int64()),
            "city": ["a b", "x/y", None, "a b", "x/y", "c"],
            "day": pa.array([date(2024, 1, 1 + i % 2) for i in range(6)], pa.date32()),
            "shard": pa.array([i % 3 for i in range(6)], pa.int32()),
            "at": pa.array(
                [datetime(2024, 1, 2, 3, 4, 5, 123456 * (i % 2), UTC) for i in range(6)],
                pa.timestamp("us", tz="UTC"),
            ),
            "on": [i % 2 == 0 for i in range(6)],
        }
    )
    parts = ["city", "day", "shard", "at", "on"]
    write_deltalake(str(table), rows.slice(0, 3), partition_by=parts)
    write_deltalake(str(table), rows.slice(3), mode="append")
    schema = DeltaTable(str(table)).schema().to_arrow()
    for options in ({}, {"starting_version": 0}):  # (a snapshot's values; a commit's text)
        read = sorted(bounded_rows(table, **options), key=lambda r: r["n"])
        assert read == rows.to_pylist()
    projected = bounded_rows(table, columns=["shard", "n"])
    assert sorted(projected, key=lambda r: r["n"]) == rows.select(["shard", "n"]).to_pylist()
    source, _ = DeltaSource(str(table)).prepare()
    assert source.record_schema() == pa.schema(schema)


def with_extra(table: Path, number: int) -> int:
    """Version ``number``'s rows with one more column, ``extra`` (the table's schema merged)."""
    rows = batch(number).append_column("part", pa.array([0] * ROWS))
    rows = rows.append_column("extra", pa.array([number] * ROWS))
    write_deltalake(str(table), rows, mode="append", schema_mode="merge")
    return DeltaTable(str(table)).version()


def test_columns_added_before_the_job_was_built_are_null_in_older_files(tmp_path: Path) -> None:
    table = tmp_path / "table"
    append(table, 0)
    with_extra(table, 1)
    rows = bounded_rows(table, starting_version=0)
    assert batches_of(rows) == every(0, 1)
    assert Counter(r["extra"] for r in rows) == {None: ROWS, 1: ROWS}


def test_a_column_added_while_the_job_runs_is_not_read_and_the_listener_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "table"
    append(table, 0)
    feeder = Appender(table, tmp_path / "ck", [1, 2], endpoints_of(monkeypatch), write=with_extra)
    testing.execute(counting_job(tmp_path, 2, "out"), launcher=ThreadLauncher(), listener=feeder)
    feeder.savepoint()
    rows = published(tmp_path / "out")
    counted(rows, range(3))
    assert "extra" not in rows[0]
    told = [m for m in feeder.warnings if "adds column(s) 'extra', which the job does not" in m]
    assert len(told) == 1, feeder.warnings  # (once: by the subtask of the version's slice)


def test_event_time_windows_over_a_table(tmp_path: Path) -> None:
    """Watermarks per slice: every window of a bounded table once, counted."""
    table = tmp_path / "table"
    for number in range(3):
        rows = batch(number).append_column(
            "ts", pa.array([(number * ROWS + i) * 100 for i in range(ROWS)], pa.int64())
        )
        write_deltalake(str(table), rows, mode="append")  # (not partitioned)
    env = StreamEnvironment(2, checkpoint_interval=0.05)
    stream = env.read_delta(table, event_time=EventTime("ts", max_out_of_orderness="1s"), slices=4)
    stream.key_by("user").window(Tumbling("2s")).count().collect("windows")
    windows = list(testing.execute(env, launcher=ThreadLauncher()).output)
    wanted: Counter[tuple[str, int]] = Counter()
    for number in range(3):
        for i in range(ROWS):
            wanted[(f"u{(number + i) % 7}", (number * ROWS + i) * 100 // 2000 * 2000)] += 1
    got = {(w["user"], w["window_start"]): w["count"] for w in windows}
    assert len(windows) == len(got) and got == dict(wanted)


def log_actions(table: Path, version: int) -> list[dict[str, Any]]:
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_a_table_with_column_mapping_is_refused_when_the_job_is_built(tmp_path: Path) -> None:
    """Its data files name the columns otherwise than the table (``col-<uuid>``)."""
    table = tmp_path / "table"
    mapping = {"delta.columnMapping.mode": "name"}
    write_deltalake(str(table), pa.table({"a": [1]}), configuration=mapping)
    with pytest.raises(SourceError, match=r"has column mapping \(delta.columnMapping.mode=name"):
        StreamEnvironment(1).read_delta(table)


def test_a_watched_run_refuses_a_checkpoint_whose_slices_a_bounded_run_ended(
    tmp_path: Path,
) -> None:
    """The bounded run read every slice to its end, which its checkpoint holds as finished:
    a watched run resuming it would never read those slices' later versions, so it fails
    naming them and what to do."""
    table = tmp_path / "table"
    append(table, 0, files=2)

    def job(**options: Any) -> StreamEnvironment:
        env = StreamEnvironment(2, checkpoint_dir=tmp_path / "ck", restart_strategy=FixedDelay(0))
        env.read_delta(table, name="orders", slices=4, **options).collect("rows")
        return env

    assert batches_of(list(testing.execute(job(), launcher=ThreadLauncher()).output)) == every(0)
    append(table, 1)
    message = r"slice\(s\) (0/4, 2/4|1/4, 3/4) read to the end of a bounded run .*\(fresh=True\)"
    with pytest.raises(JobFailedError, match=message):
        testing.execute(job(monitor="20ms"), launcher=ThreadLauncher(), restore_from="latest")


def test_a_commit_cleaned_from_the_log_before_it_was_read_fails_naming_it(tmp_path: Path) -> None:
    """A watched slice restored at version 1, whose commit log cleanup removed since (a
    checkpoint of the log at version 3): the reader fails rather than wait for it for ever."""
    table = tmp_path / "table"
    no_retention = {"delta.logRetentionDuration": "interval 0 seconds"}
    rows = batch(0).append_column("part", pa.array([0] * ROWS))
    write_deltalake(str(table), rows, partition_by=["part"], configuration=no_retention)
    source, _ = DeltaSource(str(table), starting_version=0, slices=2, monitor=0.01).prepare()
    for number in (1, 2, 3):
        append(table, number)
    log = DeltaTable(str(table))
    log.create_checkpoint()
    log.cleanup_metadata()
    assert not (table / "_delta_log" / f"{1:020d}.json").exists()
    reader = source.reader(SourceContext("orders", 0, 1))
    reader.add_split(Split("0/2", 0), (1, False, 0, None, 0))
    reader.add_split(Split("1/2", 1), (4, False, 0, None, 0))
    message = r"version 1 is not in its log, which has a checkpoint at version 3: it was cleaned"
    with pytest.raises(SourceError, match=message):
        for _ in range(100):
            reader.read(10)


def test_arguments_that_do_not_fit_are_named_when_the_job_is_built(tmp_path: Path) -> None:
    append(tmp_path / "table", 0)
    env = StreamEnvironment(1)
    wrong = [
        ({"monitor": "0s"}, r"monitor must be a positive duration, not 0.0"),
        ({"slices": 0}, r"slices must be a positive integer, not 0"),
        ({"starting_timestamp": "yesterday"}, r"'yesterday' is not an ISO-8601 date or time"),
        ({"starting_version": "first"}, r"a version number \(0 or more\) or 'latest', not 'first'"),
        ({"columns": "row"}, r"columns takes a list of column names, not 'row'"),
        ({"event_time": "nope"}, r"event_time='nope': no such column"),
    ]
    for options, message in wrong:
        with pytest.raises((ValueError, TypeError), match=message):
            env.read_delta(tmp_path / "table", **options)
