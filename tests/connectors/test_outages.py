"""Outages ridden out by the restart strategy: PostgreSQL stays down across several restarts
(every attempt fails to reach it), each restart waits longer than the one before, and once the
server is back the job goes on and is exact; with too few restarts allowed the job fails for
good, saying which strategy gave up and why.

The server is stopped by the job's listener at a complete checkpoint with rows, while the
sources hold (by construction), and started again when the job says it restarts for the
third time (or, with the default strategy, once the delays it said add up to a minute): a
count of what the job said, never a time. Last, the errors a restart cannot help (a value its
column refuses, a Kafka value that is not JSON) fail the job after its second attempt, however
many restarts its strategy has left.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from postgres_jobs import (
    SUMS,
    N,
    assert_inserted,
    execute,
    half_way,
    query,
    sums_job,
)
from test_postgres_failures import READINGS, readings_job, refusal

from cutline import (
    CheckpointCompleted,
    ExponentialDelay,
    FixedDelay,
    JobEvent,
    JobFailedError,
    JobListener,
    Restarting,
    StreamEnvironment,
    testing,
)
from cutline.examples.servers import KafkaBroker, PostgresServer, produce
from cutline.runtime.task.local import ThreadLauncher

pytestmark = pytest.mark.connectors


class LongOutage(JobListener):
    """Stops the server at the first complete checkpoint with rows, and starts it again
    when the job says it restarts for the ``back_after``-th time (never, if ``None``), or
    once the delays of its restarts add up to ``down_for`` seconds."""

    def __init__(
        self, postgres: PostgresServer, back_after: int | None, down_for: float | None = None
    ) -> None:
        self.postgres, self.back_after, self.down_for = postgres, back_after, down_for
        self.stopped_at: int | None = None
        self.restarts: list[Restarting] = []

    def on_event(self, event: JobEvent) -> None:
        match event:
            case CheckpointCompleted(final=False) if self.stopped_at is None:
                seen = query(
                    self.postgres.dsn,
                    "SELECT (SELECT count(*) FROM sums) + (SELECT count(*) FROM pg_prepared_xacts)",
                )
                if seen[0][0]:
                    self.postgres.stop()
                    self.stopped_at = event.checkpoint
            case Restarting():
                self.restarts.append(event)
                waited = sum(e.delay for e in self.restarts)
                if len(self.restarts) == self.back_after or (
                    self.down_for is not None and waited >= self.down_for
                ):
                    self.postgres.start()


def test_a_database_down_for_three_restarts_is_ridden_out_ever_later(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    execute(postgres.dsn, SUMS)
    outage = LongOutage(postgres, back_after=3)
    strategy = ExponentialDelay(initial=0.05, multiplier=2, jitter=0)
    env = sums_job(tmp_path, 2, postgres.dsn, restart_strategy=strategy)
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=outage, hold_sources=half_way(N, 2), progress=False
    )
    assert outage.stopped_at is not None
    assert [e.delay for e in outage.restarts] == pytest.approx([0.05, 0.1, 0.2])
    assert [r.delay for r in result.restarts] == pytest.approx([0.05, 0.1, 0.2])
    where = f"write_postgres(sums at 127.0.0.1:{postgres.port}/postgres)"
    assert all(where in r.cause for r in result.restarts)
    assert "cannot connect" in result.restarts[-1].cause  # (the attempts while it was down)
    assert_inserted(postgres.dsn, N)


@pytest.mark.slow
def test_with_the_default_strategy_a_database_down_for_a_minute_is_ridden_out(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The default strategy (ExponentialDelay()): the server comes back once the restarts
    waited a minute in all (nine restarts, 75 s), and the job is exact."""
    execute(postgres.dsn, SUMS)
    outage = LongOutage(postgres, back_after=None, down_for=60.0)
    env = sums_job(tmp_path, 2, postgres.dsn, restart_strategy=ExponentialDelay())
    testing.execute(
        env, launcher=ThreadLauncher(), listener=outage, hold_sources=half_way(N, 2), progress=False
    )
    assert sum(e.delay for e in outage.restarts) >= 60
    assert_inserted(postgres.dsn, N)


def test_with_too_few_restarts_the_job_fails_saying_which_strategy_gave_up(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    execute(postgres.dsn, SUMS)
    outage = LongOutage(postgres, back_after=None)
    env = sums_job(tmp_path, 2, postgres.dsn, restart_strategy=FixedDelay(2, 0))
    with pytest.raises(JobFailedError) as failed:
        testing.execute(
            env,
            launcher=ThreadLauncher(),
            listener=outage,
            hold_sources=half_way(N, 2),
            progress=False,
        )
    message = str(failed.value)
    assert message.startswith(
        "the job failed after 3 attempt(s), not restarted: FixedDelay(attempts=2, delay=0.0) "
        "used its 2 restart(s): "
    )
    assert "cannot connect" in message and not failed.value.deterministic
    postgres.start()  # (what the first attempts prepared is the next run's to settle)


# -------------------------------------------- errors a restart cannot help, found at once


def test_a_record_the_database_refuses_fails_the_job_at_once_whatever_restarts_are_left(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """A value that does not fit its column fails every attempt at the same record: the job
    fails after its second attempt, not after every restart its strategy has (20), naming
    the table, the column, the value and the record."""
    execute(postgres.dsn, READINGS)
    strategy = ExponentialDelay(initial=0.01, jitter=0)
    env = readings_job(
        tmp_path, postgres.dsn, 10, {7: 40_000}, upsert=False, restart_strategy=strategy
    )
    with pytest.raises(JobFailedError) as failed:
        testing.execute(env, launcher=ThreadLauncher(), progress=False)
    message = str(failed.value)
    assert message.startswith("the job failed after 2 attempt(s), not restarted: it failed at ")
    assert "a restart cannot help" in message and failed.value.deterministic
    assert refusal(postgres, 40_000, False, 7) in message
    assert "record: {'level': 40000, 'n': 7}" in message


def test_a_kafka_value_that_is_not_json_fails_the_job_at_once_whatever_restarts_are_left(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    kafka_broker.create_topic("clicks", 1)
    values = [json.dumps({"user": "u", "amount": i}) for i in range(20)]
    values[12] = "not json {"
    produce(kafka_broker, "clicks", values)
    env = StreamEnvironment(
        1,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "ck",
        restart_strategy=ExponentialDelay(initial=0.01, jitter=0),
    )
    env.read_kafka(
        "clicks",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        schema={"user": "string", "amount": "int64"},
        bounded=True,
    ).collect()
    with pytest.raises(JobFailedError) as failed:
        testing.execute(env, launcher=ThreadLauncher(), progress=False)
    message = str(failed.value)
    assert message.startswith("the job failed after 2 attempt(s), not restarted: it failed at ")
    assert "topic 'clicks' partition 0 offset 12: its value is not JSON" in message
    assert "'offset': 12" in message and failed.value.deterministic
