"""The event-time example runs as its documentation says (``python -m
cutline.examples.clicks_per_minute WORKDIR``) on the tests' local Spark session: its counts per
user and minute are exact, and the late output is exactly the three stragglers."""

from __future__ import annotations

import datetime as dt
import json
import runpy
import sys
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pytest

LATE = [
    {"user": "dev", "ts": dt.datetime(2024, 5, 1, 12, 1, 12)},
    {"user": "dev", "ts": dt.datetime(2024, 5, 1, 12, 1, 48)},
    {"user": "dev", "ts": dt.datetime(2024, 5, 1, 12, 2, 31)},
]
"""The stragglers: the last lines of the last file, minutes behind the watermark."""


def read_input(folder: Path) -> list[list[dict]]:
    """Every file's clicks, in the order the source reads them (by name), ``ts`` as the job
    reads it (UTC, no time zone)."""
    files = []
    for path in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows:
            stamp = dt.datetime.fromisoformat(row["ts"])
            assert stamp.tzinfo == dt.UTC and stamp.microsecond == 0
            row["ts"] = stamp.replace(tzinfo=None)
        files.append(rows)
    return files


def published(folder: Path) -> list[dict]:
    return list(ds.dataset(str(folder), format="parquet").to_table().to_pylist())


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import:RuntimeWarning")
def test_clicks_per_minute_counts_every_on_time_click_and_sends_the_stragglers_to_late(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "work"
    monkeypatch.setattr(sys, "argv", ["clicks_per_minute", str(workdir)])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("cutline.examples.clicks_per_minute", run_name="__main__", alter_sys=True)
    out = capsys.readouterr().out
    assert exit_.value.code == 0, out

    files = read_input(workdir / "clicks")
    assert [path.name for path in sorted((workdir / "clicks").glob("*"))] == [
        "clicks-0.jsonl",
        "clicks-1.jsonl",
        "clicks-2.jsonl",
    ]
    assert files[-1][-3:] == LATE  # the end of the last file
    on_time = [click for rows in files for click in rows][:-3]
    assert len(on_time) == 722
    # within each file, no click more than 2 s behind one before it: none of them is late
    for rows in files:
        highest = rows[0]["ts"]
        for click in rows[:-3] if rows is files[-1] else rows:
            assert click["ts"] >= highest - dt.timedelta(seconds=2)
            highest = max(highest, click["ts"])

    minute = dt.timedelta(minutes=1)
    expected = Counter()
    for click in on_time:
        start = click["ts"].replace(second=0)
        expected[(click["user"], start, start + minute)] += 1
    counts = published(workdir / "counts")
    windows = Counter((r["user"], r["window_start"], r["window_end"]) for r in counts)
    assert set(windows.values()) == {1}, "every window published once"
    assert {(r["user"], r["window_start"], r["window_end"]): r["count"] for r in counts} == expected
    assert len(counts) == 50 and sum(r["count"] for r in counts) == 722
    assert sorted(published(workdir / "late"), key=lambda r: r["ts"]) == LATE

    # what it printed: dev's minutes 12:01 and 12:02 without the stragglers, and its checks
    assert "minute    ann  bob  cho  dev  eve" in out
    assert "12:01      19   24   13    6   22" in out
    assert "12:02      15   18   13    9   13" in out
    assert "  dev  12:01:12  (its minute 12:01 had fired)" in out
    assert "725 clicks of 5 users in 3 JSON-lines files" in out
    assert (
        "722 clicks counted in 50 windows, 3 late; the window operator counted 3 late records"
        in out
    )
    assert "each window published once: True" in out
    assert "every count equal to the count in plain Python, stragglers left out: True" in out
    assert "the late clicks are exactly the 3 stragglers: True" in out


def test_the_example_refuses_a_workdir_that_is_not_empty(tmp_path: Path) -> None:
    from cutline.examples.clicks_per_minute import main

    (tmp_path / "something").write_text("")
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path)])
    assert exit_.value.code == 2
