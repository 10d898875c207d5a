"""The checker fails, and says where, when a snapshot or the log is tampered with."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol import Action, ChandyLamportRecorder, SnapshotComplete, SnapshotStatus
from cutline.sim.checker import (
    PROPERTIES,
    Violation,
    _ChannelHistory,
    check_run,
    simulate_and_check,
)
from cutline.sim.log import EventKind, Payment, SimRun
from cutline.sim.scenario import Channel, scenario_from_text
from cutline.sim.simulator import SimConfig, simulate

from broken_recorders import LateMarkerProcess

LINE = "3\nN1 10\nN2 10\nN3 10\nN1 N2\nN2 N1\nN2 N3\nN3 N2\n"
CONCURRENT = "snapshot N1\nsnapshot N3\nsend N2 N1 1\nsend N2 N3 2\ntick\nsend N1 N2 3\ntick\n"
ONE_STEP = SimConfig(min_delay=1, max_delay=1)


def good_run() -> tuple[SimRun, SimRun]:
    """The hand-derived run of tests/scenarios/3line-concurrent: both snapshots hold messages."""
    scenario = scenario_from_text(LINE, CONCURRENT)
    run = simulate(scenario, ONE_STEP)
    baseline = simulate(scenario, SimConfig(min_delay=1, max_delay=1, snapshots=False))
    assert check_run(run, baseline).ok
    return copy.deepcopy(run), baseline


def test_an_untouched_run_verifies_every_property() -> None:
    run, baseline = good_run()
    verdict = check_run(run, baseline)
    assert verdict.ok
    assert verdict.properties == PROPERTIES
    assert verdict.snapshots == [0, 1]
    assert verdict.summary().startswith("verified: 2 snapshots consistent")
    # without a baseline, non-interference is not claimed
    assert "non-interference" not in check_run(run).properties


def test_a_wrong_recorded_balance_is_named() -> None:
    run, _ = good_run()
    run.snapshots[1].states["N2"] += 1
    verdict = check_run(run)
    (local,) = verdict.failed("local-state")
    assert (local.snapshot, local.process) == (1, "N2")
    assert "recorded balance 8, but the log shows 7" in local.detail
    (conservation,) = verdict.failed("conservation")
    assert conservation.snapshot == 1
    assert "recorded 31 tokens" in conservation.detail


def test_a_forgotten_in_flight_message_is_named() -> None:
    run, _ = good_run()
    snap = run.snapshots[0]
    snap.messages.clear()
    verdict = check_run(run)
    (channel,) = verdict.failed("channel-state")
    assert (channel.snapshot, channel.channel, channel.process) == (0, ("N2", "N1"), "N1")
    assert "recorded nothing, expected [token(1)#0]" in channel.detail
    assert verdict.failed("conservation")
    assert "channel N2->N1" in str(channel)


def test_an_extra_message_is_named() -> None:
    run, _ = good_run()
    run.snapshots[0].messages.append((("N3", "N2"), Payment(99, 0)))
    (channel,) = check_run(run).failed("channel-state")
    assert channel.channel == ("N3", "N2")


def test_messages_out_of_order_break_channel_state_but_not_conservation() -> None:
    scenario = scenario_from_text(
        "2\nN1 10\nN2 0\nN1 N2\nN2 N1\n", "snapshot N2\nsend N1 N2 1\nsend N1 N2 2\ntick 3\n"
    )
    run = simulate(scenario, ONE_STEP)
    assert [p.amount for p in run.snapshots[0].channel_state(("N1", "N2"))] == [1, 2]
    run.snapshots[0].messages.reverse()
    verdict = check_run(run)
    assert [v.property for v in verdict.violations] == ["channel-state"]


def test_a_message_moved_to_another_channel_is_caught() -> None:
    """What is printed (the snapshot's messages) is what is checked."""
    scenario = scenario_from_text(
        "2\nN1 10\nN2 0\nN1 N2\nN2 N1\n", "snapshot N2\nsend N1 N2 1\nsend N1 N2 2\ntick 3\n"
    )
    run = simulate(scenario, ONE_STEP)
    messages = run.snapshots[0].messages
    messages[0] = (("N2", "N1"), messages[0][1])
    messages.reverse()
    channels = {v.channel for v in check_run(run).failed("channel-state")}
    assert channels == {("N1", "N2"), ("N2", "N1")}


def test_a_missing_recorded_state_is_named() -> None:
    run, _ = good_run()
    del run.snapshots[0].states["N1"]
    (local,) = check_run(run).failed("local-state")
    assert (local.snapshot, local.process) == (0, "N1")
    assert "holds no state" in local.detail


def test_completing_before_every_channel_closed_is_caught() -> None:
    """A recorder that reports local completion as soon as it records."""

    class CompletesEarly(ChandyLamportRecorder[Channel, Payment]):
        def _record(self, snapshot_id: int, closed: tuple[Channel, ...]) -> list[Action]:
            actions = super()._record(snapshot_id, closed)
            if not any(isinstance(a, SnapshotComplete) for a in actions):
                actions.append(SnapshotComplete(snapshot_id))
            return actions

        def marker_received(self, snapshot_id: int, channel: Channel) -> Sequence[Action]:
            early = self.status(snapshot_id) is SnapshotStatus.RECORDING
            actions = super().marker_received(snapshot_id, channel)
            return [a for a in actions if not (early and isinstance(a, SnapshotComplete))]

    run = simulate(
        scenario_from_text(LINE, CONCURRENT),
        ONE_STEP,
        recorder_factory=lambda name, inputs, outputs: CompletesEarly(inputs, outputs, name=name),
    )
    failures = check_run(run).failed("termination")
    assert {(v.snapshot, v.process) for v in failures} >= {(0, "N2"), (1, "N2")}
    assert all("completed while still recording" in v.detail for v in failures)


def test_a_channel_that_never_closed_is_named() -> None:
    run, _ = good_run()
    run.log = [
        e
        for e in run.log
        if not (
            e.kind is EventKind.CHANNEL_RECORDED and e.snapshot == 1 and e.channel == ("N1", "N2")
        )
    ]
    failures = check_run(run).failed("termination")
    assert [(v.snapshot, v.channel, v.process, v.detail) for v in failures] == [
        (1, None, "N2", "completed while still recording N1->N2"),
        (1, ("N1", "N2"), "N2", "was never closed"),
    ]


def test_a_second_recording_is_named() -> None:
    run, _ = good_run()
    record = next(e for e in run.log if e.kind is EventKind.RECORD and e.process == "N3")
    run.log.append(record)
    failures = check_run(run).failed("termination")
    assert any(v.process == "N3" and "recorded 2 times" in v.detail for v in failures)


def test_an_orphan_payment_breaks_the_cut_on_its_channel() -> None:
    # N1 records, then pays N2 *before* sending its marker: N2 records the payment as received,
    # while N1's recorded balance still holds it.
    scenario = scenario_from_text(
        "2\nN1 10\nN2 0\nN1 N2\nN2 N1\n", "snapshot N1\nsend N1 N2 4\ntick 3\n"
    )
    run = simulate(scenario, ONE_STEP, process_factory=LateMarkerProcess)
    verdict = check_run(run)
    (cut,) = verdict.failed("consistent-cut")
    assert (cut.snapshot, cut.process, cut.channel) == (0, "N2", ("N1", "N2"))
    assert "directly" in cut.detail
    (conservation,) = verdict.failed("conservation")
    assert "recorded 14 tokens" in conservation.detail
    assert not verdict.ok
    assert verdict.summary().startswith("NOT verified")


def test_a_different_run_without_snapshots_is_interference() -> None:
    scenario = scenario_from_text(LINE, CONCURRENT + "send N3 N2 5\nsend N2 N1 6\n")
    run = simulate(scenario, SimConfig(seed=1))
    other = simulate(scenario, SimConfig(seed=2, snapshots=False))
    failures = check_run(run, other).failed("non-interference")
    assert failures
    assert all(v.snapshot is None for v in failures)


def test_verify_runs_both_and_reports_as_data() -> None:
    scenario = scenario_from_text(LINE, CONCURRENT)
    run, verdict = simulate_and_check(scenario, SimConfig(seed=4))
    assert verdict.ok
    data = verdict.to_dict()
    assert data["ok"] is True
    assert data["violations"] == []
    assert run.snapshots_enabled


@pytest.mark.parametrize(
    ("violation", "text"),
    [
        (
            Violation("channel-state", 3, "recorded nothing", "N2", ("N1", "N2")),
            "channel-state violated (snapshot 3, channel N1->N2, process N2): recorded nothing",
        ),
        (Violation("non-interference", None, "differs"), "non-interference violated: differs"),
    ],
)
def test_violations_read_well(violation: Violation, text: str) -> None:
    assert str(violation) == text


@settings(max_examples=300)
@given(
    sent=st.lists(st.integers(0, 200), max_size=30),
    delays=st.lists(st.integers(1, 50), min_size=30, max_size=30),
    sender_recorded=st.integers(-1, 300),
    receiver_recorded=st.integers(-1, 300),
)
def test_in_flight_lookup_equals_a_full_scan(
    sent: list[int], delays: list[int], sender_recorded: int, receiver_recorded: int
) -> None:
    """The bisecting lookup agrees with the definition, FIFO or not (then it scans)."""
    delivered = sorted(
        ((s + d) * 1000 + k, k) for k, (s, d) in enumerate(zip(sent, delays, strict=False))
    )
    sent_at = {k: s * 1000 + k for k, s in enumerate(sent)}
    history = _ChannelHistory(delivered, sent_at)
    expected = [
        m
        for i, m in delivered
        if i > receiver_recorded * 1000 and sent_at[m] < sender_recorded * 1000
    ]
    assert history.between(sender_recorded * 1000, receiver_recorded * 1000) == expected
