"""``window(..., early=)`` in a whole job: however many early results a run gives (that
depends on how fast the machine is: none is promised), each window's last result is final and
exact, and every early one came before it and counted no more."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cutline import EventTime, FixedDelay, StreamEnvironment, Tumbling, testing
from cutline.runtime.task.local import ThreadLauncher

START = dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)


def test_each_window_ends_with_its_final_exact_result(tmp_path: Path) -> None:
    rows = [
        {"user": f"u{i % 4}", "ts": START + dt.timedelta(seconds=(i * 11) % 600)}
        for i in range(2000)
    ]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in" / "clicks.parquet")
    env = StreamEnvironment(
        2, checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.05, batch_size=20
    )
    clicks = env.read_parquet(
        tmp_path / "in",
        event_time=EventTime("ts", max_out_of_orderness="10 min"),
        rate_limit=20_000,
    )
    clicks.key_by("user").window(Tumbling("1 min"), early="20ms").count().collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    wanted = Counter((r["user"], r["ts"].replace(second=0)) for r in rows)
    last: dict[tuple[str, dt.datetime], dict] = {}
    for record in result.output:
        window = (record["user"], record["window_start"])
        assert window not in last or not last[window]["final"], "nothing after the final one"
        assert record["count"] <= wanted[window]
        last[window] = record
    assert {w: r["count"] for w, r in last.items()} == wanted
    assert all(r["final"] for r in last.values())


def test_every_n_records_a_window_gives_its_count_so_far_even_across_a_failure(
    tmp_path: Path,
) -> None:
    """``early_records=25``: the source hands over one record per batch (``batch_size=1``),
    so each window of a key gives its count after each 25 of its records exactly (25, 50,
    ...: the count starts again after each), then its final one; a worker failing on the way (and the job restoring its counts
    from a checkpoint) changes none of that: the early results published are exactly the
    multiples of 25 below each window's count, once each."""
    rows = [
        {"user": f"u{i % 3}", "ts": START + dt.timedelta(seconds=(i * 7) % 180)} for i in range(600)
    ]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in" / "clicks.parquet")
    env = StreamEnvironment(
        2,
        checkpoint_dir=str(tmp_path / "ck"),
        checkpoint_interval=0.02,
        batch_size=1,
        restart_strategy=FixedDelay(1),
    )
    clicks = env.read_parquet(
        tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness="10 min")
    )
    marker = tmp_path / "failed"

    def fail_once(record: dict) -> dict:
        if record["count"] == 50 and not marker.exists():  # (the first 50 of any window)
            marker.touch()
            raise RuntimeError("a worker fails after an early result")
        return record

    counts = clicks.key_by("user").window(Tumbling("1 min"), early_records=25).count()
    counts.map(fail_once).collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    assert len(result.restarts) == 1
    wanted = Counter((r["user"], r["ts"].replace(second=0)) for r in rows)
    early = Counter(
        (r["user"], r["window_start"], r["count"]) for r in result.output if not r["final"]
    )
    assert early == Counter(
        (user, start, n) for (user, start), total in wanted.items() for n in range(25, total, 25)
    )
    final = {(r["user"], r["window_start"]): r["count"] for r in result.output if r["final"]}
    assert final == wanted


def test_early_records_must_be_a_positive_count_when_the_job_is_built(tmp_path: Path) -> None:
    import pytest

    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.Table.from_pylist([{"user": "a", "ts": START}]), tmp_path / "in" / "c.parquet"
    )
    env = StreamEnvironment(1, checkpoint_dir=str(tmp_path / "ck"))
    keyed = env.read_parquet(tmp_path / "in", event_time="ts").key_by("user")
    for wrong in (0, -5, "10", 2.5, True):
        with pytest.raises(ValueError, match=f"early_records={wrong!r} must be a positive"):
            keyed.window(Tumbling("1 min"), early_records=wrong)  # type: ignore[arg-type]
