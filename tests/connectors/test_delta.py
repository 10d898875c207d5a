"""The Delta Lake sink (``cutline.connectors.delta``): every row in the table once.

The job is the ledger's running balance per account (``tests/ledger.py``): each account is
one split, read in order by one subtask, so the balance after each entry is fixed, whatever
the failures (``assert_exact`` of ``test_connector_api.py``). It runs with slots as threads;
the table is read back with delta-rs, and its log tells which checkpoints it holds: every
commit that adds files carries the application transaction ``(cutline-<job>-sums, checkpoint
id)``; one that withdraws files (a job restored from an older checkpoint than it committed)
removes those of the checkpoints after the restored one.
"""

from __future__ import annotations

import json
import random
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.fs import DeltaStorageHandler
from test_connector_api import FailAt, assert_exact
from test_savepoints import SavepointOnHold, endpoints_of

from cutline import (
    Checkpoints,
    CheckpointWarning,
    FixedDelay,
    JobClient,
    JobFailedError,
    SourceHold,
    StreamEnvironment,
    testing,
)
from cutline.connectors import SinkContext, SinkError, tables
from cutline.connectors.delta import DeltaCommittable, DeltaSink, app_id
from cutline.runtime.task.local import ThreadLauncher

from ledger import Ledger

Row = dict[str, Any]


def sums_job(
    tmp_path: Path,
    ledger: Ledger,
    *,
    fail: FailAt | None = None,
    ck: str = "ck",
    **options: Any,
) -> StreamEnvironment:
    """The ledger's running balance per account, into the Delta table ``tmp_path/table``."""
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / ck,
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 40,
    }
    env = StreamEnvironment(2, **{**settings, **options})
    stream = env.from_source(ledger, name="ledger")
    if fail is not None:
        stream = stream.map(fail, name="fail")
    balances = stream.key_by("account").sum("amount", name="balance")
    balances.sink_to(DeltaSink(str(tmp_path / "table")), name="sums")
    return env


def rows(table: Path) -> list[Row]:
    return DeltaTable(str(table)).to_pyarrow_table().to_pylist()


def commits(table: Path) -> list[tuple[list[dict[str, Any]], list[str], list[str]]]:
    """The table's commits in order: each one's application transactions, and the files it
    added and removed."""
    log = []
    for path in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines()]
        txns = [a["txn"] for a in actions if "txn" in a]
        paths = {
            kind: [a[kind]["path"] for a in actions if kind in a] for kind in ("add", "remove")
        }
        log.append((txns, paths["add"], paths["remove"]))
    return log


def checkpoint_of(path: str) -> int:
    """The checkpoint in a data file's name: ``part-<job>-<sink>-<subtask>-<checkpoint>-...``."""
    return int(path.rsplit("/", 1)[-1].split("-")[4])


def assert_one_commit_per_checkpoint(table: Path, completed: set[int]) -> str:
    """Each commit that adds files carries one transaction of the one app id, for a completed
    checkpoint, in increasing order, and adds the files of the checkpoints since the one
    before; one that removes files (withdraws those of checkpoints after a restored one)
    carries none. No file in the table's directory is outside the log. Returns the app id."""
    log = commits(table)
    assert log, "nothing committed"
    [app] = {txn["appId"] for txns, _, _ in log for txn in txns}
    versions = []
    for txns, added, removed in log:
        if removed:
            assert not txns and not added
            continue
        [txn] = txns
        versions.append(txn["version"])
        assert added and txn["version"] in completed
        before = versions[-2] if len(versions) > 1 else 0
        assert all(before < checkpoint_of(path) <= txn["version"] for path in added)
    assert versions == sorted(set(versions)), "a checkpoint committed twice, or out of order"
    assert DeltaTable(str(table)).transaction_version(app) == versions[-1]
    on_disk = {p.name for p in table.rglob("*.parquet")}
    assert on_disk == {Path(p).name for _, added, _ in log for p in added}, "orphans left"
    return app


def test_the_running_sums_are_in_the_table_once_a_commit_per_checkpoint(tmp_path: Path) -> None:
    ledger = Ledger(accounts=5, per_account=300)
    result = testing.execute(
        sums_job(tmp_path, ledger),
        launcher=ThreadLauncher(),
        hold_sources=SourceHold(records=100, checkpoints=2),
    )
    table = tmp_path / "table"
    assert_exact(ledger, rows(table), [], with_windows=False)
    completed = {c.checkpoint_id for c in result.checkpoints}
    app = assert_one_commit_per_checkpoint(table, completed)
    assert app.startswith("cutline-") and app.endswith("-sums")
    assert len(commits(table)) >= 2  # (held part-way until two checkpoints completed)


