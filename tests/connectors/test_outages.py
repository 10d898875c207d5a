"""Outages ridden out by the restart strategy: PostgreSQL stays down across several restarts
(every attempt fails to reach it), each restart waits longer than the one before, and once the
server is back the job goes on and is exact; with too few restarts allowed the job fails for
good, saying which strategy gave up and why.

The server is stopped by the job's listener at a complete checkpoint with rows, while the
sources hold (by construction), and started again when the job says it restarts for the
third time: the count of restarts, never a time.
"""

from __future__ import annotations

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

from cutline import (
    CheckpointCompleted,
    ExponentialDelay,
    FixedDelay,
    JobEvent,
    JobFailedError,
    JobListener,
    Restarting,
)
from cutline.examples.servers import PostgresServer
from cutline.runtime.task.local import ThreadLauncher

pytestmark = pytest.mark.connectors


class LongOutage(JobListener):
    """Stops the server at the first complete checkpoint with rows, and starts it again
    when the job says it restarts for the ``back_after``-th time (never, if ``None``)."""

    def __init__(self, postgres: PostgresServer, back_after: int | None) -> None:
        self.postgres, self.back_after = postgres, back_after
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
                if len(self.restarts) == self.back_after:
                    self.postgres.start()


def test_a_database_down_for_three_restarts_is_ridden_out_ever_later(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    execute(postgres.dsn, SUMS)
    outage = LongOutage(postgres, back_after=3)
    strategy = ExponentialDelay(initial=0.05, multiplier=2, jitter=0)
    env = sums_job(tmp_path, 2, postgres.dsn, restart_strategy=strategy)
    result = env.execute(
        launcher=ThreadLauncher(), listener=outage, hold_sources=half_way(N, 2), progress=False
    )
    assert outage.stopped_at is not None
    assert [e.delay for e in outage.restarts] == pytest.approx([0.05, 0.1, 0.2])
    assert [r.delay for r in result.restarts] == pytest.approx([0.05, 0.1, 0.2])
    where = f"write_postgres(sums at 127.0.0.1:{postgres.port}/postgres)"
    assert all(where in r.cause for r in result.restarts)
    assert "cannot connect" in result.restarts[-1].cause  # (the attempts while it was down)
    assert_inserted(postgres.dsn, N)


def test_with_too_few_restarts_the_job_fails_saying_which_strategy_gave_up(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    execute(postgres.dsn, SUMS)
    outage = LongOutage(postgres, back_after=None)
    env = sums_job(tmp_path, 2, postgres.dsn, restart_strategy=FixedDelay(2, 0))
    with pytest.raises(JobFailedError) as failed:
        env.execute(
            launcher=ThreadLauncher(), listener=outage, hold_sources=half_way(N, 2), progress=False
        )
    message = str(failed.value)
    assert message.startswith(
        "the job failed after 3 attempt(s), not restarted: FixedDelay(attempts=2, delay=0.0) "
        "used its 2 restart(s): "
    )
    assert "cannot connect" in message and not failed.value.deterministic
    postgres.start()  # (what the first attempts prepared is the next run's to settle)
