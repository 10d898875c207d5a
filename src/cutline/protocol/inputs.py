"""The watermark of a subtask with several logical inputs (a two-input operator's left and
right), as a sans-IO state machine.

A subtask of a two-input operator (``connect``, a join) reads two **logical inputs**, the left
stream and the right, each through one or more input **channels** (one per upstream subtask
that sends to it). Event time has a rule at each of the two levels:

* **per input**, the rule of :class:`~cutline.protocol.watermarks.WatermarkValve` (Flink's
  ``StatusWatermarkValve``): an input's watermark is the least over its channels; an idle
  channel does not hold it back (one back from idleness only once it caught up); an ended
  channel holds nothing; an input every channel of which is idle is **idle**; an input every
  channel of which ended has **ended**. Each input has a valve of its own, not a copy of its
  rule.
* **over the inputs** (Flink's two-input operators, ``CombinedWatermarkStatus``): the
  subtask's watermark is the least over its **active** inputs (not idle, not ended), and it
  only increases: an idle input does not hold it back; an input back from idleness holds it
  back at once, even behind (the subtask's watermark waits for it rather than run further
  ahead of its records); an ended input holds nothing; once every input ended the subtask's
  watermark is :data:`~cutline.protocol.watermarks.MAX_WATERMARK`. When every input not ended
  is idle the subtask is idle (it says so downstream), and its watermark moves on to the least
  of those inputs' watermarks, if that is higher (so that, over one input, it is that input's
  valve's exactly: an idle valve still moves on when one of its channels ends). The statuses
  it emits alternate, ``idle=True`` first.

:class:`MultiInputValve` keeps both: given which input each channel belongs to, it feeds each
event to its input's valve and combines what the valves emit. Over one input it emits exactly
what a ``WatermarkValve`` of the same channels emits, event for event
(``tests/protocol/test_protocol_two_inputs.py`` checks it over random event sequences), so
that a runtime can give every subtask with inputs this one object. It exposes each input's own
watermark and idleness (:meth:`MultiInputValve.input_watermark`,
:meth:`MultiInputValve.input_idle`, :meth:`MultiInputValve.holding_back`: which input holds
the subtask back, for the statistics and the web UI).

======================================================  ========================================
event (method)                                          actions it may return
======================================================  ========================================
``MultiInputValve.watermark_received(c, w)``            ``EmitWatermark(W)`` if the subtask's
                                                        watermark advanced
``MultiInputValve.status_received(c, idle)``            ``EmitStatus(idle=False)`` (an input
                                                        active again), ``EmitWatermark(W)``,
                                                        ``EmitStatus(idle=True)`` (every input
                                                        not ended idle)
``MultiInputValve.end_of_input(c)``                     ``EmitStatus(idle=False)``,
                                                        ``EmitWatermark(W)`` (the last channel
                                                        of every input: ``MAX_WATERMARK``),
                                                        ``EmitStatus(idle=True)``
======================================================  ========================================

**Invariants** (tested over random interleavings of records, barriers, watermarks and idleness
on two inputs of several channels in ``tests/protocol/test_protocol_two_inputs.py``): the
watermarks emitted only increase; one emitted never exceeds the watermark of any active input
that has not ended, nor of any of its channels that is active, caught up and not ended; it is
never below the least watermark of the active inputs (an idle input holds nothing back); every
emitted status differs from the one before, and the subtask is idle exactly when every input
not ended is; once every channel of every input ended, :data:`MAX_WATERMARK` has been emitted.
Over one input, the actions are ``WatermarkValve``'s.

**Barriers** need nothing of their own here: the subtask's
:class:`~cutline.protocol.alignment.BarrierAligner` (or ``BarrierTracker``) is given the
channels of every input, which are just more channels to it, so a checkpoint aligns (or
records) over both inputs and completes only once both inputs' barriers came. A channel
blocked for alignment is not read, so its watermarks hold its input back until it is
unblocked. Like the valve, this object is not part of a checkpoint.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar, assert_never

from cutline.protocol.errors import ProtocolError, UnknownChannelError
from cutline.protocol.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    EmitStatus,
    EmitWatermark,
    WatermarkAction,
    WatermarkValve,
)

C = TypeVar("C", bound=Hashable)
"""The type of a channel id."""
Input = TypeVar("Input", bound=Hashable)
"""The type of an input id (the runtime's: which side, ``0`` or ``1``)."""

__all__ = ["MultiInputValve", "UnknownInputError"]


class UnknownInputError(ProtocolError):
    """An input asked about that is not one of the subtask's."""


@dataclass
class _Input(Generic[C]):
    """One input: its valve, and what the combination saw it emit."""

    channels: tuple[C, ...]
    valve: WatermarkValve[C]
    open: set[C]
    """Its channels that have not ended."""
    watermark: int = MIN_WATERMARK
    idle: bool = False

    @property
    def ended(self) -> bool:
        return not self.open


class MultiInputValve(Generic[C, Input]):
    """The watermark of a subtask with one or more logical inputs, each of one or more
    channels (see the module's text for the rules and the table of events).

    :param inputs: which input each input channel belongs to (channel id -> input id); the
        inputs are in the order they are first named. A channel that holds no watermark back
        (a loop's back edge) is left out.
    :raises ValueError: when ``inputs`` names no channel.
    """

    def __init__(self, inputs: Mapping[C, Input]) -> None:
        if not inputs:
            raise ValueError("a subtask's watermark needs at least one input channel")
        channels: dict[Input, list[C]] = {}
        for channel, name in inputs.items():
            channels.setdefault(name, []).append(channel)
        self._input_of: dict[C, Input] = dict(inputs)
        self._inputs: dict[Input, _Input[C]] = {
            name: _Input(tuple(chans), WatermarkValve(chans), set(chans))
            for name, chans in channels.items()
        }
        self.watermark = MIN_WATERMARK
        """The subtask's watermark: the one emitted last (``MIN_WATERMARK`` before any)."""
        self.idle = False
        """Whether the subtask said it is idle (every input not ended is idle)."""

    # ------------------------------------------------------------------ queries

    @property
    def inputs(self) -> tuple[Input, ...]:
        """The inputs, in the order they were first named."""
        return tuple(self._inputs)

    def input_of(self, channel: C) -> Input:
        """The input ``channel`` belongs to."""
        try:
            return self._input_of[channel]
        except KeyError:
            raise UnknownChannelError(
                f"{channel!r} is not an input channel here (they are {list(self._input_of)!r})"
            ) from None

    def channels(self, input: Input) -> tuple[C, ...]:
        """The channels of ``input``, in the order they were given."""
        return self._input(input).channels

    def input_watermark(self, input: Input) -> int:
        """The watermark of ``input`` alone: the least over its channels (its valve's), or
        ``MAX_WATERMARK`` once it ended."""
        return self._input(input).valve.watermark

    def input_idle(self, input: Input) -> bool:
        """Whether ``input`` is idle (every channel of it not ended is idle): it holds nothing
        back."""
        return self._input(input).valve.idle

    def input_ended(self, input: Input) -> bool:
        """Whether every channel of ``input`` ended."""
        return self._input(input).ended

    def channel_watermark(self, channel: C) -> int:
        """The last watermark ``channel`` sent (``MAX_WATERMARK`` once it ended)."""
        return self._inputs[self.input_of(channel)].valve.channel_watermark(channel)

    def holding_back(self) -> tuple[Input, ...]:
        """The inputs that hold the subtask's watermark back now: active, not ended, and at the
        least watermark among those (none when every input is idle or ended)."""
        active = {n: s.watermark for n, s in self._inputs.items() if not s.ended and not s.idle}
        if not active:
            return ()
        low = min(active.values())
        return tuple(n for n, w in active.items() if w == low)

    # ------------------------------------------------------------------- events

    def watermark_received(self, channel: C, watermark: int) -> list[WatermarkAction]:
        """``Watermark(watermark)`` arrived on ``channel`` (a lower one than it sent before is
        ignored: a channel's watermarks only increase)."""
        state = self._inputs[self.input_of(channel)]
        return self._follow(state, state.valve.watermark_received(channel, watermark))

    def status_received(self, channel: C, idle: bool) -> list[WatermarkAction]:
        """``channel`` says it is idle (``idle=True``) or active again."""
        state = self._inputs[self.input_of(channel)]
        return self._follow(state, state.valve.status_received(channel, idle))

    def end_of_input(self, channel: C) -> list[WatermarkAction]:
        """``channel`` ended: it holds nothing any more (nor does its input, once every channel
        of it ended)."""
        state = self._inputs[self.input_of(channel)]
        emitted = state.valve.end_of_input(channel)  # (refuses a channel that ended before)
        state.open.discard(channel)
        actions = self._follow(state, emitted)
        if state.ended:
            actions += self._combine()
        return actions

    # ---------------------------------------------------------------- internals

    def _input(self, input: Input) -> _Input[C]:
        try:
            return self._inputs[input]
        except KeyError:
            raise UnknownInputError(
                f"{input!r} is not an input of this subtask (they are {list(self._inputs)!r})"
            ) from None

    def _follow(self, state: _Input[C], emitted: list[WatermarkAction]) -> list[WatermarkAction]:
        """What the subtask emits as ``state``'s valve emits ``emitted``, one after the other
        (in between, the input has each one's watermark and status)."""
        actions: list[WatermarkAction] = []
        for action in emitted:
            match action:
                case EmitWatermark(watermark=watermark):
                    state.watermark = watermark
                case EmitStatus(idle=idle):
                    state.idle = idle
                case unknown:
                    assert_never(unknown)
            actions += self._combine()
        return actions

    def _combine(self) -> list[WatermarkAction]:
        """Emit what the inputs' watermarks and statuses now make of the subtask's."""
        actions: list[WatermarkAction] = []
        live = [s for s in self._inputs.values() if not s.ended]
        active = [s for s in live if not s.idle]
        if self.idle and (active or not live):
            self.idle = False
            actions.append(EmitStatus(idle=False))
        # every input ended: the end; else the least active one; every one idle: the least
        low = min((s.watermark for s in active or live), default=MAX_WATERMARK)
        if low > self.watermark:
            self.watermark = low
            actions.append(EmitWatermark(low))
        if live and not active and not self.idle:
            self.idle = True
            actions.append(EmitStatus(idle=True))
        return actions
