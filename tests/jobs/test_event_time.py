"""Event time in whole jobs (threads): windows give exact results under random out-of-orderness,
late records go to the side output exactly once, window state survives restores.

Every input here is made of Parquet files whose records come at most ``BOUND`` ms out of order
within each file, while the files overlap in time (each covers the same span): a watermark per
subtask instead of per file would make records late; per file, none is, and every window's
result must equal the one computed here in plain Python.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from cutline import (
    AggregateFunction,
    Checkpoints,
    DataStream,
    EventTime,
    EventTimeError,
    FixedDelay,
    JobFailedError,
    JobResult,
    KeyedProcessFunction,
    ProcessContext,
    Session,
    Sliding,
    SourceHold,
    State,
    StreamEnvironment,
    Tumbling,
    Window,
    open_checkpoint,
    testing,
)
from cutline.api.progress import render
from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.task.local import ThreadLauncher

BOUND = 300
"""How far out of order (ms) the records of one file come."""
USERS = 7
Row = dict[str, Any]


def write_clicks(
    directory: Path, seed: int, files: int = 4, per_file: int = 400, disorder: int = BOUND
) -> list[Row]:
    """``files`` Parquet files of clicks (user, ts in epoch ms, amount) over the same span of
    time, each at most ``disorder`` ms out of order; small row groups (several batches)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    everything = []
    for f in range(files):
        records = []
        t = 1_700_000_000_000
        for _ in range(per_file):
            t += rng.randint(0, 40)
            records.append(
                {
                    "user": f"u{rng.randrange(USERS)}",
                    "ts": t - rng.randint(0, disorder),
                    "amount": rng.randint(1, 100),
                }
            )
        everything += records
        pq.write_table(
            pa.Table.from_pylist(records), directory / f"clicks-{f}.parquet", row_group_size=64
        )
    return everything


def environment(tmp_path: Path, parallelism: int, **options: Any) -> StreamEnvironment:
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / "checkpoints",
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 50,
    }
    settings.update(options)
    return StreamEnvironment(parallelism, **settings)


def run(env: StreamEnvironment) -> JobResult:
    result = testing.execute(env, launcher=ThreadLauncher())
    assert result.restarts == []
    return result


def tumbling(records: Iterable[Row], size: int) -> dict[tuple[str, int, int], list[Row]]:
    windows: dict[tuple[str, int, int], list[Row]] = defaultdict(list)
    for r in records:
        start = r["ts"] - r["ts"] % size
        windows[(r["user"], start, start + size)].append(r)
    return windows


def sliding(records: Iterable[Row], size: int, every: int) -> dict[tuple[str, int, int], list[Row]]:
    windows: dict[tuple[str, int, int], list[Row]] = defaultdict(list)
    for r in records:
        start = r["ts"] - r["ts"] % every
        while start + size > r["ts"]:
            windows[(r["user"], start, start + size)].append(r)
            start -= every
    return windows


def sessions(records: Iterable[Row], gap: int) -> dict[tuple[str, int, int], list[Row]]:
    by_user: dict[str, list[Row]] = defaultdict(list)
    for r in records:
        by_user[r["user"]].append(r)
    windows = {}
    for user, mine in by_user.items():
        mine.sort(key=lambda r: r["ts"])
        current: list[Row] = []
        for r in mine:
            if current and r["ts"] - current[-1]["ts"] > gap:
                windows[(user, current[0]["ts"], current[-1]["ts"] + gap)] = current
                current = []
            current.append(r)
        windows[(user, current[0]["ts"], current[-1]["ts"] + gap)] = current
    return windows


def by_window(output: list[Row], field: str) -> dict[tuple[str, int, int], Any]:
    found: dict[tuple[str, int, int], Any] = {}
    for row in output:
        window = (row["user"], row["window_start"], row["window_end"])
        assert window not in found, f"window {window} was published twice"
        found[window] = row[field]
    return found


