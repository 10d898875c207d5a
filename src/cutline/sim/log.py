"""What a simulated run leaves behind: its full event log and its recorded snapshots.

The log is the ground truth the checker (:mod:`cutline.sim.checker`) works
from; it never looks inside the recorder. Every entry has a place in one total
order (its index in the log), which is also the order the simulator carried
the events out in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from cutline.sim.scenario import Channel, Scenario


class EventKind(StrEnum):
    """The kinds of log entries."""

    SEND = "send"
    """``process`` paid ``amount`` tokens as payment ``message`` on ``channel``."""
    DELIVER = "deliver"
    """``process`` received payment ``message`` (``amount`` tokens) from ``channel``."""
    MARKER_SEND = "marker-send"
    """``process`` sent ``Marker(snapshot)`` on ``channel``."""
    MARKER_DELIVER = "marker-deliver"
    """``process`` received ``Marker(snapshot)`` from ``channel``."""
    INITIATE = "initiate"
    """The script made ``process`` initiate ``snapshot``."""
    RECORD = "record"
    """``process`` recorded its state (balance ``amount``) for ``snapshot``."""
    CHANNEL_RECORDED = "channel-recorded"
    """``process`` finished recording input ``channel`` for ``snapshot``."""
    COMPLETE = "complete"
    """``process`` completed ``snapshot`` locally."""


@dataclass(frozen=True, slots=True)
class LogEvent:
    """One entry of a run's event log."""

    time: int
    kind: EventKind
    process: str
    channel: Channel | None = None
    snapshot: int | None = None
    message: int | None = None
    amount: int | None = None


@dataclass(frozen=True, slots=True)
class Payment:
    """The one kind of application message of the token-bank model."""

    id: int
    amount: int

    def __str__(self) -> str:
        return f"token({self.amount})"


@dataclass
class RecordedSnapshot:
    """Everything the processes recorded for one snapshot id."""

    snapshot_id: int
    processes: tuple[str, ...]
    initiators: list[str] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    """Recorded balance of each process that recorded."""
    messages: list[tuple[Channel, Payment]] = field(default_factory=list)
    """Every message recorded as in flight, with its channel, in the order the destinations
    received them: the one place channel state is kept."""
    closed: list[Channel] = field(default_factory=list)
    """Input channels whose recording finished, in the order they finished."""
    completed: list[str] = field(default_factory=list)
    """Processes that completed the snapshot locally, in order of completion."""

    @property
    def complete(self) -> bool:
        """Global completion: every process completed locally."""
        return len(set(self.completed)) == len(self.processes)

    def channel_state(self, channel: Channel) -> list[Payment]:
        """The recorded state of ``channel``: its messages in the order they were received."""
        return [payment for c, payment in self.messages if c == channel]

    @property
    def channels(self) -> dict[Channel, list[Payment]]:
        """The recorded state of every channel whose recording finished."""
        state: dict[Channel, list[Payment]] = {c: [] for c in self.closed}
        for channel, payment in self.messages:
            if channel in state:
                state[channel].append(payment)
        return state

    @property
    def recorded_tokens(self) -> int:
        return sum(self.states.values()) + sum(p.amount for _, p in self.messages)


@dataclass
class SimRun:
    """The outcome of one simulated run."""

    scenario: Scenario
    seed: int
    snapshots_enabled: bool
    log: list[LogEvent]
    snapshots: dict[int, RecordedSnapshot]
    final_balances: dict[str, int]
    end_time: int
    stats: dict[str, int] = field(default_factory=dict)
    log_kept: bool = True

    @property
    def deliveries(self) -> list[tuple[int, str, int]]:
        """``(step, receiver, payment id)`` of every payment delivery, in order."""
        return [
            (e.time, e.process, e.message)  # type: ignore[misc]
            for e in self.log
            if e.kind is EventKind.DELIVER
        ]
