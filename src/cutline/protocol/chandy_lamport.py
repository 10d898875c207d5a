"""The Chandy-Lamport snapshot recorder of one process, as a sans-IO state machine.

One :class:`ChandyLamportRecorder` stands beside each process. The process
feeds it three kinds of events and carries out the actions it returns, in the
order returned:

======================================  =========================================
event (method)                          actions it may return
======================================  =========================================
``initiate(s)``                         ``RecordState``, ``SendMarker`` (one per
                                        output), ``SnapshotComplete``
``marker_received(s, c)``               as above, plus ``ChannelRecorded(s, c)``
``message_received(c, m)``              ``RecordMessage(s, c, m)`` for every
                                        snapshot still recording ``c``
``end_of_input(c)``                     ``ChannelRecorded``, ``SnapshotComplete``
                                        for the snapshots recording ``c``
``abandon(s)``                          none: snapshot ``s`` is given up here
======================================  =========================================

The recorder never touches the process's state, a clock, a socket or a random
number: it only says *when* to record the state (``RecordState``), which
markers to send, which received messages belong to which snapshot's channel
state, and when a channel's recording or the whole local snapshot is finished.
The driver must carry out ``SendMarker`` actions before the process sends any
further message on that channel: that is what makes the cut consistent.

Several snapshots run at once, each under its own id; a message that arrives
on a channel that several snapshots are recording belongs to the channel
state of each of them. Several processes may initiate the same id: a process
that has already recorded for an id ignores a later ``initiate`` of it.

Two extensions serve barrier snapshots of dataflows (the guarantees page's "Checkpointing modes"):

* a marker may **overtake** messages (an unaligned barrier jumps ahead of the
  records queued before it): ``marker_received(s, c, overtaken=...)`` names the
  messages it jumped over. They were sent before the marker, so they belong to
  ``c``'s state for ``s``; the process receives them later, as usual, and they
  are then recorded for every *other* snapshot still recording ``c``.
* a process may **delay** its recording after markers arrived, provided it
  received nothing on their channels meanwhile (barrier alignment blocks them):
  ``initiate(s, closed=...)`` records now and counts those channels as recorded
  empty. And a channel may **end** (``end_of_input``): it is recorded as it
  stands for every snapshot, and later snapshots do not wait for it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeAlias, TypeVar

from cutline.protocol.errors import (
    DuplicateMarkerError,
    InvalidSnapshotIdError,
    ProtocolError,
    UnknownChannelError,
)

C = TypeVar("C", bound=Hashable)
"""The type of a channel id (any hashable: a name, a ``(src, dst)`` pair, ...)."""
M = TypeVar("M")
"""The type of an application message."""


@dataclass(frozen=True, slots=True)
class RecordState:
    """Record the process's local state now, under ``snapshot_id``."""

    snapshot_id: int


@dataclass(frozen=True, slots=True)
class SendMarker(Generic[C]):
    """Send ``Marker(snapshot_id)`` on output ``channel`` before any further message on it."""

    snapshot_id: int
    channel: C


@dataclass(frozen=True, slots=True)
class RecordMessage(Generic[C, M]):
    """Append ``message`` (just received on ``channel``) to the channel's recorded state."""

    snapshot_id: int
    channel: C
    message: M


@dataclass(frozen=True, slots=True)
class ChannelRecorded(Generic[C]):
    """The recorded state of input ``channel`` for ``snapshot_id`` is final."""

    snapshot_id: int
    channel: C


@dataclass(frozen=True, slots=True)
class SnapshotComplete:
    """Local completion: the state and every input channel are recorded for ``snapshot_id``."""

    snapshot_id: int


Action: TypeAlias = (
    RecordState | SendMarker[C] | RecordMessage[C, M] | ChannelRecorded[C] | SnapshotComplete
)


class SnapshotStatus(Enum):
    """Where one process stands in one snapshot."""

    NOT_STARTED = "not started"
    RECORDING = "recording"
    COMPLETE = "complete"


class _CompletedIds:
    """The set of completed snapshot ids.

    Every id below ``_floor`` is complete; ``_above`` holds the completed ids
    above it. When ids 0, 1, 2, ... complete in order, ``_above`` stays empty;
    with gaps in the ids it grows by one entry per completed id above the
    first gap, until :meth:`raise_floor` is called.
    """

    __slots__ = ("_above", "_floor")

    def __init__(self) -> None:
        self._floor = 0
        self._above: set[int] = set()

    def add(self, snapshot_id: int) -> None:
        self._above.add(snapshot_id)
        self._advance()

    def raise_floor(self, floor: int) -> None:
        """Count every id below ``floor`` as complete, and forget them one by one."""
        if floor > self._floor:
            self._above = {i for i in self._above if i >= floor}
            self._floor = floor
            self._advance()

    def _advance(self) -> None:
        while self._floor in self._above:
            self._above.discard(self._floor)
            self._floor += 1

    def __contains__(self, snapshot_id: int) -> bool:
        return snapshot_id < self._floor or snapshot_id in self._above

    def __len__(self) -> int:
        return self._floor + len(self._above)


