"""Is a checkpoint a consistent cut? The per-channel record counts say.

When a subtask snapshots, it notes per channel how many records it had sent (on each
output channel, before the checkpoint's barrier) and received (on each input channel,
before its snapshot), and how many records its channel state holds. A checkpoint is a
consistent cut exactly when, for every channel ``c`` from ``p`` to ``q``::

    sent by p on c before the barrier
        = received by q on c before q's snapshot
        + recorded by q as c's input channel state (after its snapshot, before c's barrier)
        + recorded by p as c's output channel state (what an unaligned barrier overtook)

Nothing sent before the cut is lost (it is in ``q``'s state or in the channel state), and
nothing sent after it is in ``q``'s state (it would make the right side larger). Because
channels are FIFO, equal counts mean equal records.

An at-least-once checkpoint is not a consistent cut by design: a subtask goes on taking
records from the inputs whose barrier came first. Of those only *nothing lost* can hold:
``received + recorded >= sent`` (the surplus is replayed after a restore: duplicates; a
loop's back edge is recorded in that mode too, so that nothing going round is lost).

Pure functions over the counts; ``runtime/checkpoint/verify.py`` reads them (and the recorded
records themselves) from a checkpoint's files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ChannelCut", "CutViolation", "channel_cuts", "check_cut"]


@dataclass(frozen=True)
class ChannelCut:
    """One channel's counts at a checkpoint."""

    channel: str
    sent: int | None
    """``None``: the sender did not report the channel."""
    received: int | None
    """``None``: the receiver did not report the channel."""
    recorded_inputs: int = 0
    recorded_outputs: int = 0

    @property
    def in_flight(self) -> int:
        return self.recorded_inputs + self.recorded_outputs


@dataclass(frozen=True)
class CutViolation:
    """A channel on which the counts do not add up."""

    channel: str
    message: str

    def __str__(self) -> str:
        return f"channel {self.channel}: {self.message}"


def channel_cuts(
    counts: Mapping[str, Mapping[str, Mapping[str, int]]],
) -> list[ChannelCut]:
    """Per channel, the counts of every subtask's ``counts`` (subtask -> ``sent``,
    ``received``, ``recorded_inputs``, ``recorded_outputs`` -> channel -> records)."""
    sent: dict[str, int] = {}
    received: dict[str, int] = {}
    inputs: dict[str, int] = {}
    outputs: dict[str, int] = {}
    for subtask_counts in counts.values():
        for target, kind in (
            (sent, "sent"),
            (received, "received"),
            (inputs, "recorded_inputs"),
            (outputs, "recorded_outputs"),
        ):
            for channel, n in subtask_counts.get(kind, {}).items():
                target[channel] = target.get(channel, 0) + n
    channels = sorted(set(sent) | set(received) | set(inputs) | set(outputs))
    return [
        ChannelCut(
            channel,
            sent.get(channel),
            received.get(channel),
            inputs.get(channel, 0),
            outputs.get(channel, 0),
        )
        for channel in channels
    ]


def check_cut(cuts: list[ChannelCut], *, at_least_once: bool = False) -> list[CutViolation]:
    """The channels whose counts show the checkpoint is not a consistent cut (for
    ``at_least_once``: that it lost records), in channel order."""
    violations = []
    for cut in cuts:
        if cut.sent is None:
            violations.append(
                CutViolation(cut.channel, "its sender reported no count (a subtask is missing)")
            )
            continue
        if cut.received is None:
            violations.append(
                CutViolation(cut.channel, "its receiver reported no count (a subtask is missing)")
            )
            continue
        accounted = cut.received + cut.in_flight
        if at_least_once:
            if accounted < cut.sent:
                violations.append(
                    CutViolation(
                        cut.channel,
                        f"{cut.sent} records sent before the barrier, only {cut.received} "
                        f"received before the snapshot and {cut.in_flight} recorded: "
                        f"{cut.sent - accounted} lost",
                    )
                )
            continue
        if accounted != cut.sent:
            detail = (
                f"{cut.received} received before the snapshot + {cut.recorded_inputs} recorded "
                f"by the receiver + {cut.recorded_outputs} recorded by the sender = {accounted}"
            )
            what = "lost" if accounted < cut.sent else "counted after the cut"
            violations.append(
                CutViolation(
                    cut.channel,
                    f"{cut.sent} records sent before the barrier, but {detail} "
                    f"({abs(cut.sent - accounted)} {what})",
                )
            )
    return violations
