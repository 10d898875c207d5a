"""An independent checker of recorded snapshots against a run's full event log.

It never asks the recorder anything: it recomputes, from the raw log of sends,
deliveries and recording points, what every snapshot *should* contain, and
compares. For every snapshot it verifies:

``termination``
    every process recorded its state exactly once, every input channel was
    closed exactly once (after the process recorded), every process completed
    locally, and every channel carried exactly one marker.
``local-state``
    each recorded balance is the process's balance at the moment it recorded,
    as the log shows it.
``channel-state``
    the recorded messages on ``p -> q`` are exactly those ``p`` sent before
    ``p`` recorded and ``q`` received after ``q`` recorded, in order.
``consistent-cut``
    by vector clocks over the payments: no recorded state reflects a payment
    whose sending is not reflected in the sender's recorded state.
``conservation``
    recorded balances plus recorded in-flight tokens equal the tokens the
    system started with.
``non-interference`` (when given the same run without snapshots)
    the same final balances and the same order of payment deliveries.

A :class:`Violation` names the property, the snapshot, and the process and
channel where it failed.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field, replace

from cutline.sim.log import EventKind, RecordedSnapshot, SimRun
from cutline.sim.scenario import Channel, Scenario, Topology
from cutline.sim.simulator import SimConfig, simulate

PROPERTIES = (
    "termination",
    "local-state",
    "channel-state",
    "consistent-cut",
    "conservation",
    "non-interference",
)


def _channel_name(channel: Channel) -> str:
    return f"{channel[0]}->{channel[1]}"


@dataclass(frozen=True)
class Violation:
    """One property that does not hold, and where."""

    property: str
    snapshot: int | None
    detail: str
    process: str | None = None
    channel: Channel | None = None

    def __str__(self) -> str:
        where = [f"snapshot {self.snapshot}"] if self.snapshot is not None else []
        if self.channel is not None:
            where.append(f"channel {_channel_name(self.channel)}")
        if self.process is not None:
            where.append(f"process {self.process}")
        prefix = ", ".join(where)
        return (
            f"{self.property} violated ({prefix}): {self.detail}"
            if prefix
            else (f"{self.property} violated: {self.detail}")
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "property": self.property,
            "snapshot": self.snapshot,
            "process": self.process,
            "channel": list(self.channel) if self.channel else None,
            "detail": self.detail,
        }


@dataclass
class Verdict:
    """The checker's findings for one run."""

    snapshots: list[int]
    properties: tuple[str, ...]
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def failed(self, prop: str) -> list[Violation]:
        return [v for v in self.violations if v.property == prop]

    def summary(self) -> str:
        """One line: the verdict."""
        checked = ", ".join(self.properties)
        n = len(self.snapshots)
        noun = "snapshot" if n == 1 else "snapshots"
        if self.ok:
            return f"verified: {n} {noun} consistent ({checked})"
        bad = {v.snapshot for v in self.violations if v.snapshot is not None}
        where = [f"{len(bad)} of {n} {noun}"] if bad else []
        if any(v.snapshot is None for v in self.violations):
            where.append("the run as a whole")
        return (
            f"NOT verified: {len(self.violations)} violation(s) in {' and '.join(where)}; "
            f"first: {self.violations[0]}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "snapshots": self.snapshots,
            "properties": list(self.properties),
            "violations": [v.to_dict() for v in self.violations],
            "summary": self.summary(),
        }


@dataclass
class _Recording:
    """What the log says about one snapshot (log indices)."""

    record_at: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    closed_at: dict[Channel, list[int]] = field(default_factory=lambda: defaultdict(list))
    completed_at: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    markers_sent: dict[Channel, int] = field(default_factory=lambda: defaultdict(int))
    vector: dict[str, list[int]] = field(default_factory=dict)
    """Each process's vector clock (over payments) when it recorded."""
    balance: dict[str, int] = field(default_factory=dict)
    """Each process's balance, as the log shows it, when it recorded."""


