"""The Iceberg sink (``cutline.connectors.iceberg``): every row in the table once.

The job is the ledger's running balance per account (``tests/ledger.py``): each account is
one split, read in order by one subtask, so the balance after each entry is fixed, whatever
the failures (``assert_exact`` of ``test_connector_api.py``). It runs with slots as threads,
into a table of a SQL catalog on SQLite in the test's folder; the table is read back by
pyiceberg and by polars, and its snapshots tell which checkpoints it holds: every snapshot
the sink commits names the job, the sink and the checkpoint in its summary.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table
from test_connector_api import FailAt, assert_exact
from test_savepoints import SavepointOnHold, endpoints_of

from cutline import (
    Checkpoints,
    CheckpointWarning,
    FixedDelay,
    JobClient,
    SourceHold,
    StreamEnvironment,
    testing,
)
from cutline.connectors import SinkContext, tables
from cutline.connectors.iceberg import IcebergCommittable, IcebergCommitter, IcebergSink
from cutline.examples.servers import PostgresServer
from cutline.runtime.task.local import ThreadLauncher

from ledger import Ledger

Row = dict[str, Any]
TABLE = "db.sums"


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return sqlite_catalog(tmp_path, monkeypatch)


def sqlite_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A SQL catalog on SQLite, its warehouse a folder: the properties the sink is given."""
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # (no planner plugin here)
    (tmp_path / "warehouse").mkdir()
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": (tmp_path / "warehouse").as_uri(),
    }


def sums_job(
    tmp_path: Path,
    catalog: dict[str, str],
    ledger: Ledger,
    *,
    fail: FailAt | None = None,
    ck: str = "ck",
    **options: Any,
) -> StreamEnvironment:
    """The ledger's running balance per account, into the Iceberg table ``db.sums``."""
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / ck,
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 40,
    }
    env = StreamEnvironment(2, **{**settings, **options})
    stream = env.from_source(ledger, name="ledger")
    if fail is not None:
        stream = stream.map(fail, name="fail")  # (its columns unknown: a writer makes the table)
    balances = stream.key_by("account").sum("amount", name="balance")
    balances.write_iceberg(TABLE, catalog=catalog, name="sums")
    return env


def table(catalog: dict[str, str], name: str = TABLE) -> Table:
    return load_catalog("default", **catalog).load_table(name)


def rows(catalog: dict[str, str], name: str = TABLE) -> list[Row]:
    """The table's rows as pyiceberg reads them, checked against polars' reading."""
    found = table(catalog, name)
    ours = found.scan().to_arrow().to_pylist()
    theirs = pl.scan_iceberg(found).collect().to_dicts()
    key = lambda r: repr(sorted(r.items()))  # noqa: E731  (NaN: by its text)
    assert sorted(map(key, ours)) == sorted(map(key, theirs)), "pyiceberg and polars differ"
    return ours


def commits(found: Table) -> list[tuple[dict[str, str], list[str], list[str]]]:
    """The table's snapshots in order: each one's cutline summary, and the files it added and
    removed."""
    out = []
    for snapshot in found.snapshots():
        names = ("cutline.job", "cutline.sink", "cutline.checkpoint", "cutline.restored")
        summary = {k: snapshot.summary[k] for k in names if snapshot.summary[k] is not None}
        added, removed = [], []
        for manifest in snapshot.manifests(found.io):
            for entry in manifest.fetch_manifest_entry(found.io, discard_deleted=False):
                if entry.snapshot_id == snapshot.snapshot_id:
                    status = entry.status.name
                    (added if status == "ADDED" else removed if status == "DELETED" else []).append(
                        entry.data_file.file_path
                    )
        out.append((summary, added, removed))
    return out


def checkpoint_of(path: str) -> int:
    """The checkpoint in a data file's name: ``part-<job>-<sink>-<subtask>-<checkpoint>-...``."""
    return int(path.rsplit("/", 1)[-1].split("-")[4])


def data_files(tmp_path: Path) -> set[str]:
    return {p.name for p in (tmp_path / "warehouse").rglob("*.parquet")}


