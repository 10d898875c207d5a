"""Windows in a time zone (``Tumbling(size, time_zone=...)``): where they start and end across
daylight saving time and the other changes of a zone's offset, written out by hand for real
days of real zones, and for any instant of any zone against their definition computed one
local time at a time (``tests/zone_windows.py``): every instant in exactly one window, each
window ending where the next starts."""

from __future__ import annotations

import datetime as dt
import itertools
import random
import threading
import zoneinfo
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.runtime.eventtime import zones
from cutline.runtime.eventtime.assigners import Tumbling, assign, end_of, ends_of, starts_of
from cutline.runtime.eventtime.timestamps import EventTimeError
from zone_windows import DAY, boundaries, changes, local, ms, wall, window_of

HOUR = 3_600_000
SIZES = ["15 min", "30 min", "1 h", "2 h", "3 h", "4 h", "6 h", "8 h", "12 h", "1 d", "2 d", "7 d"]
ZONES = sorted(zoneinfo.available_timezones())


def at(zone: str, when: str) -> int:
    """The first instant the local clock of ``zone`` reads ``when`` (``"2024-03-10T01:00"``)."""
    return ms(dt.datetime.fromisoformat(when).replace(tzinfo=ZoneInfo(zone)))


def shown(zone: str, size: str, first: str, count: int) -> list[str]:
    """The ``count`` windows from the one holding local time ``first``, each as its local
    start (month, day, time and offset) and its length in hours."""
    assigner = Tumbling(size, time_zone=zone)
    start = starts_of(assigner, at(zone, first))[0]
    found = []
    for _ in range(count):
        end = end_of(assigner, start)
        found.append(
            f"{local(start, zone).isoformat(timespec='minutes')[5:]} {(end - start) / HOUR:g}h"
        )
        start = end
    return found


