"""Window assigners: which windows a record belongs to (what ``keyed.window(...)`` takes).

Sizes are durations (``"10s"``, ``"1 min"``, a ``timedelta``, or a number of seconds; see
:mod:`cutline.runtime.durations`), kept as whole milliseconds once made; windows are aligned
to the epoch, as in Flink, or to local midnight in a time zone:

* :class:`Tumbling` ``(size)``: ``[start, start + size)``, every record in exactly one;
  ``Tumbling(size, time_zone=...)``: the windows of a zone's local clock, whose lengths
  change where daylight saving time starts or ends.
* :class:`Sliding` ``(size, every=slide)``: windows of ``size`` starting every ``slide``; a
  record is in ``size / slide`` of them.
* :class:`Session` ``(gap=...)``: per key, records at most ``gap`` apart are one session;
  sessions merge when a record bridges them, or when they touch (Flink's and Spark's rule). A
  session's ``window_end`` is its last record's time plus the gap.

A window operator asks :func:`assign` (or :func:`starts_of`) where the windows of its records
start, and :func:`end_of` (or :func:`ends_of`) where each ends: never ``start + size`` itself,
since in a time zone that is not where a window ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cutline.runtime.durations import Duration, milliseconds, said_ms
from cutline.runtime.eventtime import zones
from cutline.runtime.eventtime.timestamps import EventTimeError


@dataclass(frozen=True)
class Tumbling:
    """Windows of ``size`` one after another: ``Tumbling("1 min")``. ``offset`` shifts them
    from the epoch (Flink's offset, Spark's ``startTime``): ``Tumbling("1 d", offset="5h")``
    is the days from 05:00 UTC to 05:00 UTC (midnight to midnight at UTC-5).

    ``time_zone`` (a name of the tz database, or a fixed offset such as ``"+05:30"``) gives
    the windows of that zone's local clock, aligned to its local midnight:
    ``Tumbling("1 h", time_zone="America/New_York")`` is the hours of the day in New York,
    ``Tumbling("6 h", time_zone="Europe/Berlin")`` the shifts from midnight, 06:00, 12:00 and
    18:00 there, ``Tumbling("1 d", time_zone=...)`` its days from midnight to midnight
    (several days: runs of days counted from 1970-01-01 there). The size divides a day (15
    min, 30 min, 1 h, 2 h, 3 h, 4 h, 6 h, 8 h, 12 h...) or is whole days; ``offset=`` is not
    for it (the windows start at local midnight). Where the zone's UTC offset is not whole
    hours the windows are still the local ones: the hours of ``Asia/Kolkata`` (UTC+05:30)
    start at half past the UTC hours.

    Each window runs from one boundary to the next, the boundaries being:

    * for a size that divides a day, every instant the local clock reads midnight plus a
      multiple of the size; where clocks go back and a local time repeats, both times it
      is read; where clocks go forward past such a time, the instant they jump. So the
      hours of New York on 2024-03-10 (clocks go from 02:00 EST to 03:00 EDT) are 00:00,
      01:00 (the jump past 02:00 is 03:00, which is a boundary anyway: 01:00 to 03:00 is
      one hour, and there is no hour at 02:00), 03:00...; on 2024-11-03 (from 02:00 EDT back
      to 01:00 EST) they are 00:00, 01:00 EDT, 01:00 EST, 02:00...: two windows that read
      01:00, one hour each. A window over a change is longer or shorter by it: a 6 h
      window is 5 or 7 hours. On Lord Howe Island, whose clocks go from 02:00 to 02:30, the
      hour from 01:00 ends at the jump, after an hour, and 02:30 to 03:00 is a window of half
      an hour;
    * for whole days, the first instant of each day: local midnight, the first time it is
      read where it repeats (in Havana, whose clocks go back from 01:00 to 00:00 on
      2024-11-03, the day is 25 hours from the first midnight), the jump where it is skipped
      (its clocks go from 00:00 to 01:00 on 2024-03-10, a day of 23 hours from 01:00).

    Every instant is thus in exactly one window, each window ends where the next starts, and
    windows of a size that divides another's nest in them (hours in days). ``window_start``
    and ``window_end`` are those instants (UTC). How they are found: :mod:`.zones`."""

    size: Any
    offset: Any = field(default=0, kw_only=True)
    time_zone: str | None = field(default=None, kw_only=True)
    """The zone whose local clock the windows follow (``"America/New_York"``); see above."""

    def __post_init__(self) -> None:
        size = _ms(self.size, "Tumbling: size")
        shown = f"Tumbling({_shown(size)})"
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "offset", _offset(self.offset, size, shown))
        if self.time_zone is not None:
            _check_zone(self.time_zone, shown)
            zone = f"time_zone={self.time_zone!r}"
            if DAY % size and size % DAY:
                raise EventTimeError(
                    f"{shown}: {zone} takes a size that divides a day (15min, 30min, 1h, 2h, "
                    f"3h, 4h, 6h, 8h, 12h...) or whole days, so that windows start at local "
                    f"midnight: {_shown(size)} is neither"
                )
            if self.offset:
                raise EventTimeError(
                    f"{shown}: offset={_shown(self.offset)} with {zone}: windows in a time "
                    "zone start at its local midnight; leave offset= out"
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
        size = _ms(self.size, "Sliding: size")
        every = _ms(self.every, "Sliding: every")
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


DAY = zones.DAY


def _check_zone(zone: Any, shown: str) -> None:
    try:
        zones.zone_info(zone)
    except ValueError as exc:
        raise EventTimeError(
            f"{shown}: time_zone={zone!r} is no time zone ('America/New_York', "
            f"'Europe/Paris', 'UTC', '+05:30'): {exc}"
        ) from None


def _offset(value: Any, period: int, shown: str) -> int:
    """An offset of windows that start every ``period`` ms: at least 0 and less than it (an
    offset of ``-5h`` for days is ``19h``: the windows are the same)."""
    offset = _ms(value, f"{shown}: offset", zero=True, keyword="offset")
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
        object.__setattr__(self, "gap", _ms(self.gap, "Session: gap"))

    def __str__(self) -> str:
        return f"Session(gap={_shown(self.gap)})"


Assigner = Tumbling | Sliding | Session


_shown = said_ms


def _ms(value: Duration, what: str, *, zero: bool = False, keyword: str | None = None) -> int:
    """A window's length in milliseconds (:func:`~cutline.runtime.durations.milliseconds`)."""
    return milliseconds(value, what, zero=zero, keyword=keyword, error=EventTimeError)