@pytest.mark.parametrize(("seed", "ahead"), [(1, None), (2, None), (3, None), (4, 7), (5, 40)])
def test_the_running_sums_are_in_the_table_once_through_a_failure_at_a_random_entry(
    tmp_path: Path, seed: int, ahead: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ahead``: the writers write a data file every that many rows, ahead of the barrier
    (files of an interval that fails are orphans, deleted by the restored writers)."""
    if ahead is not None:
        monkeypatch.setattr(tables.writer, "ROW_GROUP_ROWS", ahead)
    rng = random.Random(f"delta-{seed}")
    ledger = Ledger(accounts=5, per_account=300, numbered=seed != 2)
    fail = FailAt(f"acct-{rng.randrange(5):02d}", rng.randrange(100, 300), str(tmp_path / "f"))
    result = testing.execute(
        sums_job(tmp_path, ledger, fail=fail),
        launcher=ThreadLauncher(),
        hold_sources=SourceHold(records=100, checkpoints=2),
    )
    assert len(result.restarts) == 1 and "injected failure" in result.restarts[0].cause
    table = tmp_path / "table"
    assert_exact(ledger, rows(table), [], with_windows=False)
    assert_one_commit_per_checkpoint(table, {c.checkpoint_id for c in result.checkpoints})


def staged(
    sink: DeltaSink, job: str, batches: dict[int, list[Row]], subtask: int = 0, size: int = 0
) -> list[Any]:
    """A writer's committables for ``batches`` (checkpoint -> records, written ``size`` at a
    time, or at once), never told that one was committed (so each holds the files of the ones
    before as well)."""
    writer = sink.writer(SinkContext("sums", subtask, 2, 1, "r1", job=job), {})
    out = []
    for checkpoint, records in batches.items():
        for start in range(0, len(records), size or len(records) or 1):
            stop = start + size if size else len(records)
            writer.write(pa.RecordBatch.from_pylist(records[start:stop]))
        out.append(writer.prepare_commit(checkpoint).complete())
    return out


def test_a_replay_is_not_committed_again_and_an_older_checkpoint_withdraws_the_newer_ones(
    tmp_path: Path,
) -> None:
    sink = DeltaSink(str(tmp_path / "table"))
    batches = {3: [{"n": 1}, {"n": 2}], 5: [{"n": 3}], 6: [{"n": 4}], 7: []}
    first, second, third, empty = staged(sink, "j1", batches)
    assert isinstance(second, DeltaCommittable) and len(second.files) == 2
    committer, app = sink.global_committer(), app_id("j1", "sums")

    def state() -> tuple[int, int | None, list[int]]:
        table = DeltaTable(sink.path)
        values = sorted(r["n"] for r in table.to_pyarrow_table().to_pylist())
        return table.version(), table.transaction_version(app), values

    committer.commit(3, [first, None])
    assert state() == (0, 3, [1, 2])
    committer.commit(3, [first])  # a replay: the table does not move
    assert state() == (0, 3, [1, 2])
    committer.commit(5, [second])  # (the file of checkpoint 3 in it is not added twice)
    committer.commit(6, [third])
    assert state() == (2, 6, [1, 2, 3, 4])
    # the job restores checkpoint 5 (a savepoint 6 committed since): 6's rows come again
    committer.commit(5, [second])
    assert state() == (3, 6, [1, 2, 3])
    committer.commit(5, [second])  # (withdrawn already)
    committer.commit(7, [empty, None])  # nothing new (none since 6): no commit
    assert state() == (3, 6, [1, 2, 3])
    [(_, _, removed)] = commits(tmp_path / "table")[3:]
    assert [checkpoint_of(path) for path in removed] == [6]


def test_a_restored_writer_deletes_what_its_subtask_wrote_for_checkpoints_never_committed(
    tmp_path: Path,
) -> None:
    """Its files of checkpoint 2, which did not complete; not those of another subtask (still
    writing, for all it knows) nor another job's."""
    sink = DeltaSink(str(tmp_path / "table"))
    one, two = staged(sink, "j1", {1: [{"n": 1}], 2: [{"n": 2}]})
    [neighbour] = staged(sink, "j1", {2: [{"n": 3}]}, subtask=1)
    [other] = staged(sink, "j2", {2: [{"n": 4}]})
    sink.global_committer().commit(1, [one])

    def files() -> set[str]:
        return {p.name for p in (tmp_path / "table").glob("*.parquet")}

    def names(*committables: DeltaCommittable) -> set[str]:
        return {Path(f.path).name for c in committables for f in c.files}

    assert files() == names(two, neighbour, other)  # (two's: checkpoints 1 and 2)
    sink.writer(SinkContext("sums", 0, 2, 2, "r1", job="j1"), {0: one})  # the next attempt
    assert files() == names(one, neighbour, other)
    assert rows(tmp_path / "table") == [{"n": 1}]


