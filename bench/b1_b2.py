"""B1 (keyed running count: throughput and checkpoint overhead) and B2 (recovery) of
BENCHMARKS.md, side by side with Spark Structured Streaming in the same run.

    .venv/bin/python bench/b1_b2.py [--events 2000000] [--repeats 3] [--out bench/results/b1_b2.json]

Input: 2,000,000 events (key "k" + str(i % 10000), value 1) in 20 Parquet files, read by
every system. Systems, each run ``--repeats`` times, interleaved, at parallelism 2 on one
local Spark session (local[2]):

* cutline, built-in keyed ``sum`` (vectorized), checkpoints every 1 s, and with checkpoints
  off (only the final checkpoint at the end of the input);
* cutline, a per-record Python ``process`` function with value state, checkpoints every 1 s;
* Spark Structured Streaming micro-batch: ``groupBy("key").count()``, the same files,
  ``maxFilesPerTrigger=1``, a checkpoint location, ``trigger(availableNow=True)``;
* the floors: one Python process counting with a dict, and ``pyarrow`` group-by.

B1's 2,000,000 events take under a second here, so checkpoints every second hardly happen
in them: the overhead of checkpoints every 1 s is measured on a longer input (20,000,000
events, ``--overhead-events``) with and without checkpoints, and the overhead of checkpoints
every 0.1 s on B1's own input.

Every run is verified (all 10,000 keys end at 200; for cutline, every running sum 1..200
published exactly once); a figure of an unverified run is not reported. B2 runs the first
configuration again, checkpoints every 0.1 s, with one worker killed (SIGKILL) at half the
input by construction: each source subtask holds after half its share until a checkpoint
taken since is complete (``hold_sources``), and the kill comes on that checkpoint's
completion, so the job restores from it on a machine of any speed.

Times: ``events_per_s`` counts from every slot running to every slot finished (excluding the
JVM, the interpreter and Spark's job start); ``events_per_s_incl_start`` counts the whole
``execute()`` call on a warm Spark session; the session's own start is reported once.
PyFlink is not installed on this machine (no internet beyond the package registry; it was
not pulled in for a benchmark): its figure is not measured here.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from cutline import FixedDelay, KeyedProcessFunction, StreamEnvironment, testing
from cutline.demo import WorkerKiller, check_b1_output, write_b1_input
from cutline.runtime.task.launch import SourceHold
from cutline.spark.launcher import local_session
from figures import summary  # (bench/figures.py, beside this file)

KEYS = 10_000


class RunningCount(KeyedProcessFunction):
    def open(self, ctx):  # type: ignore[no-untyped-def]
        self.count = ctx.value_state("count")

    def process(self, record, ctx):  # type: ignore[no-untyped-def]
        count = self.count.get(0) + 1
        self.count.update(count)
        return ({"key": record["key"], "value": count},)


def _cutline(spark: Any, input_dir: Path, work: Path, *, kind: str, interval: Any) -> dict:
    out, ck = work / "out", work / "ck"
    shutil.rmtree(work, ignore_errors=True)
    env = StreamEnvironment(parallelism=2, checkpoint_interval=interval, checkpoint_dir=str(ck))
    keyed = env.read_parquet(str(input_dir)).key_by("key")
    stream = keyed.sum("value") if kind == "sum" else keyed.process(RunningCount())
    stream.write_parquet(str(out))
    start = time.perf_counter()
    result = env.execute(spark)
    wall = time.perf_counter() - start
    events = sum(result.records_in[s] for s in result.records_in if "read_parquet" in s)
    verdict = check_b1_output(out, KEYS, events // KEYS)
    durations = sorted(c.duration for c in result.checkpoints if not c.final)
    return {
        "verified": verdict.exact and not result.restarts,
        "events": events,
        "seconds": result.running_seconds,
        "seconds_incl_start": wall,
        "events_per_s": events / result.running_seconds,
        "events_per_s_incl_start": events / wall,
        "checkpoints_completed": len(result.checkpoints),
        "checkpoint_duration_p50_s": _pct(durations, 50),
        "checkpoint_duration_p99_s": _pct(durations, 99),
        "alignment_max_s": max((c.alignment for c in result.checkpoints), default=0.0),
    }


def _structured_streaming(spark: Any, input_dir: Path, work: Path, events: int) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    schema = spark.read.parquet(str(input_dir)).schema
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    name = f"b1_{int(time.time() * 1000)}"
    start = time.perf_counter()
    query = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
        .groupBy("key")
        .count()
        .writeStream.format("memory")
        .queryName(name)
        .outputMode("complete")
        .option("checkpointLocation", str(work / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    wall = time.perf_counter() - start
    row = spark.sql(f"select count(*) n, min(count) lo, max(count) hi from {name}").collect()[0]
    batches = len(query.recentProgress)
    spark.sql(f"drop view if exists {name}")
    per_key = events // KEYS
    return {
        "verified": row["n"] == KEYS and row["lo"] == per_key and row["hi"] == per_key,
        "events": events,
        "seconds_incl_start": wall,
        "events_per_s_incl_start": events / wall,
        "micro_batches": batches,
    }


def _dict_floor(input_dir: Path, events: int) -> dict:
    start = time.perf_counter()
    counts: Counter[str] = Counter()
    for path in sorted(input_dir.glob("*.parquet")):
        for key in pq.read_table(path, columns=["key"]).column("key").to_pylist():
            counts[key] += 1
    seconds = time.perf_counter() - start
    per_key = events // KEYS
    ok = len(counts) == KEYS and set(counts.values()) == {per_key}
    return {"verified": ok, "events": events, "seconds": seconds, "events_per_s": events / seconds}


def _arrow_floor(input_dir: Path, events: int) -> dict:
    start = time.perf_counter()
    totals: Counter[str] = Counter()
    for path in sorted(input_dir.glob("*.parquet")):
        grouped = pq.read_table(path).group_by("key").aggregate([("value", "sum")])
        for key, n in zip(
            grouped["key"].to_pylist(), grouped["value_sum"].to_pylist(), strict=True
        ):
            totals[key] += n
    seconds = time.perf_counter() - start
    per_key = events // KEYS
    ok = len(totals) == KEYS and set(totals.values()) == {per_key}
    return {"verified": ok, "events": events, "seconds": seconds, "events_per_s": events / seconds}


B2_INTERVAL = 0.1
"""B2's checkpoint interval: the held sources wait for a checkpoint that often."""