@pytest.mark.parametrize("parallelism", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_tumbling_sliding_and_session_counts_are_exact_under_out_of_order_input(
    tmp_path: Path, parallelism: int, seed: int
) -> None:
    clicks = write_clicks(tmp_path / "in", seed)
    env = environment(tmp_path, parallelism)
    stream = env.read_parquet(
        tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness=f"{BOUND}ms")
    )
    keyed = stream.key_by("user")
    keyed.window(Tumbling("1s")).count().collect("tumbling")
    keyed.window(Sliding("1s", every="250ms")).sum("amount").collect("sliding")
    keyed.window(Session(gap="200ms")).count().collect("session")
    result = run(env)
    assert by_window(result.collected["tumbling"], "count") == {
        w: len(rs) for w, rs in tumbling(clicks, 1000).items()
    }
    assert by_window(result.collected["sliding"], "amount") == {
        w: sum(r["amount"] for r in rs) for w, rs in sliding(clicks, 1000, 250).items()
    }
    assert by_window(result.collected["session"], "count") == {
        w: len(rs) for w, rs in sessions(clicks, 200).items()
    }


def test_min_max_and_mean_of_windows(tmp_path: Path) -> None:
    clicks = write_clicks(tmp_path / "in", 3)
    env = environment(tmp_path, 2)
    keyed = env.read_parquet(
        tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness=f"{BOUND}ms")
    ).key_by("user")
    keyed.window(Tumbling("2s")).min("amount").collect("min")
    keyed.window(Tumbling("2s")).max("amount").collect("max")
    keyed.window(Session(gap="300ms")).mean("amount").collect("mean")
    result = run(env)
    windows = tumbling(clicks, 2000)
    assert by_window(result.collected["min"], "amount") == {
        w: min(r["amount"] for r in rs) for w, rs in windows.items()
    }
    assert by_window(result.collected["max"], "amount") == {
        w: max(r["amount"] for r in rs) for w, rs in windows.items()
    }
    means = by_window(result.collected["mean"], "amount")
    expected = {
        w: sum(r["amount"] for r in rs) / len(rs) for w, rs in sessions(clicks, 300).items()
    }
    assert means.keys() == expected.keys()
    assert all(means[w] == pytest.approx(expected[w]) for w in expected)


class Spend(AggregateFunction):
    def create_accumulator(self) -> Row:
        return {"clicks": 0, "spent": 0}

    def add(self, record: Row, accumulator: Row) -> Row:
        accumulator["clicks"] += 1  # (in place: cutline hands each call its own copy)
        accumulator["spent"] += record["amount"]
        return accumulator

    def merge(self, a: Row, b: Row) -> Row:
        return {"clicks": a["clicks"] + b["clicks"], "spent": a["spent"] + b["spent"]}

    def get_result(self, accumulator: Row) -> Row:
        return accumulator


def biggest(a: Row, b: Row) -> Row:
    return a if (a["amount"], a["ts"]) >= (b["amount"], b["ts"]) else b


def amounts(key: str, window: Window, records: list[Row]) -> list[Row]:
    return [
        {
            "user": key,
            "window_start": window.start,
            "window_end": window.end,
            "amounts": sorted(r["amount"] for r in records),
        }
    ]


@pytest.mark.parametrize("parallelism", [1, 2])
def test_user_functions_aggregate_reduce_and_process_take_the_per_record_path(
    tmp_path: Path, parallelism: int
) -> None:
    clicks = write_clicks(tmp_path / "in", 4, files=3, per_file=300)
    env = environment(tmp_path, parallelism)
    # a map makes the records Python dicts: every window takes the per-record path
    keyed = (
        env.read_parquet(
            tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness=f"{BOUND}ms")
        )
        .map(dict)
        .key_by("user")
    )
    keyed.window(Session(gap="250ms")).aggregate(Spend()).collect("aggregate")
    keyed.window(Tumbling("1500ms")).reduce(biggest).collect("reduce")
    keyed.window(Sliding("1s", every="500ms")).process(amounts).collect("process")
    keyed.window(Tumbling("1500ms")).count().collect("count")
    result = run(env)
    expected_sessions = sessions(clicks, 250)
    assert by_window(result.collected["aggregate"], "spent") == {
        w: sum(r["amount"] for r in rs) for w, rs in expected_sessions.items()
    }
    assert by_window(result.collected["aggregate"], "clicks") == {
        w: len(rs) for w, rs in expected_sessions.items()
    }
    expected_tumbling = tumbling(clicks, 1500)
    reduced = by_window(result.collected["reduce"], "amount")
    assert reduced == {
        w: max((r["amount"], r["ts"]) for r in rs)[0] for w, rs in expected_tumbling.items()
    }
    assert by_window(result.collected["process"], "amounts") == {
        w: sorted(r["amount"] for r in rs) for w, rs in sliding(clicks, 1000, 500).items()
    }
    assert by_window(result.collected["count"], "count") == {
        w: len(rs) for w, rs in expected_tumbling.items()
    }


