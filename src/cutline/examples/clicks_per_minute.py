"""Clicks per user per minute, on event time: out-of-order clicks counted in their minute, late
ones sent to a side output.

The input is three JSON-lines files of clicks, ``{"user": "ann", "ts": "2024-05-01T12:03:07Z"}``,
each covering the same ten minutes (12:00 to 12:10), each at most 2 s out of order. The job
counts the clicks of each user in each minute of *event time* (the ``ts`` of the click, not
the time it is read), and writes the late clicks elsewhere::

    clicks = env.read_jsonl("clicks/", event_time="ts", max_out_of_orderness="2s",
                            idle_timeout="30s")
    counts = clicks.key_by("user").window(Tumbling("1 min")).count()
    counts.write_parquet("counts/")       # user, window_start, window_end, count
    counts.late().write_parquet("late/")  # the late clicks, as they came in

At the end of the last file come three **stragglers**: clicks of ``dev`` stamped between 12:01
and 12:03 (a phone that was offline, sending its clicks when it reconnected at 12:10). They are
late by construction:

* the job runs at parallelism 1, so the window operator's watermark is the one source
  subtask's watermark, the least of its files' (a file not started yet holds it at its lowest
  time as its first records and the bound tell, about 12:00 here, since every file covers
  the same ten minutes: the watermark moves only once the last file is being read, and then
  follows that file alone);
* the source reads at most ``BATCH`` (50) clicks at a time and sends the watermark after each
  read, so before the read that holds the stragglers the window operator has had the
  watermark of an earlier read, which held a click of 12:07:58: 12:07:55.999, long past the
  ends of the stragglers' minutes, which have fired. (With the default batch size a file
  this small is usually read at once: it would be counted whole before its watermark came,
  stragglers included.)

:func:`write_clicks` checks the second point before anything runs. At parallelism 2 the window operator
would take the minimum of two source subtasks' watermarks, and whether the other subtask had
come as far when the stragglers arrive would depend on timing: they might be counted instead.

Run it with ``python -m cutline.examples.clicks_per_minute [WORKDIR]`` (local Spark; WORKDIR,
new or empty, defaults to a new temporary folder and keeps the input, the output and the
checkpoints). It prints the counts and the late clicks, and checks them against the same
counts computed in plain Python from the files it wrote (exit status 0 when both are exact).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from cutline.api import EventTime, StreamEnvironment, Tumbling, WindowedResult

START = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
"""When the clicks begin (event time)."""
MINUTES = 10
"""How long the clicks of each file last."""
USERS = ("ann", "bob", "cho", "dev", "eve")
FILES = 3
BOUND = dt.timedelta(seconds=2)
"""How far out of order the clicks of a file come: the job's ``max_out_of_orderness``."""
BATCH = 50
"""The most clicks the source reads at once (``batch_size``)."""
MINUTE = dt.timedelta(minutes=1)

Click = dict[str, Any]
"""``{"user": str, "ts": datetime}`` (aware, UTC)."""

STRAGGLERS: list[Click] = [
    {"user": "dev", "ts": START + dt.timedelta(minutes=1, seconds=12)},
    {"user": "dev", "ts": START + dt.timedelta(minutes=1, seconds=48)},
    {"user": "dev", "ts": START + dt.timedelta(minutes=2, seconds=31)},
]
"""The late clicks, at the end of the last file."""


# ------------------------------------------------------------------------------- input


def file_clicks(f: int) -> list[Click]:
    """The on-time clicks of file ``f``, in file order: a clock that advances 1-4 s a click
    from 12:00 to 12:10, each click stamped 0-2 s before the clock."""
    rng = random.Random(f)
    clicks = []
    clock = START
    while clock < START + MINUTES * MINUTE:
        ts = max(START, clock - dt.timedelta(seconds=rng.randint(0, 2)))
        clicks.append({"user": rng.choice(USERS), "ts": ts})
        clock += dt.timedelta(seconds=rng.randint(1, 4))
    return clicks


def iso(ts: dt.datetime) -> str:
    return ts.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_clicks(directory: Path) -> list[list[Click]]:
    """Write ``clicks-0.jsonl`` ... into ``directory`` (the source reads them in name order):
    the clicks of :func:`file_clicks`, and after the last file's, the stragglers. Returns the
    on-time clicks of each file, after checking that they are within :data:`BOUND` of order
    and that the stragglers are late however the source cuts its reads."""
    files = [file_clicks(f) for f in range(FILES)]
    for rows in files:
        highest = rows[0]["ts"]
        for click in rows:
            if click["ts"] < highest - BOUND:
                raise RuntimeError(f"{click} is more than {BOUND} out of order")
            highest = max(highest, click["ts"])
    # the stragglers follow row len(last) - 1 of the last file; a read holds at most BATCH
    # rows, so the rows before len(last) - BATCH + 1 were read, and their watermark sent,
    # before them
    last = files[-1]
    read_before = last[: len(last) - BATCH + 1]
    watermark = max(c["ts"] for c in read_before) - BOUND - dt.timedelta(milliseconds=1)
    for click in STRAGGLERS:
        end = minute_of(click["ts"]) + MINUTE
        if end - dt.timedelta(milliseconds=1) > watermark:
            raise RuntimeError(f"{click} would not be late: the watermark is {watermark}")
    directory.mkdir(parents=True, exist_ok=True)
    for f, rows in enumerate(files):
        written = rows + STRAGGLERS if f == FILES - 1 else rows
        lines = [json.dumps({"user": c["user"], "ts": iso(c["ts"])}) for c in written]
        (directory / f"clicks-{f}.jsonl").write_text("\n".join(lines) + "\n")
    return files


