"""B6: checkpoint cadence and duration for a flat_map-heavy job (issue 16, point 6).

    .venv/bin/python bench/b6_cadence.py [--lines 800000] [--repeats 3] [--out bench/results/b6.json]

The job, at parallelism 2 on local Spark: a word count. JSON-lines files of text lines (12
words each, from 5,000 words) -> ``flat_map`` into one record per word (a per-record Python
function: each line read makes 12 records) -> ``key_by(word)`` -> ``count()`` -> Parquet, with
a checkpoint every second. The counting subtasks are slower than the sources, so the buffers
between them are full: real backpressure, the case where checkpoints used to come late.

Side by side in one process, interleaved, ``--repeats`` rounds:

* cutline, aligned checkpoints (the default);
* cutline, unaligned checkpoints;
* Spark Structured Streaming on the same files: ``explode(split(line))``, ``groupBy(word)
  .count()``, a checkpoint location, ``trigger(processingTime="1 second")`` and
  ``maxFilesPerTrigger=1``: each micro-batch is its checkpoint (offsets and state written).

Figures per run: checkpoints (cutline: periodic ones completed; Spark: micro-batches), the
**cadence** (median seconds between two completions; the interval asked is 1 s), checkpoint
**duration** p50 / p90 / max (cutline: trigger to complete; Spark: a micro-batch's
``triggerExecution``), the seconds from the job running to its first complete checkpoint, the
most records a cutline barrier waited behind, and lines/s. Every run is **verified**: each
word's final count equals its count in the input.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from cutline import Checkpoints, StreamEnvironment
from cutline.spark.launcher import local_session

WORDS = [f"w{i}" for i in range(5000)]
PER_LINE = 12
FILES = 8


def write_input(directory: Path, lines: int) -> Counter[str]:
    """``lines`` lines of text in ``FILES`` JSON-lines files; the count of every word."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(16)
    counts: Counter[str] = Counter()
    for f in range(FILES):
        with open(directory / f"lines-{f}.jsonl", "w") as out:
            for _ in range(lines // FILES):
                words = [rng.choice(WORDS) for _ in range(PER_LINE)]
                counts.update(words)
                out.write(json.dumps({"line": " ".join(words)}) + "\n")
    return counts


def words(record: dict) -> list[dict]:
    return [{"word": w} for w in record["line"].split()]


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "max": None}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 3),
        "p90": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 3),
        "max": round(ordered[-1], 3),
    }


def _cadence(completions: list[float]) -> float | None:
    gaps = [b - a for a, b in itertools.pairwise(completions)]
    return round(statistics.median(gaps), 3) if gaps else None