def write_late_input(path: Path) -> None:
    """One file (read a record at a time): window [0, 1000) gets 100 records, then a record at
    2500 (the watermark moves to 2499 after it), then records at 500 (1500 ms after the
    window's end passed) and 2600."""
    groups = [
        [{"user": "a", "ts": t, "amount": 1} for t in range(0, 1000, 10)],
        [{"user": "a", "ts": 2500, "amount": 1}],
        [{"user": "a", "ts": 500, "amount": 7}, {"user": "a", "ts": 2600, "amount": 1}],
    ]
    schema = pa.schema([("user", pa.string()), ("ts", pa.int64()), ("amount", pa.int64())])
    with pq.ParquetWriter(path, schema) as writer:
        for group in groups:
            writer.write_table(pa.Table.from_pylist(group, schema))


@pytest.mark.parametrize(
    ("lateness", "windows", "late"),
    [
        # too late: the window fired at 2499, and 999 + 0 <= 2499
        (0, [(0, 1000, 100), (2000, 3000, 2)], [500]),
        (1000, [(0, 1000, 100), (2000, 3000, 2)], [500]),  # 999 + 1000 <= 2499: too late
        # within the lateness (999 + 2000 > 2499): the window updates and fires again
        (2000, [(0, 1000, 100), (0, 1000, 101), (2000, 3000, 2)], []),
    ],
)
def test_late_records_update_their_window_within_the_lateness_and_go_to_the_side_output_after(
    tmp_path: Path, lateness: int, windows: list[tuple[int, int, int]], late: list[int]
) -> None:
    (tmp_path / "in").mkdir()
    write_late_input(tmp_path / "in" / "clicks.parquet")
    env = environment(tmp_path, 1, batch_size=1)  # (a watermark after every record)
    counts = (
        env.read_parquet(tmp_path / "in", event_time="ts")
        .key_by("user")
        .window(Tumbling("1s"), allowed_lateness=f"{lateness}ms")
        .count()
    )
    counts.collect("counts")
    counts.late().collect("late")
    result = run(env)
    got = [(r["window_start"], r["window_end"], r["count"]) for r in result.collected["counts"]]
    assert sorted(got) == sorted(windows)
    assert [r["ts"] for r in result.collected["late"]] == late
    assert result.collected["late"] == [{"user": "a", "ts": t, "amount": 7} for t in late]


def test_every_record_is_counted_in_a_window_or_the_late_output_exactly_once(
    tmp_path: Path,
) -> None:
    """At parallelism 2 with a bound far too small for the input, which records are late
    depends on the interleaving; but each is either in its window's count or in the late
    output."""
    clicks = write_clicks(tmp_path / "in", 5, disorder=5000)
    env = environment(tmp_path, 2)
    counts = (
        env.read_parquet(tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness="20ms"))
        .key_by("user")
        .window(Tumbling("500ms"))
        .count()
    )
    counts.collect("counts")
    counts.late().collect("late")
    result = run(env)
    counted = sum(r["count"] for r in result.collected["counts"])
    assert result.collected["late"], "a 20 ms bound on 5 s of disorder makes records late"
    assert counted + len(result.collected["late"]) == len(clicks)
    assert Counter(tuple(sorted(r.items())) for r in result.collected["late"]) <= Counter(
        tuple(sorted(r.items())) for r in clicks
    )


def test_late_records_without_a_late_reader_are_counted_and_not_kept(tmp_path: Path) -> None:
    """The same job without ``.late()``: the late records are counted (every record is in its
    window's count or among them) and let go (``test_window_operators.py`` measures that the
    window's memory does not grow with them); the window is chained with what follows it."""
    clicks = write_clicks(tmp_path / "in", 5, disorder=5000)
    env = environment(tmp_path, 2)
    (
        env.read_parquet(tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness="20ms"))
        .key_by("user")
        .window(Tumbling("500ms"))
        .count(name="per_half_second")
        .map(dict, name="after")
        .collect("counts")
    )
    result = run(env)
    assert result.metrics is not None
    late = result.metrics.operator("per_half_second").late
    assert late > 0, "a 20 ms bound on 5 s of disorder makes records late"
    assert sum(r["count"] for r in result.collected["counts"]) + late == len(clicks)