def assert_one_snapshot_per_checkpoint(tmp_path: Path, found: Table, completed: set[int]) -> str:
    """Each snapshot that adds files names one job and sink and a completed checkpoint, in
    increasing order, and adds the files of the checkpoints since the one before; one that
    removes files (withdraws those of checkpoints after a restored one, which it names) adds
    none. No data file in the warehouse is outside the snapshots. Returns the job."""
    log = commits(found)
    assert log, "nothing committed"
    [job] = {summary["cutline.job"] for summary, _, _ in log}
    assert {summary["cutline.sink"] for summary, _, _ in log} == {"sums"}
    checkpoints = []
    for summary, added, removed in log:
        checkpoint = int(summary["cutline.checkpoint"])
        if removed:
            restored = int(summary["cutline.restored"])
            assert not added and checkpoint == checkpoints[-1]
            assert all(restored < checkpoint_of(p) <= checkpoint for p in removed)
            continue
        assert added and checkpoint in completed
        before = checkpoints[-1] if checkpoints else 0
        assert all(before < checkpoint_of(path) <= checkpoint for path in added)
        assert checkpoint > before, "a checkpoint committed twice, or out of order"
        checkpoints.append(checkpoint)
    named = {Path(p).name for _, added, _ in log for p in added}
    assert data_files(tmp_path) == named, "orphans left"
    return str(job)


def test_the_running_sums_are_in_the_table_once_a_snapshot_per_checkpoint(
    tmp_path: Path, catalog: dict[str, str]
) -> None:
    ledger = Ledger(accounts=5, per_account=300)
    result = testing.execute(
        sums_job(tmp_path, catalog, ledger),
        launcher=ThreadLauncher(),
        hold_sources=SourceHold(records=100, checkpoints=2),
    )
    assert_exact(ledger, rows(catalog), [], with_windows=False)
    found = table(catalog)
    completed = {c.checkpoint_id for c in result.checkpoints}
    assert_one_snapshot_per_checkpoint(tmp_path, found, completed)
    assert len(found.snapshots()) >= 2  # (held part-way until two checkpoints completed)
    assert str(found.schema()) == str(table(catalog).schema())
    assert [f.name for f in found.schema().fields] == ["account", "entry", "amount", "ts"]


