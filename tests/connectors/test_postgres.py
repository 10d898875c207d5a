"""The PostgreSQL sink (``cutline.connectors.postgres``), exactly once by two-phase commit,
against a real server (the ``postgres`` fixture): jobs with slots as threads, and its writer
driven by hand. The job and its answer: ``postgres_jobs.py``. At the end of every test nothing
is left prepared (``pg_prepared_xacts`` is empty): nothing holds locks.

Faults land by construction: the sources hold half-way until two checkpoints (with rows)
completed (``SourceHold``), and the failure strikes past the hold.
"""

from __future__ import annotations

import random
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from postgres_jobs import (
    EVENTS,
    SUMS,
    TOTALS,
    FailAt,
    N,
    assert_inserted,
    assert_upserted,
    environment,
    execute,
    half_way,
    prepared,
    prepared_in_log,
    query,
    rows_of,
    sums_job,
)
from test_savepoints import SavepointOnHold, endpoints_of

from cutline import JobClient, SourceHold, testing
from cutline.connectors import PendingCommit, SinkContext
from cutline.connectors.postgres import PostgresSink, PostgresWriter, transaction_id
from cutline.examples.servers import PostgresServer
from cutline.runtime.task.local import ThreadLauncher

pytestmark = pytest.mark.connectors


# -- exactly once, inserted and upserted ----------------------------------------------------------


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_every_running_sum_is_inserted_once(
    postgres: PostgresServer, tmp_path: Path, parallelism: int
) -> None:
    execute(postgres.dsn, SUMS)
    env = sums_job(tmp_path, parallelism, postgres.dsn)
    result = testing.execute(env, launcher=ThreadLauncher(), hold_sources=half_way(N, parallelism))
    assert not result.restarts
    assert len(result.checkpoints) >= 3  # (two at the hold, and the final one)
    assert_inserted(postgres.dsn, N)


@pytest.mark.parametrize("batch_rows", [1, 20_000])
def test_each_users_total_is_upserted(
    postgres: PostgresServer, tmp_path: Path, batch_rows: int
) -> None:
    """Upserts in batches of one row too: each batch is flushed while the previous checkpoint's
    transaction, holding the same users' rows, may still be prepared."""
    execute(postgres.dsn, TOTALS)
    env = sums_job(tmp_path, 2, postgres.dsn, upsert=True, batch_rows=batch_rows)
    result = testing.execute(env, launcher=ThreadLauncher(), hold_sources=half_way(N, 2))
    assert not result.restarts
    assert_upserted(postgres.dsn, N)


