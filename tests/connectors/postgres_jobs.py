"""The job the PostgreSQL sink's tests run (``test_postgres.py``, ``test_postgres_failures.py``),
its answer, and helpers that ask the server.

The job: ``from_sequence(0, N)``, each number a purchase of a user (:func:`purchase`), the
users' running sums written into a table. A user's purchases are the numbers of one split of
the sequence (``from_sequence`` deals ``value % 128`` into split ``value % 128``; there are
:data:`USERS` = 128 users), read in order by one subtask, so every running sum is fixed and
computed here in plain Python: inserted, the table holds each of them once; upserted, each
user's total. Amounts are positive: a user's running sums all differ, and a row written twice
shows.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from cutline import DataStream, FixedDelay, SourceHold, StreamEnvironment
from cutline.examples.servers import PostgresServer

from ledger import first_time

N = 3000
USERS = 128
"""As many as ``from_sequence``'s splits: each user's purchases are one split's."""
SUMS = 'CREATE TABLE sums ("user" text NOT NULL, amount bigint NOT NULL)'
TOTALS = 'CREATE TABLE totals ("user" text PRIMARY KEY, amount bigint NOT NULL)'
EVENTS = "CREATE TABLE events (n bigint NOT NULL)"


def purchase(record: dict[str, int]) -> dict[str, Any]:
    n = record["value"]
    return {"user": f"u{n % USERS:03d}", "amount": n * 7919 % 97 + 1, "n": n}


def running_sums(n: int) -> Counter[tuple[str, int]]:
    """Every (user, running sum) row of the first ``n`` purchases, counted."""
    totals: Counter[str] = Counter()
    rows: Counter[tuple[str, int]] = Counter()
    for value in range(n):
        bought = purchase({"value": value})
        totals[bought["user"]] += bought["amount"]
        rows[(bought["user"], totals[bought["user"]])] += 1
    assert max(rows.values()) == 1  # (positive amounts: a user's running sums differ)
    return rows


def totals(n: int) -> dict[str, int]:
    """Each user's total after the first ``n`` purchases."""
    sums: Counter[str] = Counter()
    for value in range(n):
        bought = purchase({"value": value})
        sums[bought["user"]] += bought["amount"]
    return dict(sums)


@dataclass(frozen=True)
class FailAt:
    """Raises once (a flag file remembers it), at purchase ``n``."""

    n: int
    flag: str

    @property
    def __name__(self) -> str:
        return "fail_at"

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        if record["n"] == self.n and first_time(self.flag):
            raise RuntimeError(f"injected failure at purchase {self.n}")
        return record


def environment(
    tmp_path: Path, parallelism: int, checkpoints: str, **options: Any
) -> StreamEnvironment:
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / checkpoints,
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 50,
    }
    settings.update(options)
    return StreamEnvironment(parallelism, **settings)


def running_sum_stream(env: StreamEnvironment, n: int, fail: FailAt | None = None) -> DataStream:
    stream = env.from_sequence(0, n, name="numbers").map(purchase, name="purchase")
    if fail is not None:
        stream = stream.map(fail, name="fail")
    return stream.key_by("user").sum("amount", name="sums")


def sums_job(
    tmp_path: Path,
    parallelism: int,
    dsn: str,
    *,
    n: int = N,
    upsert: bool = False,
    table: str | None = None,
    fail: FailAt | None = None,
    checkpoints: str = "ck",
    batch_rows: int = 20_000,
    **options: Any,
) -> StreamEnvironment:
    """The users' running sums into ``sums`` (inserted) or ``totals`` (upserted on the user)."""
    env = environment(tmp_path, parallelism, checkpoints, **options)
    running_sum_stream(env, n, fail).write_postgres(
        dsn,
        table=table or ("totals" if upsert else "sums"),
        key=["user"] if upsert else None,
        columns=["user", "amount"],
        batch_rows=batch_rows,
        name="pg",
    )
    return env


def half_way(n: int, parallelism: int) -> SourceHold:
    """Each source subtask holds after half its numbers until two checkpoints completed."""
    return SourceHold(records=n // (2 * parallelism), checkpoints=2)


# -- the server ---------------------------------------------------------------------------------


def execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as connection:
        for statement in statements:
            connection.execute(statement)


def query(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as connection:
        return connection.execute(statement).fetchall()


def rows_of(dsn: str, table: str) -> Counter[tuple[Any, ...]]:
    return Counter(query(dsn, f"SELECT * FROM {table}"))


def prepared(dsn: str) -> list[str]:
    """The transactions left prepared on the server (of every database)."""
    return [gid for (gid,) in query(dsn, "SELECT gid FROM pg_prepared_xacts ORDER BY gid")]


def assert_inserted(dsn: str, n: int, table: str = "sums", times: int = 1) -> None:
    """Every running sum of the first ``n`` purchases in ``table``, ``times`` times; nothing
    prepared."""
    wanted = Counter({row: times for row in running_sums(n)})
    assert rows_of(dsn, table) == wanted
    assert prepared(dsn) == []


def assert_upserted(dsn: str, n: int) -> None:
    """Each user's total in ``totals``, once; nothing prepared."""
    assert dict(query(dsn, "SELECT * FROM totals")) == totals(n)
    assert query(dsn, "SELECT count(*) FROM totals") == [(USERS,)]
    assert prepared(dsn) == []


GID = re.compile(r"PREPARE TRANSACTION 'cutline:([a-z0-9]+):([0-9a-f]{8}):(\d+):(\d+)'")


def prepared_in_log(postgres: PostgresServer) -> list[tuple[str, str, int, int]]:
    """(job, sink, subtask, checkpoint) of every transaction prepared, in order, from the
    server's log (``log_statement=all``)."""
    return [
        (job, sink, int(subtask), int(checkpoint))
        for job, sink, subtask, checkpoint in GID.findall(postgres.log.read_text())
    ]