def test_timestamp_columns_come_back_as_timestamps(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    records = [{"user": "a", "at": base + dt.timedelta(seconds=s)} for s in (0, 1, 59, 60, 61, 125)]
    schema = pa.schema([("user", pa.string()), ("at", pa.timestamp("us", tz="UTC"))])
    pq.write_table(pa.Table.from_pylist(records, schema), tmp_path / "in" / "c.parquet")
    env = environment(tmp_path, 1)
    env.read_parquet(tmp_path / "in", event_time="at").key_by("user").window(
        Tumbling("1 min")
    ).count().collect()
    result = run(env)
    got = sorted((r["window_start"], r["window_end"], r["count"]) for r in result.output)
    minute = dt.timedelta(minutes=1)
    assert got == [
        (base, base + minute, 3),
        (base + minute, base + 2 * minute, 2),
        (base + 2 * minute, base + 3 * minute, 1),
    ]


def test_a_window_of_window_results_regroups_them_on_their_end(tmp_path: Path) -> None:
    """Results carry event time window_end - 1 (Flink's): the most clicks per user in a 1 s
    window, per 4 s."""
    clicks = write_clicks(tmp_path / "in", 6)
    env = environment(tmp_path, 2)
    (
        env.read_parquet(
            tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness=f"{BOUND}ms")
        )
        .key_by("user")
        .window(Tumbling("1s"))
        .count()
        .key_by("user")
        .window(Tumbling("4s"))
        .max("count")
        .collect()
    )
    result = run(env)
    per_second = tumbling(clicks, 1000)
    expected: dict[tuple[str, int, int], int] = {}
    for (user, _start, end), rs in per_second.items():
        outer = (end - 1) - (end - 1) % 4000
        window = (user, outer, outer + 4000)
        expected[window] = max(expected.get(window, 0), len(rs))
    assert by_window(result.output, "count") == expected


def test_bad_event_time_settings_are_refused_naming_the_column(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.table({"user": ["a"], "ts": ["2026-01-01"], "n": [1.5]}), tmp_path / "in" / "x.parquet"
    )
    env = environment(tmp_path, 1)
    with pytest.raises(EventTimeError, match=r"event_time='ts': the column is string"):
        env.read_parquet(tmp_path / "in", event_time="ts")
    with pytest.raises(
        EventTimeError, match=r"event_time='when': no such column \(columns: user, ts, n\)"
    ):
        env.read_parquet(tmp_path / "in", event_time="when")
    with pytest.raises(EventTimeError, match="event_time='n': the column is double"):
        env.read_parquet(tmp_path / "in", event_time="n")
    with pytest.raises(ValueError, match="need event_time="):
        env.read_parquet(tmp_path / "in", max_out_of_orderness="2s")
    with pytest.raises(ValueError, match="the stream has no event time"):
        env.read_parquet(tmp_path / "in").key_by("user").window(Tumbling("1s"))
    with pytest.raises(EventTimeError, match="unknown unit 'parsecs'"):
        Tumbling("3 parsecs")
    with pytest.raises(EventTimeError, match="must be positive"):
        Session(gap=0)
    with pytest.raises(EventTimeError, match="the slide is longer than the window"):
        Sliding("1s", every="2s")


# ------------------------------------------------------------------------------ timers


class Reminders(KeyedProcessFunction):
    """Per order: a reminder one second after it, unless a payment came before then."""

    def open(self, ctx: ProcessContext) -> None:
        self.placed = ctx.value_state("placed")
        self.paid = ctx.value_state("paid")

    def process(self, record: Row, ctx: ProcessContext) -> None:
        timers = ctx.timer_service
        if record["kind"] == "order":
            self.placed.update(record["ts"])
            paid = self.paid.get()
            if paid is None or paid >= record["ts"] + 1000:
                timers.register_event_time_timer(record["ts"] + 1000)
        else:
            self.paid.update(record["ts"])
            placed = self.placed.get()
            if placed is not None and record["ts"] < placed + 1000:
                timers.delete_event_time_timer(placed + 1000)

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> list[Row]:
        assert ctx.time_domain == "event"
        assert ctx.timer_service.current_watermark() >= timestamp
        return [{"order": ctx.key, "reminded_at": timestamp}]