def test_a_sql_catalog_on_postgresql_takes_the_sums_once(
    tmp_path: Path, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog in PostgreSQL (SQLAlchemy on psycopg 3: ``postgresql+psycopg://``), the
    warehouse a folder: as exact as on SQLite, the snapshots committed there."""
    catalog = {
        **sqlite_catalog(tmp_path, monkeypatch),
        "uri": postgres.dsn.replace("postgresql://", "postgresql+psycopg://"),
    }
    ledger = Ledger(accounts=3, per_account=200)
    result = testing.execute(
        sums_job(tmp_path, catalog, ledger),
        launcher=ThreadLauncher(),
        hold_sources=SourceHold(records=100, checkpoints=2),
    )
    assert_exact(ledger, rows(catalog), [], with_windows=False)
    completed = {c.checkpoint_id for c in result.checkpoints}
    assert_one_snapshot_per_checkpoint(tmp_path, table(catalog), completed)
    with psycopg.connect(postgres.dsn) as connection:  # (the catalog's own table)
        names = connection.execute("SELECT table_name FROM iceberg_tables").fetchall()
    assert names == [("sums",)]


@pytest.mark.parametrize(("seed", "ahead"), [(1, None), (2, None), (3, 7), (4, 40)])
def test_the_running_sums_are_in_the_table_once_through_a_failure_at_a_random_entry(
    tmp_path: Path,
    catalog: dict[str, str],
    seed: int,
    ahead: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job restores a checkpoint whose commit happened: it is not committed again.
    ``ahead``: the writers write a row group every that many rows, ahead of the barrier (files
    of an interval that fails are orphans, in no snapshot, deleted by the restored writers)."""
    if ahead is not None:
        monkeypatch.setattr(tables.writer, "ROW_GROUP_ROWS", ahead)
    rng = random.Random(f"iceberg-{seed}")
    ledger = Ledger(accounts=5, per_account=300, numbered=seed != 2)
    fail = FailAt(f"acct-{rng.randrange(5):02d}", rng.randrange(100, 300), str(tmp_path / "f"))
    called: list[int] = []
    commit = IcebergCommitter.commit

    def noted(self: IcebergCommitter, checkpoint_id: int, committables: list[Any]) -> None:
        called.append(checkpoint_id)
        commit(self, checkpoint_id, committables)

    monkeypatch.setattr(IcebergCommitter, "commit", noted)
    result = testing.execute(
        sums_job(tmp_path, catalog, ledger, fail=fail),
        launcher=ThreadLauncher(),
        hold_sources=SourceHold(records=100, checkpoints=2),
    )
    assert len(result.restarts) == 1 and "injected failure" in result.restarts[0].cause
    assert_exact(ledger, rows(catalog), [], with_windows=False)
    completed = {c.checkpoint_id for c in result.checkpoints}
    assert_one_snapshot_per_checkpoint(tmp_path, table(catalog), completed)
    # the failure came after two checkpoints completed (the sources held until then): the
    # restored one is committed again, and the table holds its rows once (none if it had no
    # rows of its own: the sources held)
    [restored] = [c for c in set(called) if called.count(c) == 2]
    found = [s.summary["cutline.checkpoint"] for s in table(catalog).snapshots()]
    assert found.count(str(restored)) <= 1 and called.index(restored) < len(called) - 2


def staged(
    sink: IcebergSink, job: str, batches: dict[int, list[Row]], subtask: int = 0
) -> list[Any]:
    """A writer's committables for ``batches`` (checkpoint -> records), never told that one
    was committed (so each holds the files of the ones before as well)."""
    writer = sink.writer(SinkContext("sums", subtask, 2, 1, "r1", job=job), {})
    out = []
    for checkpoint, records in batches.items():
        if records:
            writer.write(pa.RecordBatch.from_pylist(records))
        out.append(writer.prepare_commit(checkpoint).complete())
    return out


def test_a_replay_is_not_committed_again_and_an_older_checkpoint_withdraws_the_newer_ones(
    catalog: dict[str, str],
) -> None:
    sink = IcebergSink(TABLE, catalog)
    batches = {3: [{"n": 1}, {"n": 2}], 5: [{"n": 3}], 6: [{"n": 4}], 7: []}
    first, second, third, empty = staged(sink, "j1", batches)
    assert isinstance(second, IcebergCommittable) and len(second.files) == 2
    committer = sink.global_committer()

    def state() -> tuple[int, str, list[int]]:
        found = table(catalog)
        snapshot = found.current_snapshot()
        assert snapshot is not None and snapshot.summary is not None
        values = sorted(r["n"] for r in rows(catalog))
        return len(found.snapshots()), str(snapshot.summary["cutline.checkpoint"]), values

    committer.commit(3, [first, None])
    assert state() == (1, "3", [1, 2])
    committer.commit(3, [first])  # a replay: the table does not move
    assert state() == (1, "3", [1, 2])
    committer.commit(5, [second])  # (the file of checkpoint 3 in it is not added twice)
    committer.commit(6, [third])
    assert state() == (3, "6", [1, 2, 3, 4])
    # the job restores checkpoint 5 (a savepoint 6 committed since): 6's rows come again
    committer.commit(5, [second])
    assert state() == (4, "6", [1, 2, 3])
    committer.commit(5, [second])  # (withdrawn already)
    committer.commit(7, [empty, None])  # nothing new (none since 6): no snapshot
    assert state() == (4, "6", [1, 2, 3])
    [(summary, added, removed)] = commits(table(catalog))[3:]
    assert not added and [checkpoint_of(path) for path in removed] == [6]
    assert summary == {
        "cutline.job": "j1",
        "cutline.sink": "sums",
        "cutline.checkpoint": "6",
        "cutline.restored": "5",
    }


def test_a_commit_that_meets_another_writers_commit_reads_the_table_again_and_retries(
    catalog: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits between the committer's reading of the table and its commit
    (pyiceberg's own retries off): the commit fails, and the committer reads the table again
    and commits once, after the other's snapshot."""
    sink = IcebergSink(TABLE, catalog)
    [one] = staged(sink, "j1", {1: [{"n": 1}]})
    found = table(catalog)
    with found.transaction() as transaction:
        transaction.set_properties({"commit.retry.num-retries": "0"})
    committer = sink.global_committer()
    reads = 0
    original = type(committer)._table

    def stale(self: Any) -> Table | None:
        nonlocal reads
        reads += 1
        read = original(self)
        if reads == 1:  # another writer commits right after the committer read the table
            table(catalog).append(pa.table({"n": pa.array([100], pa.int64())}))
        return read

    monkeypatch.setattr(type(committer), "_table", stale)
    committer.commit(1, [one])
    assert reads == 2
    snapshots = table(catalog).snapshots()
    assert [s.summary["cutline.checkpoint"] for s in snapshots] == [None, "1"]
    assert snapshots[1].parent_snapshot_id == snapshots[0].snapshot_id
    assert sorted(r["n"] for r in rows(catalog)) == [1, 100]


def test_a_restored_writer_deletes_what_its_subtask_wrote_for_checkpoints_never_committed(
    tmp_path: Path, catalog: dict[str, str]
) -> None:
    """Its files of checkpoint 2, which did not complete; not those of another subtask (still
    writing, for all it knows) nor another job's."""
    sink = IcebergSink(TABLE, catalog)
    one, two = staged(sink, "j1", {1: [{"n": 1}], 2: [{"n": 2}]})
    [neighbour] = staged(sink, "j1", {2: [{"n": 3}]}, subtask=1)
    [other] = staged(sink, "j2", {2: [{"n": 4}]})
    sink.global_committer().commit(1, [one])

    def names(*committables: IcebergCommittable) -> set[str]:
        return {Path(f.path).name for c in committables for f in c.files}

    assert data_files(tmp_path) == names(two, neighbour, other)  # (two's: checkpoints 1, 2)
    sink.writer(SinkContext("sums", 0, 2, 2, "r1", job="j1"), {0: one})  # the next attempt
    assert data_files(tmp_path) == names(one, neighbour, other)
    assert rows(catalog) == [{"n": 1}]


def test_a_resumed_job_does_not_commit_its_restored_checkpoint_again_and_a_fresh_start_does(
    tmp_path: Path, catalog: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run stops with a savepoint, committed; the second resumes from it (its
    committer called for it again: it commits nothing) and goes on as the same job. A fresh
    start is another job: its rows once more."""
    ledger = Ledger(accounts=4, per_account=300)
    asking = SavepointOnHold(
        endpoints_of(monkeypatch), lambda _: JobClient(str(tmp_path / "ck")).savepoint(stop=True)
    )
    first = testing.execute(
        sums_job(tmp_path, catalog, ledger),
        launcher=ThreadLauncher(),
        listener=asking,
        hold_sources=SourceHold(records=150, checkpoints=1000),  # (until the job stops)
    )
    assert isinstance(asking.answer(), str) and first.savepoints
    stopped = len(rows(catalog))
    assert 0 < stopped < 4 * 300, "stopped half-way"
    before = len(table(catalog).snapshots())
    second = testing.execute(
        sums_job(tmp_path, catalog, ledger), launcher=ThreadLauncher(), restore_from="latest"
    )
    assert second.restored_from is not None
    assert_exact(ledger, rows(catalog), [], with_windows=False)
    found = table(catalog)
    restored = int(str(second.restored_from).rsplit("/", 1)[-1].split("-")[1])
    assert int(found.snapshots()[before - 1].summary["cutline.checkpoint"]) <= restored
    resumed = [int(s.summary["cutline.checkpoint"]) for s in found.snapshots()[before:]]
    assert resumed and all(c > restored for c in resumed)  # (the restored one not again)
    completed = {c.checkpoint_id for c in first.checkpoints + second.checkpoints}
    job = assert_one_snapshot_per_checkpoint(tmp_path, found, completed)

    testing.execute(
        sums_job(tmp_path, catalog, ledger, ck="ck2"), launcher=ThreadLauncher(), fresh=True
    )
    jobs = [s.summary["cutline.job"] for s in table(catalog).snapshots()]
    assert jobs[0] == job and len(set(jobs)) == 2  # (a new job: its rows once more)
    assert len(rows(catalog)) == 2 * 4 * 300


def test_a_job_restored_from_an_older_checkpoint_than_it_committed_withdraws_the_newer_ones(
    tmp_path: Path, catalog: dict[str, str]
) -> None:
    """Its newest checkpoints are damaged: the job resumes from an older one, and the rows the
    table holds of the ones after it, which the job writes again, must go (one snapshot
    removing their files)."""
    ledger = Ledger(accounts=4, per_account=300)
    env = sums_job(tmp_path, catalog, ledger, checkpoints=Checkpoints(retained=100))
    testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=100, checkpoints=2)
    )
    newest = int(table(catalog).snapshots()[-1].summary["cutline.checkpoint"])
    for folder in (tmp_path / "ck").glob("chk-*"):
        if int(folder.name.split("-")[1]) >= newest:
            for state in folder.glob("*.state"):
                state.write_bytes(b"damaged")
    with pytest.warns(CheckpointWarning, match="is damaged"):
        result = testing.execute(
            sums_job(tmp_path, catalog, ledger, checkpoints=Checkpoints(retained=100)),
            launcher=ThreadLauncher(),
            restore_from="latest",
        )
    restored = int(str(result.restored_from).rsplit("-", 1)[1])
    assert restored < newest
    assert_exact(ledger, rows(catalog), [], with_windows=False)
    [withdrawn] = [(s, removed) for s, _, removed in commits(table(catalog)) if removed]
    summary, removed = withdrawn
    assert summary["cutline.restored"] == str(restored)
    assert newest in {checkpoint_of(path) for path in removed}
    assert all(checkpoint_of(path) > restored for path in removed)


def test_import_cutline_does_not_import_pyiceberg() -> None:
    """The connector and its client are loaded when first named."""
    code = (
        "import sys, cutline, cutline.connectors, cutline.api\n"
        "assert 'pyiceberg' not in sys.modules, 'pyiceberg imported'\n"
        "from cutline.connectors import IcebergSink\n"
        "assert 'pyiceberg' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