def test_a_partitioned_table_and_the_statistics_delta_reads(tmp_path: Path) -> None:
    """Folders as delta-rs names them (values escaped, nulls in Hive's default partition), the
    partition values and the statistics of every file in the log."""
    sink = DeltaSink(str(tmp_path / "table"), partition_by=["city"])
    records = [
        {"city": "a b", "n": 4, "name": "x" * 40, "t": 2.5},
        {"city": "a b", "n": -1, "name": "y", "t": None},
        {"city": "x/y", "n": 7, "name": None, "t": 1.0},
        {"city": None, "n": 0, "name": "z", "t": 0.5},
    ]
    [committable] = staged(sink, "j1", {1: records})
    sink.global_committer().commit(1, [committable])
    key = lambda r: r["n"]  # noqa: E731
    assert sorted(rows(tmp_path / "table"), key=key) == sorted(records, key=key)
    folders = {p.parent.name for p in (tmp_path / "table").rglob("*.parquet")}
    assert folders == {"city=a%20b", "city=x%2Fy", "city=__HIVE_DEFAULT_PARTITION__"}
    [(_, added, _)] = commits(tmp_path / "table")
    adds = pa.table(DeltaTable(sink.path).get_add_actions(flatten=False)).to_pylist()
    assert len(adds) == len(added) == 3
    by_city = {a["partition"]["city"]: a for a in adds}
    ab = by_city["a b"]
    assert ab["num_records"] == 2
    assert ab["min"] == {"n": -1, "name": "x" * 32, "t": 2.5}  # (a prefix: still a bound)
    assert ab["max"] == {"n": 4, "name": "y", "t": 2.5}
    assert ab["null_count"] == {"n": 0, "name": 0, "t": 1}
    assert by_city["x/y"]["null_count"]["name"] == 1 and None in by_city


def test_a_value_that_does_not_fit_its_column_names_the_table_and_the_column(
    tmp_path: Path,
) -> None:
    path = tmp_path / "table"
    write_deltalake(str(path), pa.table({"n": pa.array([1], pa.int64()), "x": [1.5]}))
    writer = DeltaSink(str(path)).writer(SinkContext("sums", 0, 1, 1, "r1", job="j1"), {})
    writer.write(pa.RecordBatch.from_pylist([{"n": 2, "x": 3}]))  # (an integer into a double)
    with pytest.raises(SinkError, match=rf"Delta table {path}: column 'n' is int64 in the table"):
        writer.write(pa.RecordBatch.from_pylist([{"n": "three", "x": 3.5}]))
    with pytest.raises(SinkError, match=r"a value of column 'x' does not fit its type double"):
        writer.write(pa.RecordBatch.from_pylist([{"n": 4, "x": 2**62 + 1}]))
    with pytest.raises(SinkError, match=rf"Delta table {path} has no column 'y'"):
        writer.write(pa.RecordBatch.from_pylist([{"n": 4, "x": 2.0, "y": 1}]))