def write_orders(directory: Path, seed: int) -> list[Row]:
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    events: list[Row] = []
    t = 1_000_000
    for order in range(300):
        t += rng.randint(0, 30)
        events.append({"order": order, "kind": "order", "ts": t})
        if rng.random() < 0.7:
            events.append({"order": order, "kind": "pay", "ts": t + rng.randint(0, 2000)})
    events.sort(key=lambda e: e["ts"] + rng.randint(0, BOUND))  # out of order, bounded
    half = len(events) // 2
    for i, part in enumerate((events[:half], events[half:])):
        pq.write_table(
            pa.Table.from_pylist(part), directory / f"orders-{i}.parquet", row_group_size=40
        )
    return events


@pytest.mark.parametrize("parallelism", [1, 2])
def test_event_time_timers_fire_once_the_watermark_passes_and_can_be_deleted(
    tmp_path: Path, parallelism: int
) -> None:
    events = write_orders(tmp_path / "in", parallelism)
    env = environment(tmp_path, parallelism)
    (
        env.read_parquet(
            tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness=f"{BOUND + 30}ms")
        )
        .key_by("order")
        .process(Reminders())
        .collect()
    )
    result = run(env)
    placed = {e["order"]: e["ts"] for e in events if e["kind"] == "order"}
    paid = {e["order"]: e["ts"] for e in events if e["kind"] == "pay"}
    expected = sorted(
        (order, ts + 1000)
        for order, ts in placed.items()
        if order not in paid or paid[order] >= ts + 1000
    )
    assert sorted((r["order"], r["reminded_at"]) for r in result.output) == expected


class FirstSeen(KeyedProcessFunction):
    """A processing-time timer per key, registered on its first record."""

    def open(self, ctx: ProcessContext) -> None:
        self.seen = ctx.value_state("seen")

    def process(self, record: Row, ctx: ProcessContext) -> None:
        if self.seen.get() is None:
            self.seen.update(True)
            now = ctx.timer_service.current_processing_time()
            ctx.timer_service.register_processing_time_timer(now + 5)

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> list[Row]:
        assert ctx.time_domain == "processing"
        return [{"user": ctx.key}]


def test_processing_time_timers_fire_at_the_latest_when_the_input_ends(tmp_path: Path) -> None:
    clicks = write_clicks(tmp_path / "in", 7)
    env = environment(tmp_path, 2)
    env.read_parquet(tmp_path / "in").key_by("user").process(FirstSeen()).collect()
    result = run(env)
    assert sorted(r["user"] for r in result.output) == sorted({c["user"] for c in clicks})


def test_processing_time_windows_count_every_record_once(tmp_path: Path) -> None:
    clicks = write_clicks(tmp_path / "in", 8)
    env = environment(tmp_path, 2)
    (
        env.read_parquet(tmp_path / "in")
        .key_by("user")
        .window(Tumbling("50ms"), time="processing")
        .count()
        .collect()
    )
    result = run(env)
    per_user: Counter[str] = Counter()
    for row in result.output:
        per_user[row["user"]] += row["count"]
        assert row["window_end"] - row["window_start"] == 50
    assert per_user == Counter(c["user"] for c in clicks)


# ------------------------------------------------------------------------ seeing it


