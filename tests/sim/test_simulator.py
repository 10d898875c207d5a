"""The simulator: determinism, FIFO channels, delays, script order, reachability."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.sim.checker import check_run
from cutline.sim.generate import random_scenario
from cutline.sim.log import EventKind
from cutline.sim.scenario import Initiate, Scenario, ScenarioError, Tick, scenario_from_text
from cutline.sim.simulator import SimConfig, simulate
from paths import SCENARIOS

from strategies import scenarios

CHAIN = "3\nN1 10\nN2 0\nN3 0\nN1 N2\nN2 N3\n"


@settings(max_examples=150)
@given(scenario=scenarios(), seed=st.integers(0, 2**32 - 1))
def test_channels_are_fifo_and_delays_stay_in_range(scenario: Scenario, seed: int) -> None:
    run = simulate(scenario, SimConfig(seed=seed, min_delay=2, max_delay=4))
    # per channel: (is a marker, payment id or snapshot id, step) as sent and as received
    sent: dict[object, list[tuple[bool, int | None, int]]] = defaultdict(list)
    received: dict[object, list[tuple[bool, int | None, int]]] = defaultdict(list)
    for event in run.log:
        if event.kind is EventKind.SEND:
            sent[event.channel].append((False, event.message, event.time))
        elif event.kind is EventKind.MARKER_SEND:
            sent[event.channel].append((True, event.snapshot, event.time))
        elif event.kind is EventKind.DELIVER:
            received[event.channel].append((False, event.message, event.time))
        elif event.kind is EventKind.MARKER_DELIVER:
            received[event.channel].append((True, event.snapshot, event.time))
    assert set(received) <= set(sent)
    for channel, items in sent.items():
        got = received[channel]
        # everything arrives, in the order it was sent
        assert [i[:2] for i in items] == [i[:2] for i in got]
        last_payment = 0
        for (is_marker, _, t_sent), (_, _, t_got) in zip(items, got, strict=True):
            assert t_got >= t_sent + 2
            if not is_marker:
                # a payment is late only when FIFO holds it behind an earlier payment
                assert t_got <= max(t_sent + 4, last_payment)
                last_payment = t_got


def test_same_seed_gives_the_same_run_and_seeds_differ() -> None:
    scenario = random_scenario(11, processes=(6, 6), payments=(40, 40))
    a = simulate(scenario, SimConfig(seed=1))
    b = simulate(scenario, SimConfig(seed=1))
    c = simulate(scenario, SimConfig(seed=2))
    assert a.log == b.log
    assert [e.time for e in a.log] != [e.time for e in c.log]


def test_output_does_not_depend_on_hash_randomization(tmp_path: Path) -> None:
    scenario_dir = SCENARIOS
    outputs = set()
    for hash_seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "cutline.cli",
                "sim",
                str(scenario_dir / "3line.top"),
                str(scenario_dir / "3line-concurrent.events"),
                "--seed",
                "5",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        outputs.add(result.stdout)
    assert len(outputs) == 1


def test_script_events_of_a_step_come_before_its_deliveries() -> None:
    # With delay 1, N1's payment arrives at step 1; N2's snapshot at step 1 comes first.
    scenario = scenario_from_text(
        "2\nN1 5\nN2 0\nN1 N2\nN2 N1\n", "send N1 N2 5\ntick\nsnapshot N2\n"
    )
    run = simulate(scenario, SimConfig(min_delay=1, max_delay=1))
    snap = run.snapshots[0]
    assert snap.states == {"N2": 0, "N1": 0}
    assert [(c, p.amount) for c, p in snap.messages] == [(("N1", "N2"), 5)]


def test_markers_never_delay_payments() -> None:
    # N1 sends a marker with a long random delay, then a payment that would overtake it.
    scenario = scenario_from_text(
        "2\nN1 50\nN2 0\nN1 N2\nN2 N1\n",
        "snapshot N1\n" + "send N1 N2 1\ntick\n" * 10,
    )
    for seed in range(30):
        with_snapshots = simulate(scenario, SimConfig(seed=seed, max_delay=9))
        without = simulate(scenario, SimConfig(seed=seed, max_delay=9, snapshots=False))
        times = [(e.message, e.time) for e in with_snapshots.log if e.kind is EventKind.DELIVER]
        assert times == [(e.message, e.time) for e in without.log if e.kind is EventKind.DELIVER]
        assert check_run(with_snapshots, without).ok


def test_a_process_with_no_inputs_or_no_outputs_completes() -> None:
    scenario = scenario_from_text(CHAIN, "send N1 N2 4\nsnapshot N1\nsend N1 N2 3\ntick\n")
    run = simulate(scenario, SimConfig(seed=3))
    snap = run.snapshots[0]
    assert snap.complete
    assert snap.states["N1"] == 6
    assert snap.recorded_tokens == 10
    assert check_run(run).ok


def test_a_snapshot_that_cannot_terminate_is_reported_not_waited_on() -> None:
    # N3 reaches nobody: a snapshot it initiates never reaches N1 or N2.
    scenario = scenario_from_text(CHAIN, "send N1 N2 4\nsnapshot N3\ntick 3\n")
    run = simulate(scenario, SimConfig(seed=0))
    snap = run.snapshots[0]
    assert not snap.complete
    assert set(snap.states) == {"N3"}
    verdict = check_run(run)
    never = {v.process for v in verdict.failed("termination") if "never recorded" in v.detail}
    assert never == {"N1", "N2"}


def test_paying_more_than_the_balance_names_the_line() -> None:
    scenario = scenario_from_text("2\nN1 3\nN2 0\nN1 N2\nN2 N1\n", "send N1 N2 2\nsend N1 N2 2\n")
    with pytest.raises(ScenarioError) as info:
        simulate(scenario)
    assert info.value.line == 2
    assert "N1 pays 2 tokens to N2 but holds only 1" in str(info.value)


def test_bad_delays_are_refused() -> None:
    with pytest.raises(ValueError, match="min_delay"):
        SimConfig(min_delay=0)
    with pytest.raises(ValueError, match="min_delay"):
        SimConfig(min_delay=4, max_delay=3)


def test_without_a_log_nothing_is_checked() -> None:
    run = simulate(random_scenario(3), SimConfig(keep_log=False))
    assert run.log == []
    with pytest.raises(ValueError, match="no event log"):
        check_run(run)


def test_only_initiations_that_took_effect_are_listed() -> None:
    scenario = Scenario(
        scenario_from_text("2\nA 1\nB 1\nA B\nB A\n", "").topology,
        (Initiate("A", 3), Tick(10), Initiate("A", 3), Initiate("B", 3)),
    )
    run = simulate(scenario, SimConfig(seed=0))
    assert run.snapshots[3].initiators == ["A"]
    assert [e.process for e in run.log if e.kind is EventKind.INITIATE] == ["A", "A", "B"]


def test_a_run_without_payments_or_markers_still_needs_its_log() -> None:
    scenario = scenario_from_text("1\nA 5\n", "snapshot A\n")
    with pytest.raises(ValueError, match="no event log"):
        check_run(simulate(scenario, SimConfig(keep_log=False)))
    assert check_run(simulate(scenario)).ok