DAYS = [
    # New York, 2024-03-10: 02:00 EST jumps to 03:00 EDT, so no hour starts at 02:00 and the
    # one from 01:00 (EST) lasts one hour, to 03:00 EDT
    (
        "America/New_York",
        "1 h",
        "2024-03-10T00:00",
        "03-10T00:00-05:00 1h, 03-10T01:00-05:00 1h, 03-10T03:00-04:00 1h, 03-10T04:00-04:00 1h",
    ),
    # 2024-11-03: 02:00 EDT goes back to 01:00 EST: two hours read 01:00, one hour each
    (
        "America/New_York",
        "1 h",
        "2024-11-03T00:00",
        "11-03T00:00-04:00 1h, 11-03T01:00-04:00 1h, 11-03T01:00-05:00 1h, 11-03T02:00-05:00 1h",
    ),
    (
        "America/New_York",
        "30 min",
        "2024-11-03T01:00",
        "11-03T01:00-04:00 0.5h, 11-03T01:30-04:00 0.5h, 11-03T01:00-05:00 0.5h, "
        "11-03T01:30-05:00 0.5h, 11-03T02:00-05:00 0.5h",
    ),
    ("America/New_York", "6 h", "2024-03-10T00:00", "03-10T00:00-05:00 5h, 03-10T06:00-04:00 6h"),
    ("America/New_York", "6 h", "2024-11-03T00:00", "11-03T00:00-04:00 7h, 11-03T06:00-05:00 6h"),
    (
        "America/New_York",
        "1 d",
        "2024-03-09T00:00",
        "03-09T00:00-05:00 24h, 03-10T00:00-05:00 23h, 03-11T00:00-04:00 24h",
    ),
    (
        "America/New_York",
        "1 d",
        "2024-11-02T00:00",
        "11-02T00:00-04:00 24h, 11-03T00:00-04:00 25h, 11-04T00:00-05:00 24h",
    ),
    # Berlin: 02:00 CET to 03:00 CEST on 2024-03-31, 03:00 CEST back to 02:00 CET on 10-27
    (
        "Europe/Berlin",
        "6 h",
        "2024-03-31T00:00",
        "03-31T00:00+01:00 5h, 03-31T06:00+02:00 6h, 03-31T12:00+02:00 6h, "
        "03-31T18:00+02:00 6h, 04-01T00:00+02:00 6h",
    ),
    (
        "Europe/Berlin",
        "6 h",
        "2024-10-27T00:00",
        "10-27T00:00+02:00 7h, 10-27T06:00+01:00 6h, 10-27T12:00+01:00 6h, "
        "10-27T18:00+01:00 6h, 10-28T00:00+01:00 6h",
    ),
    (
        "Europe/Berlin",
        "1 h",
        "2024-10-27T01:00",
        "10-27T01:00+02:00 1h, 10-27T02:00+02:00 1h, 10-27T02:00+01:00 1h, 10-27T03:00+01:00 1h",
    ),
    (
        "Europe/Berlin",
        "8 h",
        "2024-10-26T16:00",
        "10-26T16:00+02:00 8h, 10-27T00:00+02:00 9h, 10-27T08:00+01:00 8h",
    ),
    # Kolkata (+05:30): hours from local midnight, which is 18:30 UTC
    ("Asia/Kolkata", "1 h", "2024-06-01T00:00", "06-01T00:00+05:30 1h, 06-01T01:00+05:30 1h"),
    ("Asia/Kolkata", "1 d", "2024-06-01T00:00", "06-01T00:00+05:30 24h"),
    # Lord Howe Island moves by half an hour: 02:00 +10:30 to 02:30 +11:00 on 2024-10-06
    # (the hour from 01:00 ends at the jump, and 02:30 to 03:00 is half an hour), 02:00 +11:00
    # back to 01:30 +10:30 on 2024-04-07 (the hour from 01:00 is an hour and a half long)
    (
        "Australia/Lord_Howe",
        "1 h",
        "2024-10-06T00:00",
        "10-06T00:00+10:30 1h, 10-06T01:00+10:30 1h, 10-06T02:30+11:00 0.5h, 10-06T03:00+11:00 1h",
    ),
    (
        "Australia/Lord_Howe",
        "1 h",
        "2024-04-07T00:00",
        "04-07T00:00+11:00 1h, 04-07T01:00+11:00 1.5h, 04-07T02:00+10:30 1h",
    ),
    (
        "Australia/Lord_Howe",
        "30 min",
        "2024-04-07T01:00",
        "04-07T01:00+11:00 0.5h, 04-07T01:30+11:00 0.5h, 04-07T01:30+10:30 0.5h, "
        "04-07T02:00+10:30 0.5h",
    ),
    (
        "Australia/Lord_Howe",
        "1 d",
        "2024-10-05T00:00",
        "10-05T00:00+10:30 24h, 10-06T00:00+10:30 23.5h, 10-07T00:00+11:00 24h",
    ),
    # Havana changes at midnight: 00:00 jumps to 01:00 on 2024-03-10 (that day starts at the
    # jump), 01:00 goes back to 00:00 on 2024-11-03 (that day starts at the first midnight)
    (
        "America/Havana",
        "1 d",
        "2024-03-09T00:00",
        "03-09T00:00-05:00 24h, 03-10T01:00-04:00 23h, 03-11T00:00-04:00 24h",
    ),
    (
        "America/Havana",
        "1 d",
        "2024-11-02T00:00",
        "11-02T00:00-04:00 24h, 11-03T00:00-04:00 25h, 11-04T00:00-05:00 24h",
    ),
    (
        "America/Havana",
        "2 h",
        "2024-03-09T22:00",
        "03-09T22:00-05:00 2h, 03-10T01:00-04:00 1h, 03-10T02:00-04:00 2h",
    ),
    (
        "America/Havana",
        "1 h",
        "2024-11-02T23:00",
        "11-02T23:00-04:00 1h, 11-03T00:00-04:00 1h, 11-03T00:00-05:00 1h, 11-03T01:00-05:00 1h",
    ),
    (
        "America/Havana",
        "12 h",
        "2024-11-02T12:00",
        "11-02T12:00-04:00 12h, 11-03T00:00-04:00 1h, 11-03T00:00-05:00 12h, 11-03T12:00-05:00 12h",
    ),
    # Santiago: 24:00 -03 back to 23:00 -04 on 2024-04-06, 24:00 -04 to 01:00 -03 on 09-08
    ("America/Santiago", "1 d", "2024-04-06T00:00", "04-06T00:00-03:00 25h, 04-07T00:00-04:00 24h"),
    ("America/Santiago", "1 d", "2024-09-07T00:00", "09-07T00:00-04:00 24h, 09-08T01:00-03:00 23h"),
    # Samoa skipped 2011-12-30: the day after the 29th is the 31st
    ("Pacific/Apia", "1 d", "2011-12-29T00:00", "12-29T00:00-10:00 24h, 12-31T00:00+14:00 24h"),
]


@pytest.mark.parametrize(("zone", "size", "first", "windows"), DAYS)
def test_windows_across_changes_of_offset_are_the_written_ones(
    zone: str, size: str, first: str, windows: str
) -> None:
    assert ", ".join(shown(zone, size, first, windows.count(",") + 1)) == windows