def test_a_resumed_job_goes_on_with_its_app_id_and_a_fresh_start_has_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(accounts=4, per_account=300)
    asking = SavepointOnHold(
        endpoints_of(monkeypatch), lambda _: JobClient(str(tmp_path / "ck")).savepoint(stop=True)
    )
    first = testing.execute(
        sums_job(tmp_path, ledger),
        launcher=ThreadLauncher(),
        listener=asking,
        hold_sources=SourceHold(records=150, checkpoints=1000),  # (until the job stops)
    )
    assert isinstance(asking.answer(), str) and first.savepoints
    table = tmp_path / "table"
    stopped = len(rows(table))
    assert 0 < stopped < 4 * 300, "stopped half-way"
    second = testing.execute(
        sums_job(tmp_path, ledger), launcher=ThreadLauncher(), restore_from="latest"
    )
    assert second.restored_from is not None
    assert_exact(ledger, rows(table), [], with_windows=False)
    completed = {c.checkpoint_id for c in first.checkpoints + second.checkpoints}
    app = assert_one_commit_per_checkpoint(table, completed)

    testing.execute(sums_job(tmp_path, ledger, ck="ck2"), launcher=ThreadLauncher(), fresh=True)
    apps = [txn["appId"] for txns, _, _ in commits(table) for txn in txns]
    assert apps[0] == app and len(set(apps)) == 2  # (a new job: its rows once more)
    assert len(rows(table)) == 2 * 4 * 300


def test_a_job_restored_from_an_older_checkpoint_than_it_committed_withdraws_the_newer_ones(
    tmp_path: Path,
) -> None:
    """Its newest checkpoints are damaged: the job resumes from an older one, and the rows the
    table holds of the ones after it, which the job writes again, must go (here the newest
    commit and any after the restored checkpoint: one commit of remove actions)."""
    ledger = Ledger(accounts=4, per_account=300)
    env = sums_job(tmp_path, ledger, checkpoints=Checkpoints(retained=100))
    testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=100, checkpoints=2)
    )
    table = tmp_path / "table"
    newest = commits(table)[-1][0][0]["version"]  # (the first commit's checkpoint is older)
    for folder in (tmp_path / "ck").glob("chk-*"):
        if int(folder.name.split("-")[1]) >= newest:
            for state in folder.glob("*.state"):
                state.write_bytes(b"damaged")
    with pytest.warns(CheckpointWarning, match="is damaged"):
        result = testing.execute(
            sums_job(tmp_path, ledger, checkpoints=Checkpoints(retained=100)),
            launcher=ThreadLauncher(),
            restore_from="latest",
        )
    restored = int(str(result.restored_from).rsplit("-", 1)[1])
    assert restored < newest
    assert_exact(ledger, rows(table), [], with_windows=False)
    [withdrawn] = [removed for _, _, removed in commits(table) if removed]
    assert newest in {checkpoint_of(path) for path in withdrawn}
    assert all(checkpoint_of(path) > restored for path in withdrawn)


def test_a_table_of_another_schema_fails_the_job_at_its_first_batch(tmp_path: Path) -> None:
    path = tmp_path / "table"
    columns = {"account": ["a"], "entry": [0], "amount": ["12"], "ts": [0]}
    write_deltalake(str(path), pa.table(columns))
    env = sums_job(
        tmp_path, Ledger(accounts=2, per_account=100), restart_strategy=FixedDelay(0, delay=0)
    )
    message = rf"Delta table {path}: column 'amount' is string in the table, int64 in the records"
    with pytest.raises(JobFailedError, match=message):
        testing.execute(env, launcher=ThreadLauncher())
    assert DeltaTable(str(path)).version() == 0 and len(rows(path)) == 1
    assert len(list(path.glob("*.parquet"))) == 1  # (no file written either)


