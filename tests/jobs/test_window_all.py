"""``window_all``: windows of the whole stream, not per key (Flink's ``windowAll``): exact
per-window results of the built-ins (the vectorized path, through a key column of its own
that no output shows) and of a user's function (given ``None`` as the key), at parallelism 2;
late records come out as they came in."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cutline import EventTime, StreamEnvironment, Tumbling, Window, testing
from cutline.runtime.task.local import ThreadLauncher

START = dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)


def write(tmp_path: Path, late: bool = False) -> list[dict[str, Any]]:
    """500 records over 5 minutes in two files, and (``late``) one an hour before them last:
    late once the watermark passed it (a job of parallelism 1: its one subtask holds the
    watermark at a file's lowest time before reading it)."""
    rows = [
        {"user": f"u{i % 5}", "amount": i % 7, "ts": START + dt.timedelta(seconds=(i * 13) % 300)}
        for i in range(500)
    ]
    if late:
        rows.append({"user": "late", "amount": 100, "ts": START - dt.timedelta(hours=1)})
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:250]), tmp_path / "in" / "a.parquet")
    pq.write_table(pa.Table.from_pylist(rows[250:]), tmp_path / "in" / "b.parquet")
    return rows


def minutes(rows: list[dict[str, Any]]) -> tuple[Counter[dt.datetime], Counter[dt.datetime]]:
    count: Counter[dt.datetime] = Counter()
    total: Counter[dt.datetime] = Counter()
    for r in rows:
        if r["user"] != "late":
            count[r["ts"].replace(second=0)] += 1
            total[r["ts"].replace(second=0)] += r["amount"]
    return count, total


def biggest(key: Any, window: Window, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"key": key, "start": window.start, "most": max(r["amount"] for r in records)}]


def test_windows_of_the_whole_stream_count_sum_and_process_exactly(tmp_path: Path) -> None:
    rows = write(tmp_path)
    env = StreamEnvironment(
        2, checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.05, batch_size=30
    )
    clicks = env.read_parquet(
        tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness="5 min")
    )
    counts = clicks.window_all(Tumbling("1 min")).count(name="count")
    counts.collect("counts")
    clicks.window_all(Tumbling("1 min")).sum("amount").collect("sums")  # (unnamed: one key)
    clicks.window_all(Tumbling("1 min")).process(biggest, name="most").collect("most")
    result = testing.execute(env, launcher=ThreadLauncher())
    count, total = minutes(rows)
    assert {r["window_start"]: r["count"] for r in result.collected["counts"]} == count
    assert {r["window_start"]: r["amount"] for r in result.collected["sums"]} == total
    assert all(
        set(r) == {"window_start", "window_end", "count"} for r in result.collected["counts"]
    )
    most = result.collected["most"]
    assert {r["key"] for r in most} == {None} and len(most) == len(count)


def test_late_records_of_a_built_in_come_out_as_they_came(tmp_path: Path) -> None:
    rows = write(tmp_path, late=True)
    env = StreamEnvironment(1, checkpoint_dir=str(tmp_path / "ck"), batch_size=30)
    clicks = env.read_parquet(
        tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness="5 min")
    )
    counts = clicks.window_all(Tumbling("1 min")).count()
    counts.collect("counts")
    counts.late().collect("late")
    result = testing.execute(env, launcher=ThreadLauncher())
    assert result.collected["late"] == [rows[-1]]  # (no column of window_all's)
    count, _ = minutes(rows)
    assert {r["window_start"]: r["count"] for r in result.collected["counts"]} == count
