"""The Iceberg sink (``cutline.connectors.iceberg``) on a real local Spark session, a Python
worker SIGKILLed at a random moment: the ledger's running balance after every entry is in the
table once, read back by pyiceberg and by polars (``tests/jobs/test_connector_api.py`` says why
each is fixed), each checkpoint committed in one snapshot, once. The kill lands by
construction (``_execute_killing`` of ``test_event_time_faults.py``): the sources hold
part-way until a checkpoint completed and the killer was told of it."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest
from pyiceberg.catalog import load_catalog
from test_connector_api import assert_exact
from test_event_time_faults import _execute_killing

from cutline import FixedDelay, StreamEnvironment
from cutline.demo import WorkerKiller

from ledger import Ledger


@pytest.mark.parametrize(
    "seed", [0, pytest.param(1, marks=pytest.mark.slow)]
)  # (seed 1: make soak)
def test_the_iceberg_sink_is_exact_through_a_sigkill_at_a_random_moment(
    spark, tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # (no planner plugin here)
    rng = random.Random(f"iceberg-{seed}")
    ledger = Ledger(accounts=6, per_account=1500, numbered=seed == 0)
    (tmp_path / "warehouse").mkdir()
    catalog = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": (tmp_path / "warehouse").as_uri(),
    }
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.3,
        checkpoint_dir=str(tmp_path / "ck"),
        restart_strategy=FixedDelay(delay=0),
    )
    balances = env.from_source(ledger, name="ledger").key_by("account").sum("amount")
    balances.write_iceberg("db.sums", catalog=catalog, name="sums")
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.2, 1.5))
    _execute_killing(env, spark, killer, rng.randrange(500, 2500))
    table = load_catalog("default", **catalog).load_table("db.sums")
    rows = table.scan().to_arrow().to_pylist()
    assert_exact(ledger, rows, [], with_windows=False)
    assert_exact(ledger, pl.scan_iceberg(table).collect().to_dicts(), [], with_windows=False)
    # a snapshot per commit, of one job and sink, each checkpoint once and in order
    summaries = [s.summary for s in table.snapshots()]
    assert len({(s["cutline.job"], s["cutline.sink"]) for s in summaries}) == 1
    checkpoints = [int(s["cutline.checkpoint"]) for s in summaries]
    assert checkpoints == sorted(set(checkpoints))
    # the files of the attempt that was killed, never committed, are gone
    added = {Path(task.file.file_path).name for task in table.scan().plan_files()}
    assert {p.name for p in (tmp_path / "warehouse").rglob("*.parquet")} == added
