"""The windows of ``Tumbling(size, time_zone=...)`` from their definition, one local time at a
time with :mod:`zoneinfo` (no table of transitions, no arrays): what the tests hold cutline's
to.

A window starts at every instant the local clock reads a multiple of ``size`` (midnights
counted from 1970-01-01 there), both times where a local time repeats, and where clocks jump
past such a time, at the jump; for whole days, only the first instant reading each midnight
(or jumping past it). Each window ends at the next start.
"""

from __future__ import annotations

import datetime as dt
import functools
from zoneinfo import ZoneInfo

DAY = 86_400_000
MS = dt.timedelta(milliseconds=1)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LOCAL_EPOCH = dt.datetime(1970, 1, 1)


def ms(moment: dt.datetime) -> int:
    """An aware datetime as epoch milliseconds."""
    return (moment - EPOCH) // MS


def local(t: int, zone: str) -> dt.datetime:
    """The instant ``t`` (epoch ms) in ``zone``."""
    return (EPOCH + dt.timedelta(milliseconds=t)).astimezone(ZoneInfo(zone))


def wall(t: int, zone: str) -> int:
    """What the local clock of ``zone`` reads at ``t``: ms since 1970-01-01 00:00 there."""
    return (local(t, zone).replace(tzinfo=None) - LOCAL_EPOCH) // MS


def reading(w: int, zone: str) -> list[int]:
    """The instants at which the local clock reads ``w``: none (skipped), one or two."""
    naive = LOCAL_EPOCH + dt.timedelta(milliseconds=w)
    found = {ms(naive.replace(tzinfo=ZoneInfo(zone), fold=fold)) for fold in (0, 1)}
    return sorted(t for t in found if wall(t, zone) == w)


def jump_past(w: int, zone: str) -> int:
    """Where clocks jump past the skipped local time ``w``: the first instant reading more
    (PEP 495: the two folds of a skipped time take the offsets either side of the jump)."""
    naive = LOCAL_EPOCH + dt.timedelta(milliseconds=w)
    earlier, later = sorted(ms(naive.replace(tzinfo=ZoneInfo(zone), fold=f)) for f in (0, 1))
    assert wall(earlier, zone) < w <= wall(later, zone)
    while later - earlier > 1:
        middle = (earlier + later) // 2
        if wall(middle, zone) >= w:
            later = middle
        else:
            earlier = middle
    return later


def boundaries(zone: str, size: int, lowest: int, highest: int) -> list[int]:
    """The window starts whose local time (read, or jumped past) is in
    ``[lowest, highest]`` (local ms)."""
    found: set[int] = set()
    for w in range(-(-lowest // size) * size, highest + 1, size):
        times = reading(w, zone)
        if not times:
            found.add(jump_past(w, zone))
        elif size % DAY == 0:
            found.add(times[0])
        else:
            found.update(times)
    return sorted(found)


def window_of(zone: str, size: int, t: int) -> tuple[int, int]:
    """The window ``(start, end)`` that holds the instant ``t``."""
    here, margin = wall(t, zone), size + 3 * DAY
    found = boundaries(zone, size, here - margin, here + margin)
    return max(b for b in found if b <= t), min(b for b in found if b > t)


def windows_over(zone: str, size: int, lowest: int, highest: int) -> list[int]:
    """The window starts of every window that holds an instant of ``[lowest, highest]``,
    and the end of the last (epoch ms)."""
    margin = size + 3 * DAY
    found = boundaries(zone, size, wall(lowest, zone) - margin, wall(highest, zone) + margin)
    first = max(i for i, b in enumerate(found) if b <= lowest)
    last = min(i for i, b in enumerate(found) if b > highest)
    return found[first : last + 1]


@functools.lru_cache(maxsize=4096)
def changes(zone: str, year: int) -> tuple[int, ...]:
    """The instants in UTC ``year`` at which ``zone``'s offset changes (read every six hours;
    for placing test times near them, not as a reference)."""

    def offset(t: int) -> dt.timedelta | None:
        return local(t, zone).utcoffset()

    found = []
    t = ms(dt.datetime(year, 1, 1, tzinfo=dt.UTC))
    end = ms(dt.datetime(year + 1, 1, 1, tzinfo=dt.UTC))
    while t < end:
        a, b = t, t + 6 * 3_600_000
        if offset(a) != offset(b):
            while b - a > 1:
                middle = (a + b) // 2
                a, b = (middle, b) if offset(middle) == offset(a) else (a, middle)
            found.append(b)
        t += 6 * 3_600_000
    return tuple(found)
