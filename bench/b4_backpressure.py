"""B4 of BENCHMARKS.md: checkpoints and latency under backpressure, aligned versus unaligned
versus aligned with an alignment timeout versus at-least-once.

    .venv/bin/python bench/b4_backpressure.py [--seconds 12] [--out bench/results/b4.json]

The job, at parallelism 2 on local Spark (local[2]): a source paced at a fixed rate
(``--rate`` records/s in batches of 200, each stamped with the time it was read) -> key_by ->
a deliberately slow operator (a pause per record, so that it keeps up with about two thirds
of the rate: the buffers fill and stay full) -> key_by -> a stateless stamp of
the time it arrived -> collect. Checkpoints every second.

For each mode and each buffer size (``buffer_capacity``: batches per channel and side), the
figures are: checkpoint duration (trigger to complete) and alignment time, median and
maximum over the periodic checkpoints, the records of channel state each recorded, and the
end-to-end latency of records (read at the source to seen after the slow operator), p50 and
p99. The **baseline** is the barrier travel time without backpressure: the same job with a
fast operator (the checkpoint duration there). The aim (issue 4): unaligned checkpoints stay
under 2x the baseline however full the buffers are.

Every run's output is checked (every record exactly once; at-least-once: none missing, the
duplicates counted), and a run that fails the check is reported as such, not measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cutline import Checkpoints, StreamEnvironment
from cutline.spark.launcher import local_session

BATCH = 200


class Paced:
    """Holds one source subtask to its share (half) of ``rate`` records per second, and
    stamps each batch with the time it was read. Each subtask gets its own copy."""

    def __init__(self, rate: float) -> None:
        self.share = rate / 2
        self.start: float | None = None
        self.read = 0

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.start is None:
            self.start = time.time()
        wait = self.start + self.read / self.share - time.time()
        if wait > 0:
            time.sleep(wait)
        self.read += batch.num_rows
        now = pa.array([time.time()] * batch.num_rows, pa.float64())
        key = pc.bit_wise_and(batch["value"], 63)
        return batch.append_column("read_at", now).append_column("key", key)


@dataclass(frozen=True)
class Slow:
    """Takes ``pause`` seconds per record."""

    pause: float

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(self.pause * batch.num_rows)
        return batch


def stamp(batch: pa.RecordBatch) -> pa.RecordBatch:
    now = pa.array([time.time()] * batch.num_rows, pa.float64())
    return batch.append_column("seen_at", now).drop_columns(["key"])


def run(spark: Any, mode: str, capacity: int, records: int, rate: float, slow: float) -> dict:
    checkpoints = (
        Checkpoints(mode="aligned", alignment_timeout=0.1)
        if mode == "aligned-timeout"
        else Checkpoints(mode=mode)
    )
    with tempfile.TemporaryDirectory() as tmp:
        env = StreamEnvironment(
            2,
            checkpoints=replace(checkpoints, interval=1.0, dir=f"{tmp}/ck", timeout=120),
            batch_size=BATCH,
            buffer_capacity=capacity,
        )
        (
            env.from_sequence(0, records)
            .map_batches(Paced(rate))
            .key_by("key")
            .map_batches(Slow(slow))
            .key_by("key")
            .map_batches(stamp)
            .collect()
        )
        started = time.monotonic()
        result = env.execute(spark)
        wall = time.monotonic() - started
    rows = result.output
    seen = Counter(r["value"] for r in rows)
    missing = records - len(seen)
    duplicates = len(rows) - len(seen)
    exact = missing == 0 and duplicates == 0
    verified = missing == 0 and (exact or mode == "at_least_once")
    latencies = sorted(r["seen_at"] - r["read_at"] for r in rows)
    periodic = [c for c in result.checkpoints if not c.final]

    def summary(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"median": None, "max": None}
        return {"median": round(statistics.median(values), 4), "max": round(max(values), 4)}

    return {
        "mode": mode,
        "buffer_capacity": capacity,
        "verified": verified,
        "missing": missing,
        "duplicates": duplicates,
        "checkpoints": len(periodic),
        "aborted": len(result.aborted),
        "checkpoint_duration_s": summary([c.duration for c in periodic]),
        "alignment_s": summary([c.alignment for c in periodic]),
        "channel_state_records": [c.channel_state_records for c in periodic],
        "unaligned_checkpoints": sum(c.unaligned for c in periodic),
        "latency_s": {
            "p50": round(latencies[len(latencies) // 2], 4),
            "p99": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 4),
        },
        "wall_s": round(wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="input length at the rate")
    parser.add_argument("--rate", type=float, default=20_000.0, help="records/s of the source")
    parser.add_argument("--capacities", default="2,8,32")
    parser.add_argument("--modes", default="aligned,unaligned,aligned-timeout,at_least_once")
    parser.add_argument("--out", type=Path, default=Path("bench/results/b4.json"))
    args = parser.parse_args()
    records = int(args.rate * args.seconds)
    # two slow subtasks, each taking half the records: together they keep up with 2/3 of it
    slow = 2 / (args.rate * 2 / 3)
    spark = local_session(2)
    runs = []
    baseline = run(spark, "aligned", 8, records, args.rate, 0.0)
    print(f"baseline (no backpressure): {json.dumps(baseline)}", flush=True)
    for capacity in [int(c) for c in args.capacities.split(",")]:
        for mode in args.modes.split(","):
            figures = run(spark, mode, capacity, records, args.rate, slow)
            print(json.dumps(figures), flush=True)
            runs.append(figures)
    spark.stop()
    travel = baseline["checkpoint_duration_s"]["median"]
    unaligned = [r for r in runs if r["mode"] == "unaligned" and r["verified"]]
    worst = (
        max((r["checkpoint_duration_s"]["max"] or 0.0) for r in unaligned) if unaligned else None
    )
    document = {
        "benchmark": "B4",
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        "parameters": {
            "parallelism": 2,
            "rate_records_per_s": args.rate,
            "records": records,
            "batch": BATCH,
            "slow_operator_s_per_record": round(slow, 7),
            "checkpoint_interval_s": 1.0,
        },
        "baseline": baseline,
        "runs": runs,
        "aim": {
            "baseline_barrier_travel_s": travel,
            "unaligned_worst_checkpoint_s": worst,
            "unaligned_within_2x_baseline": (
                worst is not None and travel is not None and worst <= 2 * travel
            ),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
