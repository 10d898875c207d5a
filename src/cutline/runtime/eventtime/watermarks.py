"""How watermarks are made: :class:`WatermarkStrategy` is what a source's or
``assign_timestamps``' :class:`~cutline.EventTime` says, checked against the stream's columns
(Flink's ``WatermarkStrategy``); a source subtask's watermarks are made from it by
:class:`~cutline.runtime.source_operator.SourceOperator`. A split's watermark follows its
records by bounded out-of-orderness, or by a :class:`WatermarkGenerator` of the user's
(:class:`BoundedOutOfOrderness` and :class:`Monotonous` are two).

**Jumps.** One record from the year 9999 among records of 2024 moves its split's watermark to
9999, and every later record of the split is late. With ``max_jump``, a record whose
time is more than that above the split's latest time so far (or, in its first records, above
the bulk of them) with nothing in between is a **jump** (:func:`jumps`): the source
warns, naming it, or (``on_error="dead_letter"``) sends it to the dead letters, so that it
never moves the watermark.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.durations import Duration, milliseconds, said_ms
from cutline.runtime.eventtime.timestamps import EventTimeError, TimeColumn


class WatermarkGenerator:
    """How a split's watermark follows its records (Flink's ``WatermarkGenerator``): give an
    instance as ``EventTime(..., watermarks=)`` to a source (one copy per split) or to
    ``assign_timestamps``.
    Override :meth:`on_event` to see every record with its time (a record at a time: slower),
    or :meth:`on_events` for a batch's times at once; :meth:`on_periodic_emit` says the
    watermark promised now, after every batch: no record at or before it is to come. It must
    be picklable (it is sent to the workers) and is not checkpointed: after a restore the
    splits are read again and it starts anew, as in Flink."""

    def on_event(self, timestamp: int, record: Any) -> None:
        """A record (a dict) of event time ``timestamp`` (epoch ms) was read."""

    def on_events(self, timestamps: np.ndarray) -> None:
        """A batch's event times (epoch ms, int64) were read (unless :meth:`on_event` is
        overridden: it is then called for every record instead)."""

    def on_periodic_emit(self) -> int | None:
        """The watermark promised now (epoch ms), or ``None``: nothing yet."""
        raise NotImplementedError

    @property
    def per_record(self) -> bool:
        """Whether it looks at every record (:meth:`on_event` overridden)."""
        return type(self).on_event is not WatermarkGenerator.on_event


class BoundedOutOfOrderness(WatermarkGenerator):
    """Records come at most ``bound`` behind the latest one (a duration: ``"2s"``,
    ``"500ms"``, a ``timedelta``, or a number of seconds; as ``max_out_of_orderness=``): the
    watermark is the latest time minus the bound, minus 1 ms.

    :ivar bound_ms: the bound, in milliseconds."""

    def __init__(self, bound: Duration = 0) -> None:
        self.bound_ms = milliseconds(
            bound, "BoundedOutOfOrderness: bound", zero=True, error=EventTimeError
        )
        self.highest: int | None = None

    @property
    def bound(self) -> int:
        """Deprecated: ``bound_ms``."""
        warnings.warn(
            "BoundedOutOfOrderness.bound is deprecated: read bound_ms (milliseconds)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.bound_ms

    def on_events(self, timestamps: np.ndarray) -> None:
        if len(timestamps):
            latest = int(timestamps.max())
            self.highest = latest if self.highest is None else max(self.highest, latest)

    def on_periodic_emit(self) -> int | None:
        return None if self.highest is None else self.highest - self.bound_ms - 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}({said_ms(self.bound_ms)!r})"


class Monotonous(BoundedOutOfOrderness):
    """Records come in order of their time (Flink's ``forMonotonousTimestamps``)."""

    def __init__(self) -> None:
        super().__init__(0)

    def __repr__(self) -> str:
        return "Monotonous()"


@dataclass(frozen=True)
class WatermarkStrategy:
    """How a source (or ``assign_timestamps``) makes watermarks, in the runtime's units: the
    records' time column, how far out of order they come (``bound_ms``), after how long of
    processing time without records a split is idle (``idle_timeout_s``, seconds; ``None``:
    never), and how far a record may jump ahead of its split (``max_jump_ms``; ``None``: any
    distance). Made from the user's :class:`~cutline.EventTime` by
    ``cutline.api.event_time.strategy``."""

    column: TimeColumn
    bound_ms: int = 0
    idle_timeout_s: float | None = None
    max_jump_ms: int | None = None
    generator: WatermarkGenerator | None = None
    """A generator of the user's (``watermarks=``), a copy per split; ``None``: bounded
    out-of-orderness by ``bound``."""


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


def promise_after(
    generator: WatermarkGenerator, event_time: TimeColumn, batch: Any, times: np.ndarray
) -> int | None:
    """Show ``generator`` a batch (each record with its time, or the batch's ``times`` at
    once, as it asks) and return the watermark it promises after it."""
    if generator.per_record:
        records = batch.to_pylist() if isinstance(batch, pa.RecordBatch) else list(batch)
        for record in records:
            value = record.get(event_time.column) if isinstance(record, dict) else None
            stamp = event_time.of_value(value)
            if stamp is not None:
                generator.on_event(stamp, record)
    else:
        generator.on_events(times)
    promise = generator.on_periodic_emit()
    return None if promise is None else int(promise)