_NO_ACTIONS: tuple[()] = ()


class ChandyLamportRecorder(Generic[C, M]):
    """The marker algorithm at one process: which channels to record, for which snapshots.

    :param inputs: the ids of the channels this process receives on.
    :param outputs: the ids of the channels this process sends on.
    :param name: the process's name, used in error messages only.
    """

    __slots__ = (
        "_completed",
        "_ended",
        "_input_set",
        "_open",
        "_recording",
        "inputs",
        "name",
        "outputs",
    )

    def __init__(self, inputs: Iterable[C], outputs: Iterable[C], *, name: str = "process") -> None:
        self.name = name
        self.inputs: tuple[C, ...] = tuple(inputs)
        self.outputs: tuple[C, ...] = tuple(outputs)
        self._input_set = frozenset(self.inputs)
        if len(self._input_set) != len(self.inputs):
            raise ValueError(f"{name}: an input channel is listed twice: {self.inputs!r}")
        if len(set(self.outputs)) != len(self.outputs):
            raise ValueError(f"{name}: an output channel is listed twice: {self.outputs!r}")
        # snapshot id -> input channels still being recorded (snapshots in progress only)
        self._open: dict[int, set[C]] = {}
        # input channel -> ids of the snapshots recording it, oldest first
        self._recording: dict[C, list[int]] = {}
        self._completed = _CompletedIds()
        self._ended: set[C] = set()

    # ------------------------------------------------------------------ queries

    def status(self, snapshot_id: int) -> SnapshotStatus:
        """Where this process stands in snapshot ``snapshot_id``."""
        self._check_id(snapshot_id)
        if snapshot_id in self._open:
            return SnapshotStatus.RECORDING
        if snapshot_id in self._completed:
            return SnapshotStatus.COMPLETE
        return SnapshotStatus.NOT_STARTED

    def in_progress(self) -> tuple[int, ...]:
        """Ids of the snapshots this process has recorded its state for but not completed."""
        return tuple(self._open)

    def is_recording(self, snapshot_id: int, channel: C) -> bool:
        """Whether messages arriving on ``channel`` now belong to ``snapshot_id``'s channel state."""
        self._check_id(snapshot_id)
        open_channels = self._open.get(snapshot_id)
        return open_channels is not None and channel in open_channels

    def recording_channels(self, snapshot_id: int) -> frozenset[C]:
        """The input channels still being recorded for ``snapshot_id`` (empty when not recording)."""
        self._check_id(snapshot_id)
        return frozenset(self._open.get(snapshot_id, ()))

    def discard_below(self, snapshot_id: int) -> None:
        """Promise that no event will come for any id below ``snapshot_id``.

        Those ids then count as complete and take no memory: a driver whose ids
        increase with gaps (aborted or skipped snapshots) calls this now and
        then to keep the recorder's memory constant. Refused while a snapshot
        below ``snapshot_id`` is still in progress here.
        """
        self._check_id(snapshot_id)
        pending = sorted(s for s in self._open if s < snapshot_id)
        if pending:
            raise ProtocolError(
                f"{self.name}: cannot discard ids below {snapshot_id}: snapshot(s) "
                f"{pending} still in progress"
            )
        self._completed.raise_floor(snapshot_id)

    # ------------------------------------------------------------------- events

    def initiate(self, snapshot_id: int, closed: Iterable[C] = ()) -> Sequence[Action[C, M]]:
        """This process starts snapshot ``snapshot_id``.

        ``closed`` names input channels whose marker for ``snapshot_id`` already
        arrived and on which nothing was received since (a subtask that aligned
        barriers): their recorded state is empty.

        Returns no actions when the process has already recorded its state for
        that id (another initiator's marker got here first).
        """
        self._check_id(snapshot_id)
        closed = tuple(closed)
        for channel in closed:
            self._check_input(channel, f"a marker for snapshot {snapshot_id}")
            if channel in self._ended:
                raise self._ended_error(channel, f"a marker for snapshot {snapshot_id}")
        if snapshot_id in self._open or snapshot_id in self._completed:
            return _NO_ACTIONS
        return self._record(snapshot_id, closed=closed)

    def marker_received(
        self, snapshot_id: int, channel: C, overtaken: Sequence[M] = ()
    ) -> Sequence[Action[C, M]]:
        """``Marker(snapshot_id)`` arrived on input ``channel``.

        ``overtaken`` lists, in order, the messages sent on ``channel`` before the
        marker that the marker overtook (they will be received after it): they
        are recorded as part of ``channel``'s state for this snapshot only.
        """
        self._check_id(snapshot_id)
        self._check_input(channel, f"a marker for snapshot {snapshot_id}")
        open_channels = self._open.get(snapshot_id)
        actions: list[Action[C, M]]
        if open_channels is None:
            if snapshot_id in self._completed:
                raise DuplicateMarkerError(
                    f"{self.name}: a second marker for snapshot {snapshot_id} arrived on "
                    f"channel {channel!r}, after the snapshot completed or was abandoned here"
                )
            if channel in self._ended:
                raise self._ended_error(channel, f"a marker for snapshot {snapshot_id}")
            if not overtaken:
                return self._record(snapshot_id, closed=(channel,))
            actions = self._record(snapshot_id, closed=())
            open_channels = self._open[snapshot_id]
        elif channel not in open_channels:
            raise DuplicateMarkerError(
                f"{self.name}: a second marker for snapshot {snapshot_id} arrived on "
                f"channel {channel!r}"
            )
        else:
            actions = []
        actions.extend(RecordMessage(snapshot_id, channel, m) for m in overtaken)
        open_channels.discard(channel)
        self._stop_recording(channel, snapshot_id)
        actions.append(ChannelRecorded(snapshot_id, channel))
        if not open_channels:
            actions.append(self._complete(snapshot_id))
        return actions

    def message_received(self, channel: C, message: M) -> Sequence[Action[C, M]]:
        """An application message arrived on input ``channel``."""
        snapshots = self._recording.get(channel)
        if snapshots is None:
            self._check_input(channel, "a message")
            if channel in self._ended:
                raise self._ended_error(channel, "a message")
            return _NO_ACTIONS
        return [RecordMessage(s, channel, message) for s in snapshots]

    def end_of_input(self, channel: C) -> Sequence[Action[C, M]]:
        """Input ``channel`` ended: nothing more will arrive on it, not even markers.

        Every snapshot recording it has its state as it stands; later snapshots
        do not record it.
        """
        self._check_input(channel, "the end of input")
        if channel in self._ended:
            raise self._ended_error(channel, "the end of input")
        self._ended.add(channel)
        actions: list[Action[C, M]] = []
        for snapshot_id in self._recording.pop(channel, ()):
            open_channels = self._open[snapshot_id]
            open_channels.discard(channel)
            actions.append(ChannelRecorded(snapshot_id, channel))
            if not open_channels:
                actions.append(self._complete(snapshot_id))
        return actions

    def abandon(self, snapshot_id: int) -> None:
        """Give up snapshot ``snapshot_id`` here (it was aborted): stop recording for it.

        It then counts as done: a later ``initiate`` of it does nothing, a later
        marker of it is an error (the driver filters them).
        """
        self._check_id(snapshot_id)
        open_channels = self._open.pop(snapshot_id, None)
        for channel in open_channels or ():
            self._stop_recording(channel, snapshot_id)
        self._completed.add(snapshot_id)

    # ---------------------------------------------------------------- internals

    def _record(self, snapshot_id: int, closed: tuple[C, ...]) -> list[Action[C, M]]:
        """Record the state; ``closed`` holds the channel the first marker came on, if any."""
        actions: list[Action[C, M]] = [RecordState(snapshot_id)]
        actions.extend(SendMarker(snapshot_id, out) for out in self.outputs)
        open_channels = set(self.inputs) - self._ended
        for channel in closed:
            open_channels.discard(channel)
            actions.append(ChannelRecorded(snapshot_id, channel))
        if not open_channels:
            self._completed.add(snapshot_id)
            actions.append(SnapshotComplete(snapshot_id))
            return actions
        self._open[snapshot_id] = open_channels
        for channel in open_channels:
            self._recording.setdefault(channel, []).append(snapshot_id)
        return actions

    def _stop_recording(self, channel: C, snapshot_id: int) -> None:
        snapshots = self._recording[channel]
        snapshots.remove(snapshot_id)
        if not snapshots:
            del self._recording[channel]

    def _complete(self, snapshot_id: int) -> SnapshotComplete:
        del self._open[snapshot_id]
        self._completed.add(snapshot_id)
        return SnapshotComplete(snapshot_id)

    def _check_input(self, channel: C, what: str) -> None:
        if channel not in self._input_set:
            raise UnknownChannelError(
                f"{self.name}: {what} arrived on channel {channel!r}, which is not one of its "
                f"input channels {list(self.inputs)!r}"
            )

    def _ended_error(self, channel: C, what: str) -> ProtocolError:
        return ProtocolError(f"{self.name}: {what} arrived on channel {channel!r} after its end")

    def _check_id(self, snapshot_id: int) -> None:
        if type(snapshot_id) is not int or snapshot_id < 0:
            raise InvalidSnapshotIdError(
                f"{self.name}: snapshot id {snapshot_id!r} is not a non-negative integer"
            )
