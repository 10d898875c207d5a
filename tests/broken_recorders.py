"""Deliberately broken Chandy-Lamport variants: the checker must catch each one."""

from __future__ import annotations

from collections.abc import Sequence

from cutline.protocol import (
    Action,
    ChandyLamportRecorder,
    RecordMessage,
    SendMarker,
)
from cutline.sim.log import Payment
from cutline.sim.scenario import Channel
from cutline.sim.simulator import BankProcess, Recorder, Simulator


class ForgetsInFlight(ChandyLamportRecorder[Channel, Payment]):
    """Never records messages in flight: every channel state comes out empty."""

    def message_received(self, channel: Channel, message: Payment) -> Sequence[Action]:
        actions = super().message_received(channel, message)
        return [a for a in actions if not isinstance(a, RecordMessage)]


class RecordsFirstMarkerChannel(ChandyLamportRecorder[Channel, Payment]):
    """Keeps recording the channel its first marker came on, instead of recording it as empty."""

    def _record(self, snapshot_id: int, closed: tuple[Channel, ...]) -> list[Action]:
        return super()._record(snapshot_id, closed=())


class LateMarkerProcess(BankProcess):
    """Sends its markers only after its next payment, instead of before any further message."""

    def __init__(self, sim: Simulator, pid: str, balance: int, recorder: Recorder) -> None:
        super().__init__(sim, pid, balance, recorder)
        self.held: list[Action] = []

    def apply(self, actions: Sequence[Action]) -> None:
        self.held.extend(a for a in actions if isinstance(a, SendMarker))
        super().apply([a for a in actions if not isinstance(a, SendMarker)])

    def pay(self, dst: str, amount: int, line: int | None) -> None:
        super().pay(dst, amount, line)
        held, self.held = self.held, []
        super().apply(held)


def forgets_in_flight(name: str, inputs: Sequence[Channel], outputs: Sequence[Channel]) -> Recorder:
    return ForgetsInFlight(inputs, outputs, name=name)


def records_first_marker_channel(
    name: str, inputs: Sequence[Channel], outputs: Sequence[Channel]
) -> Recorder:
    return RecordsFirstMarkerChannel(inputs, outputs, name=name)
