"""Termination detection for loops (Mattern's four counters, in two waves), as a sans-IO state
machine.

A dataflow without a loop ends by itself: the sources end their input and the end flows
downstream. A loop cannot: its head waits for its back edge, which waits for the head. The loop
is over when nothing moves in it any more, and nobody sees that at once: each participant (a
slot of the runtime, a subtask of the simulator) knows only what it did. So it counts:

* ``sent``: the records it put on a channel (counted before they are sent);
* ``processed``: the records it took from a channel and finished with (counted after the records
  that processing sent were counted in ``sent``).

Both counts only grow. A record is *in flight* (on a channel or being processed) exactly when the
sum of ``sent`` over every participant exceeds the sum of ``processed``. But the sums cannot be
read at one instant: the detector asks, in *waves*, and each participant answers when it gets
the question, each at its own moment. One wave's sums may therefore match while a record is in
flight (counted as sent by the one who answered late, not yet as processed by the one who
answered early). Two waves do not fool it:

    Let wave ``k`` end at instant ``t`` (its last answer came), and wave ``k + 1`` start after
    ``t``. Each ``processed`` of wave ``k`` was counted before ``t``, each ``sent`` of wave
    ``k + 1`` after ``t``; the counts only grow, and no more records are processed than sent.
    So ``P_k <= P(t) <= S(t) <= S_{k+1}``. If ``P_k == S_{k+1}``, all are equal: at ``t``
    nothing was in flight, and nothing was sent between ``t`` and any answer of wave ``k + 1``.

Once nothing is in flight, nothing can ever move again, **provided a record only ever arises
from processing another one** (the sources are exhausted: start the first wave only then). So:

**Invariant.** :class:`Terminated` is returned only if the sum of ``processed`` of the newest
complete wave equals the sum of ``sent`` of the wave that completes now, which was started after
it ended; then at that instant nothing was in flight, and nothing is since.

**Liveness.** Once nothing is in flight, two waves started from then on are enough: the first
counts every ``processed``, the second finds ``sent`` equal to it.

The detector never reads a clock: the host starts a wave (:meth:`TerminationDetector.start_wave`),
sends the question to every participant, passes each answer in, and, when a wave did not show
quiet, starts the next one when it likes (the runtime waits 50 ms):

=================================================  ============================================
event (method)                                     actions it may return
=================================================  ============================================
``start_wave()``                                   ``AskCounts(wave)`` (the one it returns; a wave
                                                   still open is given up)
``on_counts(participant, wave, sent, processed)``  nothing while answers are missing; once every
                                                   participant answered: ``Terminated`` or
                                                   ``NextWave``. Nothing for a late answer (an
                                                   older wave, a wave already complete, after
                                                   ``Terminated``)
=================================================  ============================================

Late and repeated answers are normal, and change nothing they must not: an answer to a wave
other than the open one is ignored; a second answer in the open wave keeps, of each count, the
larger (either was counted after the question; the larger is the newer). Impossible events
raise a :class:`~cutline.protocol.ProtocolError` and leave the detector unchanged: an unknown
participant, a wave never asked, a count that is not a non-negative integer or that went down
from one wave to the next (a participant restarted: start a new detector with the new
generation), a wave started after :class:`Terminated`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

from cutline.protocol.errors import ProtocolError

P = TypeVar("P", bound=Hashable)
"""The type of a participant id (a slot, a subtask)."""


class UnknownParticipantError(ProtocolError):
    """Counts came from a participant the detector does not wait for."""


@dataclass(frozen=True, slots=True)
class AskCounts:
    """Ask every participant for its counts, naming wave ``wave``: each counts *after* the
    question came, and answers with ``on_counts(participant, wave, sent, processed)``."""

    wave: int


@dataclass(frozen=True, slots=True)
class NextWave:
    """Wave ``wave`` is complete but did not show quiet (``sent`` and ``processed`` are its sums):
    call ``start_wave()`` again when you like."""

    wave: int
    sent: int
    processed: int


@dataclass(frozen=True, slots=True)
class Terminated:
    """Nothing is in flight, and nothing will be: wave ``wave`` counted as many records sent as
    the wave before it had counted processed (``records``, every record the participants ever
    sent)."""

    wave: int
    records: int


TerminationAction: TypeAlias = NextWave | Terminated

_NONE: tuple[()] = ()


class TerminationDetector(Generic[P]):
    """Decides, from waves of counts, that no record is in flight and none ever will be.

    :param participants: everyone who sends or processes records; each answers every wave.
    """

    def __init__(self, participants: Iterable[P]) -> None:
        self.participants: frozenset[P] = frozenset(participants)
        if not self.participants:
            raise ValueError("a termination detector needs at least one participant")
        self._wave = 0
        """The newest wave asked (0: none yet)."""
        self._answers: dict[P, tuple[int, int]] = {}
        """Answers to the open wave: participant -> (sent, processed)."""
        self._open = False
        """Wave ``_wave`` waits for answers."""
        self._last: dict[P, tuple[int, int]] = {}
        """Each participant's counts in the newest complete wave (to see them never go down)."""
        self._processed: int | None = None
        """The sum of ``processed`` of the newest complete wave."""
        self._terminated: Terminated | None = None

    # ------------------------------------------------------------------ queries

    @property
    def wave(self) -> int:
        """The newest wave asked (0 before the first)."""
        return self._wave

    @property
    def terminated(self) -> bool:
        return self._terminated is not None

    @property
    def waiting_for(self) -> frozenset[P]:
        """The participants whose answer the open wave still lacks (none when no wave is open)."""
        if not self._open:
            return frozenset()
        return self.participants - self._answers.keys()

    # ------------------------------------------------------------------- events

    def start_wave(self) -> AskCounts:
        """Open the next wave (giving up one still open: its answers will be late)."""
        if self._terminated is not None:
            raise ProtocolError(f"a wave started after termination (wave {self._wave})")
        self._wave += 1
        self._answers = {}
        self._open = True
        return AskCounts(self._wave)

    def on_counts(
        self, participant: P, wave: int, sent: int, processed: int
    ) -> Sequence[TerminationAction]:
        """``participant`` answered wave ``wave``: it had sent ``sent`` records and processed
        ``processed``, counted after the question came."""
        if participant not in self.participants:
            raise UnknownParticipantError(f"{participant!r} does not take part")
        if type(wave) is not int or not 1 <= wave <= self._wave:
            raise ProtocolError(f"counts of wave {wave!r} from {participant!r}: never asked")
        for name, count in (("sent", sent), ("processed", processed)):
            if type(count) is not int or count < 0:
                raise ProtocolError(f"{participant!r} counted {count!r} records {name}")
        if wave != self._wave or not self._open:
            return _NONE  # late: an older wave, or one already complete
        before = self._last.get(participant, (0, 0))
        if sent < before[0] or processed < before[1]:
            raise ProtocolError(
                f"{participant!r} counted {sent} sent and {processed} processed in wave {wave}, "
                f"after {before[0]} and {before[1]} in an earlier one: counts never go down"
            )
        earlier = self._answers.get(participant, (0, 0))
        self._answers[participant] = (max(sent, earlier[0]), max(processed, earlier[1]))
        if len(self._answers) < len(self.participants):
            return _NONE
        return (self._complete(),)

    # ---------------------------------------------------------------- internals

    def _complete(self) -> TerminationAction:
        """Every participant answered the open wave: compare it with the one before."""
        self._open = False
        self._last = self._answers
        sent = sum(s for s, _ in self._answers.values())
        processed = sum(p for _, p in self._answers.values())
        if self._processed == sent:
            self._terminated = Terminated(self._wave, sent)
            return self._terminated
        self._processed = processed
        return NextWave(self._wave, sent, processed)
