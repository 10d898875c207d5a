"""Barrier alignment of one subtask (aligned, exactly-once checkpoints), as a sans-IO state machine.

A subtask with several input channels receives ``Barrier(n)`` on each of them,
in line with its records. With aligned checkpoints (SEMANTICS §3) a subtask
that receives ``Barrier(n)`` on input ``i`` stops consuming ``i`` until
``Barrier(n)`` has arrived on every input; then it snapshots its state,
forwards ``Barrier(n)`` on every output and resumes all inputs. On an acyclic
dataflow no channel state is recorded.

One :class:`AlignedBarrierHandler` stands beside each subtask. The subtask
feeds it events and carries out the actions it returns, in order:

=================================  ============================================
event (method)                     actions it may return
=================================  ============================================
``barrier_received(n, c)``         ``BlockChannel(c)``; or, when ``n`` is
                                   aligned, ``SnapshotState(n)``,
                                   ``ForwardBarrier(n)``, ``UnblockChannels``;
                                   ``AbortAlignment(m)`` first when a newer
                                   checkpoint overtakes a pending one
``abort(n)``                       ``AbortAlignment(n)``, ``UnblockChannels``
``end_of_input(c)``                as ``barrier_received`` when the end of
                                   ``c`` completes an alignment
=================================  ============================================

The handler never reads a record, a clock or a socket: the subtask asks it
which channels are blocked (:meth:`AlignedBarrierHandler.is_blocked`) and
reads only from the others. Checkpoint ids increase; every channel carries
each checkpoint's barrier at most once, in increasing order. A barrier of a
checkpoint that was already aborted or subsumed here is ignored.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

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
    """Take the snapshot of the subtask's state for ``checkpoint_id`` now."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class ForwardBarrier:
    """Emit ``Barrier(checkpoint_id)`` on every output channel, before any further record."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class AbortAlignment:
    """Give up checkpoint ``checkpoint_id`` here: decline it to the coordinator."""

    checkpoint_id: int
    reason: str


AlignmentAction: TypeAlias = (
    BlockChannel[C] | UnblockChannels[C] | SnapshotState | ForwardBarrier | AbortAlignment
)

_NONE: tuple[()] = ()


class AlignedBarrierHandler(Generic[C]):
    """Aligned barrier handling at one subtask.

    :param inputs: the ids of the subtask's input channels (none for a source).
    :param name: the subtask's name, for error messages.
    """

    __slots__ = ("_blocked", "_ended", "_last_seen", "_pending", "_settled", "inputs", "name")

    def __init__(self, inputs: Iterable[C], *, name: str = "subtask") -> None:
        self.name = name
        self.inputs: tuple[C, ...] = tuple(inputs)
        if len(set(self.inputs)) != len(self.inputs):
            raise ValueError(f"{name}: an input channel is listed twice: {self.inputs!r}")
        self._last_seen: dict[C, int] = {}
        """Per channel, the id of the last barrier it delivered."""
        self._ended: set[C] = set()
        self._blocked: list[C] = []
        """Channels blocked by the pending alignment, in the order their barriers came."""
        self._pending: int | None = None
        """The checkpoint being aligned."""
        self._settled = -1
        """Every checkpoint id up to this one is done here: snapshotted, aborted or subsumed."""

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

    @property
    def live_inputs(self) -> tuple[C, ...]:
        """The inputs that have not ended."""
        return tuple(c for c in self.inputs if c not in self._ended)

    @property
    def last_settled(self) -> int:
        """The newest checkpoint id this subtask is done with (-1 before any)."""
        return self._settled

    # ------------------------------------------------------------------- events

    def barrier_received(self, checkpoint_id: int, channel: C) -> Sequence[AlignmentAction[C]]:
        """``Barrier(checkpoint_id)`` arrived on input ``channel``."""
        self._check_id(checkpoint_id, channel)
        self._check_live(channel, f"a barrier for checkpoint {checkpoint_id}")
        last = self._last_seen.get(channel)
        if last is not None and checkpoint_id <= last:
            raise BarrierOrderError(
                f"{self.name}: channel {channel!r} delivered a barrier for checkpoint "
                f"{checkpoint_id} after one for checkpoint {last}"
            )
        if channel in self._blocked:
            raise BarrierOrderError(
                f"{self.name}: channel {channel!r} is blocked for checkpoint {self._pending} "
                f"but delivered a barrier for checkpoint {checkpoint_id}"
            )
        self._last_seen[channel] = checkpoint_id
        if checkpoint_id <= self._settled:
            return _NONE  # a checkpoint already aborted or subsumed here
        if self._pending is not None and checkpoint_id < self._pending:
            # Another input skipped this checkpoint (it was aborted upstream) and already
            # delivered a newer barrier: this one can never align here.
            return _NONE
        actions: list[AlignmentAction[C]] = []
        if self._pending is not None and checkpoint_id > self._pending:
            actions += self._abort(
                f"checkpoint {checkpoint_id} overtook it on channel {channel!r} before it aligned"
            )
        if self._pending is None:
            self._pending = checkpoint_id
        if len(self._blocked) + 1 + len(self._ended) == len(self.inputs):
            actions += self._complete()  # this barrier was the last one missing
        else:
            self._blocked.append(channel)
            actions.append(BlockChannel(channel))
        return actions

    def abort(self, checkpoint_id: int) -> Sequence[AlignmentAction[C]]:
        """Checkpoint ``checkpoint_id`` was aborted (by the coordinator, or upstream).

        Ends its alignment if it is pending; its barriers that come later are ignored.
        """
        self._check_id(checkpoint_id)
        if checkpoint_id <= self._settled:
            return _NONE
        if self._pending is not None and checkpoint_id >= self._pending:
            actions = self._abort(
                "it was aborted"
                if checkpoint_id == self._pending
                else f"the newer checkpoint {checkpoint_id} was aborted"
            )
        else:
            actions = []
        self._settled = max(self._settled, checkpoint_id)
        return actions

    def end_of_input(self, channel: C) -> Sequence[AlignmentAction[C]]:
        """Input ``channel`` ended: it counts as aligned for every later checkpoint."""
        self._check_live(channel, "the end of input")
        if channel in self._blocked:
            raise BarrierOrderError(
                f"{self.name}: channel {channel!r} is blocked for checkpoint {self._pending} "
                "but delivered its end of input"
            )
        self._ended.add(channel)
        if self._pending is not None and len(self._blocked) + len(self._ended) == len(self.inputs):
            return self._complete()
        return _NONE

    # ---------------------------------------------------------------- internals

    def _complete(self) -> list[AlignmentAction[C]]:
        """Every live input delivered the pending barrier: snapshot, forward, resume."""
        assert self._pending is not None
        return self._end([SnapshotState(self._pending), ForwardBarrier(self._pending)])

    def _abort(self, reason: str) -> list[AlignmentAction[C]]:
        assert self._pending is not None
        return self._end([AbortAlignment(self._pending, reason)])

    def _end(self, actions: list[AlignmentAction[C]]) -> list[AlignmentAction[C]]:
        """Settle the pending checkpoint (after ``actions``) and resume the blocked inputs."""
        assert self._pending is not None
        held = tuple(self._blocked)
        self._settled = self._pending
        self._pending = None
        self._blocked = []
        if held:
            actions.append(UnblockChannels(held))
        return actions

    def _check_live(self, channel: C, what: str) -> None:
        if channel not in self.inputs:
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
