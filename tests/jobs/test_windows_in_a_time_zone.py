"""Windows of a zone's local clock in whole jobs (``Tumbling(size, time_zone=...)``): the hours,
6-hour shifts and days of New York over the night its clocks go back (2024-11-03, 02:00 EDT
to 01:00 EST), on either state backend, counted exactly per window and published with the
window's start and end (timestamps, as the event-time column is)."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline import EventTime, State, StreamEnvironment, Tumbling, Window, testing
from cutline.runtime.task.local import ThreadLauncher
from zone_windows import ms, windows_over

NEW_YORK = ZoneInfo("America/New_York")
FIRST = dt.datetime(2024, 11, 2, 12, tzinfo=dt.UTC)
MINUTES = 48 * 60
"""A record every 5 minutes for two days from ``FIRST``, per user."""
WINDOWS = {"hours": "1 h", "shifts": "6 h", "days": "1 d"}


def write(tmp_path: Path) -> list[dict[str, Any]]:
    """Clicks of three users every 5 minutes (ten minutes out of order at most) in two
    Parquet files covering the same time."""
    rng = random.Random(3)
    rows = [
        {"user": f"u{u}", "ts": FIRST + dt.timedelta(minutes=m), "n": 1}
        for m in range(0, MINUTES, 5)
        for u in range(3)
    ]
    (tmp_path / "in").mkdir()
    for part in (0, 1):
        mine = rows[part::2]
        mine.sort(key=lambda r: r["ts"] + dt.timedelta(minutes=rng.randrange(10)))
        pq.write_table(pa.Table.from_pylist(mine), tmp_path / "in" / f"c{part}.parquet")
    return rows


def by_definition(rows: list[dict[str, Any]], size: str) -> dict[tuple[Any, ...], int]:
    """Each (user, window start, window end) and its count, its windows from
    ``tests/zone_windows.py``."""
    times = [ms(r["ts"]) for r in rows]
    starts = windows_over("America/New_York", Tumbling(size).size, min(times), max(times))
    found: Counter[tuple[Any, ...]] = Counter()
    for r, t in zip(rows, times, strict=True):
        i = max(i for i, s in enumerate(starts) if s <= t)
        found[(r["user"], utc(starts[i]), utc(starts[i + 1]))] += 1
    return dict(found)


def utc(t: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=t)


def local(moment: dt.datetime) -> str:
    return f"{moment.astimezone(NEW_YORK):%H:%M%z}"


def sizes(key: Any, window: Window, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user's function's view of a window: its start and end, and how many records."""
    return [{"user": key, "start": window.start, "end": window.end, "n": len(records)}]


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_hours_shifts_and_days_of_new_york_over_the_night_clocks_go_back(
    tmp_path: Path, backend: str
) -> None:
    rows = write(tmp_path)
    env = StreamEnvironment(
        2,
        checkpoint_dir=str(tmp_path / "ck"),
        checkpoint_interval=0.05,
        batch_size=40,
        state=State(backend=backend),
    )
    clicks = env.read_parquet(
        tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness="10 min")
    )
    keyed = clicks.key_by("user")
    for name, size in WINDOWS.items():
        keyed.window(Tumbling(size, time_zone="America/New_York")).count().collect(name)
    hours = Tumbling("1 h", time_zone="America/New_York")
    keyed.window(hours).process(sizes).collect("process")
    clicks.window_all(hours).count().collect("all")
    result = testing.execute(env, launcher=ThreadLauncher())
    assert result.restarts == []
    got = {}
    for name, size in WINDOWS.items():
        output = result.collected[name]
        got[name] = {(r["user"], r["window_start"], r["window_end"]): r["count"] for r in output}
        assert len(got[name]) == len(output), f"a window of {name} was published twice"
        assert got[name] == by_definition(rows, size), name
        assert sum(got[name].values()) == len(rows)
    midnight = dt.datetime(2024, 11, 3, 4, tzinfo=dt.UTC)  # (00:00 EDT)
    night = [
        (local(start), local(end), count)
        for (user, start, end), count in sorted(got["hours"].items())
        if user == "u0" and midnight <= start
    ]
    assert night[:4] == [  # (the hour that reads 01:00 twice: two windows of an hour each)
        ("00:00-0400", "01:00-0400", 12),
        ("01:00-0400", "01:00-0500", 12),
        ("01:00-0500", "02:00-0500", 12),
        ("02:00-0500", "03:00-0500", 12),
    ]
    assert got["shifts"][("u0", midnight, dt.datetime(2024, 11, 3, 11, tzinfo=dt.UTC))] == 7 * 12
    assert got["days"][("u0", midnight, dt.datetime(2024, 11, 4, 5, tzinfo=dt.UTC))] == 25 * 12
    whole = {(r["window_start"], r["window_end"]): r["count"] for r in result.collected["all"]}
    assert whole == {(s, e): 3 * n for (user, s, e), n in got["hours"].items() if user == "u0"}
    seen = {(r["user"], r["start"], r["end"]): r["n"] for r in result.collected["process"]}
    assert seen == got["hours"]  # (a process function's Window: the same start and end)