@pytest.mark.parametrize(
    ("upsert", "parallelism", "seed"), [(False, 2, 1), (False, 3, 2), (True, 2, 3), (True, 1, 4)]
)
def test_a_failure_at_a_random_purchase_restarts_exactly(
    postgres: PostgresServer, tmp_path: Path, upsert: bool, parallelism: int, seed: int
) -> None:
    """A failure at a random purchase past the hold (two checkpoints with rows completed before
    it): the restored job commits what the restored checkpoint prepared, rolls back the rest,
    and writes the purchases after it again."""
    execute(postgres.dsn, TOTALS if upsert else SUMS)
    at = random.Random(seed).randrange(3 * N // 4, N)
    fail = FailAt(at, str(tmp_path / "failed"))
    env = sums_job(tmp_path, parallelism, postgres.dsn, upsert=upsert, fail=fail)
    result = testing.execute(env, launcher=ThreadLauncher(), hold_sources=half_way(N, parallelism))
    assert len(result.restarts) == 1
    assert f"injected failure at purchase {at}" in result.restarts[0].cause
    assert result.restarts[0].restored_from is not None
    if upsert:
        assert_upserted(postgres.dsn, N)
    else:
        assert_inserted(postgres.dsn, N)


@dataclass(frozen=True)
class Price:
    """Record ``n`` prices item ``n % 7``, always at the same price: each item's row is fixed
    whichever of its records is written last."""

    @property
    def __name__(self) -> str:
        return "price"

    def __call__(self, record: dict[str, int]) -> dict[str, Any]:
        item = record["value"] % 7
        return {"user": f"item-{item}", "amount": 100 + item}


def test_upserts_of_one_key_from_every_subtask_go_through_one_and_never_wait_for_each_other(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """Every source subtask has records of every key and no key_by comes before the sink:
    two writers upserting one key would each wait for the other's prepared transaction,
    committed only once a checkpoint the waiting one holds up completes. The records go to
    the sink hashed by the key, so one writer has each; after a key_by of the key (a running
    sum) they are not hashed again."""
    execute(postgres.dsn, TOTALS)
    env = environment(tmp_path, 2, "ck", checkpoint_interval=0.02, batch_size=8)
    env.from_sequence(0, 4000, name="numbers").map(Price(), name="price").write_postgres(
        postgres.dsn, table="totals", key=["user"], batch_rows=1, name="totals"
    )
    sink = env.graph.operators["totals"]
    assert [(e.partitioning, e.key) for e in sink.inputs] == [("hash", "user")]
    testing.execute(env, launcher=ThreadLauncher(), hold_sources=half_way(4000, 2))
    assert dict(query(postgres.dsn, 'SELECT "user", amount FROM totals')) == {
        f"item-{i}": 100 + i for i in range(7)
    }
    assert prepared(postgres.dsn) == []
    # (after a key_by of the same field: as it comes, chained)
    env = sums_job(tmp_path, 2, postgres.dsn, upsert=True, checkpoints="ck2")
    assert [e.partitioning for e in env.graph.operators["pg"].inputs] == ["forward"]


# -- recovery, by hand --------------------------------------------------------------------------


def context(
    subtask: int = 0,
    parallelism: int = 1,
    *,
    generation: int = 1,
    job: str = "jobone",
    uid: str = "events",
) -> SinkContext:
    return SinkContext("pg", subtask, parallelism, generation, "run1", job=job, uid=uid)


def numbers(*ns: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"n": n} for n in ns])


def written(dsn: str) -> list[int]:
    return [n for (n,) in query(dsn, "SELECT n FROM events ORDER BY n")]


def die(writer: PostgresWriter) -> None:
    """The writer's process dies: its connections drop (the server rolls back the open
    transaction), and nothing is committed nor rolled back by it."""
    assert writer.data is not None
    writer.data.close()
    writer.control.close()


def gid(subtask: int, checkpoint: int, job: str = "jobone", uid: str = "events") -> str:
    return transaction_id(job, uid, subtask, checkpoint)


def test_transaction_ids_name_the_job_the_sink_the_subtask_and_the_checkpoint() -> None:
    assert gid(2, 17) == f"cutline:jobone:{zlib.crc32(b'events'):08x}:2:17"
    assert gid(2, 17, uid="audit") != gid(2, 17) != gid(2, 17, job="jobtwo")


@pytest.mark.parametrize("server_restarts", [False, True])
def test_a_restored_writer_commits_the_restored_checkpoint_and_rolls_back_the_next(
    postgres: PostgresServer, server_restarts: bool
) -> None:
    """Checkpoints 1 and 2 prepared, the writer dies (and the server restarts: prepared
    transactions survive it); the writer restored with checkpoint 1 commits 1, rolls back 2;
    restored again with checkpoint 1, it does nothing more (a commit is idempotent)."""
    dsn = postgres.dsn
    execute(dsn, EVENTS)
    sink = PostgresSink(dsn, "events")
    writer = sink.writer(context(), {})
    writer.write(numbers(1, 2, 3))
    first = writer.prepare_commit(1)
    writer.write(numbers(4, 5))
    second = writer.prepare_commit(2)
    writer.write(numbers(6))  # (open, never prepared)
    assert first == [(1, gid(0, 1))]
    assert second == [(1, gid(0, 1)), (2, gid(0, 2))]
    die(writer)
    if server_restarts:
        postgres.restart()
    assert prepared(dsn) == [gid(0, 1), gid(0, 2)]
    assert written(dsn) == []

    restored = sink.writer(context(generation=2), {0: first})
    assert written(dsn) == [1, 2, 3]
    assert prepared(dsn) == []
    restored.write(numbers(7))
    assert restored.prepare_commit(3) == [(3, gid(0, 3))]
    restored.commit(3)
    restored.commit(3)
    restored.close()
    sink.writer(context(generation=3), {0: first}).close()
    assert written(dsn) == [1, 2, 3, 7]
    assert prepared(dsn) == []


