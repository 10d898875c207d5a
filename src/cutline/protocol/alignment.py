"""Barrier handling of one subtask, for every checkpointing mode, as sans-IO state machines.

A subtask receives ``Barrier(n)`` on each of its input channels, in line with
its records. What it does then is the checkpointing mode (the guarantees page's "Checkpointing
modes"):

* **aligned** (exactly-once): a subtask that receives ``Barrier(n)`` on input
  ``i`` stops consuming ``i`` until ``Barrier(n)`` has arrived on every input;
  then it snapshots its state, forwards ``Barrier(n)`` and resumes. No channel
  state is recorded (on an acyclic dataflow).
* **unaligned** (exactly-once): on the first ``Barrier(n)`` the subtask
  snapshots at once and forwards an *unaligned* barrier, which overtakes the
  records queued in its output buffers (the runtime keeps those as the output
  side of the channel state). The records that arrive on every other input
  until its ``Barrier(n)`` does are the input side: the Chandy-Lamport
  recording, done by :class:`~cutline.protocol.ChandyLamportRecorder`. An
  unaligned barrier that arrives overtakes the records queued before it in
  the subtask's input buffer; they are recorded too.
* **alignment timeout**: an aligned checkpoint whose alignment lasts too long
  (the runtime measures it and calls :meth:`BarrierAligner.alignment_timed_out`)
  switches to unaligned for that checkpoint; so does one that receives an
  unaligned barrier from an upstream subtask that switched.
* **at-least-once** (:class:`BarrierTracker`): inputs are never blocked; the
  snapshot is taken when the last barrier arrives. Replay may duplicate.
* **loops** (the ABS paper's extension): the inputs of an iteration head that
  come round a back edge are never waited for: the head snapshots once its
  other inputs aligned, then records the back edges until ``Barrier(n)`` comes
  round (the same recording); in at-least-once mode too, or records would be lost.

One handler stands beside each subtask. A subtask with several logical inputs (a two-input
operator's left and right) gives its one handler the channels of every input: they are just
more channels, so a checkpoint aligns (or records) over both inputs, and completes only once
the barriers of both came (``tests/protocol/test_protocol_two_inputs.py``). The subtask feeds it
events and carries out the actions it returns, in order:

=======================================  ==========================================
event (method)                           actions it may return
=======================================  ==========================================
``barrier_received(n, c)``               ``BlockChannel(c)``; or ``SnapshotState(n)``,
                                         ``ForwardBarrier(n)``, ``RecordMessage``,
                                         ``UnblockChannels``, ``SnapshotComplete(n)``;
                                         ``DeclineCheckpoint(m)`` first for an older
                                         checkpoint ``n`` overtook
``message_received(c, m)``               ``RecordMessage(n, c, m)`` for every
                                         checkpoint recording ``c``
``end_of_input(c)``                      as ``barrier_received`` when the end of ``c``
                                         completes an alignment or a recording
``alignment_timed_out(n)``               the unaligned snapshot of ``n``
``abort(n)``                             ``DeclineCheckpoint``, ``UnblockChannels``
=======================================  ==========================================

``SnapshotState(n)`` asks for the synchronous copy of the subtask's state;
``RecordMessage`` actions then add channel state to it; ``SnapshotComplete(n)``
says the checkpoint is whole here: write it and acknowledge. A checkpoint
without recorded channels gets both at once.

The handlers never read a record, a clock or a socket: the subtask asks which
channels are blocked (``is_blocked``, ``blocked_channels``) and reads only the
others. Checkpoint ids increase; every channel carries each checkpoint's
barrier at most once, in increasing order. A barrier of a checkpoint that was
already aborted or subsumed here is ignored.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from cutline.protocol.chandy_lamport import (
    ChandyLamportRecorder,
    ChannelRecorded,
    RecordMessage,
    RecordState,
    SnapshotComplete,
)
from cutline.protocol.errors import (
    InvalidCheckpointIdError,
    ProtocolError,
    UnknownChannelError,
)

C = TypeVar("C", bound=Hashable)
"""The type of a channel id."""


class BarrierOrderError(ProtocolError):
    """A channel delivered a barrier that is not newer than the last one it delivered, or
    delivered anything after it was blocked or had ended."""


@dataclass(frozen=True, slots=True)
class BlockChannel(Generic[C]):
    """Stop consuming ``channel``: its later records wait until the alignment ends."""

    channel: C


@dataclass(frozen=True, slots=True)
class UnblockChannels(Generic[C]):
    """Resume consuming ``channels`` (in this order), first their records held back."""

    channels: tuple[C, ...]


@dataclass(frozen=True, slots=True)
class SnapshotState:
    """Take the (synchronous) snapshot of the subtask's state for ``checkpoint_id`` now."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class ForwardBarrier:
    """Emit ``Barrier(checkpoint_id)`` on every output channel, before any further record.

    ``unaligned``: emit it ahead of the records queued in the output buffers, and keep
    those records as the output side of the checkpoint's channel state.
    """

    checkpoint_id: int
    unaligned: bool = False