@pytest.mark.parametrize(
    ("zone", "size", "dates"),
    [
        ("America/New_York", "1 h", ("2024-03-09", "2024-03-12")),
        ("America/New_York", "1 h", ("2024-11-02", "2024-11-05")),
        ("America/New_York", "15 min", ("2024-11-02", "2024-11-04")),
        ("Europe/Berlin", "6 h", ("2024-03-30", "2024-04-02")),
        ("Europe/Berlin", "3 h", ("2024-10-26", "2024-10-29")),
        ("Asia/Kolkata", "30 min", ("2024-05-01", "2024-05-03")),
        ("Australia/Lord_Howe", "1 h", ("2024-04-06", "2024-04-09")),
        ("Australia/Lord_Howe", "15 min", ("2024-10-05", "2024-10-07")),
        ("America/Havana", "1 d", ("2024-03-08", "2024-03-12")),
        ("America/Havana", "4 h", ("2024-11-01", "2024-11-05")),
        ("Asia/Beirut", "1 d", ("2024-10-25", "2024-10-29")),
        ("America/Santiago", "2 d", ("2024-09-01", "2024-09-15")),
    ],
)
def test_every_instant_of_whole_local_days_is_in_exactly_one_window(
    zone: str, size: str, dates: tuple[str, str]
) -> None:
    """The windows over the days, one after the other from the first: starts strictly
    increasing, each ending where the next starts, the same as the definition's; every
    minute of the days and random milliseconds are in the one of them that holds them."""
    assigner = Tumbling(size, time_zone=zone)
    lo, hi = at(zone, dates[0] + "T00:00"), at(zone, dates[1] + "T00:00") - 1
    starts = [starts_of(assigner, lo)[0]]
    while starts[-1] <= hi:
        starts.append(end_of(assigner, starts[-1]))
    ends = ends_of(assigner, np.array(starts[:-1], dtype=np.int64))
    assert ends.tolist() == starts[1:]
    assert all(a < b for a, b in itertools.pairwise(starts))
    margin = assigner.size + 3 * DAY
    defined = boundaries(zone, assigner.size, wall(lo, zone) - margin, wall(hi, zone) + margin)
    assert [b for b in defined if starts[0] <= b <= starts[-1]] == starts
    rng = random.Random(size)
    times = np.array(
        list(range(lo, hi, 60_000)) + [rng.randrange(lo, hi) for _ in range(3000)] + [hi],
        dtype=np.int64,
    )
    index, found = assign(assigner, times)
    assert index.tolist() == list(range(len(times)))
    holding = np.searchsorted(np.array(starts), times, "right") - 1
    assert found.tolist() == [starts[i] for i in holding]
    assert (times < ends[holding]).all()


def check(assigner: Tumbling, zone: str, t: int) -> None:
    """``t``'s window as the definition has it, and its neighbours touching it."""
    start, end = window_of(zone, assigner.size, t)
    assert starts_of(assigner, t) == [start]
    assert assign(assigner, np.array([t, start, end - 1]))[1].tolist() == [start] * 3
    assert end_of(assigner, start) == end
    assert starts_of(assigner, end) == [end]  # (the next window starts where this one ends)
    assert end_of(assigner, starts_of(assigner, start - 1)[0]) == start


@settings(max_examples=150, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    size=st.sampled_from(SIZES),
    t=st.integers(
        ms(dt.datetime(1850, 1, 1, tzinfo=dt.UTC)), ms(dt.datetime(2100, 1, 1, tzinfo=dt.UTC))
    ),
)
def test_the_window_of_any_instant_in_any_zone_is_the_definition(
    zone: str, size: str, t: int
) -> None:
    check(Tumbling(size, time_zone=zone), zone, t)


@settings(max_examples=150, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    size=st.sampled_from(SIZES),
    year=st.integers(1880, 2100),
    data=st.data(),
)
def test_the_window_of_an_instant_near_a_change_of_offset_is_the_definition(
    zone: str, size: str, year: int, data: st.DataObject
) -> None:
    """Times within a window and a day of a change (any zone, 1880-2100: standard times
    set up, wars, the changes after 2037 that the tz database has as a rule)."""
    assigner = Tumbling(size, time_zone=zone)
    near = changes(zone, year) or (ms(dt.datetime(year, 7, 1, tzinfo=dt.UTC)),)
    change = data.draw(st.sampled_from(near))
    reach = assigner.size + DAY
    check(assigner, zone, change + data.draw(st.integers(-reach, reach)))


