"""The Delta Lake sink (``cutline.connectors.delta``) on a real local Spark session, a Python
worker SIGKILLed at a random moment: the ledger's running balance after every entry is in the
table once (``tests/jobs/test_connector_api.py`` says why each is fixed), each checkpoint
committed once. The kill lands by construction (``_execute_killing`` of
``test_event_time_faults.py``): the sources hold part-way until a checkpoint completed and the
killer was told of it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from deltalake import DeltaTable
from test_connector_api import assert_exact
from test_event_time_faults import _execute_killing

from cutline import StreamEnvironment
from cutline.connectors.delta import DeltaSink
from cutline.demo import WorkerKiller

from ledger import Ledger


@pytest.mark.parametrize("seed", [0, 1])
def test_the_delta_sink_is_exact_through_a_sigkill_at_a_random_moment(
    spark, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(f"delta-{seed}")
    ledger = Ledger(accounts=6, per_account=1500, numbered=seed == 0)
    env = StreamEnvironment(
        2, checkpoint_interval=0.3, checkpoint_dir=str(tmp_path / "ck"), restart_delay=0
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