@dataclass(frozen=True, slots=True)
class DeclineCheckpoint:
    """Give up checkpoint ``checkpoint_id`` here (drop what was taken for it) and decline it
    to the coordinator."""

    checkpoint_id: int
    reason: str


BarrierAction: TypeAlias = (
    BlockChannel[C]
    | UnblockChannels[C]
    | SnapshotState
    | ForwardBarrier
    | RecordMessage[C, Any]
    | SnapshotComplete
    | DeclineCheckpoint
)

_NONE: tuple[()] = ()


class _BarrierHandler(Generic[C]):
    """What both handlers share: the inputs, their ends and order checks, and the recorder
    of the channels that are recorded after a snapshot."""

    def __init__(self, inputs: Iterable[C], back_edges: Iterable[C], name: str) -> None:
        self.name = name
        self.inputs: tuple[C, ...] = tuple(inputs)
        self._input_set = frozenset(self.inputs)
        if len(self._input_set) != len(self.inputs):
            raise ValueError(f"{name}: an input channel is listed twice: {self.inputs!r}")
        self.back_edges: frozenset[C] = frozenset(back_edges)
        unknown = self.back_edges - set(self.inputs)
        if unknown:
            raise ValueError(f"{name}: back edges {sorted(map(repr, unknown))} are not inputs")
        self._last_seen: dict[C, int] = {}
        """Per channel, the id of the last barrier it delivered."""
        self._ended: set[C] = set()
        self._settled = -1
        """Every checkpoint id up to this one has been snapshotted, aborted or subsumed here."""
        self._recorder: ChandyLamportRecorder[C, Any] = ChandyLamportRecorder(
            self.inputs, (), name=name
        )

    @property
    def live_inputs(self) -> tuple[C, ...]:
        """The inputs that have not ended."""
        return tuple(c for c in self.inputs if c not in self._ended)

    @property
    def last_settled(self) -> int:
        """The newest checkpoint id snapshotted, aborted or subsumed here (-1 before any)."""
        return self._settled

    @property
    def recording(self) -> tuple[int, ...]:
        """The checkpoints snapshotted here whose channel state is still being recorded."""
        return self._recorder.in_progress()

    def recorded_channels(self, checkpoint_id: int) -> frozenset[C]:
        """The inputs still recorded for ``checkpoint_id``."""
        return self._recorder.recording_channels(checkpoint_id)

    def message_received(self, channel: C, message: Any) -> Sequence[RecordMessage[C, Any]]:
        """The subtask consumed ``message`` from ``channel``: record it for every checkpoint
        that records ``channel``."""
        return self._recorder.message_received(channel, message)  # type: ignore[return-value]

    # ---------------------------------------------------------------- internals

    def _regular_aligned(self, delivered: Iterable[C]) -> bool:
        """Whether every live input that is not a back edge is in ``delivered``."""
        have = set(delivered)
        return all(
            c in have for c in self.inputs if c not in self._ended and c not in self.back_edges
        )

    def _check_barrier(self, checkpoint_id: int, channel: C) -> None:
        self._check_id(checkpoint_id, channel)
        self._check_live(channel, f"a barrier for checkpoint {checkpoint_id}")
        last = self._last_seen.get(channel)
        if last is not None and checkpoint_id <= last:
            raise BarrierOrderError(
                f"{self.name}: channel {channel!r} delivered a barrier for checkpoint "
                f"{checkpoint_id} after one for checkpoint {last}"
            )

    def _decline_recordings(self, channel: C, before: int) -> list[BarrierAction[C]]:
        """Checkpoints older than ``before`` still recording ``channel`` can never complete:
        ``channel`` just skipped their barrier."""
        actions: list[BarrierAction[C]] = []
        for old in self._recorder.in_progress():
            if old < before and channel in self._recorder.recording_channels(old):
                self._recorder.abandon(old)
                actions.append(
                    DeclineCheckpoint(
                        old,
                        f"checkpoint {before} overtook it on channel {channel!r} before "
                        "its barrier came",
                    )
                )
        return actions

    def _snapshot(
        self, checkpoint_id: int, closed: Iterable[C], unaligned: bool
    ) -> list[BarrierAction[C]]:
        """Snapshot now; ``closed`` delivered the barrier and nothing since; the other live
        inputs are recorded until their barrier comes."""
        actions: list[BarrierAction[C]] = []
        for action in self._recorder.initiate(checkpoint_id, closed):
            if isinstance(action, RecordState):
                actions.append(SnapshotState(checkpoint_id))
                actions.append(ForwardBarrier(checkpoint_id, unaligned))
            elif isinstance(action, SnapshotComplete):
                actions.append(action)
        return actions

    def _forget(self) -> None:
        """Let the recorder forget every id below the oldest one still in play here, so that
        its memory stays constant whatever the ids skipped (aborted elsewhere, restored)."""
        self._recorder.discard_below(min((*self._recorder.in_progress(), self._settled + 1)))

    def _recorded(self, actions: Iterable[Any]) -> list[BarrierAction[C]]:
        """The recorder's actions, as the handler's (``ChannelRecorded`` says nothing more)."""
        return [a for a in actions if not isinstance(a, ChannelRecorded)]

    def _check_live(self, channel: C, what: str) -> None:
        if channel not in self._input_set:
            raise UnknownChannelError(
                f"{self.name}: {what} arrived on channel {channel!r}, which is not one of its "
                f"input channels {list(self.inputs)!r}"
            )
        if channel in self._ended:
            raise BarrierOrderError(
                f"{self.name}: {what} arrived on channel {channel!r} after its end of input"
            )

    def _check_id(self, checkpoint_id: int, channel: C | None = None) -> None:
        if type(checkpoint_id) is not int or checkpoint_id < 0:
            on = f" (on channel {channel!r})" if channel is not None else ""
            raise InvalidCheckpointIdError(
                f"{self.name}: checkpoint id {checkpoint_id!r}{on} is not a non-negative integer"
            )


