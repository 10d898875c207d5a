"""The event time a subtask has reached, kept in one place: its :class:`EventClock`.

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
subtask moves them (:class:`~cutline.runtime.task.subtask.SubtaskRunner`), and a window
operator its own when it is restored or goes by the wall clock.
"""

from __future__ import annotations

from cutline.protocol.watermarks import MIN_WATERMARK


class EventClock:
    """The watermark each of a chain's ``operators`` reached, and its outputs' (epoch ms)."""

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