def test_watermarks_late_records_and_windows_are_in_the_metrics_statistics_and_report(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from cutline.cli import main
    from cutline.report import build_report

    (tmp_path / "in").mkdir()
    write_late_input(tmp_path / "in" / "clicks.parquet")
    env = environment(tmp_path, 1, batch_size=1)
    counts = (
        env.read_parquet(tmp_path / "in", event_time="ts")
        .key_by("user")
        .window(Tumbling("1s"))
        .count(name="per_second")
    )
    counts.collect("counts")
    counts.late().collect("late")
    events: list[str] = []
    result = testing.execute(env, launcher=ThreadLauncher(), listener=lambda k, m: events.append(m))
    assert result.metrics is not None
    window = result.metrics.operator("per_second")
    assert window.late == 1 and result.metrics.late == {"per_second": 1}
    assert window.watermark == MAX_WATERMARK  # the end of the input
    assert window.watermark_lag(0.0) == 0.0
    console = Console(width=160, record=True)
    console.print(render(result.metrics))
    drawn = console.export_text()
    assert "late records: per_second 1" in drawn
    row = next(line for line in drawn.splitlines() if line.startswith("per_second"))
    assert row.split()[-4:] == ["end", "0.0", "s", "1"]  # watermark, lag, late (no window open)
    final = result.checkpoints[-1]
    assert final.event_time()["per_second"] == {"late": 1, "windows": 0, "timers": 0}
    assert any("late records so far: per_second 1" in m for m in events if "(final)" in m)
    shown = CliRunner().invoke(
        main, ["checkpoints", "show", str(tmp_path / "checkpoints"), str(final.checkpoint_id)]
    )
    assert shown.exit_code == 0, shown.output
    assert "event time" in shown.output and "per_second" in shown.output
    page = build_report(str(tmp_path / "checkpoints"))
    assert '<section id="event-time">' in page and "per_second" in page


class FailOnceOn:
    """A map_batches function that raises once, on the first batch with an ``amount`` of
    ``amount`` (a file remembers it across the restart)."""

    __name__ = "fail_once"

    def __init__(self, amount: int, flag: Path) -> None:
        self.amount, self.flag = amount, flag

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.amount in batch.column("amount").to_pylist() and not self.flag.exists():
            self.flag.touch()
            raise RuntimeError(f"injected failure on the record of amount {self.amount}")
        return batch


def test_a_record_late_before_a_failure_is_late_after_the_restore_too(tmp_path: Path) -> None:
    """The window operator's watermark is in its checkpoint: after a restore the watermarks
    from the sources start again from the least, but the window that fired before the
    checkpoint does not open again for the record that was late then (it would be published
    twice: 100 before, 1 after)."""
    (tmp_path / "in").mkdir()
    write_late_input(tmp_path / "in" / "clicks.parquet")
    env = environment(tmp_path, 1, batch_size=1)
    counts = (
        env.read_parquet(tmp_path / "in", event_time="ts")
        .map_batches(FailOnceOn(7, tmp_path / "failed"))  # the late record
        .key_by("user")
        .window(Tumbling("1s"))
        .count()
    )
    counts.collect("counts")
    counts.late().collect("late")
    # hold after the record at 2500: a checkpoint completes with the window [0, 1000) fired
    result = testing.execute(env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=101))
    assert len(result.restarts) == 1 and result.restarts[0].restored_from is not None
    got = sorted((r["window_start"], r["count"]) for r in result.collected["counts"])
    assert got == [(0, 100), (2000, 2)]
    assert [r["ts"] for r in result.collected["late"]] == [500]


class FlagOnWindow:
    """A map_batches function that creates ``flag`` once a result of window ``start`` of a
    user other than ``quiet`` goes through."""

    __name__ = "flag_on_window"

    def __init__(self, start: int, flag: Path) -> None:
        self.start, self.flag = start, flag

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        for row in batch.to_pylist():
            if row["window_start"] == self.start and row["user"] != "quiet":
                self.flag.touch()
        return batch