class BarrierAligner(_BarrierHandler[C]):
    """Exactly-once barrier handling at one subtask: aligned, unaligned, or aligned with a
    switch to unaligned (the runtime calls :meth:`alignment_timed_out`).

    :param inputs: the ids of the subtask's input channels.
    :param unaligned: take every checkpoint unaligned (snapshot on the first barrier).
    :param back_edges: the inputs that come round a loop: never waited for, recorded.
    :param name: the subtask's name, for error messages.
    """

    def __init__(
        self,
        inputs: Iterable[C],
        *,
        unaligned: bool = False,
        back_edges: Iterable[C] = (),
        name: str = "subtask",
    ) -> None:
        super().__init__(inputs, back_edges, name)
        self.unaligned = unaligned
        self._blocked: list[C] = []
        """Channels blocked by the pending alignment, in the order their barriers came."""
        self._pending: int | None = None
        """The checkpoint being aligned (its snapshot not taken yet)."""
        self._forced = False
        """Whether the pending checkpoint must align (no switch to unaligned)."""

    # ------------------------------------------------------------------ queries

    @property
    def pending_checkpoint(self) -> int | None:
        """The checkpoint being aligned, if any."""
        return self._pending

    def is_blocked(self, channel: C) -> bool:
        """Whether the subtask must not consume ``channel`` now."""
        return channel in self._blocked

    @property
    def blocked_channels(self) -> tuple[C, ...]:
        return tuple(self._blocked)

    # ------------------------------------------------------------------- events

    def barrier_received(
        self,
        checkpoint_id: int,
        channel: C,
        *,
        unaligned: bool = False,
        overtaken: Sequence[Any] = (),
        forced_aligned: bool = False,
    ) -> Sequence[BarrierAction[C]]:
        """``Barrier(checkpoint_id)`` arrived on input ``channel``.

        ``unaligned``: the upstream subtask sent it unaligned; ``overtaken``: the records of
        ``channel`` queued before it in this subtask's input buffer, which it jumped over
        (they are consumed later; they belong to the checkpoint's channel state).
        ``forced_aligned``: align this checkpoint whatever the mode, without a timeout (the
        final checkpoint of a job, after which nothing may be left in flight).
        """
        self._check_barrier(checkpoint_id, channel)
        if (
            channel in self._blocked
            and (unaligned or overtaken)
            and self._pending is not None
            and checkpoint_id > self._pending
        ):
            # an unaligned barrier jumps the queue, even of a blocked channel: the pending
            # checkpoint was given up upstream
            actions = self._decline_pending(
                f"checkpoint {checkpoint_id} overtook it on channel {channel!r} before it aligned"
            )
            actions.extend(
                self.barrier_received(
                    checkpoint_id, channel, unaligned=unaligned, overtaken=overtaken
                )
            )
            return actions
        if channel in self._blocked:
            raise BarrierOrderError(
                f"{self.name}: channel {channel!r} is blocked for checkpoint {self._pending} "
                f"but delivered a barrier for checkpoint {checkpoint_id}"
            )
        self._last_seen[channel] = checkpoint_id
        actions = self._decline_recordings(channel, checkpoint_id)
        if channel in self._recorder.recording_channels(checkpoint_id):
            actions += self._recorded(
                self._recorder.marker_received(checkpoint_id, channel, overtaken)
            )
            return actions
        if checkpoint_id <= self._settled:
            return actions  # a checkpoint already aborted or subsumed here
        if self._pending is not None and checkpoint_id < self._pending:
            # Another input skipped this checkpoint (it was aborted upstream) and already
            # delivered a newer barrier: this one can never align here.
            return actions
        if self._pending is not None and checkpoint_id > self._pending:
            actions += self._decline_pending(
                f"checkpoint {checkpoint_id} overtook it on channel {channel!r} before it aligned"
            )
        self._pending = checkpoint_id
        self._forced = forced_aligned
        if unaligned or overtaken or (self.unaligned and not forced_aligned):
            return actions + self._take(unaligned=True, arrived=channel, overtaken=overtaken)
        if self._regular_aligned((*self._blocked, channel)):
            return actions + self._take(unaligned=False, arrived=channel)
        self._blocked.append(channel)
        actions.append(BlockChannel(channel))
        return actions

    def alignment_timed_out(self, checkpoint_id: int) -> Sequence[BarrierAction[C]]:
        """Checkpoint ``checkpoint_id`` has not aligned here in the time allowed: take it
        unaligned now. When none of its barriers has come yet, this subtask initiates it
        (as any process may in Chandy-Lamport) and records every input until they come."""
        self._check_id(checkpoint_id)
        if self._pending == checkpoint_id and not self._forced:
            return self._take(unaligned=True)
        if (
            self._pending is None
            and checkpoint_id > self._settled
            and checkpoint_id not in self._recorder.in_progress()
        ):
            self._pending = checkpoint_id
            self._forced = False
            return self._take(unaligned=True)
        return _NONE  # aligned, aborted or snapshotted meanwhile; another aligning; or forced

    def end_of_input(self, channel: C) -> Sequence[BarrierAction[C]]:
        """Input ``channel`` ended: it counts as aligned and recorded for every later
        checkpoint."""
        self._check_live(channel, "the end of input")
        if channel in self._blocked:
            raise BarrierOrderError(
                f"{self.name}: channel {channel!r} is blocked for checkpoint {self._pending} "
                "but delivered its end of input"
            )
        self._ended.add(channel)
        actions = self._recorded(self._recorder.end_of_input(channel))
        if self._pending is not None and self._regular_aligned(self._blocked):
            actions += self._take(unaligned=False)
        return actions

    def abort(self, checkpoint_id: int) -> Sequence[BarrierAction[C]]:
        """Checkpoint ``checkpoint_id`` was aborted (by the coordinator, or upstream).

        Ends its alignment or recording here (and those of older ones); its barriers that
        come later are ignored.
        """
        self._check_id(checkpoint_id)
        actions: list[BarrierAction[C]] = []
        for old in self._recorder.in_progress():
            if old <= checkpoint_id:
                self._recorder.abandon(old)
                actions.append(DeclineCheckpoint(old, "it was aborted"))
        if self._pending is not None and checkpoint_id >= self._pending:
            actions += self._decline_pending(
                "it was aborted"
                if checkpoint_id == self._pending
                else f"the newer checkpoint {checkpoint_id} was aborted"
            )
        self._settled = max(self._settled, checkpoint_id)  # its later barriers are ignored
        self._forget()
        return actions

    # ---------------------------------------------------------------- internals

    def _take(
        self, *, unaligned: bool, arrived: C | None = None, overtaken: Sequence[Any] = ()
    ) -> list[BarrierAction[C]]:
        """Snapshot the pending checkpoint now: its blocked inputs delivered the barrier (and
        ``arrived`` too, which overtook ``overtaken``); the others are recorded."""
        checkpoint_id = self._pending
        assert checkpoint_id is not None
        held = tuple(self._blocked)
        self._settled = checkpoint_id
        self._pending = None
        self._blocked = []
        actions = self._snapshot(checkpoint_id, held, unaligned)
        if arrived is not None:
            actions += self._recorded(
                self._recorder.marker_received(checkpoint_id, arrived, overtaken)
            )
        if held:
            # unblock before the local completion, so the order is the aligned one:
            # snapshot, forward, resume, complete
            done = [a for a in actions if isinstance(a, SnapshotComplete)]
            actions = [a for a in actions if not isinstance(a, SnapshotComplete)]
            actions.append(UnblockChannels(held))
            actions += done
        self._forget()
        return actions

    def _decline_pending(self, reason: str) -> list[BarrierAction[C]]:
        assert self._pending is not None
        actions: list[BarrierAction[C]] = [DeclineCheckpoint(self._pending, reason)]
        held = tuple(self._blocked)
        self._settled = self._pending
        self._pending = None
        self._blocked = []
        self._forget()
        if held:
            actions.append(UnblockChannels(held))
        return actions


