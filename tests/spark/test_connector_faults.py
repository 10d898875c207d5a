"""A connector of the public API (``tests/ledger.py``) on a real local Spark session, a Python
worker SIGKILLed at a random moment: every entry's running balance and every window's count
published exactly once (``tests/jobs/test_connector_api.py`` says why each result is fixed).
The kill lands by construction (``_execute_killing`` of ``test_event_time_faults.py``): the
sources hold part-way until a checkpoint completed and the killer was told of it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_connector_api import assert_exact, ledger_job, published
from test_event_time_faults import _execute_killing

from cutline import FixedDelay, StreamEnvironment
from cutline.demo import WorkerKiller

from ledger import Journal, Ledger, journal


@pytest.mark.parametrize(
    "seed", [0, pytest.param(1, marks=pytest.mark.slow)]
)  # (seed 1: make soak)
def test_a_connector_is_read_exactly_once_through_a_sigkill_at_a_random_moment(
    spark, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(f"ledger-{seed}")
    ledger = Ledger(accounts=6, per_account=1500, numbered=seed == 0)
    env = ledger_job(tmp_path, 2, ledger, tmp_path / "out", checkpoint_interval=0.3, batch_size=100)
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.2, 1.5))
    hold = rng.randrange(500, 2500)  # (of the 4,500 entries of three accounts a subtask reads)
    _execute_killing(env, spark, killer, hold)
    out = tmp_path / "out"
    assert_exact(ledger, published(out / "balances"), published(out / "counts"))


def test_a_sink_of_the_api_is_exact_through_a_sigkill_at_a_random_moment(
    spark, tmp_path: Path
) -> None:
    """The journal (a two-phase-commit sink of the API, ``tests/ledger.py``) behind the ledger,
    a random worker killed at a random moment: every entry's balance in it once."""
    rng = random.Random("journal")
    ledger = Ledger(accounts=6, per_account=1500)
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.3,
        checkpoint_dir=str(tmp_path / "ck"),
        restart_strategy=FixedDelay(delay=0),
    )
    env.from_source(ledger, name="ledger").key_by("account").sum("amount", name="balance").sink_to(
        Journal(str(tmp_path / "journal")), name="journal"
    )
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.2, 1.5))
    _execute_killing(env, spark, killer, rng.randrange(500, 2500))
    assert_exact(ledger, journal(tmp_path / "journal"), [], with_windows=False)
