"""A time zone's local clock, for windows aligned to it (``Tumbling(size, time_zone=...)``):
where those windows start and end, as epoch milliseconds, over NumPy arrays of times.

A zone's clock reads UTC plus an offset, and the offset changes at the zone's transitions
(daylight saving time starts or ends, or the zone moves its standard time). Between two
transitions the local clock runs as UTC does, so there a window of ``size`` starts where the
local time is a multiple of ``size`` (midnights counted from 1970-01-01 in the zone, so
that, for a size that divides a day, windows start at local midnight): at
``t - (t + offset) mod size``, as with a fixed offset. All the care is at the transitions,
where the rule is:

* **part of a day** (``size`` divides a day: 15 min, 1 h, 6 h...): a window starts at every
  instant the local clock reads a multiple of ``size`` (both times where clocks go back and a
  local time repeats), and at every instant clocks go forward past one (where ``02:00`` is
  skipped, at the jump: 01:59:59.999 EST is followed by 03:00 EDT, which starts a window);
* **whole days**: a day starts at its first instant, the first time the local clock reads
  its midnight or more (a midnight that repeats starts the day the first time; one that is
  skipped, at the jump).

Each window ends where the next starts. In both, a window's start is the last of these
instants at or before a record's time, and its end the first after its start, so every
instant is in exactly one window, and the windows of a size that divides another's nest in
its windows (hours in 6 h windows in days).

The offsets come from :mod:`zoneinfo` (the tz database, and its rule for the years after its
table; Arrow's own time zone arithmetic stops at the table's last year, 2037, and would put
New York's summers after it in standard time). They are read once per zone: a
:class:`_Clock` keeps them over the span of time asked about so far, read at every UTC
midnight of the span and bisected to the millisecond wherever the offset at one midnight is
not the one at the next, and extended as times later (or earlier) than the span come. Two
changes within one day that cancel would go unseen; in the tz database two changes of a
zone's offset are always days apart (a test reads the whole of it: the closest are nearly
four days apart). Per batch of times the work is then array arithmetic over the few spans of
constant offset the batch touches.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import zoneinfo
from dataclasses import dataclass

import numpy as np

DAY = 86_400_000
_BLOCK = 32 * DAY
"""The clock reads a zone's offsets in spans of whole blocks, 32 days each, as times come."""
_MARGIN = 3 * DAY
"""How far beyond the times asked about the offsets are read: more than any window can be
longer than its size (a window is longer by what clocks go back in it: at most a day)."""
_MS = dt.timedelta(milliseconds=1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_FIRST = (dt.datetime(1, 1, 2, tzinfo=dt.UTC) - _EPOCH) // _MS
_LAST = (dt.datetime(9999, 12, 30, tzinfo=dt.UTC) - _EPOCH) // _MS
_LOW = np.iinfo(np.int64).min
_HIGH = np.iinfo(np.int64).max
_FIXED = re.compile(r"([+-])(\d\d):(\d\d)")


def zone_info(name: str) -> dt.tzinfo:
    """The zone ``name``: one of the tz database (``"America/New_York"``, ``"UTC"``) or a
    fixed offset (``"+05:30"``); :class:`ValueError` saying why when there is none."""
    fixed = _FIXED.fullmatch(name) if isinstance(name, str) else None
    try:
        if fixed:
            sign, hours, minutes = fixed.groups()
            offset = dt.timedelta(hours=int(hours), minutes=int(minutes))
            return dt.timezone(-offset if sign == "-" else offset)
        return zoneinfo.ZoneInfo(name)
    except (KeyError, ValueError, TypeError, OSError) as exc:
        raise ValueError(str(exc).strip("'\"") or type(exc).__name__) from None


def window_starts(zone: str, size: int, ts: np.ndarray) -> np.ndarray:
    """The start of the window of ``size`` ms in ``zone`` of each of ``ts`` (epoch ms): the
    last boundary (see the module) at or before it."""
    if not len(ts):
        return np.asarray(ts, dtype=np.int64).copy()
    return _windows(zone, size, ts).last_at(ts)


def window_ends(zone: str, size: int, starts: np.ndarray) -> np.ndarray:
    """The end of each window starting at ``starts``: the first boundary after it (so that a
    window ends where the next starts)."""
    if not len(starts):
        return np.asarray(starts, dtype=np.int64).copy()
    return _windows(zone, size, starts).first_after(starts)


def _windows(zone: str, size: int, ts: np.ndarray) -> _Windows:
    ts = np.asarray(ts, dtype=np.int64)
    lowest, highest = int(ts.min()), int(ts.max())
    lo, hi = lowest - size - _MARGIN, highest + size + _MARGIN
    if lo < _FIRST or hi > _LAST:
        far = lowest if lo < _FIRST else highest
        raise ValueError(
            f"the time {far} (epoch ms) is too far from 1970 for windows in a time zone: they "
            "are placed for the years 1 to 9999"
        )
    return _clock(zone).windows(size, lo, hi)


_CLOCKS: dict[str, _Clock] = {}
_CLOCKS_LOCK = threading.Lock()


def _clock(zone: str) -> _Clock:
    with _CLOCKS_LOCK:
        clock = _CLOCKS.get(zone)
        if clock is None:
            clock = _CLOCKS[zone] = _Clock(zone_info(zone))
        return clock


class _Clock:
    """A zone's offsets over ``[lo, hi]`` (epoch ms, whole blocks), the span of time asked
    about so far: ``first`` at ``lo``, then each ``(instant, offset from it)`` of
    ``changes``. Window operators of several subtasks (threads) share it: a lock keeps its
    extensions one at a time; what :meth:`windows` returns is never changed."""

    def __init__(self, zone: dt.tzinfo) -> None:
        self.zone = zone
        self.lock = threading.Lock()
        self.lo = self.hi = self.first = 0
        self.changes: list[tuple[int, int]] = []
        self.made: dict[int, _Windows] = {}

    def windows(self, size: int, lo: int, hi: int) -> _Windows:
        """The windows of ``size`` over (at least) ``[lo, hi]``."""
        with self.lock:
            if self.lo == self.hi or lo < self.lo or hi > self.hi:
                self._cover(max(_FIRST, lo - lo % _BLOCK), min(_LAST, hi - hi % _BLOCK + _BLOCK))
            made = self.made.get(size)
            if made is None:
                made = self.made[size] = _Windows.of(self, size)
            return made

    def _cover(self, lo: int, hi: int) -> None:
        if self.lo == self.hi:
            self.first, self.changes = self._read(lo, hi)
            self.lo, self.hi = lo, hi
        if lo < self.lo:
            self.first, earlier = self._read(lo, self.lo)
            self.changes, self.lo = earlier + self.changes, lo
        if hi > self.hi:
            self.changes += self._read(self.hi, hi)[1]
            self.hi = hi
        self.made = {}

    def _read(self, lo: int, hi: int) -> tuple[int, list[tuple[int, int]]]:
        """The offset at ``lo`` and the changes in ``(lo, hi]`` (both whole days)."""
        first = before = self._offset(lo)
        changes = []
        for midnight in range(lo, hi, DAY):
            at, after = midnight, self._offset(midnight + DAY)
            while before != after:  # (a change, or more, in the day)
                at = self._bisect(at, before, midnight + DAY)
                before = self._offset(at)
                changes.append((at, before))
        return first, changes

    def _bisect(self, a: int, offset: int, b: int) -> int:
        """An instant in ``(a, b]`` whose offset is not ``offset`` and the one before it is
        (``a``'s is ``offset``, ``b``'s is not)."""
        while b - a > 1:
            middle = (a + b) // 2
            if self._offset(middle) == offset:
                a = middle
            else:
                b = middle
        return b

    def _offset(self, ms: int) -> int:
        local = (_EPOCH + dt.timedelta(milliseconds=ms)).astimezone(self.zone)
        return (local.utcoffset() or dt.timedelta()) // _MS


@dataclass(frozen=True)
class _Windows:
    """The windows of ``size`` over a clock's span, as arrays over its spans of constant
    offset. Span ``i`` runs from ``starts[i]`` to ``ends[i]`` at offset ``offsets[i]``: its
    local clock reads ``t + offsets[i]`` at ``t``. Windows start in it at the instants its
    clock reads a multiple of ``size`` from ``least[i]`` on (for a size that divides a day,
    any it reads; for days, only those no earlier span read), and at ``starts[i]`` itself if
    the clock jumped forward there past a multiple. ``before[i]`` is the last window start at
    or before ``starts[i]``, ``after[i]`` the first at or after it: for a time in span ``i``
    with no window start in the span at or before it, its window started at ``before[i]``;
    for one after the span's last, the next starts at ``after[i + 1]``."""

    size: int
    starts: np.ndarray
    ends: np.ndarray
    offsets: np.ndarray
    least: np.ndarray
    before: np.ndarray
    after: np.ndarray

    @classmethod
    def of(cls, clock: _Clock, size: int) -> _Windows:
        starts = np.array([clock.lo] + [t for t, _ in clock.changes], dtype=np.int64)
        offsets = np.array([clock.first] + [o for _, o in clock.changes], dtype=np.int64)
        ends = np.append(starts[1:], clock.hi)
        first_wall = starts + offsets  # (what a span's clock reads first, ...
        end_wall = ends + offsets  # ... and what it would read next after its last instant)
        if size % DAY:  # every reading of a multiple starts a window
            seen = np.append(first_wall[0], end_wall[:-1])  # (the clock before the change)
            least = first_wall
        else:  # only a first reading of a midnight: not one an earlier span read already
            seen = np.append(first_wall[0], np.maximum.accumulate(end_wall)[:-1])
            least = np.maximum(first_wall, seen)
        jump = _ceil(seen, size) < first_wall  # (the clock went forward past a multiple)
        first_at = _ceil(least, size) - offsets
        first = np.where(jump, starts, np.where(first_at < ends, first_at, _HIGH))
        last_wall = end_wall - 1 - (end_wall - 1) % size
        last = np.where(last_wall >= least, last_wall - offsets, np.where(jump, starts, _LOW))
        at_start = jump | (first_at == starts)
        before = np.maximum.accumulate(np.where(at_start, starts, np.append(_LOW, last[:-1])))
        after = np.minimum.accumulate(first[::-1])[::-1]
        return cls(size, starts, ends, offsets, least, before, after)

    def last_at(self, ts: np.ndarray) -> np.ndarray:
        """The last window start at or before each of ``ts``: where its span's clock last
        read a multiple of the size, if that starts a window, else ``before`` the span."""
        i = np.searchsorted(self.starts, ts, "right") - 1
        wall = ts + self.offsets[i]
        multiple = wall - wall % self.size
        found: np.ndarray = np.where(
            multiple >= self.least[i], multiple - self.offsets[i], self.before[i]
        )
        return _checked(found)

    def first_after(self, ts: np.ndarray) -> np.ndarray:
        """The first window start after each of ``ts``: where its span's clock next reads a
        multiple that starts a window, if the span lasts until then, else ``after`` it."""
        i = np.searchsorted(self.starts, ts, "right") - 1
        wall = ts + self.offsets[i]
        multiple = np.maximum(wall - wall % self.size + self.size, _ceil(self.least[i], self.size))
        at = multiple - self.offsets[i]
        later = np.append(self.after[1:], _HIGH)
        found: np.ndarray = np.where(at < self.ends[i], at, later[i])
        return _checked(found)


def _ceil(values: np.ndarray, size: int) -> np.ndarray:
    ceiled: np.ndarray = -(-values // size) * size
    return ceiled


def _checked(found: np.ndarray) -> np.ndarray:
    if (found == _LOW).any() or (found == _HIGH).any():  # (the margins make this impossible)
        raise AssertionError("a window in a time zone fell outside the offsets read for it")
    return found
