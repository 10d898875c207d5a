"""Watermark generators (Flink's ``WatermarkGenerator``): ``watermarks=`` on a source or
``assign_timestamps`` instead of ``max_out_of_orderness=``: ``Monotonous()`` for records in
order, ``BoundedOutOfOrderness``, and one of the user's own, each a copy per split, give
exact windows; what a generator promises never moves the watermark back (a property over
random promises, ``SplitWatermarks.promised``)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cutline import (
    BoundedOutOfOrderness,
    EventTime,
    Monotonous,
    StreamEnvironment,
    Tumbling,
    WatermarkGenerator,
    testing,
)
from cutline.protocol.watermarks import EmitWatermark, SplitWatermarks
from cutline.runtime.task.local import ThreadLauncher

START = dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)


class EveryOtherRecord(WatermarkGenerator):
    """A user's own: looks at every record (``on_event``), promises the latest time minus
    ``slack`` ms, and only every other batch (a promise may wait)."""

    def __init__(self, slack: int) -> None:
        self.slack, self.latest, self.batches, self.seen = slack, None, 0, 0

    def on_event(self, timestamp: int, record: Any) -> None:
        assert isinstance(record, dict) and "user" in record
        self.seen += 1
        self.latest = timestamp if self.latest is None else max(self.latest, timestamp)

    def on_periodic_emit(self) -> int | None:
        self.batches += 1
        if self.latest is None or self.batches % 2:
            return None
        return self.latest - self.slack - 1


def write(tmp_path: Path) -> list[dict[str, Any]]:
    """600 records in order of their time over 15 minutes, in two files."""
    rows = [
        {"user": f"u{i % 3}", "ts": START + dt.timedelta(seconds=i * 900 // 600)}
        for i in range(600)
    ]
    (tmp_path / "in").mkdir()
    half = len(rows) // 2
    pq.write_table(pa.Table.from_pylist(rows[:half]), tmp_path / "in" / "a.parquet")
    pq.write_table(pa.Table.from_pylist(rows[half:]), tmp_path / "in" / "b.parquet")
    return rows


def counts(rows: list[dict[str, Any]]) -> Counter[tuple[str, dt.datetime]]:
    return Counter((r["user"], r["ts"].replace(second=0)) for r in rows)


@pytest.mark.parametrize(
    "generator", [Monotonous(), BoundedOutOfOrderness("30s"), EveryOtherRecord(0)]
)
def test_a_generator_on_the_source_gives_exact_windows(
    tmp_path: Path, generator: WatermarkGenerator
) -> None:
    rows = write(tmp_path)
    env = StreamEnvironment(
        2, checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.05, batch_size=25
    )
    env.read_parquet(tmp_path / "in", event_time=EventTime("ts", watermarks=generator)).key_by(
        "user"
    ).window(Tumbling("1 min")).count().collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    found = Counter({(r["user"], r["window_start"]): r["count"] for r in result.output})
    assert found == counts(rows)
    assert result.metrics is not None and result.metrics.late == {}


def test_a_generator_on_assign_timestamps_gives_exact_windows(tmp_path: Path) -> None:
    rows = write(tmp_path)
    env = StreamEnvironment(1, checkpoint_dir=str(tmp_path / "ck"), batch_size=25)
    env.read_parquet(tmp_path / "in").assign_timestamps(
        EventTime("ts", watermarks=EveryOtherRecord(1000))
    ).key_by("user").window(Tumbling("1 min")).count().collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    found = Counter({(r["user"], r["window_start"]): r["count"] for r in result.output})
    assert found == counts(rows)


def test_a_generator_is_checked_when_the_job_is_built(tmp_path: Path) -> None:
    write(tmp_path)
    env = StreamEnvironment(1, checkpoint_dir=str(tmp_path / "ck"))
    with pytest.raises(TypeError, match=r"watermarks= takes a WatermarkGenerator .* not int"):
        env.read_parquet(tmp_path / "in", event_time=EventTime("ts", watermarks=5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"give max_out_of_orderness= or watermarks=, not both"):
        env.read_parquet(
            tmp_path / "in",
            event_time=EventTime("ts", watermarks=Monotonous(), max_out_of_orderness="1s"),
        )
    with pytest.raises(ValueError, match=r"watermarks= need event_time=: write event_time="):
        env.read_parquet(tmp_path / "in", watermarks=Monotonous())


@given(
    promises=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.one_of(st.none(), st.integers(-100, 100))),
        max_size=40,
    )
)
def test_promises_never_move_the_watermark_back(promises: list[tuple[str, int | None]]) -> None:
    """Whatever two splits' generators promise, in any order, the watermarks emitted only
    increase and never pass the least of the splits' highest promises so far."""
    splits: SplitWatermarks[str] = SplitWatermarks(bound=0)
    splits.split_added("a")
    splits.split_added("b")
    emitted: list[int] = []
    held: dict[str, int] = {}
    for split, promise in promises:
        for action in splits.promised(split, promise, 0.0):
            if isinstance(action, EmitWatermark):
                emitted.append(action.watermark)
        if promise is not None:
            held[split] = max(held.get(split, promise), promise)
    assert emitted == sorted(set(emitted))
    if emitted:
        assert len(held) == 2 and emitted[-1] == min(held.values())
