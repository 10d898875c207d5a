"""How watermarks are made: :class:`WatermarkStrategy` is what ``event_time=``,
``max_out_of_orderness=``, ``idle_timeout=`` and ``max_watermark_jump=`` say (Flink's
``WatermarkStrategy``); a source subtask's watermarks are made from it by
:class:`~cutline.runtime.source_operator.SourceOperator`.

**Jumps.** One record from the year 9999 among records of 2024 moves its split's watermark to
9999, and every later record of the split is late. With ``max_watermark_jump``, a record whose
time is more than that above the split's latest time so far (or, in its first records, above
the bulk of them) with nothing in between is a **jump** (:func:`jumps`): the source
warns, naming it, or (``on_error="dead_letter"``) sends it to the dead letters, so that it
never moves the watermark.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cutline.runtime.eventtime.timestamps import EventTime


@dataclass(frozen=True)
class WatermarkStrategy:
    """How a source (or ``assign_timestamps``) makes watermarks: the records' event time, how
    far out of order they come (``bound``, ms), after how long without records a split is
    idle (``idle_timeout``, seconds; ``None``: never), and how far a record may jump ahead
    of its split (``max_jump``, ms; ``None``: any distance)."""

    event_time: EventTime
    bound: int = 0
    idle_timeout: float | None = None
    max_jump: int | None = None


def jumps(values: np.ndarray, latest: int | None, bound: int) -> np.ndarray:
    """Which of ``values`` (a batch's times, ms) jump more than ``bound`` ahead of their
    split: above the first gap wider than ``bound`` in the times sorted up from the split's
    ``latest`` so far (``None``, its first records: from the batch's median, so that a few
    records far behind the others are no reference). A mask."""
    if not len(values):
        return np.zeros(0, dtype=bool)
    start = int(np.median(values)) if latest is None else latest
    ordered = np.sort(np.append(values[values >= start], start))
    gaps = np.flatnonzero(np.diff(ordered) > bound)
    if not len(gaps):
        return np.zeros(len(values), dtype=bool)
    jumped: np.ndarray = values > ordered[gaps[0]]
    return jumped