def quiet_user(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("user", pa.array(["quiet"] * batch.num_rows))


def _clicks_beside_a_trickle(
    tmp_path: Path, seed: int, trickle: Callable[[StreamEnvironment], DataStream]
) -> None:
    """Clicks (bounded, two files, event time in ``value``) unioned with ``trickle(env)`` (an
    unbounded trickle of records of 1970, user ``quiet``), counted per user and second: every
    window of the clicks fires while the trickle still runs, then the job is stopped (once
    the last one went through: the wait is on that record, not on a clock), each exact."""
    clicks = write_clicks(tmp_path / "in", seed, files=2)
    table = pq.read_table(tmp_path / "in").rename_columns(["user", "value", "amount"])
    for i, part in enumerate((table.slice(0, 400), table.slice(400))):
        pq.write_table(part, tmp_path / "in" / f"clicks-{i}.parquet")
    env = environment(tmp_path, 2)
    bounded = env.read_parquet(
        tmp_path / "in", event_time=EventTime("value", max_out_of_orderness=f"{BOUND}ms")
    )
    last = max(c["ts"] for c in clicks)
    counts = bounded.union(trickle(env)).key_by("user").window(Tumbling("1s")).count()
    flag = tmp_path / "last-window-fired"
    counts.map_batches(FlagOnWindow(last - last % 1000, flag)).collect()
    result = testing.execute(
        env, launcher=ThreadLauncher(), stop_after=0.05, listener=once_something_was_read(flag)
    )
    assert flag.exists(), "the clicks' last window never fired: the idle input held it back"
    published = by_window([r for r in result.output if r["user"] != "quiet"], "count")
    assert published == {w: len(rs) for w, rs in tumbling(clicks, 1000).items()}


def test_an_idle_input_does_not_hold_the_watermark_back(tmp_path: Path) -> None:
    """The trickle (one record a second per subtask) is a source with an idle timeout: without
    idleness its watermark would hold every window of the clicks back for ever."""
    _clicks_beside_a_trickle(
        tmp_path,
        9,
        lambda env: env.from_sequence(
            0, None, event_time=EventTime("value", idle_timeout="50ms"), rate_limit=2.0
        ).map_batches(quiet_user),
    )


def once_something_was_read(path: Path) -> Callable[[str, str], None]:
    """A listener that keeps the driver, when the job starts running, until ``path`` exists, so
    that ``stop_after`` stops the job only after that (60 s at most, for a broken job)."""

    def listener(kind: str, message: str) -> None:
        if kind == "running":
            deadline = time.monotonic() + 60
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.005)

    return listener


@pytest.mark.parametrize(("before", "after", "backend"), [(2, 3, "memory"), (3, 1, "disk")])
def test_timers_survive_a_failure_and_a_restore_at_another_parallelism(
    tmp_path: Path, before: int, after: int, backend: str
) -> None:
    """The reminders job fails for good on a record read after a checkpoint taken while its
    sources held half-way (timers registered and not fired yet are in it); a new run restores
    that checkpoint at another parallelism, each key's timers going with its key group: the
    two runs publish each reminder once."""
    events = write_orders(tmp_path / "in", before + after)
    hold = len(events) // (2 * before)  # (each subtask holds half-way into its file)

    def job(parallelism: int, checkpoints: str, fail: bool) -> StreamEnvironment:
        env = environment(
            tmp_path,
            parallelism,
            checkpoint_dir=tmp_path / checkpoints,
            state=State(backend=backend),
            checkpoints=Checkpoints(retained=100),
            restart_strategy=FixedDelay(0, delay=0),
        )
        stream = env.read_parquet(
            tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness=f"{BOUND + 30}ms")
        )
        if fail:  # on the last event of a file: read only after the hold
            stream = stream.map_batches(FailOnLast(events, tmp_path / "failed"))
        stream.key_by("order").process(Reminders(), name="reminders").write_parquet(
            tmp_path / "out", name="out"
        )
        return env

    with pytest.raises(JobFailedError, match="injected failure"):
        testing.execute(
            job(before, "ck1", fail=True),
            launcher=ThreadLauncher(),
            hold_sources=SourceHold(records=hold),
        )
    retained = sorted((tmp_path / "ck1").glob("chk-*"), key=lambda p: int(p.name[4:]))[-1]
    timers = sum(
        1
        for entry in open_checkpoint(str(retained)).keyed_entries("reminders")
        if entry.state == "_timers"
    )
    assert timers > 0, "the checkpoint restored holds timers not fired yet"
    result = testing.execute(
        job(after, "ck2", fail=False), launcher=ThreadLauncher(), restore_from=retained
    )
    assert result.restarts == []
    placed = {e["order"]: e["ts"] for e in events if e["kind"] == "order"}
    paid = {e["order"]: e["ts"] for e in events if e["kind"] == "pay"}
    expected = sorted(
        (order, ts + 1000)
        for order, ts in placed.items()
        if order not in paid or paid[order] >= ts + 1000
    )
    got = pq.read_table(tmp_path / "out").to_pylist()
    assert sorted((r["order"], r["reminded_at"]) for r in got) == expected


