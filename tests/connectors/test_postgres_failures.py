"""The PostgreSQL sink when something goes wrong, against a real server (the ``postgres``
fixture; the job and its answer: ``postgres_jobs.py``).

* The server lost while the job runs: the job fails over and, once the server is back, is
  exact.
* Refused when the job is built, on the driver: the server, the credentials, prepared
  transactions, the table, the key's constraint; and, when the fields written are known
  (``columns=``, or the stream's columns), a field that is not a column (or a generated one),
  a NOT NULL column without a default left out, a field whose type its column does not take.
* A record the server refuses as the job runs (a value too large for its column, a null in a
  NOT NULL column, a CHECK it breaks; text in a column of numbers): named with the table, the
  column, the value and the record, the same way in every attempt; the job fails, or with
  ``on_error="dead_letter"`` the record goes to the dead letters, exactly once across a
  failure, and every other record is written exactly once. Driven by hand: several refused in
  one batch, the newest row of a key refused, and upserts left to the snapshot thread.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from postgres_jobs import (
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
    purchase,
    query,
    rows_of,
    running_sum_stream,
    sums_job,
)
from test_runtime_jobs import dead_letters

from cutline import (
    CheckpointCompleted,
    FixedDelay,
    JobEvent,
    JobFailedError,
    JobFailure,
    JobListener,
    Restarting,
    SavepointCompleted,
    StreamEnvironment,
    testing,
)
from cutline.connectors import PendingCommit, RecordError, SinkContext, SinkError
from cutline.connectors.postgres import PostgresSink
from cutline.examples.servers import PostgresServer, free_port
from cutline.runtime.task.local import ThreadLauncher

pytestmark = pytest.mark.connectors


# -- the server lost while the job runs ---------------------------------------------------------


class Outage(JobListener):
    """Stops the server at the first complete checkpoint with rows (committed or prepared),
    and starts it again when the job says it restarts (or failed for good)."""

    def __init__(self, postgres: PostgresServer, table: str) -> None:
        self.postgres, self.table = postgres, table
        self.stopped_at: int | None = None
        self.restarted = False

    def on_event(self, event: JobEvent) -> None:
        match event:
            case SavepointCompleted():
                pass
            case CheckpointCompleted(final=False) if self.stopped_at is None:
                dsn = self.postgres.dsn
                seen = query(
                    dsn,
                    f"SELECT (SELECT count(*) FROM {self.table}) + "
                    "(SELECT count(*) FROM pg_prepared_xacts)",
                )
                if seen[0][0]:
                    self.postgres.stop()
                    self.stopped_at = event.checkpoint
            case Restarting() | JobFailure() if self.stopped_at is not None:
                if not self.postgres.running:
                    self.postgres.start()
                    self.restarted = True


@pytest.mark.parametrize("upsert", [False, True])
def test_the_database_lost_while_the_job_runs(
    postgres: PostgresServer, tmp_path: Path, upsert: bool
) -> None:
    """The server stops at a complete checkpoint with rows (its transactions prepared, or
    some committed) and input is left: the job fails (the sink cannot reach it), restarts
    once the server is back, commits what the restored checkpoint prepared (prepared
    transactions survive the server's restart) and is exact."""
    dsn = postgres.dsn
    execute(dsn, TOTALS if upsert else SUMS)
    outage = Outage(postgres, "totals" if upsert else "sums")
    env = sums_job(tmp_path, 2, dsn, upsert=upsert)
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=outage, hold_sources=half_way(N, 2)
    )
    assert outage.stopped_at is not None and outage.restarted
    assert len(result.restarts) == 1
    assert f"write_postgres({outage.table} at 127.0.0.1:{postgres.port}/postgres)" in (
        result.restarts[0].cause
    )
    restored = result.restarts[0].restored_from
    assert restored is not None and restored >= outage.stopped_at
    if upsert:
        assert_upserted(dsn, N)
    else:
        assert_inserted(dsn, N)


# -- refused when the job is built ----------------------------------------------------------------


def build(tmp_path: Path, dsn: str, **options: Any) -> None:
    """``write_postgres`` on the driver, as a job is built."""
    env = environment(tmp_path, 1, "ck")
    running_sum_stream(env, 10).write_postgres(dsn, **options)


