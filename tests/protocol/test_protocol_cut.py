"""The consistent-cut check (``protocol/cut.py``): exact messages for each kind of violation,
and, with hypothesis, random FIFO channel histories simulated record by record.

The simulation follows one channel from a sender ``p`` to a receiver ``q`` the way the runtime
does: ``p`` puts batches into a bounded output queue (counting them as sent), they cross the
wire into ``q``'s input queue, ``q`` takes them (counting them as received). ``p`` emits the
checkpoint's barrier in line (aligned) or ahead of its queued batches, which it records as
output channel state (unaligned). ``q`` snapshots at the barrier (aligned: blocking the
channel until the other channels' barriers came), at the first barrier of any channel
(unaligned: what it takes afterwards, or what the barrier overtakes in its input queue, is
recorded as input channel state), or whenever it likes without blocking (at-least-once).

The records carry ids, so the truth is known independently of the counts: the checkpoint is
consistent on a channel exactly when the records in ``q``'s state plus the recorded ones are
exactly the records sent before the barrier. ``check_cut`` sees only the counts, and must
come to the same verdict; faulty recorders (losing a recorded batch, counting late, not
blocking) make the inconsistent histories.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol.cut import ChannelCut, CutViolation, channel_cuts, check_cut

# ------------------------------------------------------------------------ exact unit tests

CHANNEL = "map>sum:0>1"


def test_counts_that_add_up_are_a_consistent_cut() -> None:
    cuts = [
        ChannelCut(CHANNEL, sent=10, received=10),
        ChannelCut("map>sum:1>1", sent=10, received=4, recorded_inputs=3, recorded_outputs=3),
        ChannelCut("map>sum:1>0", sent=0, received=0),
    ]
    assert check_cut(cuts) == []
    assert check_cut(cuts, at_least_once=True) == []


def test_a_lost_record_is_named_with_its_channel_and_every_count() -> None:
    cut = ChannelCut(CHANNEL, sent=10, received=7, recorded_inputs=1, recorded_outputs=1)
    assert check_cut([cut]) == [
        CutViolation(
            CHANNEL,
            "10 records sent before the barrier, but 7 received before the snapshot + 1 "
            "recorded by the receiver + 1 recorded by the sender = 9 (1 lost)",
        )
    ]
    assert str(check_cut([cut])[0]) == (
        f"channel {CHANNEL}: 10 records sent before the barrier, but 7 received before the "
        "snapshot + 1 recorded by the receiver + 1 recorded by the sender = 9 (1 lost)"
    )


def test_records_counted_after_the_cut_are_named_with_how_many() -> None:
    (violation,) = check_cut([ChannelCut(CHANNEL, sent=5, received=5, recorded_inputs=3)])
    assert violation.channel == CHANNEL
    assert violation.message == (
        "5 records sent before the barrier, but 5 received before the snapshot + 3 recorded "
        "by the receiver + 0 recorded by the sender = 8 (3 counted after the cut)"
    )


def test_a_missing_sender_is_named() -> None:
    (violation,) = check_cut([ChannelCut(CHANNEL, sent=None, received=3)])
    assert str(violation) == (
        f"channel {CHANNEL}: its sender reported no count (a subtask is missing)"
    )


def test_a_missing_receiver_is_named() -> None:
    (violation,) = check_cut([ChannelCut(CHANNEL, sent=3, received=None)])
    assert str(violation) == (
        f"channel {CHANNEL}: its receiver reported no count (a subtask is missing)"
    )


def test_a_missing_sender_and_receiver_are_violations_in_at_least_once_too() -> None:
    cuts = [ChannelCut("a:0>0", None, 1), ChannelCut("b:0>0", 1, None)]
    assert [v.channel for v in check_cut(cuts, at_least_once=True)] == ["a:0>0", "b:0>0"]


def test_at_least_once_accepts_a_surplus_that_exactly_once_calls_counted_after_the_cut() -> None:
    cut = ChannelCut(CHANNEL, sent=10, received=12, recorded_inputs=1)
    assert check_cut([cut], at_least_once=True) == []
    (violation,) = check_cut([cut])
    assert violation.message.endswith("(3 counted after the cut)")


def test_at_least_once_catches_a_loss_and_says_how_many() -> None:
    cut = ChannelCut(CHANNEL, sent=10, received=6, recorded_inputs=1, recorded_outputs=1)
    assert check_cut([cut], at_least_once=True) == [
        CutViolation(
            CHANNEL,
            "10 records sent before the barrier, only 6 received before the snapshot and 2 "
            "recorded: 2 lost",
        )
    ]


def test_violations_come_in_channel_order_and_only_for_the_bad_channels() -> None:
    cuts = channel_cuts(
        {
            "src-0": {"sent": {"b:0>0": 4, "a:0>0": 4, "c:0>0": 4}},
            "dst-0": {"received": {"c:0>0": 4, "b:0>0": 3, "a:0>0": 5}},
        }
    )
    assert [v.channel for v in check_cut(cuts)] == ["a:0>0", "b:0>0"]


def test_channel_cuts_gathers_each_channel_s_counts_from_both_of_its_subtasks() -> None:
    counts = {
        "src-0": {
            "sent": {"s>m:0>0": 7, "s>m:0>1": 2},
            "recorded_outputs": {"s>m:0>1": 1},
            "received": {},
            "recorded_inputs": {},
        },
        "m-0": {"received": {"s>m:0>0": 5}, "recorded_inputs": {"s>m:0>0": 2}},
        "m-1": {"received": {"s>m:0>1": 1, "loop:1>1": 0}},
    }
    assert channel_cuts(counts) == [
        ChannelCut("loop:1>1", sent=None, received=0),
        ChannelCut("s>m:0>0", sent=7, received=5, recorded_inputs=2),
        ChannelCut("s>m:0>1", sent=2, received=1, recorded_outputs=1),
    ]
    assert [v.channel for v in check_cut(channel_cuts(counts))] == ["loop:1>1"]


def test_in_flight_is_the_records_recorded_on_both_sides() -> None:
    assert ChannelCut(CHANNEL, 9, 2, recorded_inputs=3, recorded_outputs=4).in_flight == 7


# -------------------------------------------------------------- simulated FIFO channels

BARRIER = "barrier"
FAULTS = ("drop_input", "drop_output", "count_late", "count_early", "no_block", "record_late")
"""Faulty recorders: forget the last recorded input / output batch, count the first batch
sent after the barrier as before it, miss the last batch sent before it, an aligned receiver
that does not block the channel whose barrier came, an unaligned one that records a batch
taken after the barrier."""


@dataclass
class ChannelHistory:
    """One channel's checkpoint as simulated: what its two subtasks counted and recorded, and
    (the truth) which records were sent before the barrier."""

    channel: str
    sender: str
    receiver: str
    sent: int = 0
    """The sender's count at its barrier."""
    received: int = 0
    """The receiver's count at its snapshot."""
    in_state: list[int] = field(default_factory=list)
    """Ids of the records the receiver took before its snapshot."""
    recorded_inputs: list[list[int]] = field(default_factory=list)
    recorded_outputs: list[list[int]] = field(default_factory=list)
    before_barrier: int = 0
    """Records ``0 .. before_barrier - 1`` were sent before the barrier."""
    fault: str | None = None

    def accounted(self) -> Counter[int]:
        """The records the checkpoint holds: in the receiver's state, and recorded."""
        recorded = [i for batch in self.recorded_inputs + self.recorded_outputs for i in batch]
        return Counter(self.in_state + recorded)

    def consistent(self, at_least_once: bool) -> bool:
        """The truth, from the records themselves: the records the sender says it sent before
        the barrier (the first ``sent``: the channel is FIFO) against those in the receiver's
        state and recorded."""
        before = Counter(range(self.sent))
        if at_least_once:
            return not before - self.accounted()
        return self.accounted() == before