class BarrierTracker(_BarrierHandler[C]):
    """At-least-once barrier handling at one subtask: nothing is ever blocked.

    The snapshot of ``n`` is taken when ``Barrier(n)`` has arrived on every live input
    that is not a back edge; records that arrive on an input after its barrier are
    consumed before the snapshot, so replay after a restore may repeat them. Back
    edges are recorded after the snapshot until the barrier comes round, as with
    exactly-once: replay must never lose a record. Several checkpoints may be pending.

    :param inputs: the ids of the subtask's input channels.
    :param back_edges: the inputs that come round a loop.
    :param name: the subtask's name, for error messages.
    """

    def __init__(
        self, inputs: Iterable[C], *, back_edges: Iterable[C] = (), name: str = "subtask"
    ) -> None:
        super().__init__(inputs, back_edges, name)
        self._pending: dict[int, set[C]] = {}
        """Checkpoints not snapshotted yet -> the inputs that delivered their barrier."""

    @property
    def pending_checkpoints(self) -> tuple[int, ...]:
        return tuple(sorted(self._pending))

    def is_blocked(self, channel: C) -> bool:
        """Never: at-least-once does not block inputs."""
        return False

    @property
    def blocked_channels(self) -> tuple[C, ...]:
        return ()

    def barrier_received(
        self,
        checkpoint_id: int,
        channel: C,
        *,
        unaligned: bool = False,
        overtaken: Sequence[Any] = (),
        forced_aligned: bool = False,
    ) -> Sequence[BarrierAction[C]]:
        """``Barrier(checkpoint_id)`` arrived on input ``channel`` (at-least-once barriers
        are never unaligned: the two flags are accepted for symmetry and must be unset)."""
        self._check_barrier(checkpoint_id, channel)
        if unaligned or overtaken:
            raise ProtocolError(
                f"{self.name}: an unaligned barrier for checkpoint {checkpoint_id} arrived "
                f"on channel {channel!r} in an at-least-once job"
            )
        self._last_seen[channel] = checkpoint_id
        actions = self._decline_recordings(channel, checkpoint_id)
        if channel in self._recorder.recording_channels(checkpoint_id):
            actions += self._recorded(self._recorder.marker_received(checkpoint_id, channel))
            return actions
        if checkpoint_id <= self._settled:
            return actions
        self._pending.setdefault(checkpoint_id, set()).add(channel)
        return actions + self._ready()

    def end_of_input(self, channel: C) -> Sequence[BarrierAction[C]]:
        """Input ``channel`` ended: it counts as delivered for every later checkpoint."""
        self._check_live(channel, "the end of input")
        self._ended.add(channel)
        return self._recorded(self._recorder.end_of_input(channel)) + self._ready()

    def abort(self, checkpoint_id: int) -> Sequence[BarrierAction[C]]:
        """Checkpoint ``checkpoint_id`` was aborted: forget it and older ones here."""
        self._check_id(checkpoint_id)
        actions: list[BarrierAction[C]] = []
        for old in self._recorder.in_progress():
            if old <= checkpoint_id:
                self._recorder.abandon(old)
                actions.append(DeclineCheckpoint(old, "it was aborted"))
        for old in sorted(self._pending):
            if old <= checkpoint_id:
                del self._pending[old]
                actions.append(DeclineCheckpoint(old, "it was aborted"))
        self._settled = max(self._settled, checkpoint_id)
        self._forget()
        return actions

    def _ready(self) -> list[BarrierAction[C]]:
        """Snapshot the pending checkpoints whose barriers all came, oldest first; older
        pending ones that are not ready can never be (their barriers were skipped)."""
        actions: list[BarrierAction[C]] = []
        ready = sorted(n for n, have in self._pending.items() if self._regular_aligned(have))
        if not ready:
            return actions
        for old in sorted(self._pending):
            if old < ready[-1] and old not in ready:
                del self._pending[old]
                actions.append(
                    DeclineCheckpoint(old, f"checkpoint {ready[-1]} completed its barriers first")
                )
        for n in ready:
            closed = self._pending.pop(n) - self._ended
            self._settled = n
            actions += self._snapshot(n, closed, unaligned=False)
        self._forget()
        return actions
