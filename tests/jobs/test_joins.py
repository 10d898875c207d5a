"""The built-in joins in a job (slots as threads, parallelism 2, both inputs read from
several files): every result exactly the plain-Python answer, once; bad joins refused when
the job is built, naming the stream and the column."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline import EventTime, Session, Sliding, StreamEnvironment, Tumbling, testing
from cutline.runtime.task.local import ThreadLauncher

ADS = 5
S = 1_000


def write(path: Path, rows: list[dict[str, Any]], parts: int = 2) -> Path:
    """Rows into ``parts`` files, each in time order (no record late)."""
    path.mkdir(parents=True)
    for i in range(parts):
        part = sorted(rows[i::parts], key=lambda r: r["ts"])
        pq.write_table(pa.Table.from_pylist(part), path / f"{i}.parquet")
    return path


def inputs(tmp_path: Path, seed: int = 3) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(seed)
    clicks = [
        {"ad": rng.randrange(ADS), "ts": rng.randrange(100 * S), "click": i} for i in range(300)
    ]
    views = [
        {"ad": rng.randrange(ADS), "ts": rng.randrange(100 * S), "view": i} for i in range(200)
    ]
    write(tmp_path / "clicks", clicks)
    write(tmp_path / "views", views)
    return clicks, views


def run(tmp_path: Path, build: Any, batch_size: int = 65536) -> list[dict[str, Any]]:
    env = StreamEnvironment(
        2, checkpoint_interval=0.05, checkpoint_dir=tmp_path / "ck", batch_size=batch_size
    )
    time = EventTime("ts", max_out_of_orderness=0)
    clicks = env.read_parquet(tmp_path / "clicks", event_time=time, name="clicks")
    views = env.read_parquet(tmp_path / "views", event_time=time, name="views")
    build(clicks, views).collect()
    result = testing.execute(env, launcher=ThreadLauncher())
    rows: list[dict[str, Any]] = result.collected["collect"]
    assert not result.collected.get("late"), "no record late after the join"
    return rows


def key(row: dict[str, Any], *names: str) -> tuple[Any, ...]:
    return tuple(row.get(n) for n in names)


def test_an_interval_join_gives_every_pair_once_and_each_unmatched_left_row(
    tmp_path: Path,
) -> None:
    clicks, views = inputs(tmp_path)
    rows = run(
        tmp_path,
        lambda c, v: c.interval_join(v, on="ad", between=("-10s", "0s"), how="left"),
    )
    wanted: Counter[tuple[Any, ...]] = Counter()
    for c in clicks:
        found = [v for v in views if v["ad"] == c["ad"] and -10 * S <= v["ts"] - c["ts"] <= 0]
        for v in found:
            wanted[(c["ad"], c["ts"], c["click"], v["ts"], v["view"])] += 1
        if not found:
            wanted[(c["ad"], c["ts"], c["click"], None, None)] += 1
    got = Counter(key(r, "ad", "ts", "click", "ts_right", "view") for r in rows)
    assert got == wanted
    assert list(rows[0]) == ["ad", "ts", "click", "ts_right", "view"]


@pytest.mark.parametrize("how", ["inner", "full"])
def test_a_window_join_gives_the_pairs_of_each_window(tmp_path: Path, how: str) -> None:
    clicks, views = inputs(tmp_path)
    rows = run(tmp_path, lambda c, v: c.window_join(v, on="ad", window=Tumbling("10s"), how=how))
    wanted: Counter[tuple[Any, ...]] = Counter()
    for start in range(0, 100 * S, 10 * S):
        for ad in range(ADS):
            cs = [c for c in clicks if c["ad"] == ad and start <= c["ts"] < start + 10 * S]
            vs = [v for v in views if v["ad"] == ad and start <= v["ts"] < start + 10 * S]
            for c in cs:
                for v in vs:
                    wanted[(ad, start, c["click"], v["view"])] += 1
            if how == "full":
                for c in cs if not vs else []:
                    wanted[(ad, start, c["click"], None)] += 1
                for v in vs if not cs else []:
                    wanted[(ad, start, None, v["view"])] += 1
    got = Counter(key(r, "ad", "window_start", "click", "view") for r in rows)
    assert got == wanted
    assert all(r["window_end"] == r["window_start"] + 10 * S for r in rows)


def test_an_asof_join_gives_each_left_row_the_version_valid_at_its_time(tmp_path: Path) -> None:
    clicks, views = inputs(tmp_path)
    rows = run(tmp_path, lambda c, v: c.asof_join(v, on="ad", how="left"))
    wanted = Counter()
    for c in clicks:
        before = [v for v in views if v["ad"] == c["ad"] and v["ts"] <= c["ts"]]
        best = max(before, key=lambda v: v["ts"], default=None)
        ties = [v for v in before if best is not None and v["ts"] == best["ts"]]
        view = None if best is None else (best["view"] if len(ties) == 1 else "tie")
        wanted[(c["click"], view)] += 1
    got = Counter(
        (r["click"], r["view"] if wanted.get((r["click"], "tie")) is None else "tie") for r in rows
    )
    assert got == wanted


def test_a_regular_join_pairs_everything_with_an_equal_key(tmp_path: Path) -> None:
    clicks, views = inputs(tmp_path)
    rows = run(tmp_path, lambda c, v: c.join(v, on="ad"))
    wanted = Counter((c["click"], v["view"]) for c in clicks for v in views if c["ad"] == v["ad"])
    assert Counter((r["click"], r["view"]) for r in rows) == wanted


def test_sessions_and_sliding_windows_join_too(tmp_path: Path) -> None:
    clicks, views = inputs(tmp_path)
    sliding = run(
        tmp_path, lambda c, v: c.window_join(v, on="ad", window=Sliding("20s", every="10s"))
    )
    wanted = Counter()
    for start in range(-10 * S, 100 * S, 10 * S):
        for c in clicks:
            for v in views:
                inside = all(start <= r["ts"] < start + 20 * S for r in (c, v))
                if c["ad"] == v["ad"] and inside:
                    wanted[(start, c["click"], v["view"])] += 1
    assert Counter(key(r, "window_start", "click", "view") for r in sliding) == wanted
    (tmp_path / "ck").rename(tmp_path / "ck-sliding")
    sessions = run(tmp_path, lambda c, v: c.window_join(v, on="ad", window=Session(gap="1s")))
    assert sessions, "pairs in sessions"
    for r in sessions:
        assert r["window_start"] <= min(r["ts"], r["ts_right"])
        assert max(r["ts"], r["ts_right"]) < r["window_end"]


def test_a_join_that_cannot_work_is_refused_when_the_job_is_built(tmp_path: Path) -> None:
    inputs(tmp_path)
    env = StreamEnvironment(2)
    clicks = env.read_parquet(tmp_path / "clicks", event_time="ts")
    views = env.read_parquet(tmp_path / "views", event_time="ts")
    bare = env.read_parquet(tmp_path / "views", name="bare")
    with pytest.raises(
        ValueError, match=r"interval_join \(right input\): the records have no column 'user'"
    ):
        clicks.interval_join(views, left_on="ad", right_on="user", between=("-1s", "0s"))
    with pytest.raises(
        ValueError, match=r"the lower bound \(0 ms\) is above the upper bound \(-1000 ms\)"
    ):
        clicks.interval_join(views, on="ad", between=("0s", "-1s"))
    with pytest.raises(ValueError, match="asof_join: how='full' is not supported"):
        clicks.asof_join(views, on="ad", how="full")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window_join: the right stream has no event time"):
        clicks.window_join(bare, on="ad", window=Tumbling("1s"))
    named = env.read_parquet(write(tmp_path / "named", [{"ad": "a", "ts": 1}], 1), event_time="ts")
    with pytest.raises(TypeError, match="keys are of different types: the left's 'ad' is int64"):
        clicks.join(named, on="ad")
    with pytest.raises(TypeError, match="say the key"):
        clicks.join(views)
    with pytest.raises(TypeError, match="join the stream itself, not a keyed one"):
        clicks.join(views.key_by("ad"), on="ad")  # type: ignore[arg-type]


def test_a_window_after_a_join_counts_the_pairs_by_their_event_time(tmp_path: Path) -> None:
    """A pair's event time is the later of its two records': a tumbling window of 10 s after
    an interval join counts each pair in the window of that time."""
    clicks, views = inputs(tmp_path)

    def build(c: Any, v: Any) -> Any:
        pairs = c.interval_join(v, on="ad", between=("-10s", "0s"))
        return pairs.key_by("ad").window(Tumbling("10s")).count()

    rows = run(tmp_path, build)
    wanted: Counter[tuple[int, int]] = Counter()
    for c in clicks:
        for v in views:
            if c["ad"] == v["ad"] and -10 * S <= v["ts"] - c["ts"] <= 0:
                later = max(c["ts"], v["ts"])
                wanted[(c["ad"], later - later % (10 * S))] += 1
    assert {(r["ad"], r["window_start"]): r["count"] for r in rows} == dict(wanted)


def test_a_null_key_pairs_with_nothing_and_an_outer_join_emits_it(tmp_path: Path) -> None:
    write(
        tmp_path / "clicks",
        [{"ad": a, "ts": t * S, "click": t} for t, a in enumerate([1, None, 2])],
    )
    write(
        tmp_path / "views", [{"ad": a, "ts": t * S, "view": t} for t, a in enumerate([None, 1, 3])]
    )
    rows = run(tmp_path, lambda c, v: c.interval_join(v, on="ad", between=("0s", "5s"), how="full"))
    assert sorted(((r["ad"], r["click"], r["view"]) for r in rows), key=repr) == sorted(
        [(1, 0, 1), (None, 1, None), (2, 2, None), (None, None, 0), (3, None, 2)], key=repr
    )


def test_a_window_after_an_outer_interval_join_finds_no_unmatched_row_late(
    tmp_path: Path,
) -> None:
    """A right join's unmatched views come out when the watermark reaches ``R.time - lower``,
    10 s after their own time: the join holds the watermark it passes on 10 s back, so the
    window after it counts every one of them (none goes to its ``.late()``). Clicks of two
    ads of five: most views find none."""
    rng = random.Random(5)
    clicks = [{"ad": rng.randrange(2), "ts": rng.randrange(100 * S), "click": i} for i in range(60)]
    views = [
        {"ad": rng.randrange(ADS), "ts": rng.randrange(100 * S), "view": i} for i in range(200)
    ]
    write(tmp_path / "clicks", clicks)
    write(tmp_path / "views", views)

    def build(c: Any, v: Any) -> Any:
        joined = c.interval_join(v, on="ad", between=("-10s", "0s"), how="right", name="j")
        counts = joined.key_by("ad").window(Tumbling("5s")).count(name="w")
        counts.late().collect("late")
        return counts

    rows = run(tmp_path, build, batch_size=5)  # (watermarks in small steps)
    wanted: Counter[tuple[int, int]] = Counter()
    for v in views:
        found = [c for c in clicks if c["ad"] == v["ad"] and -10 * S <= v["ts"] - c["ts"] <= 0]
        for c in found or [None]:
            later = v["ts"] if c is None else max(c["ts"], v["ts"])
            wanted[(v["ad"], later - later % (5 * S))] += 1
    assert {(r["ad"], r["window_start"]): r["count"] for r in rows} == dict(wanted)