def test_a_writer_restored_at_a_lower_parallelism_settles_every_old_subtask(
    postgres: PostgresServer,
) -> None:
    dsn = postgres.dsn
    execute(dsn, EVENTS)
    sink = PostgresSink(dsn, "events")
    zero, one = sink.writer(context(0, 2), {}), sink.writer(context(1, 2), {})
    zero.write(numbers(1))
    one.write(numbers(2))
    kept = {0: zero.prepare_commit(1), 1: one.prepare_commit(1)}
    zero.write(numbers(3))
    one.write(numbers(4))
    zero.prepare_commit(2)
    one.prepare_commit(2)
    die(zero)
    die(one)
    assert prepared(dsn) == sorted(gid(s, c) for s in (0, 1) for c in (1, 2))

    sink.writer(context(0, 1, generation=2), kept).close()
    assert written(dsn) == [1, 2]
    assert prepared(dsn) == []


def test_a_writer_restored_at_a_higher_parallelism_settles_only_the_old_subtasks_it_takes_over(
    postgres: PostgresServer,
) -> None:
    dsn = postgres.dsn
    execute(dsn, EVENTS)
    sink = PostgresSink(dsn, "events")
    writer = sink.writer(context(0, 1), {})
    writer.write(numbers(1))
    kept = writer.prepare_commit(1)
    writer.write(numbers(2))
    writer.prepare_commit(2)
    die(writer)

    sink.writer(context(1, 2, generation=2), {}).close()  # (old subtask 0 is not its)
    assert prepared(dsn) == [gid(0, 1), gid(0, 2)]
    sink.writer(context(0, 2, generation=2), {0: kept}).close()
    assert written(dsn) == [1]
    assert prepared(dsn) == []


def test_the_transactions_of_another_job_or_another_sink_are_never_touched(
    postgres: PostgresServer,
) -> None:
    dsn = postgres.dsn
    execute(dsn, EVENTS)
    sink = PostgresSink(dsn, "events")
    others = [sink.writer(context(job="jobtwo"), {}), sink.writer(context(uid="audit"), {})]
    for i, other in enumerate(others):
        other.write(numbers(100 + i))
        other.prepare_commit(1)
    mine = sink.writer(context(), {})
    mine.write(numbers(1))
    mine.prepare_commit(1)
    die(mine)
    theirs = sorted([gid(0, 1, job="jobtwo"), gid(0, 1, uid="audit")])
    assert prepared(dsn) == sorted([*theirs, gid(0, 1)])

    sink.writer(context(generation=2), {}).close()  # (a restore from before checkpoint 1)
    assert prepared(dsn) == theirs
    for other in others:
        other.commit(1)
        other.close()
    assert written(dsn) == [100, 101]
    assert prepared(dsn) == []


