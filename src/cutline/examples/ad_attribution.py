"""Ad attribution: each click credited to the last view of the same ad within the ten minutes
before it, on event time, by an as-of join.

The input is two streams of Parquet files over the same hour of event time (12:00 to 13:00),
each file at most 2 s out of order: **views** ``{"ad", "ts", "view"}`` (three files) and
**clicks** ``{"ad", "ts", "click"}`` (two files). The job::

    views = env.read_parquet("views/", event_time=EventTime("ts", max_out_of_orderness="2s"))
    clicks = env.read_parquet("clicks/", event_time=EventTime("ts", max_out_of_orderness="2s"))
    last = clicks.asof_join(views, on="ad", how="left", suffix="_view")
    attributed = last.map_batches(within_ten_minutes)   # a view older than that: none
    attributed.write_parquet("attributed/")             # ad, ts, click, ts_view, view

**Why an as-of join.** ``asof_join`` gives each click exactly one row: the view of its ad with
the greatest time at or before the click's (``how="left"``: nulls when there is none). That
view is the *last* view before the click, so the click is attributed to it when it is at most
ten minutes older (``ts - ts_view <= 10 min``, both ends inclusive), and to no view otherwise:
no other view can be within the ten minutes when the last one is not. The rule is one
comparison of two columns of the join's row, vectorized (``map_batches``). An interval join,
``between=("-10 min", "0s")``, would give every view of the ten minutes, one row each,
emitted as each pair meets: picking the last of them would need a second stateful step that
waits, per click, until no later view can come (the watermark past the click's time), which
is what the as-of join does already, keeping per ad only the newest view at or below the
watermark and those above it (an interval join keeps ten minutes of views).

A click is emitted once the watermark of both inputs passes its time, so a view that comes
later from another file but is stamped before the click still counts; every click is
published once, attributed or not. Times are unique per ad (views and clicks), so that "the
last view" is never a tie.

Run it with ``python -m cutline.examples.ad_attribution [WORKDIR]`` (local Spark,
parallelism 2; WORKDIR, new or empty, defaults to a new temporary folder and keeps the input,
the output and the checkpoints). It prints the clicks attributed per ad and a few of them,
and checks every click's attribution against the same rule computed in plain Python from the
files it wrote (exit status 0 when all are exact).
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import itertools
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from cutline.api import EventTime, StreamEnvironment

START = dt.datetime(2024, 5, 1, 12, 0)
"""When the input begins (event time, UTC)."""
MINUTES = 60
"""How long each file lasts."""
ADS = ("shoes", "hats", "bags", "socks", "belts")
VIEW_FILES = 3
CLICK_FILES = 2
VIEWS_PER_FILE = 400
CLICKS_PER_FILE = 150
RARE = "belts"
"""An ad seldom viewed (one view in 200; one click in 10): many of its clicks have no view in
the ten minutes before them."""
BOUND = dt.timedelta(seconds=2)
"""How far out of order each file is: the job's ``max_out_of_orderness``."""
TOLERANCE = dt.timedelta(minutes=10)
"""How old the last view may be for the click to be attributed to it (inclusive)."""
PARALLELISM = 2

Row = dict[str, Any]
"""A view ``{"ad", "ts", "view"}`` or a click ``{"ad", "ts", "click"}``; ``ts`` a naive UTC
``datetime`` of whole milliseconds."""


# ------------------------------------------------------------------------------- input


def _stamps(
    rng: random.Random, count: int, rare: int, taken: set[tuple[str, dt.datetime]]
) -> list[Row]:
    """``count`` rows over the hour in file order: a clock that moves evenly, each row stamped
    up to :data:`BOUND` before it, with an ad (:data:`RARE` one time in ``rare``) and a time
    that no other row of its ad has (``taken``)."""
    rows = []
    step = MINUTES * 60_000 // count
    common = [ad for ad in ADS if ad != RARE]
    for i in range(count):
        ad = RARE if rng.randrange(rare) == 0 else rng.choice(common)
        while True:
            clock = START + dt.timedelta(milliseconds=i * step + rng.randrange(step))
            ts = max(START, clock - dt.timedelta(milliseconds=rng.randrange(2_000)))
            if (ad, ts) not in taken:
                break
        taken.add((ad, ts))
        rows.append({"ad": ad, "ts": ts})
    return rows


