"""Property tests: thousands of generated runs, every checker property asserted.

Graphs are random strongly connected graphs of 2-12 processes; scripts hold
random payments and 1-4 snapshots, some overlapping, some initiated by
several processes. Every snapshot must verify, and each deliberately broken
recorder must be caught.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.sim.checker import PROPERTIES, check_run, simulate_and_check
from cutline.sim.log import EventKind
from cutline.sim.scenario import Scenario
from cutline.sim.simulator import SimConfig, simulate

from broken_recorders import (
    LateMarkerProcess,
    forgets_in_flight,
    records_first_marker_channel,
)
from strategies import scenarios

delays = st.tuples(st.integers(1, 3), st.integers(0, 6)).map(lambda d: (d[0], d[0] + d[1]))


@settings(max_examples=2000)
@given(scenario=scenarios(), seed=st.integers(0, 2**32 - 1), delay=delays)
def test_every_snapshot_of_every_run_is_consistent(
    scenario: Scenario, seed: int, delay: tuple[int, int]
) -> None:
    config = SimConfig(seed=seed, min_delay=delay[0], max_delay=delay[1])
    run, verdict = simulate_and_check(scenario, config)
    assert verdict.properties == PROPERTIES
    for prop in PROPERTIES:
        assert verdict.failed(prop) == [], prop
    topo = scenario.topology
    assert set(run.snapshots) == set(scenario.snapshot_ids)
    for snap in run.snapshots.values():
        # strongly connected: every snapshot terminates, everywhere
        assert snap.complete
        assert sorted(snap.completed) == sorted(topo.processes)
        assert sorted(snap.closed) == sorted(topo.channels)
        assert snap.recorded_tokens == topo.total_tokens
    # one marker per channel per snapshot: the paper's bound, met exactly
    assert run.stats["markers"] == len(run.snapshots) * len(topo.channels)
    assert verdict.ok


@settings(max_examples=200)
@given(scenario=scenarios(), seed=st.integers(0, 2**32 - 1))
def test_same_seed_same_run(scenario: Scenario, seed: int) -> None:
    first = simulate(scenario, SimConfig(seed=seed))
    second = simulate(scenario, SimConfig(seed=seed))
    assert first.log == second.log
    assert first.snapshots == second.snapshots


def _recorded_by_marker(scenario: Scenario, seed: int) -> bool:
    """Whether, in the correct run, some process first recorded because a marker arrived."""
    run = simulate(scenario, SimConfig(seed=seed))
    initiated: set[tuple[str, int | None]] = set()
    for event in run.log:
        if event.kind is EventKind.INITIATE:
            initiated.add((event.process, event.snapshot))
        elif event.kind is EventKind.RECORD and (event.process, event.snapshot) not in initiated:
            return True
    return False


@settings(max_examples=300)
@given(scenario=scenarios(), seed=st.integers(0, 2**32 - 1))
def test_checker_catches_a_recorder_that_forgets_in_flight_messages(
    scenario: Scenario, seed: int
) -> None:
    config = SimConfig(seed=seed)
    correct = simulate(scenario, config)
    in_flight = sum(len(s.messages) for s in correct.snapshots.values())
    broken = simulate(scenario, config, recorder_factory=forgets_in_flight)
    verdict = check_run(broken, simulate(scenario, SimConfig(seed=seed, snapshots=False)))
    # caught exactly when there was something in flight to forget
    assert verdict.ok == (in_flight == 0)
    if in_flight:
        assert verdict.failed("channel-state")
        assert verdict.failed("conservation")
        assert all(v.channel is not None for v in verdict.failed("channel-state"))


@settings(max_examples=300)
@given(scenario=scenarios(), seed=st.integers(0, 2**32 - 1))
def test_checker_catches_a_recorder_that_records_the_first_marker_channel(
    scenario: Scenario, seed: int
) -> None:
    config = SimConfig(seed=seed)
    broken = simulate(scenario, config, recorder_factory=records_first_marker_channel)
    verdict = check_run(broken)
    if _recorded_by_marker(scenario, seed):
        # the channel its first marker came on is never closed
        failures = verdict.failed("termination")
        assert failures
        assert any(v.channel is not None and "never closed" in v.detail for v in failures)


def test_checker_catches_markers_sent_after_a_message() -> None:
    """A process that sends its next payment before its markers breaks the cut."""
    from cutline.sim.generate import random_scenario

    caught: dict[str, int] = {}
    runs = 0
    for seed in range(300):
        scenario = random_scenario(seed)
        config = SimConfig(seed=seed)
        baseline = simulate(scenario, SimConfig(seed=seed, snapshots=False))
        verdict = check_run(simulate(scenario, config, process_factory=LateMarkerProcess), baseline)
        runs += 1
        for prop in {v.property for v in verdict.violations}:
            caught[prop] = caught.get(prop, 0) + 1
        assert not verdict.failed("non-interference")
    # the orphan payments show up as an inconsistent cut and broken conservation
    assert caught.get("consistent-cut", 0) >= runs // 4
    assert caught.get("conservation", 0) >= runs // 10
    assert caught.get("channel-state", 0) >= runs // 10


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(max_examples=20_000)
@given(
    scenario=scenarios(max_processes=30, max_snapshots=8, max_payments=120),
    seed=st.integers(0, 2**32 - 1),
    delay=delays,
)
def test_soak_larger_graphs_and_more_snapshots(
    scenario: Scenario, seed: int, delay: tuple[int, int]
) -> None:
    """`make soak`: 20,000 runs on graphs of up to 30 processes with up to 8 snapshots."""
    run, verdict = simulate_and_check(
        scenario, SimConfig(seed=seed, min_delay=delay[0], max_delay=delay[1])
    )
    assert verdict.ok, verdict.summary()
    assert all(snap.complete for snap in run.snapshots.values())