def _recovery(spark: Any, input_dir: Path, work: Path, events: int, interval: float) -> dict:
    out, ck = work / "out", work / "ck"
    shutil.rmtree(work, ignore_errors=True)
    env = StreamEnvironment(
        parallelism=2,
        checkpoint_interval=interval,
        checkpoint_dir=str(ck),
        restart_strategy=FixedDelay(delay=0),
    )
    env.read_parquet(str(input_dir)).key_by("key").sum("value").write_parquet(str(out))
    killer = WorkerKiller()  # kills on the first checkpoint completed, the sources held
    result = testing.execute(
        env,
        spark,
        on_ready=killer.on_ready,
        listener=killer,
        hold_sources=SourceHold(records=events // 4),  # half of each subtask's share
    )
    verdict = check_b1_output(out, KEYS, events // KEYS)
    read_before = result.source_records.get(1, 0)
    restored_from = result.restarts[0].restored_from if result.restarts else None
    return {
        "verified": verdict.exact and killer.killed_at is not None and len(result.restarts) == 1,
        "checkpoint_interval_s": interval,
        "recovery_s": killer.recovery_seconds(),
        "restored_from_checkpoint": restored_from,
        "records_read_by_failed_generation_at_least": read_before,
        "records_read_after_restore": result.source_records.get(2, 0),
        "records_replayed_at_least": max(0, read_before + result.source_records.get(2, 0) - events),
    }


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    index = min(len(values) - 1, round(q / 100 * (len(values) - 1)))
    return values[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--overhead-events",
        type=int,
        default=20_000_000,
        help="input of the checkpoint-overhead pair (B1's 2,000,000 events take about one "
        "second here: too short for checkpoints every second to happen)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/b1_b2.json"))
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="cutline-b1-"))
    input_dir = base / "input"
    write_b1_input(input_dir, args.events, KEYS)
    start = time.perf_counter()
    spark = local_session(2)
    spark.range(1).collect()
    session_start = time.perf_counter() - start

    systems: dict[str, list[dict]] = {
        "cutline sum, checkpoints 1 s": [],
        "cutline sum, checkpoints off": [],
        "cutline sum, checkpoints 0.1 s": [],
        "cutline process(), checkpoints 1 s": [],
        "spark structured streaming": [],
        "python dict": [],
        "pyarrow group_by": [],
    }
    _cutline(spark, input_dir, base / "warmup", kind="sum", interval="1s")  # warm the workers
    for repeat in range(args.repeats):
        for name, runs in systems.items():
            work = base / f"run-{repeat}"
            if name == "cutline sum, checkpoints 1 s":
                run = _cutline(spark, input_dir, work, kind="sum", interval="1s")
            elif name == "cutline sum, checkpoints off":
                run = _cutline(spark, input_dir, work, kind="sum", interval=None)
            elif name == "cutline sum, checkpoints 0.1 s":
                run = _cutline(spark, input_dir, work, kind="sum", interval=0.1)
            elif name == "cutline process(), checkpoints 1 s":
                run = _cutline(spark, input_dir, work, kind="process", interval="1s")
            elif name == "spark structured streaming":
                run = _structured_streaming(spark, input_dir, work, args.events)
            elif name == "python dict":
                run = _dict_floor(input_dir, args.events)
            else:
                run = _arrow_floor(input_dir, args.events)
            runs.append(run)
            rate = run.get("events_per_s") or run.get("events_per_s_incl_start")
            print(
                f"{name:<38} run {repeat + 1}: {rate:>12,.0f} events/s  verified={run['verified']}"
            )

    long_input = base / "input-long"
    write_b1_input(long_input, args.overhead_events, KEYS)
    long_runs: dict[str, list[dict]] = {
        "cutline sum, checkpoints 1 s, long input": [],
        "cutline sum, checkpoints off, long input": [],
    }
    for repeat in range(args.repeats):
        for name, runs in long_runs.items():
            interval = "1s" if "1 s" in name else None
            run = _cutline(
                spark, long_input, base / f"long-{repeat}", kind="sum", interval=interval
            )
            runs.append(run)
            print(
                f"{name:<42} run {repeat + 1}: {run['events_per_s']:>12,.0f} events/s  "
                f"checkpoints={run['checkpoints_completed']} verified={run['verified']}"
            )
    systems.update(long_runs)
    off = summary(systems["cutline sum, checkpoints off"], "events_per_s")
    long_on = summary(long_runs["cutline sum, checkpoints 1 s, long input"], "events_per_s")
    long_off = summary(long_runs["cutline sum, checkpoints off, long input"], "events_per_s")
    recoveries = [
        _recovery(spark, input_dir, base / f"b2-{i}", args.events, B2_INTERVAL)
        for i in range(args.repeats)
    ]
    for run in recoveries:
        print(
            f"B2: restored from checkpoint {run['restored_from_checkpoint']}, recovery "
            f"{run['recovery_s']} s, verified={run['verified']}"
        )

    results = []
    for name, runs in systems.items():
        results.append(
            {
                "name": "B1",
                "system": name,
                "parameters": {
                    "events": args.overhead_events if "long input" in name else args.events,
                    "keys": KEYS,
                    "files": 20,
                    "parallelism": 2,
                },
                "figures": {
                    "events_per_s": summary(runs, "events_per_s"),
                    "events_per_s_incl_start": summary(runs, "events_per_s_incl_start"),
                    "checkpoints_completed": summary(runs, "checkpoints_completed"),
                    "checkpoint_duration_p50_s": summary(runs, "checkpoint_duration_p50_s"),
                    "checkpoint_duration_p99_s": summary(runs, "checkpoint_duration_p99_s"),
                    "alignment_max_s": summary(runs, "alignment_max_s"),
                },
                "verified": all(r["verified"] for r in runs),
                "runs": runs,
            }
        )
    frequent = summary(systems["cutline sum, checkpoints 0.1 s"], "events_per_s")
    for interval, events, with_checkpoints, without in (
        (1.0, args.overhead_events, long_on, long_off),
        (0.1, args.events, frequent, off),
    ):
        overhead = (
            without["median"] / with_checkpoints["median"]
            if with_checkpoints["median"] and without["median"]
            else None
        )
        results.append(
            {
                "name": "B1",
                "system": "cutline checkpoint overhead",
                "parameters": {"interval_s": interval, "events": events},
                "figures": {
                    "throughput_off_over_on": overhead,
                    "overhead_percent": None if overhead is None else (overhead - 1) * 100,
                },
                "verified": with_checkpoints["runs"] == without["runs"] == args.repeats,
            }
        )
    results.append(
        {
            "name": "B2",
            "system": "cutline sum, SIGKILL of a worker at half the input",
            "parameters": {"events": args.events, "parallelism": 2, "interval_s": B2_INTERVAL},
            "figures": {"recovery_s": summary(recoveries, "recovery_s")},
            "verified": all(r["verified"] for r in recoveries),
            "runs": recoveries,
        }
    )
    document = {
        "benchmark": "B1 and B2",
        "machine": {"cpus": 2, "python": sys.version.split()[0], "platform": platform.platform()},
        "spark_session_start_s": session_start,
        "pyflink": "not measured: PyFlink is not installed here",
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    shutil.rmtree(base, ignore_errors=True)
    _table(results)
    print(f"written {args.out}")
    sys.exit(0 if all(entry["verified"] for entry in results) else 1)


def _fmt(summary: Any, scale: float = 1.0, digits: int = 0) -> str:
    if not isinstance(summary, dict) or summary.get("median") is None:
        return "-"
    return (
        f"{summary['median'] * scale:,.{digits}f} "
        f"({summary['min'] * scale:,.{digits}f}-{summary['max'] * scale:,.{digits}f})"
    )


def _table(results: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="B1 keyed running count, parallelism 2 (median, min-max)")
    for column in ("system", "events/s", "events/s incl. start", "checkpoints", "ckpt p50 ms"):
        table.add_column(column, justify="right" if column != "system" else "left")
    table.add_column("verified")
    for entry in results:
        figures = entry["figures"]
        if entry["name"] != "B1" or "events_per_s" not in figures:
            continue
        table.add_row(
            entry["system"],
            _fmt(figures["events_per_s"]),
            _fmt(figures["events_per_s_incl_start"]),
            _fmt(figures["checkpoints_completed"]),
            _fmt(figures["checkpoint_duration_p50_s"], 1000),
            "yes" if entry["verified"] else "NO",
        )
    console = Console(width=150)
    console.print(table)
    for entry in results:
        if entry["system"] == "cutline checkpoint overhead":
            overhead = entry["figures"]["overhead_percent"]
            shown = "-" if overhead is None else f"{overhead:.1f}%"
            console.print(
                f"checkpoint overhead at {entry['parameters']['interval_s']} s "
                f"({entry['parameters']['events']:,} events): {shown} "
                "(throughput off / on - 1, medians)"
            )
        if entry["name"] == "B2":
            console.print(
                f"B2 recovery (kill -> every slot running again): "
                f"{_fmt(entry['figures']['recovery_s'], 1, 2)} s, "
                f"verified={'yes' if entry['verified'] else 'NO'}"
            )


if __name__ == "__main__":
    main()