def make_input(seed: int = 5) -> tuple[list[list[Row]], list[list[Row]]]:
    """The views of each view file and the clicks of each click file, in file order. The
    first click file also has three clicks on the edges of the rule, after a view of the
    rare ad that has no other for over ten minutes: one at the same millisecond (attributed,
    0 s before), one exactly ten minutes later (attributed: the bound is inclusive) and one
    a millisecond after that (not attributed)."""
    rng = random.Random(seed)
    taken: set[tuple[str, dt.datetime]] = set()
    views = [_stamps(rng, VIEWS_PER_FILE, 200, taken) for _ in range(VIEW_FILES)]
    clicks = [_stamps(rng, CLICKS_PER_FILE, 10, taken) for _ in range(CLICK_FILES)]
    clicks[0] = sorted(clicks[0] + [{"ad": RARE, "ts": ts} for ts in edges(views)], key=_time)
    for name, files in (("view", views), ("click", clicks)):
        n = 0
        for rows in files:
            for row in rows:
                n += 1
                row[name] = f"{name[0]}{n:04d}"
    return views, clicks


def edges(views: list[list[Row]]) -> list[dt.datetime]:
    """The times of the three clicks on the edges of the rule (see :func:`make_input`)."""
    rare = sorted(v["ts"] for rows in views for v in rows if v["ad"] == RARE)
    alone = next(t for t, after in itertools.pairwise(rare) if after - t > TOLERANCE)
    return [alone, alone + TOLERANCE, alone + TOLERANCE + dt.timedelta(milliseconds=1)]


def _time(row: Row) -> dt.datetime:
    ts: dt.datetime = row["ts"]
    return ts


SCHEMAS = {
    kind: pa.schema([("ad", pa.string()), ("ts", pa.timestamp("ms")), (kind, pa.string())])
    for kind in ("view", "click")
}


def write_input(workdir: Path) -> tuple[list[list[Row]], list[list[Row]]]:
    """Write ``views/views-N.parquet`` and ``clicks/clicks-N.parquet`` into ``workdir``, after
    checking that each file is within :data:`BOUND` of order; returns what was written."""
    views, clicks = make_input()
    for kind, files in (("view", views), ("click", clicks)):
        folder = workdir / f"{kind}s"
        folder.mkdir(parents=True)
        for f, rows in enumerate(files):
            highest = rows[0]["ts"]
            for row in rows:
                if row["ts"] < highest - BOUND:
                    raise RuntimeError(f"{row} is more than {BOUND} out of order")
                highest = max(highest, row["ts"])
            table = pa.Table.from_pylist(rows, schema=SCHEMAS[kind])
            pq.write_table(table, folder / f"{kind}s-{f}.parquet")
    return views, clicks


# --------------------------------------------------------------------------------- job


