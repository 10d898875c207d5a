"""Integer event times in another unit than milliseconds (``EventTime(unit=)``): seconds,
microseconds or nanoseconds since the epoch give the same windows as milliseconds would, and
``window_start`` and ``window_end`` come back in the column's own unit. Integers that look
like seconds, read as milliseconds without a unit said (windows in 1970), are warned about."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline import EventTime, EventTimeError, StreamEnvironment, Tumbling, testing
from cutline.runtime.task.local import ThreadLauncher

START = 1_714_564_800  # 2024-05-01 12:00:00 UTC, in seconds
PER_MS = {"s": 1 / 1000, "ms": 1, "us": 1000, "ns": 1_000_000}


def clicks(tmp_path: Path, unit: str) -> list[dict[str, Any]]:
    """300 clicks over ten minutes, out of order, their times integers of ``unit``."""
    rows = [
        {"user": f"u{i % 3}", "at": int((START * 1000 + (i * 7919) % 600_000) * PER_MS[unit])}
        for i in range(300)
    ]
    (tmp_path / "in").mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in" / "clicks.parquet")
    return rows


def per_minute(rows: list[dict[str, Any]], unit: str) -> Counter[tuple[str, int]]:
    minute = int(60_000 * PER_MS[unit])
    return Counter((r["user"], r["at"] - r["at"] % minute) for r in rows)


def env_of(tmp_path: Path, checkpoints: str = "ck") -> StreamEnvironment:
    return StreamEnvironment(
        2, checkpoint_dir=str(tmp_path / checkpoints), checkpoint_interval=0.05, batch_size=40
    )


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_integer_times_of_any_unit_give_the_windows_and_come_back_in_it(
    tmp_path: Path, unit: str
) -> None:
    rows = clicks(tmp_path, unit)
    env = env_of(tmp_path)
    counts = (
        env.read_parquet(
            tmp_path / "in", event_time=EventTime("at", unit=unit, max_out_of_orderness="10 min")
        )
        .key_by("user")
        .window(Tumbling("1 min"))
        .count()
    )
    counts.collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    found = Counter({(r["user"], r["window_start"]): r["count"] for r in result.output})
    assert found == per_minute(rows, unit)
    minute = int(60_000 * PER_MS[unit])
    assert all(r["window_end"] - r["window_start"] == minute for r in result.output)


def test_assign_timestamps_takes_the_unit_too(tmp_path: Path) -> None:
    rows = clicks(tmp_path, "ns")
    env = env_of(tmp_path)
    stream = env.read_parquet(tmp_path / "in").assign_timestamps(
        EventTime("at", unit="ns", max_out_of_orderness="10 min")
    )
    stream.key_by("user").window(Tumbling("1 min")).count().collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    found = Counter({(r["user"], r["window_start"]): r["count"] for r in result.output})
    assert found == per_minute(rows, "ns")


def test_seconds_read_as_milliseconds_are_warned_about_naming_the_unit_to_give(
    tmp_path: Path,
) -> None:
    clicks(tmp_path, "s")
    env = env_of(tmp_path)
    env.read_parquet(tmp_path / "in", event_time="at").key_by("user").window(
        Tumbling("1 min")
    ).count().collect()
    events: list[str] = []
    testing.execute(
        env, launcher=ThreadLauncher(), listener=lambda kind, message: events.append(message)
    )
    said = [m for m in events if "give EventTime('at', unit='s')" in m]
    assert said, events
    assert (
        "holds integers like 17145" in said[0] and "read as epoch milliseconds: 1970-01-" in said[0]
    )
    events.clear()
    env = env_of(tmp_path, "ck2")  # (said to be seconds: no warning)
    env.read_parquet(tmp_path / "in", event_time=EventTime("at", unit="s")).key_by("user").window(
        Tumbling("1 min")
    ).count().collect()
    testing.execute(
        env, launcher=ThreadLauncher(), listener=lambda kind, message: events.append(message)
    )
    assert not [m for m in events if "unit='s'" in m]


def test_a_unit_that_cannot_be_is_refused_when_the_job_is_built(tmp_path: Path) -> None:
    clicks(tmp_path, "s")
    pq.write_table(
        pa.table({"user": ["a"], "ts": pa.array([0], pa.timestamp("ms"))}), tmp_path / "t.parquet"
    )
    env = env_of(tmp_path)
    with pytest.raises(EventTimeError, match=r"unit='min': use 's', 'ms', 'us' or 'ns'"):
        env.read_parquet(tmp_path / "in", event_time=EventTime("at", unit="min"))
    with pytest.raises(
        EventTimeError, match=r"is for integer times: the column 'ts' is timestamp\[ms\]"
    ):
        env.read_parquet(tmp_path / "t.parquet", event_time=EventTime("ts", unit="s"))
    with pytest.raises(ValueError, match=r"event_time_unit= need event_time="):
        env.read_parquet(tmp_path / "in", event_time_unit="s")
    seconds = env.read_parquet(tmp_path / "in", event_time=EventTime("at", unit="s")).key_by("user")
    with pytest.raises(ValueError, match=r"its size \(500 ms\) is no whole number of seconds"):
        seconds.window(Tumbling("500ms"))