class FailOnLast:
    """Raises on the batch holding the last event of the input file (written by
    write_orders: the second half of the events), once."""

    __name__ = "fail_on_last"

    def __init__(self, events: list[Row], flag: Path) -> None:
        last = events[-1]
        self.key = (last["order"], last["kind"], last["ts"])
        self.flag = flag

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        for row in batch.to_pylist():
            if (row["order"], row["kind"], row["ts"]) == self.key and not self.flag.exists():
                self.flag.touch()
                raise RuntimeError("injected failure")
        return batch


def test_an_idle_stream_after_assign_timestamps_does_not_hold_the_watermark_back(
    tmp_path: Path,
) -> None:
    """As above, with the trickle's event time given by assign_timestamps (idle_timeout there)."""
    _clicks_beside_a_trickle(
        tmp_path,
        10,
        lambda env: (
            env.from_sequence(0, None, rate_limit=2.0)
            .map_batches(quiet_user)
            .assign_timestamps(EventTime("value", idle_timeout="50ms"))
        ),
    )


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_sessions_that_touch_merge_as_in_flink(tmp_path: Path, backend: str) -> None:
    """A record exactly the gap after the previous one continues its session (its window
    [t, t + gap) touches the session's end); one a millisecond later starts a new one."""
    (tmp_path / "in").mkdir()
    rows = [{"user": "a", "ts": t} for t in (0, 200, 400, 601, 1000)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in" / "s.parquet")
    env = environment(tmp_path, 1, state=State(backend=backend))
    stream = env.read_parquet(tmp_path / "in", event_time="ts")
    stream.key_by("user").window(Session(gap="200ms")).count().collect("columns")
    stream.map(dict).key_by("user").window(Session(gap="200ms")).count().collect("records")
    result = run(env)
    for name in ("columns", "records"):
        got = sorted(
            (r["window_start"], r["window_end"], r["count"]) for r in result.collected[name]
        )
        assert got == [(0, 600, 3), (601, 801, 1), (1000, 1200, 1)], name


def biggest_rows(key: str, window: Window, table: pa.Table) -> pa.Table:
    """The rows of the window with its largest amount (ties kept), vectorized."""
    top = pa.compute.max(table.column("amount"))
    found = table.filter(pa.compute.equal(table.column("amount"), top))
    return found.select(["user", "amount"]).append_column(
        "window_start", pa.array([window.start] * found.num_rows, pa.int64())
    )


@pytest.mark.parametrize(("parallelism", "records"), [(1, "arrow"), (2, "arrow"), (2, "dicts")])
def test_process_batches_gets_each_window_as_one_arrow_table(
    tmp_path: Path, parallelism: int, records: str
) -> None:
    clicks = write_clicks(tmp_path / "in", 12, files=3, per_file=300)
    env = environment(tmp_path, parallelism)
    stream = env.read_parquet(
        tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness=f"{BOUND}ms")
    )
    if records == "dicts":
        stream = stream.map(dict)
    stream.key_by("user").window(Sliding("1s", every="500ms")).process_batches(
        biggest_rows
    ).collect()
    result = run(env)
    expected = []
    for (user, start, _), rows in sliding(clicks, 1000, 500).items():
        top = max(r["amount"] for r in rows)
        expected += [(user, top, start)] * sum(r["amount"] == top for r in rows)
    got = [(r["user"], r["amount"], r["window_start"]) for r in result.output]
    assert sorted(got) == sorted(expected)


def test_assign_timestamps_that_never_gets_a_record_goes_idle_after_its_timeout() -> None:
    """A subtask of ``assign_timestamps`` that no record reaches (a key nobody has, a
    partition of one) counts its idle time from its first tick, as an empty partition does:
    it goes idle and stops holding the watermark back."""
    from cutline.runtime.eventtime.assign import AssignTimestampsLogic
    from cutline.runtime.eventtime.timestamps import TimeColumn
    from cutline.runtime.eventtime.watermarks import WatermarkStrategy
    from cutline.runtime.operators import OperatorContext

    strategy = WatermarkStrategy(TimeColumn("ts"), bound_ms=0, idle_timeout_s=1.0)
    ctx = OperatorContext(
        name="assign", subtask=0, parallelism=1, max_parallelism=128, generation=1
    )
    running = AssignTimestampsLogic(strategy).open(ctx, None)
    running.on_processing_time(10_000)
    assert running.take_status() is None
    running.on_processing_time(11_000)
    assert running.take_status() is True