def test_a_checkpoint_restored_by_another_job_has_its_prepared_transactions_committed(
    postgres: PostgresServer,
) -> None:
    """A checkpoint restored elsewhere (another checkpoint directory: another job id) holds
    transactions named with the old job's id: they are committed all the same; the old job's
    others (not held) are left alone, as that job may still run."""
    dsn = postgres.dsn
    execute(dsn, EVENTS)
    sink = PostgresSink(dsn, "events")
    writer = sink.writer(context(job="jobone"), {})
    writer.write(numbers(1))
    kept = writer.prepare_commit(1)
    writer.write(numbers(2))
    writer.prepare_commit(2)
    die(writer)

    sink.writer(context(job="jobtwo"), {0: kept}).close()
    assert written(dsn) == [1]
    assert prepared(dsn) == [gid(0, 2, job="jobone")]
    sink.writer(context(job="jobone", generation=2), {0: kept}).close()
    assert written(dsn) == [1]
    assert prepared(dsn) == []


def gate(
    monkeypatch: pytest.MonkeyPatch,
    connection: psycopg.Connection[Any],
    command: str,
    until: threading.Event,
    *,
    answered: bool = False,
) -> None:
    """``connection``'s statements that begin with ``command`` wait for ``until``: before
    they are sent, or (``answered``) once the server has answered them."""
    execute = connection.execute

    def gated(statement: Any, *args: Any, **kwargs: Any) -> Any:
        text = statement if isinstance(statement, str) else statement.as_string(connection)
        if not text.startswith(command):
            return execute(statement, *args, **kwargs)
        if not answered:
            assert until.wait(timeout=60), f"{command} held for good"
        result = execute(statement, *args, **kwargs)
        if answered:
            assert until.wait(timeout=60), f"{command} held for good"
        return result

    monkeypatch.setattr(connection, "execute", gated)


@pytest.mark.parametrize("taken", ["after the commit", "before the commit is known"])
def test_an_upsert_barrier_before_the_last_checkpoints_commit_does_not_block_the_writer(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch, taken: str
) -> None:
    """Checkpoint 1 prepared an upsert of user u; rows of u come again (in batches of one row)
    and checkpoint 2's barrier comes before checkpoint 1 is known complete: writing them would
    wait for checkpoint 1's row lock, which only the writer's thread releases (when told that
    checkpoint 1 completed). So they wait in the writer, and checkpoint 2 is prepared on the
    snapshot thread (a PendingCommit), which the commit of checkpoint 1 lets through.

    The server lets the upsert through at ``COMMIT PREPARED``, before the writer's thread
    takes checkpoint 1 off its prepared transactions: checkpoint 2's committable (every
    transaction prepared and not known to be committed) holds checkpoint 1's too when the
    snapshot thread takes it in between. Both orders are right, and each is made here by a
    gate: the snapshot thread's ``PREPARE TRANSACTION`` held until ``commit(1)`` returned, or
    ``commit(1)`` held past its ``COMMIT PREPARED`` until the committable is taken. A writer
    restored with either committable commits nothing twice."""
    dsn = postgres.dsn
    execute(dsn, TOTALS)
    sink = PostgresSink(dsn, "totals", key=("user",), batch_rows=1)
    writer = sink.writer(context(uid="totals"), {})
    row = pa.RecordBatch.from_pylist
    writer.write(row([{"user": "u", "amount": 5}]))
    assert writer.prepare_commit(1) == [(1, gid(0, 1, uid="totals"))]
    writer.write(row([{"user": "u", "amount": 7}]))
    writer.write(row([{"user": "v", "amount": 1}]))
    pending = writer.prepare_commit(2)
    assert isinstance(pending, PendingCommit)
    committed, completed = threading.Event(), threading.Event()
    assert writer.data is not None
    if taken == "after the commit":
        gate(monkeypatch, writer.data, "PREPARE TRANSACTION", committed)
        wanted = [(2, gid(0, 2, uid="totals"))]
    else:
        gate(monkeypatch, writer.control, "COMMIT PREPARED", completed, answered=True)
        wanted = [(1, gid(0, 1, uid="totals")), (2, gid(0, 2, uid="totals"))]
    with ThreadPoolExecutor(1) as snapshot_thread:
        second = snapshot_thread.submit(pending.complete)
        second.add_done_callback(lambda _: completed.set())
        writer.commit(1)
        if taken == "after the commit":
            assert not second.done()  # (the writer went on while checkpoint 2 waits)
        committed.set()
        assert second.result(timeout=60) == wanted
    assert query(dsn, "SELECT * FROM totals") == [("u", 5)]
    writer.commit(2)
    writer.close()
    assert sorted(query(dsn, "SELECT * FROM totals")) == [("u", 7), ("v", 1)]
    assert prepared(dsn) == []
    sink.writer(context(uid="totals", generation=2), {0: wanted}).close()
    assert sorted(query(dsn, "SELECT * FROM totals")) == [("u", 7), ("v", 1)]
    assert prepared(dsn) == []


