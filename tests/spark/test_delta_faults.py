"""The Delta Lake sink and source (``cutline.connectors.delta``) on a real local Spark session, a
Python worker SIGKILLed.

The sink: at a random moment, the ledger's running balance after every entry is in the table
once (``tests/jobs/test_connector_api.py`` says why each is fixed), each checkpoint committed
once. The kill lands by construction (``_execute_killing`` of ``test_event_time_faults.py``):
the sources hold part-way until a checkpoint completed and the killer was told of it.

The source: a watched table gets a version at every complete checkpoint
(``test_delta_source.py``'s ``Appender``) and a worker is killed on one of the first three,
while the job runs (it runs until the test stops it with a savepoint, once every version is
read)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from deltalake import DeltaTable
from test_connector_api import assert_exact
from test_delta_source import Appender, append, counted, published
from test_event_time_faults import _execute_killing
from test_savepoints import endpoints_of

from cutline import FixedDelay, JobListener, StreamEnvironment, testing
from cutline.connectors.delta import DeltaSink
from cutline.demo import WorkerKiller
from cutline.runtime.driver.events import CheckpointCompleted, JobEvent, SavepointCompleted

from ledger import Ledger


@pytest.mark.parametrize("seed", [0, 1])
def test_the_delta_sink_is_exact_through_a_sigkill_at_a_random_moment(
    spark, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(f"delta-{seed}")
    ledger = Ledger(accounts=6, per_account=1500, numbered=seed == 0)
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.3,
        checkpoint_dir=str(tmp_path / "ck"),
        restart_strategy=FixedDelay(delay=0),
    )
    table = tmp_path / "table"
    balances = env.from_source(ledger, name="ledger").key_by("account").sum("amount")
    balances.sink_to(DeltaSink(str(table)), name="sums")
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.2, 1.5))
    _execute_killing(env, spark, killer, rng.randrange(500, 2500))
    assert_exact(
        ledger, DeltaTable(str(table)).to_pyarrow_table().to_pylist(), [], with_windows=False
    )
    # one transaction per commit, of one app id, each checkpoint once and in order
    commits = [
        [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted((table / "_delta_log").glob("*.json"))
    ]
    txns = [[a["txn"] for a in actions if "txn" in a] for actions in commits]
    assert all(len(t) == 1 for t in txns) and len({t["appId"] for [t] in txns}) == 1
    versions = [t["version"] for [t] in txns]
    assert versions == sorted(set(versions))
    # the files of the attempt that was killed, never committed, are gone
    added = {Path(a["add"]["path"]).name for actions in commits for a in actions if "add" in a}
    assert {p.name for p in table.rglob("*.parquet")} == added


class KillAndAppend(JobListener):
    """The job's listener: on the ``kill_at``-th complete checkpoint, the killer SIGKILLs its
    worker; every event goes on to the appender (the next version at each checkpoint)."""

    def __init__(self, killer: WorkerKiller, appender: Appender, kill_at: int) -> None:
        self.killer, self.appender, self.kill_at = killer, appender, kill_at
        self.completed = 0

    def on_event(self, event: JobEvent) -> None:
        if isinstance(event, CheckpointCompleted) and not isinstance(event, SavepointCompleted):
            self.completed += 1
            if self.completed == self.kill_at:
                self.killer.kill()
        self.appender(event.kind, event.message)


@pytest.mark.parametrize(
    "seed", [0, pytest.param(1, marks=pytest.mark.slow)]
)  # (seed 1: make soak)
def test_the_delta_source_is_exact_through_a_sigkill_mid_stream(
    spark, tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watched table, a version appended at every complete checkpoint: a worker SIGKILLed
    after a random one of the first three (the table still growing: the job runs until the
    test stops it), and every row of every version once in the running counts."""
    rng = random.Random(f"delta-source-{seed}")
    table = tmp_path / "table"
    append(table, 0, files=3)
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.3,
        checkpoint_dir=str(tmp_path / "ck"),
        restart_strategy=FixedDelay(delay=0),
    )
    orders = env.read_delta(table, monitor="50ms", name="orders")
    orders.key_by("user").count(name="per_user").write_parquet(tmp_path / "out", name="out")
    appender = Appender(table, tmp_path / "ck", list(range(1, 7)), endpoints_of(monkeypatch), 2)
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}")
    try:
        result = testing.execute(
            env,
            spark,
            on_ready=killer.on_ready,
            listener=KillAndAppend(killer, appender, rng.randrange(1, 4)),
        )
    finally:
        killer.disarm()
    assert killer.killed_at is not None and len(result.restarts) == 1
    cause = result.restarts[0].cause
    assert "lost" in cause or "died" in cause, cause
    appender.savepoint()
    counted(published(tmp_path / "out"), range(7))