# --------------------------------------------------------------------------------- job


def clicks_per_minute(env: StreamEnvironment, clicks: Path) -> WindowedResult:
    """The job: per user, the clicks of each minute of event time."""
    stream = env.read_jsonl(
        clicks,
        event_time=EventTime(
            "ts",  # ISO-8601 text to whole seconds: read as a timestamp
            max_out_of_orderness="2s",
            idle_timeout="30s",  # a file without clicks that long stops holding the watermark back
        ),
        name="clicks",
    )
    return stream.key_by("user").window(Tumbling("1 min")).count(name="per_minute")


def run(workdir: Path, spark: Any = None) -> Any:
    """Run the job on the input in ``workdir/clicks`` (counts into ``workdir/counts``, late
    clicks into ``workdir/late``); return its ``JobResult``."""
    env = StreamEnvironment(
        1,  # one source subtask: which clicks are late is fixed by the input alone
        checkpoint_interval="500ms",
        checkpoint_dir=workdir / "checkpoints",
        batch_size=BATCH,
    )
    counts = clicks_per_minute(env, workdir / "clicks")
    counts.write_parquet(workdir / "counts", name="counts")
    counts.late().write_parquet(workdir / "late", name="late")
    return env.execute(spark)


# --------------------------------------------------------------------- the answer in Python


def naive(ts: dt.datetime) -> dt.datetime:
    """As the job reads it: the column is ``timestamp[us]`` (UTC, no time zone)."""
    return ts.astimezone(dt.UTC).replace(tzinfo=None)


def minute_of(ts: dt.datetime) -> dt.datetime:
    return ts.replace(second=0, microsecond=0)


def expected_counts(files: list[list[Click]]) -> dict[tuple[str, dt.datetime, dt.datetime], int]:
    """(user, window_start, window_end) -> its clicks, over the on-time clicks ``files``."""
    counts: Counter[tuple[str, dt.datetime, dt.datetime]] = Counter()
    for rows in files:
        for click in rows:
            start = naive(minute_of(click["ts"]))
            counts[(click["user"], start, start + MINUTE)] += 1
    return dict(counts)


def published(directory: Path) -> list[dict[str, Any]]:
    """The rows a file sink published."""
    if not directory.exists():
        return []
    return list(ds.dataset(str(directory), format="parquet").to_table().to_pylist())


# -------------------------------------------------------------------------------- main


def show(counts: list[dict[str, Any]], late: list[dict[str, Any]]) -> None:
    print("clicks per user per minute of event time (Tumbling('1 min'), max_out_of_orderness 2s):")
    print("minute  " + "".join(f"{u:>5}" for u in USERS))
    table = {(r["user"], r["window_start"]): r["count"] for r in counts}
    for start in sorted({r["window_start"] for r in counts}):
        cells = "".join(f"{table.get((u, start), 0):>5}" for u in USERS)
        print(f"{start:%H:%M}   {cells}")
    print(f"late clicks ({len(late)}, to counts.late(), as they came in):")
    for r in sorted(late, key=lambda r: (r["ts"], r["user"])):
        print(f"  {r['user']}  {r['ts']:%H:%M:%S}  (its minute {r['ts']:%H:%M} had fired)")


def main(argv: list[str] | None = None) -> int:
    """Run the job on local Spark, print what it found and whether it is right."""
    parser = argparse.ArgumentParser(
        prog="python -m cutline.examples.clicks_per_minute",
        description="Clicks per user per minute on event time, late clicks to a side output.",
    )
    parser.add_argument(
        "workdir", nargs="?", help="a new or empty folder (default: a new temporary one)"
    )
    args = parser.parse_args(argv)
    if args.workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="clicks-per-minute-"))
    else:
        workdir = Path(args.workdir)
        if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
            parser.error(f"{workdir} is not a new or empty folder")

    from cutline.spark.launcher import local_session

    on_time = write_clicks(workdir / "clicks")
    total = sum(len(rows) for rows in on_time) + len(STRAGGLERS)
    print(
        f"{total} clicks of {len(USERS)} users in {FILES} JSON-lines files, each from 12:00 to "
        f"12:10 and at most {BOUND.seconds} s out of order; the last file ends with "
        f"{len(STRAGGLERS)} clicks stamped between 12:01 and 12:03"
    )
    result = run(workdir, local_session(1))
    counts, late = published(workdir / "counts"), published(workdir / "late")
    show(counts, late)

    windows = Counter((r["user"], r["window_start"], r["window_end"]) for r in counts)
    once = all(n == 1 for n in windows.values())
    found = {(r["user"], r["window_start"], r["window_end"]): r["count"] for r in counts}
    right = found == expected_counts(on_time)
    stragglers = sorted((c["user"], naive(c["ts"])) for c in STRAGGLERS)
    late_right = sorted((r["user"], r["ts"]) for r in late) == stragglers
    counted = sum(r["count"] for r in counts)
    noted = result.metrics.operator("per_minute").late
    print(
        f"{counted} clicks counted in {len(counts)} windows, {len(late)} late; the window "
        f"operator counted {noted} late records (result.metrics); "
        f"{len(result.checkpoints)} checkpoint(s), {len(result.restarts)} restart(s)"
    )
    print(f"input, output and checkpoints in {workdir}")
    print(f"each window published once: {once}")
    print(f"every count equal to the count in plain Python, stragglers left out: {right}")
    print(f"the late clicks are exactly the {len(STRAGGLERS)} stragglers: {late_right}")
    exact = counted + len(late) == total and noted == len(late)
    return 0 if once and right and late_right and exact else 1


if __name__ == "__main__":
    sys.exit(main())