def within_ten_minutes(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The as-of join's rows with the view kept only when it is at most :data:`TOLERANCE`
    older than the click (else ``view`` and ``ts_view`` null: not attributed)."""
    age = pc.subtract(batch.column("ts"), batch.column("ts_view"))
    stale = pc.fill_null(pc.greater(age, pa.scalar(TOLERANCE, pa.duration("ms"))), False)
    columns = {name: batch.column(name) for name in batch.schema.names}
    for name in ("ts_view", "view"):
        column = columns[name]
        columns[name] = pc.if_else(stale, pa.nulls(len(column), column.type), column)
    return pa.RecordBatch.from_pydict(columns, schema=batch.schema)


def attribution(env: StreamEnvironment, workdir: Path) -> Any:
    """The job: the clicks of ``workdir/clicks``, each with the last view of its ad in
    ``workdir/views`` at most ten minutes before it. Returns the joined stream (its
    ``late()`` sides are the records that came too late to be joined: none here)."""
    time = EventTime("ts", max_out_of_orderness=BOUND)
    views = env.read_parquet(workdir / "views", event_time=time, name="views")
    clicks = env.read_parquet(workdir / "clicks", event_time=time, name="clicks")
    return clicks.asof_join(views, on="ad", how="left", suffix="_view", name="last_view")


def run(workdir: Path, spark: Any = None) -> Any:
    """Run the job on the input in ``workdir`` (attributions into ``workdir/attributed``,
    late records into ``workdir/late-clicks`` and ``workdir/late-views``); its result."""
    env = StreamEnvironment(
        PARALLELISM, checkpoint_interval="1s", checkpoint_dir=workdir / "checkpoints"
    )
    joined = attribution(env, workdir)
    attributed = joined.map_batches(within_ten_minutes, name="within_ten_minutes")
    attributed.write_parquet(workdir / "attributed", name="attributed")
    joined.late("left").write_parquet(workdir / "late-clicks", name="late_clicks")
    joined.late("right").write_parquet(workdir / "late-views", name="late_views")
    return env.execute(spark, progress=False)


# --------------------------------------------------------------------- the answer in Python


def expected(views: list[list[Row]], clicks: list[list[Row]]) -> dict[str, str | None]:
    """Each click's view (``None``: not attributed), by the rule in plain Python: the view of
    its ad with the greatest time at or before the click's, if at most ten minutes older."""
    by_ad: dict[str, list[tuple[dt.datetime, str]]] = {}
    for row in (r for rows in views for r in rows):
        by_ad.setdefault(row["ad"], []).append((row["ts"], row["view"]))
    for found in by_ad.values():
        found.sort()
    answer: dict[str, str | None] = {}
    for click in (c for rows in clicks for c in rows):
        found = by_ad.get(click["ad"], [])
        i = bisect.bisect_right(found, (click["ts"], "\uffff")) - 1  # the last at or before
        view = None
        if i >= 0 and click["ts"] - found[i][0] <= TOLERANCE:
            view = found[i][1]
        answer[click["click"]] = view
    return answer


def published(directory: Path) -> list[Row]:
    """The rows a file sink published."""
    if not directory.exists() or not any(directory.glob("*.parquet")):
        return []
    return list(ds.dataset(str(directory), format="parquet").to_table().to_pylist())


# -------------------------------------------------------------------------------- main


def show(rows: list[Row], edge_times: list[dt.datetime]) -> None:
    print(f"clicks per ad, attributed to a view at most {TOLERANCE.seconds // 60} min before:")
    print(f"{'ad':<6} {'clicks':>6} {'attributed':>10} {'not':>4}")
    for ad in ADS:
        mine = [r for r in rows if r["ad"] == ad]
        done = sum(r["view"] is not None for r in mine)
        print(f"{ad:<6} {len(mine):>6} {done:>10} {len(mine) - done:>4}")
    ordered = sorted(rows, key=lambda r: r["ts"])
    print("the first clicks:")
    for r in ordered[:3]:
        print("  " + line(r))
    print("the clicks on the edges of the rule:")
    for r in ordered:
        if r["ad"] == RARE and r["ts"] in edge_times:
            print("  " + line(r))


def line(r: Row) -> str:
    """One click and what it was attributed to."""
    credit = "not attributed (no view in the 10 min before)"
    if r["view"] is not None:
        age = (r["ts"] - r["ts_view"]).total_seconds()
        credit = f"view {r['view']} at {clock(r['ts_view'])}, {age:.3f} s before"
    return f"{r['click']}  {r['ad']:<6} {clock(r['ts'])}  {credit}"


def clock(ts: dt.datetime) -> str:
    """``12:03:07.250``."""
    return f"{ts:%H:%M:%S}.{ts.microsecond // 1000:03d}"


def main(argv: list[str] | None = None) -> int:
    """Run the job on local Spark, print what it found and whether it is right."""
    parser = argparse.ArgumentParser(
        prog="python -m cutline.examples.ad_attribution",
        description="Clicks attributed to the last view of their ad within ten minutes.",
    )
    parser.add_argument(
        "workdir", nargs="?", help="a new or empty folder (default: a new temporary one)"
    )
    args = parser.parse_args(argv)
    if args.workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="ad-attribution-"))
    else:
        workdir = Path(args.workdir)
        if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
            parser.error(f"{workdir} is not a new or empty folder")

    from cutline.spark.launcher import local_session

    views, clicks = write_input(workdir)
    n_views, n_clicks = sum(map(len, views)), sum(map(len, clicks))
    print(
        f"{n_views} views in {VIEW_FILES} files and {n_clicks} clicks in {CLICK_FILES} files "
        f"of {len(ADS)} ads, 12:00 to 13:00, each file at most {BOUND.seconds} s out of order"
    )
    result = run(workdir, local_session(PARALLELISM))
    rows = published(workdir / "attributed")
    late = published(workdir / "late-clicks") + published(workdir / "late-views")
    show(rows, edges(views))

    once = Counter(r["click"] for r in rows)
    each_once = len(rows) == n_clicks and set(once.values()) == {1}
    found = {r["click"]: r["view"] for r in rows}
    right = found == expected(views, clicks)
    noted = result.metrics.operator("last_view").late
    print(
        f"{len(rows)} clicks published, {sum(v is not None for v in found.values())} "
        f"attributed; {len(late)} late records ({noted} counted by the join); "
        f"{len(result.checkpoints)} checkpoint(s), {len(result.restarts)} restart(s)"
    )
    print(f"input, output and checkpoints in {workdir}")
    print(f"each click published once: {each_once}")
    print(f"every attribution equal to the plain-Python rule: {right}")
    return 0 if each_once and right and not late and noted == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