def run(tmp_path: Path, dsn: str, fn: Any, **options: Any) -> None:
    """A job of ten records ``fn`` makes into ``dsn`` (no restarts)."""
    env = environment(tmp_path, 1, "ck", restart_strategy=FixedDelay(0))
    env.from_sequence(0, 10).map(fn).write_postgres(dsn, **options)
    testing.execute(env, launcher=ThreadLauncher())


def where(postgres: PostgresServer, table: str) -> str:
    return re.escape(f"write_postgres({table} at 127.0.0.1:{postgres.port}/postgres)")


@pytest.mark.parametrize("postgres", [{"max_prepared_transactions": 0}], indirect=True)
def test_a_server_without_prepared_transactions_is_refused_saying_how_to_allow_them(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    execute(postgres.dsn, SUMS)
    with pytest.raises(SinkError, match=where(postgres, "sums")) as refused:
        build(tmp_path, postgres.dsn, table="sums", columns=["user", "amount"])
    assert re.search(
        r"max_prepared_transactions = 0.*ALTER SYSTEM SET max_prepared_transactions = 64.*"
        r"-c max_prepared_transactions=64.*restart the server",
        str(refused.value),
    )


def test_a_table_that_does_not_exist(postgres: PostgresServer, tmp_path: Path) -> None:
    with pytest.raises(
        SinkError, match=where(postgres, "public.nope") + r": table 'public.nope' does not exist"
    ):
        build(tmp_path, postgres.dsn, table="public.nope")


def test_an_upsert_key_without_a_unique_constraint(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    execute(postgres.dsn, SUMS)
    with pytest.raises(
        SinkError,
        match=where(postgres, "sums") + r": an upsert on key \['user'\] needs a primary key or "
        r"unique constraint.*ALTER TABLE sums ADD PRIMARY KEY \(user\)",
    ):
        build(tmp_path, postgres.dsn, table="sums", key=["user"], columns=["user", "amount"])


def test_credentials_refused(postgres: PostgresServer, tmp_path: Path) -> None:
    dsn = f"postgresql://ghost@127.0.0.1:{postgres.port}/postgres"
    with pytest.raises(
        SinkError, match=where(postgres, "sums") + r": cannot connect: .*role \"ghost\" does not"
    ):
        build(tmp_path, dsn, table="sums")


def test_a_server_that_is_not_there(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(
        SinkError,
        match=re.escape(f"write_postgres(sums at 127.0.0.1:{port}/postgres): cannot connect: ")
        + r".*refused",
    ):
        build(tmp_path, f"postgresql://postgres@127.0.0.1:{port}/postgres", table="sums")


def from_file(tmp_path: Path, env: StreamEnvironment, rows: pa.Table) -> Any:
    """A stream whose columns the job knows as it is built: a Parquet file of ``rows``."""
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    pq.write_table(rows, folder / "part-0.parquet")
    return env.read_parquet(folder)


def test_a_not_null_column_left_out_is_refused_when_the_job_is_built(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The fields written are known from ``columns=``, or from the stream's columns (a file's):
    a NOT NULL column without a default that they leave out is refused then, not when the
    first record comes."""
    execute(postgres.dsn, SUMS, "ALTER TABLE sums ADD COLUMN region text NOT NULL")
    refused = where(postgres, "sums") + (
        r": column\(s\) \['region'\] are NOT NULL without a default, and the records have no "
        r"such field \(their fields: user, amount\)"
    )
    with pytest.raises(SinkError, match=refused):
        build(tmp_path, postgres.dsn, table="sums", columns=["user", "amount"])
    env = environment(tmp_path, 1, "ck")
    known = from_file(tmp_path, env, pa.table({"user": ["u"], "amount": [1]}))
    with pytest.raises(SinkError, match=refused):
        known.write_postgres(postgres.dsn, table="sums")
    execute(postgres.dsn, "ALTER TABLE sums ALTER COLUMN region SET DEFAULT 'eu'")
    build(tmp_path, postgres.dsn, table="sums", columns=["user", "amount"])
    known.write_postgres(postgres.dsn, table="sums")


def test_fields_that_are_not_columns_or_cannot_be_written_are_refused_when_the_job_is_built(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    execute(postgres.dsn, "CREATE TABLE g (a bigint, b bigint GENERATED ALWAYS AS (a * 2) STORED)")
    env = environment(tmp_path, 1, "ck")
    known = from_file(tmp_path, env, pa.table({"a": [1], "b": [2], "c": [3]}))
    with pytest.raises(
        SinkError, match=where(postgres, "g") + r": the records' field\(s\) \['c'\] are not columns"
    ):
        known.write_postgres(postgres.dsn, table="g")
    with pytest.raises(
        SinkError,
        match=where(postgres, "g") + r": column\(s\) \['b'\] are GENERATED ALWAYS \(the server "
        r"makes their values\): leave the field\(s\) out with columns=\[\.\.\.\]",
    ):
        known.write_postgres(postgres.dsn, table="g", columns=["a", "b"])
    with pytest.raises(
        SinkError,
        match=where(postgres, "g") + r": the records have no field\(s\) \['nope'\] \(their "
        r"fields: a, b, c\)",
    ):
        known.write_postgres(postgres.dsn, table="g", columns=["a", "nope"])
    known.write_postgres(postgres.dsn, table="g", columns=["a"])


@pytest.mark.parametrize(
    ("column", "values", "why"),
    [
        ("bigint", pa.array(["5"]), "text does not go into a column of numbers"),
        ("boolean", pa.array(["true"]), "text does not go into a column of booleans"),
        ("bytea", pa.array(["x"]), "text does not go into a column of bytes"),
        ("bigint", pa.array([[1, 2]]), "lists and structs go into an array or a json column"),
        ("text", pa.array([{"a": 1}]), "lists and structs go into an array or a json column"),
        ("bigint[]", pa.array([1]), "the column is an array, and the field holds no lists"),
        ("bigint[]", pa.array([["a"]]), "its items: text does not go into a column of numbers"),
        ("integer", pa.array([1.5]), "numbers with a fraction do not go into a column of integers"),
        ("date", pa.array([1]), "numbers go into a column of numbers or text"),
        ("interval", pa.array([True]), "true and false go into a boolean or text column"),
    ],
)
def test_a_field_whose_type_its_column_does_not_take_is_refused_when_the_job_is_built(
    postgres: PostgresServer, tmp_path: Path, column: str, values: pa.Array, why: str
) -> None:
    execute(postgres.dsn, f"CREATE TABLE t (v {column})")
    env = environment(tmp_path, 1, "ck")
    known = from_file(tmp_path, env, pa.table({"v": values}))
    with pytest.raises(
        SinkError,
        match=where(postgres, "t")
        + re.escape(f": the records' field 'v' is {known.schema.field('v').type}, and column v is ")
        + re.escape(f"{column}: {why}"),
    ):
        known.write_postgres(postgres.dsn, table="t")


@pytest.mark.parametrize(
    ("column", "values", "stored"),
    [
        ("date", pa.array(["2024-01-31"]), "2024-01-31"),  # (text: the server reads it)
        ("uuid", pa.array(["1b4e28ba-2fa1-11d2-883f-0016d3cca427"]), None),
        ("text", pa.array([7]), "7"),
        ("numeric(10,2)", pa.array([1.25]), "1.25"),
        ("bigint[]", pa.array([[1, 2]]), "{1,2}"),
        ("jsonb", pa.array([{"a": 1}]), '{"a": 1}'),
        ("smallint", pa.array([7]), "7"),  # (an int64 field: 70000 is the server's to refuse)
    ],
)
def test_a_field_whose_type_its_column_takes_is_written(
    postgres: PostgresServer, tmp_path: Path, column: str, values: pa.Array, stored: str | None
) -> None:
    execute(postgres.dsn, f"CREATE TABLE t (v {column})")
    env = environment(tmp_path, 1, "ck")
    from_file(tmp_path, env, pa.table({"v": values})).write_postgres(postgres.dsn, table="t")
    testing.execute(env, launcher=ThreadLauncher())
    got = query(postgres.dsn, "SELECT v::text FROM t")
    assert got == [(stored if stored is not None else values[0].as_py(),)]


# -- refused as the job runs ----------------------------------------------------------------------

READINGS = (
    "CREATE TABLE readings (n bigint PRIMARY KEY, level smallint NOT NULL CHECK (level <> 13))"
)
"""Levels fit a smallint, are given, and are never 13."""
BAD = {"too large": 40_000, "null": None, "thirteen": 13}


@dataclass(frozen=True)
class Reading:
    """Record ``n``'s reading: level ``n % 1000 + 100``, but those of ``bad`` (n -> level)."""

    bad: tuple[tuple[int, int | None], ...] = ()

    @property
    def __name__(self) -> str:
        return "reading"

    def __call__(self, record: dict[str, int]) -> dict[str, Any]:
        n = record["value"]
        return {"n": n, "level": dict(self.bad).get(n, n % 1000 + 100)}


def readings_job(
    tmp_path: Path,
    dsn: str,
    n: int,
    bad: dict[int, int | None],
    *,
    upsert: bool,
    parallelism: int = 1,
    fail: FailAt | None = None,
    on_error: str = "fail",
    **options: Any,
) -> StreamEnvironment:
    env = environment(tmp_path, parallelism, "ck", dead_letter_dir=tmp_path / "dead", **options)
    stream = env.from_sequence(0, n, name="numbers").map(Reading(tuple(bad.items())))
    if fail is not None:
        stream = stream.map(fail, name="fail")
    stream.write_postgres(
        dsn, table="readings", key=["n"] if upsert else None, name="readings", on_error=on_error
    )
    return env


def refusal(postgres: PostgresServer, level: int | None, upsert: bool, n: int) -> str:
    """What the sink says of a reading of ``level`` (one of :data:`BAD`) as record ``n``."""
    said = f"write_postgres(readings at 127.0.0.1:{postgres.port}/postgres): "
    if level == 40_000:
        large = (
            "smallint out of range" if upsert else 'value "40000" is out of range for type smallint'
        )
        return said + f"column level (smallint) cannot take 40000: {large}"
    if level is None:
        return said + (
            'column level (smallint) cannot take None: null value in column "level" of '
            f'relation "readings" violates not-null constraint (Failing row contains ({n}, null).)'
        )
    return said + (
        'the row breaks readings_level_check on level = 13: new row for relation "readings" '
        f'violates check constraint "readings_level_check" (Failing row contains ({n}, 13).)'
    )


class Causes(JobListener):
    def __init__(self) -> None:
        self.causes: list[str] = []

    def on_event(self, event: JobEvent) -> None:
        if isinstance(event, Restarting):
            self.causes.append(event.cause)


@pytest.mark.parametrize("upsert", [False, True])
@pytest.mark.parametrize("kind", list(BAD))
def test_a_record_the_server_refuses_fails_the_job_naming_the_table_the_column_the_value_and_it(
    postgres: PostgresServer, tmp_path: Path, upsert: bool, kind: str
) -> None:
    """The same in both attempts (the message holds nothing that changes): restart logic can
    tell a record that always fails."""
    execute(postgres.dsn, READINGS)
    level = BAD[kind]
    env = readings_job(
        tmp_path,
        postgres.dsn,
        10,
        {7: level},
        upsert=upsert,
        restart_strategy=FixedDelay(1, delay=0),
    )
    causes = Causes()
    with pytest.raises(JobFailedError) as failed:
        testing.execute(env, launcher=ThreadLauncher(), listener=causes)
    failure = failed.value.failure
    assert failure is not None and failure.operator == "readings"
    assert failure.message == refusal(postgres, level, upsert, 7)
    assert failure.record == repr({"level": level, "n": 7})
    assert causes.causes == [failure.describe()]  # (the first attempt's: the same)
    assert rows_of(postgres.dsn, "readings") == Counter()
    assert prepared(postgres.dsn) == []


def day(record: dict[str, int]) -> dict[str, Any]:
    return {"n": record["value"], "day": record["value"] + 5}


def text_amount(record: dict[str, int]) -> dict[str, Any]:
    return {"user": "u", "amount": f"x{record['value']}"}


@pytest.mark.parametrize("upsert", [False, True])
def test_a_field_whose_type_its_column_does_not_take_fails_the_job_as_the_records_come(
    postgres: PostgresServer, tmp_path: Path, upsert: bool
) -> None:
    """The records' columns unknown when the job is built (after a ``map``): each batch's are
    matched to the table's as it comes. An upsert of numbers into a date column said only
    ``cannot cast type integer[] to date[]``; text into a bigint column, neither the column nor
    the value."""
    execute(postgres.dsn, "CREATE TABLE days (n bigint PRIMARY KEY, day date)", TOTALS)
    key = ["n"] if upsert else None
    with pytest.raises(JobFailedError) as failed:
        run(tmp_path, postgres.dsn, day, table="days", key=key)
    assert failed.value.failure is not None
    assert failed.value.failure.message == (
        f"write_postgres(days at 127.0.0.1:{postgres.port}/postgres): column day (date) cannot "
        "take 5: numbers go into a column of numbers or text"
    )
    assert failed.value.failure.record == repr({"day": 5, "n": 0})
    with pytest.raises(JobFailedError) as failed:
        run(tmp_path, postgres.dsn, text_amount, table="totals", key=["user"] if upsert else None)
    assert failed.value.failure is not None
    assert failed.value.failure.message == (
        f"write_postgres(totals at 127.0.0.1:{postgres.port}/postgres): column amount (bigint) "
        "cannot take 'x0': text does not go into a column of numbers (convert the field before "
        "the sink, or make the column text)"
    )
    assert rows_of(postgres.dsn, "days") == rows_of(postgres.dsn, "totals") == Counter()
    assert prepared(postgres.dsn) == []


def test_a_field_that_is_not_a_column_fails_the_job_as_the_records_come(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The records' fields unknown when the job is built (a ``map``, no ``columns=``)."""
    execute(postgres.dsn, SUMS)
    with pytest.raises(
        JobFailedError,
        match=where(postgres, "sums") + r": the records' field\(s\) \['n'\] are not columns of "
        r"the table \(its columns: user, amount\); write only some fields with columns=\[\.\.\.\]",
    ):
        run(tmp_path, postgres.dsn, purchase, table="sums")
    assert rows_of(postgres.dsn, "sums") == Counter()
    assert prepared(postgres.dsn) == []


@pytest.mark.parametrize(("upsert", "parallelism"), [(False, 2), (True, 2), (True, 1)])
def test_refused_records_go_to_the_dead_letters_once_and_the_rest_is_written_once(
    postgres: PostgresServer, tmp_path: Path, upsert: bool, parallelism: int
) -> None:
    """A reading in ten is bad (too large, null, or 13), and a failure strikes past the hold:
    every good reading is in the table once, every bad one in the dead letters once, with what
    the sink said of it. Upserts of keys a prepared transaction holds are checked before the
    snapshot thread sends them: those refused are put aside too."""
    execute(postgres.dsn, READINGS)
    n = 2000
    bad = {i: list(BAD.values())[i // 10 % 3] for i in range(3, n, 10)}
    fail = FailAt(1777, str(tmp_path / "failed"))
    env = readings_job(
        tmp_path,
        postgres.dsn,
        n,
        bad,
        upsert=upsert,
        parallelism=parallelism,
        fail=fail,
        on_error="dead_letter",
    )
    result = testing.execute(env, launcher=ThreadLauncher(), hold_sources=half_way(n, parallelism))
    assert len(result.restarts) == 1 and result.restarts[0].restored_from is not None
    assert rows_of(postgres.dsn, "readings") == Counter(
        {(i, i % 1000 + 100): 1 for i in range(n) if i not in bad}
    )
    letters = dead_letters(tmp_path / "dead")
    assert sorted(json.loads(letter["record"])["n"] for letter in letters) == sorted(bad)
    for letter in letters:
        record = json.loads(letter["record"])
        assert letter["operator"] == "readings"
        assert letter["error"] == refusal(postgres, bad[record["n"]], upsert, record["n"])
    assert prepared(postgres.dsn) == []


# -- refused as the job runs, the writer driven by hand ------------------------------------------


def context() -> SinkContext:
    return SinkContext("readings", 0, 1, 1, "run1", job="jobone", uid="readings")


def prepare(writer: Any, checkpoint_id: int) -> tuple[Any, list[RecordError]]:
    """``prepare_commit`` asked again after each record it refuses, as cutline does with
    ``on_error="dead_letter"``: what it returned, and the records refused."""
    refused = []
    while True:
        try:
            return writer.prepare_commit(checkpoint_id), refused
        except RecordError as exc:
            refused.append(exc)


def rows(*readings: tuple[int, int | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"n": n, "level": level} for n, level in readings])


@pytest.mark.parametrize("upsert", [False, True])
def test_every_record_refused_in_a_batch_is_handed_over_once_and_the_rest_written(
    postgres: PostgresServer, upsert: bool
) -> None:
    execute(postgres.dsn, READINGS)
    sink = PostgresSink(postgres.dsn, "readings", ("n",) if upsert else None, batch_rows=100)
    writer = sink.writer(context(), {})
    writer.write(rows(*[(i, BAD[kind]) for i, kind in ((3, "too large"), (5, "null"))]))
    writer.write(rows(*[(i, i + 100) for i in (1, 2, 4, 6)], (7, 13), (8, 108)))
    committable, refused = prepare(writer, 1)
    assert [(e.record["n"], str(e)) for e in refused] == [
        (i, refusal(postgres, level, upsert, i)) for i, level in ((3, 40_000), (5, None), (7, 13))
    ]
    writer.commit(1)
    writer.close()
    assert committable == [(1, writer.prefix + "0:1")]
    assert sorted(query(postgres.dsn, "SELECT * FROM readings")) == [
        (i, i + 100) for i in (1, 2, 4, 6, 8)
    ]
    assert prepared(postgres.dsn) == []


def test_an_upsert_whose_newest_row_of_a_key_is_refused_writes_the_next_newest(
    postgres: PostgresServer,
) -> None:
    """As if the refused record never came. An older row that a newer one of its key replaces
    within the batch is never sent: never refused either."""
    execute(postgres.dsn, READINGS)
    writer = PostgresSink(postgres.dsn, "readings", ("n",)).writer(context(), {})
    writer.write(rows((1, 101), (1, 13), (2, 13), (2, 102), (3, 103), (1, None)))
    _, refused = prepare(writer, 1)
    assert [e.record for e in refused] == [{"n": 1, "level": 13}, {"n": 1, "level": None}]
    writer.commit(1)
    writer.close()
    assert sorted(query(postgres.dsn, "SELECT * FROM readings")) == [(1, 101), (2, 102), (3, 103)]


def test_upserts_left_to_the_snapshot_thread_are_checked_first(postgres: PostgresServer) -> None:
    """Checkpoint 2's barrier comes while checkpoint 1's transaction (holding key 1) is still
    prepared: its rows are sent by the snapshot thread. Checked first on the writer's thread,
    in a copy of the table, a row breaking the table's CHECK is refused there (and said as the
    table would say it); one breaking what the copy lacks (a foreign key) fails the prepare on
    the snapshot thread, naming it: the subtask fails over."""
    execute(
        postgres.dsn,
        "CREATE TABLE sites (name text PRIMARY KEY)",
        "INSERT INTO sites VALUES ('north')",
        READINGS,
        "ALTER TABLE readings ADD COLUMN site text REFERENCES sites (name)",
    )
    writer = PostgresSink(postgres.dsn, "readings", ("n",)).writer(context(), {})
    sited = pa.RecordBatch.from_pylist
    writer.write(sited([{"n": 1, "level": 101, "site": "north"}]))
    assert prepare(writer, 1) == ([(1, writer.prefix + "0:1")], [])
    writer.write(
        sited([{"n": 1, "level": 13, "site": "north"}, {"n": 2, "level": 102, "site": "north"}])
    )
    pending, refused = prepare(writer, 2)
    assert isinstance(pending, PendingCommit)
    assert [str(e) for e in refused] == [
        refusal(postgres, 13, True, 1).replace("(1, 13).", "(1, 13, north).")
    ]
    writer.commit(1)
    assert pending.complete() == [(2, writer.prefix + "0:2")]
    writer.commit(2)
    writer.write(sited([{"n": 1, "level": 111, "site": "south"}]))
    writer.write(sited([{"n": 3, "level": 103, "site": "north"}]))
    committable, refused = prepare(writer, 3)  # (on the writer's thread: put aside)
    assert committable == [(3, writer.prefix + "0:3")]
    assert [e.record for e in refused] == [{"n": 1, "level": 111, "site": "south"}]
    writer.write(sited([{"n": 3, "level": 113, "site": "south"}]))
    pending, refused = prepare(writer, 4)
    assert isinstance(pending, PendingCommit) and refused == []
    writer.commit(3)
    with pytest.raises(SinkError) as broke:
        pending.complete()
    assert str(broke.value).startswith(
        f"write_postgres(readings at 127.0.0.1:{postgres.port}/postgres): the row breaks "
        "readings_site_fkey on site = 'south': insert or update on table \"readings\" violates "
        'foreign key constraint "readings_site_fkey" (Key (site)=(south) is not present in '
        "table \"sites\".); record {'n': 3, 'level': 113, 'site': 'south'}"
    )
    writer.abort()
    assert sorted(query(postgres.dsn, "SELECT * FROM readings")) == [
        (1, 101, "north"),
        (2, 102, "north"),
        (3, 103, "north"),
    ]
    assert [p[0] for p in writer.prepared] == []
    assert prepared(postgres.dsn) == []