def test_the_statistics_are_those_delta_rs_writes_of_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken from the Parquet footer (several row groups here), they equal delta-rs's own for
    every type it bounds; a float column with NaN or an infinity has none (a bound JSON cannot
    hold, or one that would not bound the NaN), and a binary or nested one only null counts."""
    monkeypatch.setattr(tables.writer, "ROW_GROUP_ROWS", 3)
    utc = pa.timestamp("us", tz="UTC")
    columns = {
        "i": pa.array([5, -3, None, 9, 0, 2, 7], pa.int64()),
        "small": pa.array([1, 2, 3, 4, 5, 6, None], pa.int16()),
        "f": pa.array([0.5, 2.5, -1.0, None, 3.0, 1.0, 0.0]),
        "s": pa.array(["m", "b", None, "z" * 40, "a" * 40, "q", "c"]),
        "b": pa.array([True, False, True, None, True, True, True]),
        "d": pa.array([19000, 18000, 20000, None, 19500, 1, 19999], pa.date32()),
        "t": pa.array([10**15, 2 * 10**15, None, 1, 5 * 10**14, 3, 10**12], utc),
        "nan": pa.array([1.0, float("nan"), 2.0, 3.0, 4.0, 5.0, 6.0]),
        "inf": pa.array([1.0, float("inf"), 2.0, 3.0, 4.0, 5.0, 6.0]),
        "raw": pa.array([b"x", b"y", None, b"z", b"w", b"v", b"u"]),
        "l": pa.array([[1], [2, 3], None, [], [4], [5], [6]]),
    }
    records = pa.table(columns)
    ours_sink = DeltaSink(str(tmp_path / "ours"))
    [committable] = staged(ours_sink, "j1", {1: records.to_pylist()}, size=3)
    assert isinstance(committable, DeltaCommittable) and len(committable.files) == 1
    [data] = committable.files
    assert pq.ParquetFile(tmp_path / "ours" / data.path).metadata.num_row_groups == 3
    ours = json.loads(data.stats)
    write_deltalake(str(tmp_path / "theirs"), records)
    [theirs] = [
        json.loads(a["add"]["stats"]) for a in log_actions(tmp_path / "theirs") if "add" in a
    ]
    bounded = ["i", "small", "f", "b", "d", "t"]
    for kind in ("minValues", "maxValues"):
        for stats in (ours, theirs):  # (an instant: delta-rs leaves out a zero fraction)
            stats[kind]["t"] = datetime.fromisoformat(stats[kind]["t"])
        assert {c: ours[kind][c] for c in bounded} == {c: theirs[kind][c] for c in bounded}
    assert theirs["minValues"]["s"] == "a" * 40  # (ours: its first 32 characters, as Spark's)
    assert ours["minValues"]["s"] == "a" * 32 and "s" not in ours["maxValues"]  # (z * 40)
    assert not {"nan", "inf", "raw", "l"} & {*ours["minValues"], *ours["maxValues"]}
    assert ours["numRecords"] == 7
    assert ours["nullCount"] == {c: records.column(c).null_count for c in columns if c != "l"}


def log_actions(table: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((table / "_delta_log").glob("*.json"))
        for line in path.read_text().splitlines()
    ]


def test_a_column_of_mostly_distinct_values_is_written_without_a_dictionary(
    tmp_path: Path,
) -> None:
    """Ids and free text are encoded plain (a dictionary of them is work thrown away, and a
    larger file); a column of few values keeps its dictionary."""
    records = [{"id": f"user-{i}", "city": f"city-{i % 7}", "n": i} for i in range(5000)]
    sink = DeltaSink(str(tmp_path / "table"))
    [committable] = staged(sink, "j1", {1: records})
    sink.global_committer().commit(1, [committable])
    [data] = committable.files
    chunks = pq.ParquetFile(tmp_path / "table" / data.path).metadata.row_group(0)
    encodings = {chunks.column(i).path_in_schema: chunks.column(i).encodings for i in range(3)}
    assert "RLE_DICTIONARY" in encodings["city"]
    assert "RLE_DICTIONARY" not in encodings["id"] and "RLE_DICTIONARY" not in encodings["n"]
    assert sorted(rows(tmp_path / "table"), key=lambda r: r["n"]) == records


@pytest.mark.parametrize(("target", "most_open"), [(1, 64), (1 << 30, 1)])
def test_files_are_rolled_when_large_and_when_too_many_are_open_and_every_row_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: int, most_open: int
) -> None:
    """A part file past its target size is closed and another opened; past the most open
    files, the one written least recently is closed: every row still in the table once."""
    monkeypatch.setattr(tables.writer, "ROW_GROUP_ROWS", 10)
    monkeypatch.setattr(tables.parts, "TARGET_FILE_BYTES", target)
    monkeypatch.setattr(tables.parts, "MAX_OPEN_FILES", most_open)
    sink = DeltaSink(str(tmp_path / "table"), partition_by=["city"])
    records = [{"city": f"c{i % 3}", "n": i} for i in range(120)]
    one, two = staged(sink, "j1", {1: records[:60], 2: records[60:]}, size=10)
    committer = sink.global_committer()
    committer.commit(1, [one])
    committer.commit(2, [two])
    assert sorted(rows(tmp_path / "table"), key=lambda r: r["n"]) == records
    [(_, first, _), (_, second, _)] = commits(tmp_path / "table")
    assert len(first) > 3 and len(second) > 3  # (3 partitions: one file each, if not rolled)
    assert {checkpoint_of(p) for p in first} == {1} and {checkpoint_of(p) for p in second} == {2}


def test_a_column_of_nulls_that_gets_a_type_mid_interval_goes_into_files_of_each_type(
    tmp_path: Path,
) -> None:
    sink = DeltaSink(str(tmp_path / "table"))
    records = [{"n": 1, "x": None}, {"n": 2, "x": None}, {"n": 3, "x": "c"}, {"n": 4, "x": None}]
    writer = sink.writer(SinkContext("sums", 0, 1, 1, "r1", job="j1"), {})
    for record in records:
        writer.write(pa.RecordBatch.from_pylist([record]))
    committable = writer.prepare_commit(1).complete()
    assert len(committable.files) == 2
    sink.global_committer().commit(1, [committable])
    assert sorted(rows(tmp_path / "table"), key=lambda r: r["n"]) == records
    assert DeltaTable(sink.path).schema().to_arrow().field("x").type == pa.string()


def test_a_file_that_cannot_be_written_fails_the_checkpoint_and_every_later_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's thread could not write a row group: the files of the interval lack it,
    so they are never committed; the writer refuses from then on, naming the table."""
    monkeypatch.setattr(tables.writer, "ROW_GROUP_ROWS", 2)
    sink = DeltaSink(str(tmp_path / "table"))
    writer = sink.writer(SinkContext("sums", 0, 1, 1, "r1", job="j1"), {})
    appends = 0

    def append(self: Any, rows: pa.Table) -> None:
        nonlocal appends
        appends += 1
        if appends == 2:
            raise OSError("the disk is full")
        self.parquet.write_table(rows)

    monkeypatch.setattr(tables.parts.PartFile, "append", append)
    message = rf"cannot write into {tmp_path / 'table'}: the disk is full"
    with pytest.raises(SinkError, match=message):  # (at a later hand-over, or the barrier)
        for n in range(6):
            writer.write(pa.RecordBatch.from_pylist([{"n": n}]))
        writer.prepare_commit(1).complete()
    with pytest.raises(SinkError, match=message):
        writer.write(pa.RecordBatch.from_pylist([{"n": 9}]))
    writer.abort()