def test_windows_of_a_local_clock_in_step_with_utc_are_the_epochs_shifted() -> None:
    """Where every offset of a zone is a multiple of the size, its windows are those aligned
    to the epoch: 5 minutes in New York, half hours in Kolkata; else, for a zone of one
    offset, those shifted by it: Kolkata's hours start at half past the UTC ones, the days
    of a fixed offset of -03:00 at 03:00 UTC."""
    rng = random.Random(5)
    times = np.array(
        [
            rng.randrange(
                ms(dt.datetime(2000, 1, 1, tzinfo=dt.UTC)),
                ms(dt.datetime(2090, 1, 1, tzinfo=dt.UTC)),
            )
            for _ in range(2000)
        ],
        dtype=np.int64,
    )
    for zone, size, offset in [
        ("America/New_York", "5 min", 0),
        ("Asia/Kolkata", "30 min", 0),
        ("Asia/Kolkata", "1 h", 30 * 60_000),
        ("+05:30", "1 h", 30 * 60_000),
        ("-03:00", "1 d", 3 * HOUR),
        ("UTC", "1 d", 0),
    ]:
        starts = assign(Tumbling(size, time_zone=zone), times)[1]
        epochs = assign(Tumbling(size, offset=dt.timedelta(milliseconds=offset)), times)[1]
        assert (starts == epochs).all(), (zone, size)


def test_day_windows_follow_the_rules_of_the_tz_database_after_2037() -> None:
    """The tz database's table of New York ends in 2037, its rule goes on: the days of July
    2040 start at 04:00 UTC (EDT), those of January at 05:00 (Arrow's own arithmetic puts
    every day after 2037 at 05:00)."""
    assigner = Tumbling("1 d", time_zone="America/New_York")
    summer = ms(dt.datetime(2040, 7, 1, 12, tzinfo=dt.UTC))
    winter = ms(dt.datetime(2041, 1, 1, 12, tzinfo=dt.UTC))
    assert starts_of(assigner, summer) == [ms(dt.datetime(2040, 7, 1, 4, tzinfo=dt.UTC))]
    assert starts_of(assigner, winter) == [ms(dt.datetime(2041, 1, 1, 5, tzinfo=dt.UTC))]


def test_threads_asking_about_spans_far_apart_get_what_one_would() -> None:
    """Window operators of several subtasks share a zone's clock: each extends it in turn."""
    zone, size = "Europe/Lisbon", Tumbling("1 h").size
    zones._CLOCKS.pop(zone, None)  # (a clock that has read nothing yet)
    rng = random.Random(9)
    spans = [
        np.array([base + rng.randrange(20 * DAY) for _ in range(500)], dtype=np.int64)
        for base in (rng.randrange(-60 * 365 * DAY, 100 * 365 * DAY) for _ in range(16))
    ]
    found: dict[int, list[int]] = {}

    def ask(i: int) -> None:
        found[i] = zones.window_starts(zone, size, spans[i]).tolist()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(spans))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, times in enumerate(spans):
        assert found[i][:20] == [window_of(zone, size, int(t))[0] for t in times[:20]]
        assert found[i] == zones.window_starts(zone, size, times).tolist()


def test_no_zone_changes_its_offset_twice_within_a_day() -> None:
    """What the clock's reading of offsets once a day relies on (``zones``): in the
    installed tz database, two changes of a zone's offset are more than a day apart (the
    rules it has for the years after its table change twice a year, months apart)."""
    from zoneinfo import _zoneinfo  # (the pure Python ZoneInfo keeps its table in reach)

    closest = []
    for name in ZONES:
        info = _zoneinfo.ZoneInfo.no_cache(name)
        offsets = [t.utcoff for t in info._ttinfos]
        previous = info._tti_before.utcoff if info._tti_before else None
        last = None
        for t, offset in zip(info._trans_utc, offsets, strict=True):
            if offset != previous:
                if last is not None:
                    closest.append((t - last, name))
                last = t
            previous = offset
    assert min(closest)[0] > 86_400, min(closest)


def test_times_too_far_from_1970_are_refused_naming_the_windows() -> None:
    assigner = Tumbling("1 h", time_zone="Europe/Paris")
    with pytest.raises(EventTimeError, match=r"Tumbling\(1h, time_zone=Europe/Paris\): the time"):
        assign(assigner, np.array([0, 300_000 * 365 * DAY], dtype=np.int64))
    assert assign(assigner, np.array([], dtype=np.int64))[1].tolist() == []