def run_cutline(spark: Any, input_dir: Path, mode: str, expected: Counter[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = StreamEnvironment(
            2, checkpoints=Checkpoints(interval="1s", dir=f"{tmp}/ck", mode=mode)
        )
        env.read_jsonl(input_dir).flat_map(words).key_by("word").count().write_parquet(f"{tmp}/out")
        running: list[float] = []
        started = time.monotonic()
        result = env.execute(
            spark,
            progress=False,
            listener=lambda kind, _: (
                running.append(time.monotonic()) if kind == "running" else None
            ),
        )
        table = ds.dataset(f"{tmp}/out", format="parquet").to_table(columns=["word", "count"])
        finals = table.group_by("word").aggregate([("count", "max")])
        counted = dict(
            zip(finals["word"].to_pylist(), finals["count_max"].to_pylist(), strict=True)
        )
        verified = counted == dict(expected) and table.num_rows == sum(expected.values())
    periodic = [c for c in result.checkpoints if not c.final]
    ready = (running[0] - started) if running else 0.0
    completions = [c.triggered_at + c.duration for c in periodic]
    behind = [c.waited_behind[2] for c in periodic if c.waited_behind is not None]
    return {
        "system": f"cutline {mode}",
        "verified": verified,
        "checkpoints": len(periodic),
        "cadence_s": _cadence(completions),
        "checkpoint_duration_s": _quantiles([c.duration for c in periodic]),
        "first_checkpoint_after_running_s": (
            round(completions[0] - ready, 3) if completions else None
        ),
        "barrier_waited_behind_records_max": max(behind, default=0),
        "running_s": round(result.running_seconds, 2),
        "lines_per_s": round(sum(expected.values()) / PER_LINE / result.running_seconds),
    }


def run_spark(spark: Any, input_dir: Path, expected: Counter[str]) -> dict:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    work = Path(tempfile.mkdtemp())
    try:
        schema = StructType([StructField("line", StringType())])
        counts = (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", 1)
            .json(str(input_dir))
            .select(F.explode(F.split("line", " ")).alias("word"))
            .groupBy("word")
            .count()
        )
        name = f"b6_{int(time.time() * 1000)}"
        started = time.monotonic()
        query = (
            counts.writeStream.outputMode("complete")
            .format("memory")
            .queryName(name)
            .option("checkpointLocation", str(work / "ck"))
            .trigger(processingTime="1 second")
            .start()
        )
        while True:  # until every file is in
            progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
            if len(progress) >= FILES:
                break
            time.sleep(0.2)
        query.stop()
        wall = time.monotonic() - started
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
        rows = spark.sql(f"select word, count from {name}").collect()
        counted = {row["word"]: row["count"] for row in rows}
        verified = counted == dict(expected)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def ended(p: dict) -> float:
        return _epoch(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000

    completions = [ended(p) for p in batches]
    first = completions[0] - _epoch(batches[0]["timestamp"]) if completions else None
    return {
        "system": "spark structured streaming",
        "verified": verified,
        "checkpoints": len(batches),
        "cadence_s": _cadence(completions),
        "checkpoint_duration_s": _quantiles(
            [p["durationMs"]["triggerExecution"] / 1000 for p in batches]
        ),
        "first_checkpoint_after_running_s": round(first, 3) if first is not None else None,
        "barrier_waited_behind_records_max": None,
        "running_s": round(wall, 2),
        "lines_per_s": round(sum(expected.values()) / PER_LINE / wall),
    }


def _epoch(timestamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=800_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/b6.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cutline-b6-"))
    try:
        expected = write_input(work / "lines", args.lines)
        spark = local_session(2)
        runs: list[dict] = []
        for round_ in range(args.repeats):
            for system in ("cutline aligned", "cutline unaligned", "spark"):
                if system == "spark":
                    figures = run_spark(spark, work / "lines", expected)
                else:
                    figures = run_cutline(spark, work / "lines", system.split()[1], expected)
                figures["round"] = round_
                print(json.dumps(figures), flush=True)
                runs.append(figures)
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    document = {
        "benchmark": "B6",
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        "parameters": {
            "parallelism": 2,
            "lines": args.lines,
            "words_per_line": PER_LINE,
            "vocabulary": len(WORDS),
            "files": FILES,
            "checkpoint_interval_s": 1.0,
        },
        "runs": runs,
        "summary": _summary(runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    _print(document["summary"])
    print(f"wrote {args.out}")
    if not all(r["verified"] for r in runs):
        sys.exit(1)


def _summary(runs: list[dict]) -> list[dict]:
    """Per system: the median of each figure over its verified runs, and the min-max."""
    summary = []
    for system in dict.fromkeys(r["system"] for r in runs):
        mine = [r for r in runs if r["system"] == system and r["verified"]]

        def spread(values: list[float]) -> dict[str, float | None]:
            values = [v for v in values if v is not None]
            if not values:
                return {"median": None, "min": None, "max": None}
            return {
                "median": round(statistics.median(values), 3),
                "min": round(min(values), 3),
                "max": round(max(values), 3),
            }

        summary.append(
            {
                "system": system,
                "verified_runs": len(mine),
                "checkpoints": spread([r["checkpoints"] for r in mine]),
                "cadence_s": spread([r["cadence_s"] for r in mine]),
                "duration_p50_s": spread([r["checkpoint_duration_s"]["p50"] for r in mine]),
                "duration_max_s": spread([r["checkpoint_duration_s"]["max"] for r in mine]),
                "first_checkpoint_s": spread([r["first_checkpoint_after_running_s"] for r in mine]),
                "lines_per_s": spread([r["lines_per_s"] for r in mine]),
            }
        )
    return summary


def _print(summary: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="B6: checkpoint cadence, flat_map-heavy word count (interval 1 s)")
    for column in (
        "system",
        "checkpoints",
        "cadence s",
        "duration p50 s",
        "max s",
        "first s",
        "lines/s",
        "verified",
    ):
        table.add_column(column, justify="right" if column != "system" else "left")

    def cell(figure: dict) -> str:
        if figure["median"] is None:
            return "-"
        return f"{figure['median']:g} ({figure['min']:g}-{figure['max']:g})"

    for row in summary:
        table.add_row(
            row["system"],
            cell(row["checkpoints"]),
            cell(row["cadence_s"]),
            cell(row["duration_p50_s"]),
            cell(row["duration_max_s"]),
            cell(row["first_checkpoint_s"]),
            cell(row["lines_per_s"]),
            str(row["verified_runs"]),
        )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
