"""Event time's progress: watermarks, generated per source split and combined per subtask, as
sans-IO state machines.

A **watermark** ``W`` is a promise about event time: no record with a timestamp ``<= W`` is
to come any more (timestamps and watermarks are integers, epoch milliseconds as in Flink).
Watermarks travel the dataflow in band, like barriers: a subtask sends ``Watermark(W)`` on
every output after the records it sent before, and each operator fires what ``W`` completes
(an event-time window whose end it passed, a timer due). A record whose timestamp is at or
below the watermark of the operator that receives it is **late**.

Two objects make the watermarks; the runtime feeds them events and carries out the actions
they return, in order:

* :class:`SplitWatermarks`, beside a source subtask: one generator per **split** (a file, a
  partition) with *bounded out-of-orderness* (Flink's ``WatermarkStrategy
  .forBoundedOutOfOrderness``): a split that has shown timestamps up to ``T`` promises
  ``T - bound - 1``. The subtask's watermark is the minimum over its splits, so a slow split
  holds it back and one file's records never become late because another file was read
  further. A split not started yet holds the watermark at the lowest timestamp it is known
  to hold, minus one (``split_added(split, lowest)``), or, when that is not known, at
  :data:`MIN_WATERMARK`; a finished split holds nothing. A split that showed no record for
  ``idle_timeout`` (processing time, given by the host: :meth:`SplitWatermarks.tick`) is
  **idle** and stops holding the watermark back until it has records again; when every
  split is idle the subtask says so downstream (``EmitStatus(idle=True)``). A split that
  never showed a record holds the watermark until its records start (a file waiting its
  turn), unless its reader says it read all there is (``caught_up(split, now_s)``: a Kafka
  partition at its end): its idle time counts from then, so that an empty partition does
  not hold the watermark back for ever.
* :class:`WatermarkValve`, beside a subtask with inputs (Flink's ``StatusWatermarkValve``):
  its watermark is the minimum over its input channels' watermarks. An idle channel does not
  hold it back; a channel that becomes active again holds it back only once its own
  watermark caught up with the valve's (until then its records may be late: they came after
  the watermark moved on without them). An ended channel holds nothing; once every channel
  ended the valve emits :data:`MAX_WATERMARK`, which fires everything.
* :class:`~cutline.protocol.inputs.MultiInputValve` (:mod:`cutline.protocol.inputs`), beside
  a subtask whose channels belong to several logical inputs (a two-input operator's left and
  right): a ``WatermarkValve`` per input, and the subtask's watermark the least over its
  active inputs (an idle input holds nothing back, an ended one nothing; every input ended:
  :data:`MAX_WATERMARK`). Over one input it is its ``WatermarkValve``, action for action.

A fourth keeps what they made, once per subtask: its :class:`EventClock`, the watermark each
operator of the subtask's chain was last told and the one its outputs last sent on (a value
the runtime moves forward; it emits nothing).

=====================================================  =========================================
event (method)                                         actions it may return
=====================================================  =========================================
``SplitWatermarks.split_added(split, lowest)``         none (a split held back from the start)
``SplitWatermarks.caught_up(split, now_s)``            none (its idle time counts from now)
``SplitWatermarks.records(split, highest, now_s)``     ``EmitStatus(idle=False)`` if the subtask
                                                       was idle, then ``EmitWatermark(W)`` if
                                                       its watermark advanced
``SplitWatermarks.promised(split, w, now_s)``          as ``records``, with a generator's
                                                       promise ``w`` for the split
``SplitWatermarks.split_finished(split)``              ``EmitWatermark(W)`` if it advanced; the
                                                       last: as ``exhausted()``, or (unbounded)
                                                       as ``quiet()``
``SplitWatermarks.quiet()``                            ``EmitStatus(idle=True)``
``SplitWatermarks.tick(now_s)``                        ``EmitWatermark(W)`` (a split went idle),
                                                       ``EmitStatus(idle=True)`` (all did)
``SplitWatermarks.exhausted()``                        ``EmitWatermark(MAX_WATERMARK)``
``WatermarkValve.watermark_received(c, w)``            ``EmitWatermark(W)`` if it advanced
``WatermarkValve.status_received(c, idle)``            ``EmitStatus``, ``EmitWatermark``
``WatermarkValve.end_of_input(c)``                     ``EmitStatus(idle=False)``,
                                                       ``EmitWatermark(W)``
``MultiInputValve.watermark_received(c, w)``           as ``WatermarkValve``'s, over the inputs
                                                       (:mod:`cutline.protocol.inputs`)
``MultiInputValve.status_received(c, idle)``           as ``WatermarkValve``'s, over the inputs
``MultiInputValve.end_of_input(c)``                    as ``WatermarkValve``'s, over the inputs
=====================================================  =========================================

**Invariants** (tested over random interleavings in ``tests/protocol/test_protocol_watermarks.py``,
and for several inputs in ``tests/protocol/test_protocol_two_inputs.py``):
the watermarks emitted only increase; a valve's emitted watermark never exceeds the
watermark of any channel that is active, caught up and not ended (a subtask's over several
inputs: nor that of any active input not ended, nor of such a channel of one); an idle
channel (or input) never holds it back; every emitted status differs from the one before;
once every split finished (or every channel ended), :data:`MAX_WATERMARK` has been emitted.

**Checkpoints.** None of these objects is part of a checkpoint (as in Flink): after a restore the
sources read their splits again from their offsets and make the watermarks anew, starting
from :data:`MIN_WATERMARK`, which is never wrong (only late). The watermarks inside channel
state an unaligned checkpoint recorded are recorded with the records, in order, and replayed
in that order. Barrier alignment needs nothing of its own here: a channel blocked for
alignment is not read, so its watermarks hold the valve back until it is unblocked.

The objects never read a clock: processing time comes in as ``now_s`` (seconds, any origin; the operators' processing-time callbacks take ``now_ms``, epoch milliseconds).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

from cutline.protocol.errors import ProtocolError, UnknownChannelError

C = TypeVar("C", bound=Hashable)
S = TypeVar("S", bound=Hashable)

MIN_WATERMARK = -(2**63)
"""The watermark before any: nothing is promised."""
MAX_WATERMARK = 2**63 - 1
"""The watermark at the end of the input: every timestamp has passed."""


@dataclass(frozen=True, slots=True)
class EmitWatermark:
    """Send ``Watermark(watermark)`` downstream (after the records sent before it), and fire
    what it completes here."""

    watermark: int


@dataclass(frozen=True, slots=True)
class EmitStatus:
    """Tell downstream that this subtask is idle (holds no watermark back) or active again."""

    idle: bool


WatermarkAction: TypeAlias = EmitWatermark | EmitStatus


class WatermarkError(ProtocolError):
    """An event the watermark rules do not allow (a split or channel used after its end)."""


def bounded_out_of_orderness(highest: int, bound: int) -> int:
    """The watermark of a split that showed timestamps up to ``highest`` and whose records come
    at most ``bound`` milliseconds out of order (Flink: ``highest - bound - 1``)."""
    return max(MIN_WATERMARK, highest - bound - 1)


def lowest_after(lowest: int, highest: int, bound: int) -> int:
    """The lowest timestamp a split can hold, from its first records (their ``lowest`` and
    ``highest``) when its records come at most ``bound`` milliseconds out of order: none of
    those is below ``lowest``, and none after them below ``highest - bound``. A split not
    started yet may hold the watermark there (:meth:`SplitWatermarks.split_added`) when no
    statistics say its lowest timestamp."""
    return min(lowest, highest - bound)


@dataclass
class _Split:
    held: int
    """What this split promises: no more record at or below it."""
    last_records: float | None = None
    """When it last had records (processing time), once started; or, never started, when
    its reader first said it read all there is."""
    idle: bool = False


class SplitWatermarks(Generic[S]):
    """The watermark of one source subtask, from the splits it reads (see the module's table).

    :param bound: the records' out-of-orderness, in milliseconds (``max_out_of_orderness``).
    :param idle_timeout: seconds without a record after which a split is idle (``None``: never).
    :param bounded: whether the subtask's splits are all it will read. ``False`` (splits found
        while the job runs: a watched directory, new partitions): once its last split
        finished, or while it has none, the subtask is idle instead of at its end
        (:meth:`quiet`), and a split added later brings it back with its records.
    """

    def __init__(
        self, bound: int, idle_timeout: float | None = None, *, bounded: bool = True
    ) -> None:
        if bound < 0:
            raise ValueError(f"the out-of-orderness bound cannot be negative, not {bound}")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"an idle timeout must be positive, not {idle_timeout}")
        self.bound = bound
        self.idle_timeout = idle_timeout
        self.bounded = bounded
        self._splits: dict[S, _Split] = {}
        self._finished: set[S] = set()
        self.watermark = MIN_WATERMARK
        """The watermark emitted last (``MIN_WATERMARK`` before any)."""
        self.idle = False
        """Whether the subtask said it is idle (every split it has idle)."""

    @property
    def splits(self) -> list[S]:
        """The splits that hold the watermark (added, not finished)."""
        return list(self._splits)

    def split_added(self, split: S, lowest: int | None = None) -> list[WatermarkAction]:
        """A split this subtask will read; ``lowest``: the lowest timestamp it holds, if known
        (a Parquet file's statistics, or ``lowest_after()`` its first records). Until it
        shows records it holds the watermark there."""
        if split in self._splits or split in self._finished:
            raise WatermarkError(f"split {split!r} was added twice")
        held = MIN_WATERMARK if lowest is None else max(MIN_WATERMARK, lowest - 1)
        self._splits[split] = _Split(held)
        return []

    def caught_up(self, split: S, now_s: float) -> list[WatermarkAction]:
        """The reader read all there is of ``split`` for now (a partition at its end). One
        that never showed a record counts its idle time from ``now_s`` (the first time): so an
        empty partition goes idle; one that did counts from its last records, as ever."""
        state = self._live(split)
        if state.last_records is None:
            state.last_records = now_s
        return []

    def records(self, split: S, highest: int, now_s: float) -> list[WatermarkAction]:
        """The subtask read records of ``split`` whose highest timestamp is ``highest``."""
        return self.promised(split, bounded_out_of_orderness(highest, self.bound), now_s)

    def promised(self, split: S, watermark: int | None, now_s: float) -> list[WatermarkAction]:
        """The subtask read records of ``split``, whose watermark generator (a user's: Flink's
        ``WatermarkGenerator``) now promises ``watermark`` (``None``: nothing yet). A promise
        lower than one before it changes nothing: watermarks never go back."""
        state = self._live(split)
        state.last_records = now_s
        state.idle = False
        if watermark is not None:
            state.held = max(state.held, watermark)
        actions: list[WatermarkAction] = []
        if self.idle:
            self.idle = False
            actions.append(EmitStatus(idle=False))
        return actions + self._advance()

    def split_finished(self, split: S) -> list[WatermarkAction]:
        """Every record of ``split`` was read: it holds nothing any more."""
        self._live(split)
        del self._splits[split]
        self._finished.add(split)
        if not self._splits:
            return self.exhausted() if self.bounded else self.quiet()
        return self._advance()

    def quiet(self) -> list[WatermarkAction]:
        """(An unbounded subtask) it has no split now: it holds nothing back and says it is
        idle, until a split added later shows records."""
        if self._splits:
            raise WatermarkError("a subtask with splits to read is not quiet")
        if self.idle or self.watermark == MAX_WATERMARK:
            return []
        self.idle = True
        return [EmitStatus(idle=True)]

    def tick(self, now_s: float) -> list[WatermarkAction]:
        """Processing time is ``now_s``: splits without records for ``idle_timeout`` go idle."""
        timeout = self.idle_timeout
        if timeout is None or not self._splits or self.watermark == MAX_WATERMARK:
            return []
        changed = False
        for state in self._splits.values():
            started = state.last_records
            if not state.idle and started is not None and now_s - started >= timeout:
                state.idle = changed = True
        if not changed:
            return []
        actions = self._advance()
        if all(s.idle for s in self._splits.values()) and not self.idle:
            self.idle = True
            actions.append(EmitStatus(idle=True))
        return actions

    def exhausted(self) -> list[WatermarkAction]:
        """The subtask has no more records (every split finished, or the input ended)."""
        self._finished.update(self._splits)
        self._splits.clear()
        actions: list[WatermarkAction] = []
        if self.idle:
            self.idle = False
            actions.append(EmitStatus(idle=False))
        if self.watermark < MAX_WATERMARK:
            self.watermark = MAX_WATERMARK
            actions.append(EmitWatermark(MAX_WATERMARK))
        return actions

    def _live(self, split: S) -> _Split:
        state = self._splits.get(split)
        if state is None:
            if split in self._finished:
                raise WatermarkError(f"split {split!r} is used after it finished")
            raise WatermarkError(f"split {split!r} was never added")
        return state

    def _advance(self) -> list[WatermarkAction]:
        active = [s.held for s in self._splits.values() if not s.idle]
        if not active:  # every split idle: none holds the watermark back
            return []
        low = min(active)
        if low > self.watermark:
            self.watermark = low
            return [EmitWatermark(low)]
        return []


@dataclass
class _Channel:
    watermark: int = MIN_WATERMARK
    idle: bool = False
    caught_up: bool = True
    """Its watermark is not behind the valve's: it holds the valve back (a channel that comes
    back from idleness behind the valve does not until it catches up)."""
    ended: bool = False


class WatermarkValve(Generic[C]):
    """The watermark of a subtask with inputs: the minimum over its input channels (see the
    module's table)."""

    def __init__(self, channels: Iterable[C]) -> None:
        self._channels: dict[C, _Channel] = {c: _Channel() for c in channels}
        if not self._channels:
            raise ValueError("a watermark valve needs at least one input channel")
        self.watermark = MIN_WATERMARK
        """The watermark emitted last."""
        self.idle = False
        """Whether the valve said it is idle (every input channel not ended is idle)."""

    def channel_watermark(self, channel: C) -> int:
        return self._channel(channel).watermark

    def watermark_received(self, channel: C, watermark: int) -> list[WatermarkAction]:
        """``Watermark(watermark)`` arrived on ``channel`` (a lower one than it sent before is
        ignored: a channel's watermarks only increase)."""
        state = self._live(channel)
        if watermark <= state.watermark:
            return []
        state.watermark = watermark
        if not state.caught_up and watermark >= self.watermark:
            state.caught_up = True
        if state.idle:
            return []  # (an idle channel's watermark counts once it is active again)
        return self._advance()

    def status_received(self, channel: C, idle: bool) -> list[WatermarkAction]:
        """``channel`` says it is idle (``idle=True``) or active again."""
        state = self._live(channel)
        if state.idle == idle:
            return []
        state.idle = idle
        if not idle:
            state.caught_up = state.watermark >= self.watermark
            actions: list[WatermarkAction] = []
            if self.idle:
                self.idle = False
                actions.append(EmitStatus(idle=False))
            return actions + self._advance()
        return self._went_idle()

    def end_of_input(self, channel: C) -> list[WatermarkAction]:
        """``channel`` ended: it holds nothing any more."""
        state = self._live(channel)
        state.ended = True
        state.watermark = MAX_WATERMARK
        actions: list[WatermarkAction] = []
        if all(s.ended for s in self._channels.values()):
            if self.idle:
                self.idle = False
                actions.append(EmitStatus(idle=False))
            if self.watermark < MAX_WATERMARK:
                self.watermark = MAX_WATERMARK
                actions.append(EmitWatermark(MAX_WATERMARK))
            return actions
        return self._went_idle()  # (the channels left may all be idle)

    def _channel(self, channel: C) -> _Channel:
        try:
            return self._channels[channel]
        except KeyError:
            raise UnknownChannelError(f"{channel!r} is not an input channel here") from None

    def _live(self, channel: C) -> _Channel:
        state = self._channel(channel)
        if state.ended:
            raise WatermarkError(f"channel {channel!r} sent something after its end of input")
        return state

    def _holding(self) -> list[_Channel]:
        return [s for s in self._channels.values() if not s.ended and not s.idle and s.caught_up]

    def _advance(self) -> list[WatermarkAction]:
        holding = self._holding()
        if not holding:
            return []
        low = min(s.watermark for s in holding)
        if low <= self.watermark:
            return []
        self.watermark = low
        for state in self._channels.values():  # channels behind it that caught up now
            if not state.caught_up and state.watermark >= low:
                state.caught_up = True
        return [EmitWatermark(low)]

    def _went_idle(self) -> list[WatermarkAction]:
        live = [s for s in self._channels.values() if not s.ended]
        if live and all(s.idle for s in live):
            # every input idle: as Flink does, move on to the highest watermark any of them
            # reached (nothing holds it back), then say so downstream
            actions: list[WatermarkAction] = []
            high = max(s.watermark for s in live)
            if high > self.watermark:
                self.watermark = high
                actions.append(EmitWatermark(high))
            if not self.idle:
                self.idle = True
                actions.append(EmitStatus(idle=True))
            return actions
        return self._advance()


class EventClock:
    """The event time a subtask has reached, kept in one place: the watermark each of its
    chain's ``operators`` reached, and its outputs' (epoch ms).

    Each operator of a subtask's chain has its own place on the clock, the watermark it was last
    told (``on_watermark``), and the subtask's outputs one more, the watermark it last sent on.
    They differ for a moment, and for good reasons:

    * when a watermark comes, the subtask tells the chain's operators one after the other, and
      what one fires goes through those after it **before** they are told (Flink's rule): a
      window's result, stamped with the window's last millisecond, reaches a second window that
      has not yet seen the watermark that fired it, so it is on time there;
    * after an ``assign_timestamps``, the operators see the watermarks it makes, not those from
      upstream;
    * a window operator restored from a checkpoint starts where its checkpoint had got to (so
      that a window that fired then never opens again), while the watermarks from upstream start
      again from the least;
    * a processing-time window's place is the wall clock's time it reached.

    A place only moves forward. Operators read theirs (``OperatorContext.watermark``); the
    subtask moves them (the runtime's ``SubtaskRunner``), and a window
    operator its own when it is restored or goes by the wall clock.
    """

    def __init__(self, operators: int = 1) -> None:
        self._reached = [MIN_WATERMARK] * (operators + 1)

    def reached(self, position: int) -> int:
        """The watermark the ``position``-th operator of the chain was last told."""
        return self._reached[position]

    def advance(self, position: int, watermark: int) -> int:
        """The ``position``-th operator is told ``watermark``: its place moves there if that is
        further on. Returns where its place is."""
        reached = self._reached
        if watermark > reached[position]:
            reached[position] = watermark
        return reached[position]

    @property
    def output(self) -> int:
        """The watermark the subtask last sent on its outputs."""
        return self._reached[-1]

    def sent(self, watermark: int) -> None:
        """The subtask sent ``watermark`` on its outputs."""
        self.advance(len(self._reached) - 1, watermark)