def simulate(
    channel: str,
    sender: str,
    receiver: str,
    rnd: random.Random,
    *,
    sender_unaligned: bool,
    receiver_mode: str,
    capacity: int,
    fault: str | None,
    limit: int = 40,
) -> ChannelHistory:
    """Run one channel until the checkpoint is taken at both ends (and a little beyond),
    choosing at random among the steps possible at each moment."""
    history = ChannelHistory(channel, sender, receiver, fault=fault)
    output: deque[Any] = deque()  # the sender's queue, bounded by ``capacity`` batches
    wire: deque[Any] = deque()  # on the wire and in the receiver's input queue
    next_id = sent = received = 0
    barrier_sent = barrier_taken = False
    snapshot: int | None = None
    late_count_pending = fault == "count_late"
    late_record_pending = fault == "record_late"
    last_batch: list[int] = []
    while True:
        blocked = (
            receiver_mode == "aligned"
            and barrier_taken
            and snapshot is None
            and fault != "no_block"
        )
        steps = []
        if next_id < limit and len(output) < capacity:
            steps += ["send"] * 3
        if not barrier_sent:
            steps.append("barrier")
        if output:
            steps += ["transfer"] * 2
        if wire and not blocked:
            steps += ["take"] * 2
        if receiver_mode == "unaligned" and not barrier_taken and BARRIER in wire:
            steps.append("overtake")
        if snapshot is None and (
            (receiver_mode == "unaligned" and not barrier_taken)
            or (receiver_mode != "unaligned" and barrier_taken)
        ):
            steps.append("snapshot")
        done = barrier_sent and barrier_taken and snapshot is not None
        if not steps or (done and rnd.random() < 0.2):
            break
        step = rnd.choice(steps)
        if step == "send":
            batch = list(range(next_id, next_id + rnd.randint(1, 3)))
            next_id += len(batch)
            sent += len(batch)
            output.append(batch)
            if barrier_sent and late_count_pending:  # counted as if before the barrier
                history.sent += len(batch)
                late_count_pending = False
            last_batch = batch
        elif step == "barrier":
            barrier_sent = True
            history.sent = sent
            history.before_barrier = next_id
            if fault == "count_early" and last_batch:
                history.sent -= len(last_batch)
            if sender_unaligned:  # overtakes the queued batches: they are recorded
                history.recorded_outputs = [list(b) for b in output]
                if fault == "drop_output" and history.recorded_outputs:
                    history.recorded_outputs.pop()
                output.appendleft(BARRIER)
            else:
                output.append(BARRIER)
        elif step == "transfer":
            wire.append(output.popleft())
        elif step == "take":
            item = wire.popleft()
            if item == BARRIER:
                barrier_taken = True
                if receiver_mode == "unaligned" and snapshot is None:
                    snapshot = received
                continue
            received += len(item)
            if snapshot is None:
                history.in_state += item
            elif receiver_mode == "unaligned" and not barrier_taken:
                history.recorded_inputs.append(list(item))
            elif late_record_pending and receiver_mode == "unaligned":
                history.recorded_inputs.append(list(item))
                late_record_pending = False
        elif step == "overtake":  # the barrier jumps the input queue; what it passed is recorded
            if snapshot is None:
                snapshot = received
            ahead = list(wire)[: list(wire).index(BARRIER)]
            history.recorded_inputs += [list(b) for b in ahead]
            wire.remove(BARRIER)
            barrier_taken = True
        elif step == "snapshot":
            snapshot = received
    history.received = snapshot if snapshot is not None else received
    if fault == "drop_input" and history.recorded_inputs:
        history.recorded_inputs.pop()
    return history


