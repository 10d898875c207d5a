"""How watermarks are made: :class:`WatermarkStrategy` is what ``event_time=``,
``max_out_of_orderness=`` and ``idle_timeout=`` say (Flink's ``WatermarkStrategy``); a source
subtask's watermarks are made from it by
:class:`~cutline.runtime.source_operator.SourceOperator`."""

from __future__ import annotations

from dataclasses import dataclass

from cutline.runtime.eventtime.timestamps import EventTime


@dataclass(frozen=True)
class WatermarkStrategy:
    """How a source (or ``assign_timestamps``) makes watermarks: the records' event time, how
    far out of order they come (``bound``, ms), and after how long without records a split is
    idle (``idle_timeout``, seconds; ``None``: never)."""

    event_time: EventTime
    bound: int = 0
    idle_timeout: float | None = None