# -- resumed, restored elsewhere, started afresh ------------------------------------------------


@pytest.mark.parametrize("postgres", [{"settings": {"log_statement": "all"}}], indirect=True)
def test_a_resumed_job_keeps_its_job_id_and_a_fresh_start_begins_another(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped with a savepoint half-way, resumed (``restore_from="latest"``) at another
    parallelism: its transactions carry the same job id, and over the two runs every running
    sum is in the table once. A fresh start (another directory) is another job: its
    transactions carry another id, and it writes every running sum again."""
    dsn = postgres.dsn
    execute(dsn, SUMS)
    asking = SavepointOnHold(
        endpoints_of(monkeypatch), lambda _: JobClient(str(tmp_path / "ck")).savepoint(stop=True)
    )
    first = testing.execute(
        sums_job(tmp_path, 2, dsn),
        launcher=ThreadLauncher(),
        listener=asking,
        hold_sources=SourceHold(records=N // 4, checkpoints=1000),  # (until the job stops)
    )
    path = asking.answer()
    assert isinstance(path, str) and first.savepoints == [path]
    assert 0 < sum(rows_of(dsn, "sums").values()) < N, "stopped half-way"
    before = prepared_in_log(postgres)

    second = testing.execute(
        sums_job(tmp_path, 3, dsn), launcher=ThreadLauncher(), restore_from="latest"
    )
    assert second.restored_from is not None
    resumed = prepared_in_log(postgres)[len(before) :]
    (job,) = {j for j, *_ in before}
    assert before and resumed and {j for j, *_ in resumed} == {job}
    assert {s for _, _, s, _ in resumed} == {0, 1, 2}
    assert min(c for *_, c in resumed) > max(c for *_, c in before)
    assert_inserted(dsn, N)

    third = testing.execute(
        sums_job(tmp_path, 2, dsn, checkpoints="ck-fresh"), launcher=ThreadLauncher(), fresh=True
    )
    assert third.restored_from is None
    fresh = prepared_in_log(postgres)[len(before) + len(resumed) :]
    assert fresh and {j for j, *_ in fresh} != {job} and len({j for j, *_ in fresh}) == 1
    assert {sink for _, sink, *_ in fresh} == {sink for _, sink, *_ in before}
    assert_inserted(dsn, N, times=2)


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1)])
def test_a_savepoint_restored_into_another_directory_is_exact(
    postgres: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    before: int,
    after: int,
) -> None:
    """Restored from a savepoint elsewhere, the job is another job (another id): what the
    savepoint holds prepared is still committed once, and nothing is left prepared."""
    dsn = postgres.dsn
    execute(dsn, SUMS)
    asking = SavepointOnHold(
        endpoints_of(monkeypatch), lambda _: JobClient(str(tmp_path / "ck")).savepoint(stop=True)
    )
    testing.execute(
        sums_job(tmp_path, before, dsn),
        launcher=ThreadLauncher(),
        listener=asking,
        hold_sources=SourceHold(records=N // (2 * before), checkpoints=1000),
    )
    path = asking.answer()
    assert isinstance(path, str)
    env = sums_job(tmp_path, after, dsn, checkpoints="ck2")
    assert testing.execute(env, launcher=ThreadLauncher(), restore_from=path).restored_from == path
    assert_inserted(dsn, N)
