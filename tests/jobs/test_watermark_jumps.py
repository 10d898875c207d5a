"""A record far ahead of its split (the year 9999 among records of 2024) would move the
watermark there and make every later record late, silently. With ``EventTime(max_jump=)`` the
source warns, naming it, or (``on_error="dead_letter"``) sends it to the dead letters, and
the windows come out as without it."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline import EventTime, StreamEnvironment, Tumbling, testing
from cutline.runtime.eventtime.watermarks import jumps
from cutline.runtime.task.local import ThreadLauncher

START = dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)
DAY = 86_400_000


def write_clicks(tmp_path: Path) -> list[dict[str, Any]]:
    rows = [
        {"user": f"u{i % 3}", "ts": START + dt.timedelta(seconds=(i * 7) % 600)} for i in range(400)
    ]
    rows.insert(150, {"user": "u1", "ts": dt.datetime(9999, 1, 1, tzinfo=dt.UTC)})
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in" / "clicks.parquet")
    return rows


def job(
    tmp_path: Path, folder: str, max_jump: str | None = None, **options: Any
) -> tuple[StreamEnvironment, Any]:
    env = StreamEnvironment(
        1,
        checkpoint_dir=str(tmp_path / folder),
        checkpoint_interval=0.05,
        batch_size=50,
        dead_letter_dir=str(tmp_path / f"{folder}-dead"),
    )
    counts = (
        env.read_parquet(
            tmp_path / "in",
            event_time=EventTime("ts", max_out_of_orderness="10 min", max_jump=max_jump),
            **options,
        )
        .key_by("user")
        .window(Tumbling("1 min"))
        .count(name="per_minute")
    )
    counts.collect()
    return env, counts


def expected(rows: list[dict[str, Any]]) -> Counter[tuple[str, dt.datetime]]:
    return Counter((r["user"], r["ts"].replace(second=0)) for r in rows if r["ts"].year == 2024)


def test_a_record_far_ahead_goes_to_the_dead_letters_and_the_windows_are_exact(
    tmp_path: Path,
) -> None:
    rows = write_clicks(tmp_path)
    env, _ = job(tmp_path, "ck", max_jump="1 d", on_error="dead_letter")
    result = testing.execute(env, launcher=ThreadLauncher())
    found = Counter({(r["user"], r["window_start"]): r["count"] for r in result.output})
    assert found == expected(rows)
    assert result.metrics is not None and result.metrics.late == {}
    dead = [
        json.loads(line)
        for path in (tmp_path / "ck-dead").rglob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert len(dead) == 1 and "9999-01-01" in json.dumps(dead[0])
    assert "jumps more than max_jump=24h ahead of its latest" in json.dumps(dead[0])


def test_without_the_dead_letters_a_jump_is_warned_about_and_without_a_bound_nothing_is(
    tmp_path: Path,
) -> None:
    write_clicks(tmp_path)
    env, _ = job(tmp_path, "ck", max_jump="1 d")
    events: list[str] = []
    result = testing.execute(env, launcher=ThreadLauncher(), listener=lambda k, m: events.append(m))
    said = [m for m in events if "max_jump" in m]
    assert len(said) == 1 and "9999-01-01 00:00:00 UTC" in said[0]
    assert "the watermark follows them and later records may be late" in said[0]
    assert result.metrics is not None and result.metrics.late  # (it did: the warning's point)
    env, _ = job(tmp_path, "ck2")
    events.clear()
    testing.execute(env, launcher=ThreadLauncher(), listener=lambda k, m: events.append(m))
    assert not [m for m in events if "max_jump" in m]


@settings(max_examples=300, deadline=None)
@given(
    bulk=st.lists(st.integers(0, 10 * DAY), min_size=7, max_size=40),
    far=st.lists(st.integers(21 * DAY, 10**6 * DAY), max_size=3),
    latest=st.one_of(st.none(), st.integers(0, 10 * DAY)),
)
def test_jumps_are_exactly_the_records_beyond_a_gap_wider_than_the_bound(
    bulk: list[int], far: list[int], latest: int | None
) -> None:
    """Records of the bulk (all within 10 days, the most of the batch) are never jumps; those
    more than 10 days beyond the bulk and the split's latest are."""
    bound = 10 * DAY
    values = np.array(bulk + far, dtype=np.int64)
    mask = jumps(values, latest, bound)
    assert not mask[: len(bulk)].any()
    assert mask[len(bulk) :].all()