def runtime_counts(histories: list[ChannelHistory]) -> dict[str, dict[str, dict[str, int]]]:
    """What the subtasks put into their acknowledgements (``PendingSnapshot.channel_counts``): every
    output channel's ``sent`` and input channel's ``received`` (zeros too), and the recorded
    records per channel where there are any."""
    counts: dict[str, dict[str, dict[str, int]]] = {}

    def of(subtask: str) -> dict[str, dict[str, int]]:
        return counts.setdefault(
            subtask, {"sent": {}, "received": {}, "recorded_inputs": {}, "recorded_outputs": {}}
        )

    for h in histories:
        of(h.sender)["sent"][h.channel] = h.sent
        of(h.receiver)["received"][h.channel] = h.received
        inputs = sum(len(b) for b in h.recorded_inputs)
        outputs = sum(len(b) for b in h.recorded_outputs)
        if inputs:
            of(h.receiver)["recorded_inputs"][h.channel] = inputs
        if outputs:
            of(h.sender)["recorded_outputs"][h.channel] = outputs
    return counts


MODES = ("aligned", "unaligned", "aligned-timeout", "at_least_once")


@dataclass
class Job:
    """One checkpoint of a job in ``mode``: the history of each of its channels."""

    mode: str
    histories: list[ChannelHistory]

    @property
    def at_least_once(self) -> bool:
        return self.mode == "at_least_once"


def build_job(mode: str, subtasks: int, channels: int, seed: int, faults: bool) -> Job:
    """A job's checkpoint: ``channels`` channels between ``subtasks`` subtasks (a subtask may
    send to itself, as around a loop), each simulated with its own interleaving; ``seed``
    drives every random choice."""
    rnd = random.Random(seed)
    names = [f"op{i}-0" for i in range(subtasks)]
    histories = []
    for number in range(channels):
        sender, receiver = rnd.choice(names), rnd.choice(names)
        if mode == "aligned-timeout":  # each side may have switched to unaligned, or not
            sender_unaligned = rnd.random() < 0.5
            receiver_mode = rnd.choice(["aligned", "unaligned"])
        else:
            sender_unaligned = mode == "unaligned"
            receiver_mode = "aligned" if mode == "aligned" else mode
        fault = rnd.choice([None, None, None, *FAULTS]) if faults else None
        histories.append(
            simulate(
                f"e{number}:{sender}>{receiver}",
                sender,
                receiver,
                rnd,
                sender_unaligned=sender_unaligned,
                receiver_mode=receiver_mode,
                capacity=rnd.randint(1, 4),
                fault=fault,
            )
        )
    return Job(mode, histories)


