"""Window assigners: which windows a record belongs to (what ``keyed.window(...)`` takes).

Sizes are durations (``"10s"``, ``"1 min"``, a ``timedelta`` or milliseconds); windows are
aligned to the epoch, as in Flink:

* :class:`Tumbling` ``(size)``: ``[start, start + size)``, every record in exactly one.
* :class:`Sliding` ``(size, every=slide)``: windows of ``size`` starting every ``slide``; a
  record is in ``size / slide`` of them.
* :class:`Session` ``(gap=...)``: per key, records at most ``gap`` apart are one session;
  sessions merge when a record bridges them, or when they touch (Flink's and Spark's rule). A
  session's ``window_end`` is its last record's time plus the gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.eventtime.timestamps import EventTimeError, duration_ms


@dataclass(frozen=True)
class Tumbling:
    """Windows of ``size`` one after another: ``Tumbling("1 min")``. ``offset`` shifts them
    from the epoch (Flink's offset, Spark's ``startTime``): ``Tumbling("1 d", offset="5h")``
    is the days from 05:00 UTC to 05:00 UTC (midnight to midnight at UTC-5)."""

    size: Any
    offset: Any = field(default=0, kw_only=True)
    time_zone: str | None = field(default=None, kw_only=True)
    """Windows of whole days from midnight to midnight in this IANA time zone
    (``"America/New_York"``): 23 or 25 hours long where daylight saving time starts or
    ends."""

    def __post_init__(self) -> None:
        size = duration_ms(self.size, "Tumbling size")
        shown = f"Tumbling({_shown(size)})"
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "offset", _offset(self.offset, size, shown))
        if self.time_zone is not None:
            _check_zone(self.time_zone, shown)
            if size % DAY or self.offset:
                raise EventTimeError(
                    f"{shown}: time_zone= is for windows of whole days from midnight (without "
                    "offset=); for hours, offset= shifts them"
                )

    def __str__(self) -> str:
        shift = f", offset={_shown(self.offset)}" if self.offset else ""
        zone = f", time_zone={self.time_zone}" if self.time_zone else ""
        return f"Tumbling({_shown(self.size)}{shift}{zone})"


@dataclass(frozen=True)
class Sliding:
    """Windows of ``size`` starting every ``every``: ``Sliding("10 min", every="1 min")``;
    ``offset`` shifts them from the epoch, as :class:`Tumbling`'s."""

    size: Any
    every: Any
    offset: Any = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        size = duration_ms(self.size, "Sliding size")
        every = duration_ms(self.every, "Sliding every")
        shown = f"Sliding({_shown(size)}, every={_shown(every)})"
        if every > size:
            raise EventTimeError(
                f"{shown}: the slide is longer than the window, so some records would be in no "
                "window; use Tumbling for a slide equal to the size"
            )
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "every", every)
        object.__setattr__(self, "offset", _offset(self.offset, every, shown))

    def __str__(self) -> str:
        shift = f", offset={_shown(self.offset)}" if self.offset else ""
        return f"Sliding({_shown(self.size)}, every={_shown(self.every)}{shift})"


DAY = 86_400_000


def _check_zone(zone: Any, shown: str) -> None:
    try:
        pa.array([0], pa.timestamp("ms", tz=zone)).cast(pa.int64())
        pc.floor_temporal(pa.array([0], pa.timestamp("ms", tz=zone)), 1, "day")
    except (pa.ArrowException, TypeError) as exc:
        raise EventTimeError(
            f"{shown}: time_zone={zone!r} is no time zone ('America/New_York', "
            f"'Europe/Paris', 'UTC'): {str(exc).splitlines()[0]}"
        ) from None


def _offset(value: Any, period: int, shown: str) -> int:
    """An offset of windows that start every ``period`` ms: at least 0 and less than it (an
    offset of ``-5h`` for days is ``19h``: the windows are the same)."""
    offset = duration_ms(value, f"{shown}: offset", zero=True)
    if offset >= period:
        raise EventTimeError(
            f"{shown}: offset={_shown(offset)} must be less than {_shown(period)} (an offset "
            f"of {_shown(offset)} gives the windows of {_shown(offset % period)})"
        )
    return offset


@dataclass(frozen=True)
class Session:
    """Per key, records at most ``gap`` apart: ``Session(gap="30 min")``."""

    gap: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "gap", duration_ms(self.gap, "Session gap"))

    def __str__(self) -> str:
        return f"Session(gap={_shown(self.gap)})"


Assigner = Tumbling | Sliding | Session


def _shown(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def assign(assigner: Tumbling | Sliding, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The windows of timestamps ``ts``: (index of the record, window start) per pair."""
    if isinstance(assigner, Tumbling):
        size, offset = assigner.size, assigner.offset
        if assigner.time_zone is not None:
            return np.arange(len(ts)), _local_days(ts, assigner.size // DAY, assigner.time_zone)
        return np.arange(len(ts)), ts - np.mod(ts - offset, size)
    size, slide = assigner.size, assigner.every
    count = math.ceil(size / slide)
    last = ts - np.mod(ts - assigner.offset, slide)
    starts = last[:, None] - slide * np.arange(count, dtype=np.int64)[None, :]
    inside = starts + size > ts[:, None]
    index = np.broadcast_to(np.arange(len(ts))[:, None], starts.shape)
    return index[inside], starts[inside]


def end_of(assigner: Tumbling | Sliding, start: int) -> int:
    """Where the window starting at ``start`` ends (exclusive): ``start + size``, or the
    midnight ``size`` days later in its time zone."""
    if isinstance(assigner, Tumbling) and assigner.time_zone is not None:
        return int(ends_of(assigner, np.array([start], dtype=np.int64))[0])
    return start + assigner.size  # type: ignore[no-any-return]


def ends_of(assigner: Tumbling | Sliding, starts: np.ndarray) -> np.ndarray:
    """:func:`end_of` of many starts."""
    if isinstance(assigner, Tumbling) and assigner.time_zone is not None:
        days = assigner.size // DAY
        later = starts + assigner.size + DAY // 2  # (past the next midnight, DST or not)
        return _local_days(later, days, assigner.time_zone)
    ends: np.ndarray = starts + assigner.size
    return ends


def _local_days(ts: np.ndarray, days: int, zone: str) -> np.ndarray:
    """The local midnight at or before each of ``ts`` (epoch ms) that starts a run of
    ``days`` days counted from 1970-01-01 in ``zone``, as epoch ms."""
    local = pa.array(ts, pa.timestamp("ms", tz=zone))
    floored = pc.floor_temporal(local, days, "day").cast(pa.int64())
    found: np.ndarray = np.asarray(floored.to_numpy(zero_copy_only=False), dtype=np.int64)
    return found


def starts_of(assigner: Tumbling | Sliding, stamp: int) -> list[int]:
    """The starts of the windows of one timestamp, latest first."""
    if isinstance(assigner, Tumbling):
        if assigner.time_zone is not None:
            days = assigner.size // DAY
            return [int(_local_days(np.array([stamp]), days, assigner.time_zone)[0])]
        return [stamp - (stamp - assigner.offset) % assigner.size]
    last = stamp - (stamp - assigner.offset) % assigner.every
    out = []
    start = last
    while start + assigner.size > stamp:
        out.append(start)
        start -= assigner.every
    return out


@dataclass(frozen=True)
class Window:
    """The window a ``process`` function is given: its start and end (in the event-time
    column's type: ``datetime`` or epoch milliseconds)."""

    start: Any
    end: Any