def test_a_table_at_a_uri_is_written_through_delta_rs_own_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URI (``s3://`` and the others) goes through delta-rs's object store, not Arrow's
    local filesystem (here that store on a local folder): files, partitions, commits and
    orphans. A ``file://`` URI is a local path."""
    monkeypatch.setattr(tables.writer, "ROW_GROUP_ROWS", 4)
    sink = DeltaSink((tmp_path / "table").as_uri(), partition_by=["city"])
    assert sink.path == str(tmp_path / "table")
    (tmp_path / "table").mkdir()
    store = pafs.PyFileSystem(DeltaStorageHandler(sink.path))
    monkeypatch.setattr(DeltaSink, "store", lambda self: store)
    records = [{"city": f"c{i % 2}", "n": i} for i in range(20)]
    one, two = staged(sink, "j1", {1: records[:10], 2: records[10:]}, size=3)
    sink.global_committer().commit(1, [one])
    assert sorted(rows(tmp_path / "table"), key=lambda r: r["n"]) == records[:10]
    sink.writer(SinkContext("sums", 0, 2, 2, "r1", job="j1"), {0: one})  # the next attempt
    on_disk = {p.name for p in (tmp_path / "table").rglob("*.parquet")}
    assert on_disk == {Path(f.path).name for f in one.files} and len(two.files) == 4


def test_the_files_codec_is_chosen_and_a_codec_unknown_is_refused_at_build(
    tmp_path: Path,
) -> None:
    sink = DeltaSink(str(tmp_path / "table"), compression="SNAPPY")
    one, _ = staged(sink, "j1", {1: [{"n": 1}], 2: [{"n": 2}]})
    sink.global_committer().commit(1, [one])
    [data] = one.files
    assert data.path.endswith(".snappy.parquet")
    chunk = pq.ParquetFile(tmp_path / "table" / data.path).metadata.row_group(0).column(0)
    assert chunk.compression == "SNAPPY"
    sink.writer(SinkContext("sums", 0, 2, 2, "r1", job="j1"), {0: one})  # (2's an orphan)
    assert {p.name for p in (tmp_path / "table").glob("*.parquet")} == {data.path}
    assert rows(tmp_path / "table") == [{"n": 1}]
    env = StreamEnvironment(1)
    with pytest.raises(ValueError, match=r"compression must be one of zstd, snappy, .*'zip'"):
        env.from_sequence(0, 3).write_delta(tmp_path / "t2", compression="zip")
