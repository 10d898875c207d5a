"""The PostgreSQL sink (two-phase commit) on a real local Spark session, a Python worker
SIGKILLed: every running sum in the table once (inserted) or each user's total (upserted), and
nothing left prepared on the server (``pg_prepared_xacts`` empty).

The job is ``tests/connectors/test_postgres.py``'s: ``from_sequence``, each number a purchase of
one of 128 users (a user's purchases are one split's, read in order, so every running sum is
fixed and computed here in plain Python). The kills land by construction: at a random moment
while the sources hold part-way (``_execute_killing`` of ``test_event_time_faults.py``), and,
with a test-only sink (:class:`KillsAtCommit`), between a checkpoint's completion and the
commit of its transactions: the writer SIGKILLs its own process the first time it is told to
commit one. The restored job commits them from the restored checkpoint. The server: the
``postgres`` fixture of ``tests/server_fixtures.py``.
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_event_time_faults import _execute_killing

from cutline import FixedDelay, SourceHold, StreamEnvironment, testing
from cutline.connectors import SinkContext
from cutline.connectors.postgres import PostgresSink, PostgresWriter
from cutline.demo import WorkerKiller
from cutline.examples.servers import PostgresServer

from ledger import first_time

N = 6000
USERS = 128
"""As many as ``from_sequence``'s splits: each user's purchases are one split's."""
TABLES = {
    False: 'CREATE TABLE sums ("user" text NOT NULL, amount bigint NOT NULL)',
    True: 'CREATE TABLE totals ("user" text PRIMARY KEY, amount bigint NOT NULL)',
}


def purchase(record: dict[str, int]) -> dict[str, Any]:
    n = record["value"]
    return {"user": f"u{n % USERS:03d}", "amount": n * 7919 % 97 + 1, "n": n}


def assert_exact(dsn: str, upsert: bool) -> None:
    """Inserted: every (user, running sum) once; upserted: each user's total. Nothing left
    prepared."""
    running: Counter[str] = Counter()
    rows: Counter[tuple[str, int]] = Counter()
    for value in range(N):
        bought = purchase({"value": value})
        running[bought["user"]] += bought["amount"]
        rows[(bought["user"], running[bought["user"]])] += 1
    with psycopg.connect(dsn) as connection:
        if upsert:
            assert dict(connection.execute("SELECT * FROM totals").fetchall()) == dict(running)
        else:
            assert Counter(connection.execute("SELECT * FROM sums").fetchall()) == rows
        assert connection.execute("SELECT gid FROM pg_prepared_xacts").fetchall() == []


@dataclass(frozen=True)
class KillsAtCommit(PostgresSink):
    """The PostgreSQL sink whose writer SIGKILLs its own process (the Python worker) the first
    time (``flag``, a file, remembers it) it is told to commit a prepared transaction, before
    committing it."""

    flag: str = ""

    def writer(self, context: SinkContext, restored: Mapping[int, Any]) -> PostgresWriter:
        return KillingWriter(self, context, restored, self.flag)


class KillingWriter(PostgresWriter):
    def __init__(
        self, sink: PostgresSink, context: SinkContext, restored: Mapping[int, Any], flag: str
    ) -> None:
        super().__init__(sink, context, restored)
        self.flag = flag

    def commit(self, checkpoint_id: int) -> None:
        due = any(prepared <= checkpoint_id for prepared, _ in self.prepared)
        if due and first_time(self.flag):
            os.kill(os.getpid(), signal.SIGKILL)
        super().commit(checkpoint_id)


def running_sums(
    tmp_path: Path, dsn: str, upsert: bool, flag: str | None = None
) -> StreamEnvironment:
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.3,
        checkpoint_dir=str(tmp_path / "ck"),
        restart_strategy=FixedDelay(delay=0),
        batch_size=100,
    )
    sums = (
        env.from_sequence(0, N, name="numbers")
        .map(purchase, name="purchase")
        .key_by("user")
        .sum("amount", name="sums")
    )
    table, key = ("totals", ("user",)) if upsert else ("sums", None)
    if flag is None:
        sums.write_postgres(dsn, table=table, key=key, columns=["user", "amount"], name="pg")
    else:
        sink = KillsAtCommit(dsn, table, key, columns=("user", "amount"), flag=flag)
        sums.sink_to(sink, name="pg")
    return env


@pytest.mark.parametrize(
    ("upsert", "seed"), [(False, 0), pytest.param(False, 1, marks=pytest.mark.slow), (True, 2)]
)  # (seed 1: make soak)
def test_a_sigkill_at_a_random_moment_writes_every_running_sum_once(
    spark: Any, postgres: PostgresServer, tmp_path: Path, upsert: bool, seed: int
) -> None:
    rng = random.Random(f"postgres-{seed}")
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute(TABLES[upsert])
    env = running_sums(tmp_path, postgres.dsn, upsert)
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.2, 1.5))
    _execute_killing(env, spark, killer, rng.randrange(N // 8, 3 * N // 8))
    assert_exact(postgres.dsn, upsert)


@pytest.mark.parametrize("upsert", [False, True])
def test_a_sigkill_between_a_checkpoints_completion_and_its_commit(
    spark: Any, postgres: PostgresServer, tmp_path: Path, upsert: bool
) -> None:
    """The writer dies with its checkpoint complete and its transaction prepared, not
    committed: the restored writer commits it (the restored checkpoint holds it)."""
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute(TABLES[upsert])
    flag = tmp_path / "killed"
    env = running_sums(tmp_path, postgres.dsn, upsert, flag=str(flag))
    result = testing.execute(env, spark, hold_sources=SourceHold(records=N // 4, checkpoints=2))
    assert flag.exists()
    assert len(result.restarts) == 1
    cause = result.restarts[0].cause
    assert "lost" in cause or "died" in cause, cause
    assert result.restarts[0].restored_from is not None
    assert_exact(postgres.dsn, upsert)