class _ChannelHistory:
    """The payments delivered on one channel, to answer "what was in flight across a cut"."""

    def __init__(self, deliveries: list[tuple[int, int]], sent_at: dict[int, int]) -> None:
        self.delivered_at = [i for i, _ in deliveries]
        self.sent_at = [sent_at[m] for _, m in deliveries]
        self.ids = [m for _, m in deliveries]
        # Delivery order is send order on a FIFO channel; the checker does not take that on
        # trust, and falls back to a full scan when the log shows otherwise.
        self.fifo = all(a < b for a, b in zip(self.sent_at, self.sent_at[1:], strict=False))

    def between(self, sender_recorded: int, receiver_recorded: int) -> list[int]:
        """Ids of the payments sent before ``sender_recorded`` and delivered after
        ``receiver_recorded`` (log indices), in delivery order."""
        if not self.fifo:
            return [
                m
                for i, s, m in zip(self.delivered_at, self.sent_at, self.ids, strict=True)
                if i > receiver_recorded and s < sender_recorded
            ]
        lo = bisect.bisect_right(self.delivered_at, receiver_recorded)
        hi = bisect.bisect_left(self.sent_at, sender_recorded)
        return self.ids[lo:hi]


@dataclass
class _Log:
    """Everything the checker derives from one pass over the event log."""

    sent_at: dict[int, int] = field(default_factory=dict)
    amounts: dict[int, int] = field(default_factory=dict)
    delivered: dict[Channel, list[tuple[int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    """Per channel, ``(log index, payment id)`` of each delivery, in order."""
    recordings: dict[int, _Recording] = field(default_factory=lambda: defaultdict(_Recording))


def _read_log(run: SimRun) -> _Log:
    topo = run.scenario.topology
    index = {p: i for i, p in enumerate(topo.processes)}
    balance = dict(topo.balances)
    clock = {p: [0] * len(topo.processes) for p in topo.processes}
    sent_clock: dict[int, list[int]] = {}
    out = _Log()
    for i, event in enumerate(run.log):
        kind, p = event.kind, event.process
        if kind is EventKind.SEND:
            assert event.message is not None and event.amount is not None
            balance[p] -= event.amount
            clock[p][index[p]] += 1
            sent_clock[event.message] = clock[p][:]
            out.sent_at[event.message] = i
            out.amounts[event.message] = event.amount
        elif kind is EventKind.DELIVER:
            assert event.message is not None and event.amount is not None and event.channel
            balance[p] += event.amount
            mine = clock[p]
            for k, v in enumerate(sent_clock[event.message]):
                if v > mine[k]:
                    mine[k] = v
            mine[index[p]] += 1
            out.delivered[event.channel].append((i, event.message))
        elif kind is EventKind.RECORD:
            assert event.snapshot is not None
            rec = out.recordings[event.snapshot]
            rec.record_at[p].append(i)
            if p not in rec.vector:
                rec.vector[p] = clock[p][:]
                rec.balance[p] = balance[p]
        elif kind is EventKind.CHANNEL_RECORDED:
            assert event.snapshot is not None and event.channel is not None
            out.recordings[event.snapshot].closed_at[event.channel].append(i)
        elif kind is EventKind.COMPLETE:
            assert event.snapshot is not None
            out.recordings[event.snapshot].completed_at[p].append(i)
        elif kind is EventKind.MARKER_SEND:
            assert event.snapshot is not None and event.channel is not None
            out.recordings[event.snapshot].markers_sent[event.channel] += 1
    return out


def check_run(run: SimRun, baseline: SimRun | None = None) -> Verdict:
    """Check every snapshot of ``run``; with ``baseline`` (the same run without snapshots) also
    non-interference."""
    if not run.log_kept:
        raise ValueError("this run kept no event log (SimConfig.keep_log=False): nothing to check")
    topo = run.scenario.topology
    log = _read_log(run)
    in_flight = {c: _ChannelHistory(log.delivered.get(c, []), log.sent_at) for c in topo.channels}
    snapshot_ids = sorted(set(run.snapshots) | set(log.recordings))
    verdict = Verdict(
        snapshots=snapshot_ids,
        properties=PROPERTIES if baseline is not None else PROPERTIES[:-1],
    )
    for s in snapshot_ids:
        rec = log.recordings[s]
        snap = run.snapshots.get(s) or RecordedSnapshot(s, topo.processes)
        verdict.violations += _termination(s, rec, topo)
        verdict.violations += _local_state(s, rec, snap)
        verdict.violations += _channel_state(s, rec, snap, topo, in_flight, log.amounts)
        verdict.violations += _consistent_cut(s, rec, topo, log)
        verdict.violations += _conservation(s, snap, topo)
    if baseline is not None:
        verdict.violations += _non_interference(run, baseline)
    return verdict


def _termination(s: int, rec: _Recording, topo: Topology) -> list[Violation]:
    out: list[Violation] = []
    inputs: dict[str, list[Channel]] = defaultdict(list)
    for channel in topo.channels:
        inputs[channel[1]].append(channel)
    for p in topo.processes:
        times = len(rec.record_at.get(p, ()))
        if times != 1:
            what = "never recorded its state" if times == 0 else f"recorded {times} times"
            out.append(Violation("termination", s, what, process=p))
            continue
        completions = rec.completed_at.get(p, [])
        if len(completions) != 1:
            what = "never completed" if not completions else f"completed {len(completions)} times"
            out.append(Violation("termination", s, what, process=p))
            continue
        still_open = [
            c for c in inputs[p] if not rec.closed_at.get(c) or rec.closed_at[c][0] > completions[0]
        ]
        if still_open:
            out.append(
                Violation(
                    "termination",
                    s,
                    "completed while still recording "
                    + ", ".join(_channel_name(c) for c in still_open),
                    process=p,
                )
            )
    for channel in topo.channels:
        src, dst = channel
        closes = rec.closed_at.get(channel, [])
        if dst in rec.record_at and len(closes) != 1:
            what = "was never closed" if not closes else f"was closed {len(closes)} times"
            out.append(Violation("termination", s, what, process=dst, channel=channel))
        elif closes and dst in rec.record_at and closes[0] < rec.record_at[dst][0]:
            out.append(
                Violation("termination", s, "was closed before its process recorded", dst, channel)
            )
        markers = rec.markers_sent.get(channel, 0)
        if src in rec.record_at and markers != 1:
            out.append(
                Violation(
                    "termination",
                    s,
                    f"carried {markers} markers instead of exactly 1",
                    process=src,
                    channel=channel,
                )
            )
    return out


def _local_state(s: int, rec: _Recording, snap: RecordedSnapshot) -> list[Violation]:
    out: list[Violation] = []
    for p in sorted(set(rec.balance) | set(snap.states)):
        expected, recorded = rec.balance.get(p), snap.states.get(p)
        if recorded is None:
            what = "recorded its state (the log says so) but the snapshot holds no state for it"
        elif expected is None:
            what = f"has a recorded balance of {recorded} but never recorded (the log says so)"
        elif recorded != expected:
            what = f"recorded balance {recorded}, but the log shows {expected} when it recorded"
        else:
            continue
        out.append(Violation("local-state", s, what, process=p))
    return out


def _channel_state(
    s: int,
    rec: _Recording,
    snap: RecordedSnapshot,
    topo: Topology,
    in_flight: dict[Channel, _ChannelHistory],
    amounts: dict[int, int],
) -> list[Violation]:
    """Compares what the snapshot holds (and so what is printed) with what the log implies."""
    out: list[Violation] = []
    recorded: dict[Channel, list[int]] = defaultdict(list)
    for channel, payment in snap.messages:
        recorded[channel].append(payment.id)
    for channel in topo.channels:
        src, dst = channel
        if src in rec.record_at and dst in rec.record_at:
            expected = in_flight[channel].between(rec.record_at[src][0], rec.record_at[dst][0])
        else:
            expected = []  # a cut with one side missing fails termination instead
        got = recorded.pop(channel, [])
        if got != expected:
            out.append(
                Violation(
                    "channel-state",
                    s,
                    f"recorded {_describe_payments(got, amounts)}, "
                    f"expected {_describe_payments(expected, amounts)}",
                    process=dst,
                    channel=channel,
                )
            )
    out += [
        Violation("channel-state", s, "messages recorded on a channel that does not exist", None, c)
        for c in recorded
    ]
    return out


def _consistent_cut(s: int, rec: _Recording, topo: Topology, log: _Log) -> list[Violation]:
    out: list[Violation] = []
    index = {p: i for i, p in enumerate(topo.processes)}
    for q, vq in rec.vector.items():
        for p, vp in rec.vector.items():
            k = index[p]
            if p != q and vq[k] > vp[k]:
                orphan = _direct_orphan(p, q, log.delivered, log.sent_at, rec.record_at)
                how = "directly" if orphan else "through other processes"
                out.append(
                    Violation(
                        "consistent-cut",
                        s,
                        f"{q}'s recorded state reflects {vq[k] - vp[k]} event(s) of {p} that "
                        f"{p}'s recorded state does not ({how})",
                        process=q,
                        channel=orphan,
                    )
                )
    return out


def _conservation(s: int, snap: RecordedSnapshot, topo: Topology) -> list[Violation]:
    if len(snap.states) != len(topo.processes):
        return []  # a snapshot missing states fails termination or local-state instead
    in_balances = sum(snap.states.values())
    total = snap.recorded_tokens
    if total == topo.total_tokens:
        return []
    return [
        Violation(
            "conservation",
            s,
            f"recorded {total} tokens ({in_balances} in balances, {total - in_balances} in "
            f"channels) but the system holds {topo.total_tokens}",
        )
    ]


def _describe_payments(ids: list[int], amounts: dict[int, int]) -> str:
    if not ids:
        return "nothing"
    return "[" + ", ".join(f"token({amounts.get(m, '?')})#{m}" for m in ids) + "]"


def _direct_orphan(
    p: str,
    q: str,
    delivered: dict[Channel, list[tuple[int, int]]],
    sent_at: dict[int, int],
    record_at: dict[str, list[int]],
) -> Channel | None:
    """The channel ``p -> q`` if it carried a payment sent after ``p`` recorded and received before
    ``q`` recorded."""
    p_at, q_at = record_at[p][0], record_at[q][0]
    for i, m in delivered.get((p, q), ()):
        if i < q_at and sent_at[m] > p_at:
            return (p, q)
    return None


def _non_interference(run: SimRun, baseline: SimRun) -> list[Violation]:
    out: list[Violation] = []
    for p, value in run.final_balances.items():
        if baseline.final_balances.get(p) != value:
            out.append(
                Violation(
                    "non-interference",
                    None,
                    f"ends with {value} tokens with snapshots but "
                    f"{baseline.final_balances.get(p)} without",
                    process=p,
                )
            )
    with_snapshots, without = run.deliveries, baseline.deliveries
    if with_snapshots != without:
        for k, (a, b) in enumerate(zip(with_snapshots, without, strict=False)):
            if a != b:
                out.append(
                    Violation(
                        "non-interference",
                        None,
                        f"payment delivery {k} is payment {a[2]} to {a[1]} at step {a[0]} with "
                        f"snapshots but payment {b[2]} to {b[1]} at step {b[0]} without",
                        process=a[1],
                    )
                )
                break
        else:
            out.append(
                Violation(
                    "non-interference",
                    None,
                    f"{len(with_snapshots)} payment deliveries with snapshots, {len(without)} without",
                )
            )
    return out


def simulate_and_check(
    scenario: Scenario, config: SimConfig | None = None
) -> tuple[SimRun, Verdict]:
    """Run ``scenario`` with and without snapshots and check every property."""
    config = config or SimConfig()
    run = simulate(scenario, config)
    baseline = simulate(scenario, replace(config, snapshots=False))
    return run, check_run(run, baseline)