def jobs(*, faults: bool) -> st.SearchStrategy[Job]:
    """Jobs of :func:`build_job`: hypothesis draws the shape and a seed (few draws per example
    keep thousands of examples within seconds; a failure prints the four numbers)."""
    return st.builds(
        build_job,
        st.sampled_from(MODES),
        st.integers(1, 5),
        st.integers(1, 8),
        st.integers(0, 2**32 - 1),
        st.just(faults),
    )


@settings(max_examples=1200)
@given(jobs(faults=True))
def test_check_cut_rejects_exactly_the_channels_whose_records_do_not_add_up(job: Job) -> None:
    # the model itself: honest recorders make a consistent cut (a check of the simulation)
    for h in job.histories:
        if h.fault is None:
            assert h.sent == h.before_barrier
            assert h.consistent(job.at_least_once)
    cuts = channel_cuts(runtime_counts(job.histories))
    for at_least_once in sorted({job.at_least_once, False}):
        violations = check_cut(cuts, at_least_once=at_least_once)
        wrong = sorted(h.channel for h in job.histories if not h.consistent(at_least_once))
        assert [v.channel for v in violations] == wrong
        for violation in violations:
            assert str(violation).startswith(f"channel {violation.channel}: ")


COUNT_KINDS = ("sent", "received", "recorded_inputs", "recorded_outputs")


@settings(max_examples=800)
@given(
    jobs(faults=False),
    st.integers(0, 4),
    st.sampled_from(COUNT_KINDS),
    st.integers(1, 5),
    st.booleans(),
)
def test_any_changed_count_of_a_consistent_cut_is_caught_on_its_channel(
    job: Job, pick: int, kind: str, size: int, down: bool
) -> None:
    counts = runtime_counts(job.histories)
    history = job.histories[pick % len(job.histories)]
    owner = history.sender if kind in ("sent", "recorded_outputs") else history.receiver
    before = counts[owner][kind].get(history.channel, 0)
    delta = -min(size, before) if down and before else size
    counts[owner][kind][history.channel] = before + delta
    cuts = {c.channel: c for c in channel_cuts(counts)}
    violations = check_cut(list(cuts.values()), at_least_once=job.at_least_once)
    if job.at_least_once:  # a surplus is fine there; a shortfall beyond it is not
        shortfall = delta if kind == "sent" else -delta
        surplus = sum(history.accounted().values()) - history.before_barrier
        caught = shortfall > surplus
        assert [v.channel for v in violations] == ([history.channel] if caught else [])
    else:
        assert [v.channel for v in violations] == [history.channel]
        what = "lost" if (kind == "sent") == (delta > 0) else "counted after the cut"
        assert violations[0].message.endswith(f"({abs(delta)} {what})")


@settings(max_examples=300)
@given(jobs(faults=False), st.integers(0, 3))
def test_a_missing_subtask_s_counts_are_caught_on_each_of_its_channels(job: Job, pick: int) -> None:
    counts = runtime_counts(job.histories)
    missing = sorted(counts)[pick % len(counts)]
    del counts[missing]
    violations = check_cut(channel_cuts(counts), at_least_once=job.at_least_once)
    # (a channel from the subtask to itself vanishes with it: no subtask names it any more)
    touching = sorted(
        h.channel
        for h in job.histories
        if missing in (h.sender, h.receiver) and h.sender != h.receiver
    )
    assert [v.channel for v in violations] == touching
    for violation, channel in zip(violations, touching, strict=True):
        history = next(h for h in job.histories if h.channel == channel)
        side = "sender" if history.sender == missing else "receiver"
        assert violation.message == f"its {side} reported no count (a subtask is missing)"


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_of_the_simulation_can_break_the_cut(fault: str) -> None:
    """The faulty recorders are not no-ops: each one, in its mode, makes some history of a
    few hundred inconsistent (so the property above sees real violations)."""
    modes = {
        "no_block": ("aligned", False),
        "drop_input": ("unaligned", True),
        "drop_output": ("unaligned", True),
        "record_late": ("unaligned", True),
    }
    receiver_mode, sender_unaligned = modes.get(fault, ("aligned", False))
    broken = 0
    for seed in range(300):
        history = simulate(
            "e:a>b",
            "a-0",
            "b-0",
            random.Random(seed),
            sender_unaligned=sender_unaligned,
            receiver_mode=receiver_mode,
            capacity=3,
            fault=fault,
        )
        if not history.consistent(at_least_once=False):
            broken += 1
            cut = channel_cuts(runtime_counts([history]))
            assert [v.channel for v in check_cut(cut)] == ["e:a>b"]
    assert broken > 0