def assign(assigner: Tumbling | Sliding, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The windows of timestamps ``ts``: (index of the record, window start) per pair."""
    if isinstance(assigner, Tumbling):
        size, offset = assigner.size, assigner.offset
        if assigner.time_zone is not None:
            return np.arange(len(ts)), _in_zone(assigner, zones.window_starts, ts)
        return np.arange(len(ts)), ts - np.mod(ts - offset, size)
    size, slide = assigner.size, assigner.every
    count = math.ceil(size / slide)
    last = ts - np.mod(ts - assigner.offset, slide)
    starts = last[:, None] - slide * np.arange(count, dtype=np.int64)[None, :]
    inside = starts + size > ts[:, None]
    index = np.broadcast_to(np.arange(len(ts))[:, None], starts.shape)
    return index[inside], starts[inside]


def end_of(assigner: Tumbling | Sliding, start: int) -> int:
    """Where the window starting at ``start`` ends (exclusive): ``start + size``, or in a
    time zone the next window's start (see :class:`Tumbling`)."""
    if isinstance(assigner, Tumbling) and assigner.time_zone is not None:
        return int(ends_of(assigner, np.array([start], dtype=np.int64))[0])
    return start + assigner.size  # type: ignore[no-any-return]


def ends_of(assigner: Tumbling | Sliding, starts: np.ndarray) -> np.ndarray:
    """:func:`end_of` of many starts."""
    if isinstance(assigner, Tumbling) and assigner.time_zone is not None:
        return _in_zone(assigner, zones.window_ends, starts)
    ends: np.ndarray = starts + assigner.size
    return ends


def _in_zone(assigner: Tumbling, place: Any, ts: np.ndarray) -> np.ndarray:
    """``place`` (:func:`~cutline.runtime.eventtime.zones.window_starts` or ``window_ends``)
    of ``ts`` for a time-zone assigner, a time it cannot place refused naming it."""
    try:
        found: np.ndarray = place(assigner.time_zone, assigner.size, ts)
    except ValueError as exc:
        raise EventTimeError(f"{assigner}: {exc}") from None
    return found


def starts_of(assigner: Tumbling | Sliding, stamp: int) -> list[int]:
    """The starts of the windows of one timestamp, latest first."""
    if isinstance(assigner, Tumbling):
        if assigner.time_zone is not None:
            stamps = np.array([stamp], dtype=np.int64)
            return [int(_in_zone(assigner, zones.window_starts, stamps)[0])]
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
