"""Nexmark end-to-end latency on cutline (issue 18, point 5): how long after the bids that
complete a window its result comes out, at a fixed input rate.

    .venv/bin/python bench/nexmark_latency.py [--rate 20000] [--repeats 3] [--queries q5,q7,q11]
        [--out bench/results/nexmark_latency.json]

200,000 Nexmark events (the generator and cache of ``bench/nexmark.py``, at ``--event-rate``
events a second of event time, 1,000 by default: 200 s of event time, so that many windows
complete while the job runs) are read at
``--rate`` bids a second for the whole source (``rate_limit``: each of the 2 source subtasks
reads its share), with checkpoints every second, on local Spark at parallelism 2. Beside each
query the job writes, per batch each source subtask reads, which subtask it is, the highest
event time read so far and the wall clock (an operator of its own, through ``transform``);
each result row is stamped with the wall clock it leaves the window (``map_batches``).

A window ``[start, end)`` is complete once every source subtask has read a bid at or after
``end + 2 s`` (the out-of-orderness bound: its watermark has then passed ``end - 1``): its
**latency** is from the latest of those reads to its result leaving the window operator (for
q5, the second stage's). That is the system's own delay (the channels, the watermark's
travel, the window firing), not the 2 s the bound makes every window wait. Figures: p50 and
p99 over the windows of a run, median over runs. Every run's answer is verified against the
reference, as in ``bench/nexmark.py``.

Only cutline is measured here: Spark Structured Streaming and PyFlink would need a
rate-limited source and a stamped sink of their own (not done).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

import nexmark  # (the benchmark beside this file: the script's folder is on sys.path)
from cutline import StreamEnvironment
from cutline.runtime.operators import Batch, Logic, OperatorContext, RunningOperator
from cutline.spark.launcher import local_session
from nexmark_reference import InputSpec


class ArrivalLogic(Logic):
    """Per batch a source subtask read: (subtask, highest event time so far, wall clock)."""

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _Arrivals(ctx.subtask)


class _Arrivals(RunningOperator):
    def __init__(self, subtask: int) -> None:
        self.subtask = subtask
        self.highest = -(2**63)

    def process(self, batch: Batch) -> Batch | None:
        if not len(batch):
            return None
        self.highest = max(self.highest, int(np.max(batch.column("date_time").to_numpy())))
        return pa.record_batch(
            {
                "subtask": pa.array([self.subtask], pa.int64()),
                "highest": pa.array([self.highest], pa.int64()),
                "at": pa.array([time.time()], pa.float64()),
            }
        )


def emitted(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The results, stamped with the wall clock they leave the window operator."""
    return batch.append_column("emitted_at", pa.array([time.time()] * batch.num_rows))


def completed_at(arrivals: pa.Table, ends: np.ndarray, bound_ms: int) -> np.ndarray:
    """Per window end: when the last source subtask read a bid at or after ``end + bound``
    (``nan``: never, before the end of the input)."""
    done = np.full(len(ends), -np.inf)
    for subtask in set(arrivals.column("subtask").to_pylist()):
        mine = arrivals.filter(pa.compute.equal(arrivals.column("subtask"), subtask))
        order = np.argsort(mine.column("at").to_numpy())
        highest = mine.column("highest").to_numpy()[order]
        at = mine.column("at").to_numpy()[order]
        first = np.searchsorted(highest, ends + bound_ms, side="left")
        when = np.where(first < len(at), at[np.minimum(first, len(at) - 1)], np.nan)
        done = np.maximum(done, when)
    return done


def run(spark: Any, inp: Any, query: str, rate: float, work: Path, expected: Any) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    env = StreamEnvironment(
        nexmark.PARALLELISM,
        checkpoint_interval=nexmark.CHECKPOINT_INTERVAL,
        checkpoint_dir=str(work / "ck"),
    )
    bids = env.read_parquet(
        str(inp.parquet),
        event_time="date_time",
        max_out_of_orderness=f"{nexmark.WATERMARK_S}s",
        rate_limit=rate,
        name="bids",
    )
    bids.transform("arrivals", ArrivalLogic(), name="arrivals").write_parquet(
        str(work / "arrivals"), name="arrivals_out"
    )
    results = nexmark.CUTLINE_QUERIES[query](bids)
    results.map_batches(emitted, name="stamp").write_parquet(str(work / "out"), name="out")
    result = env.execute(spark, progress=False)
    table = ds.dataset(str(work / "out"), format="parquet").to_table()
    arrivals = ds.dataset(str(work / "arrivals"), format="parquet").to_table()
    answer = nexmark.cutline_answer(query, table.drop(["emitted_at"]))
    check = nexmark.compare(answer, expected[query])
    ends = table.column("window_end").to_numpy().astype(np.int64)
    done = completed_at(arrivals, ends, nexmark.WATERMARK_S * 1000)
    latency = table.column("emitted_at").to_numpy() - done
    measured = latency[np.isfinite(latency)]
    shutil.rmtree(work, ignore_errors=True)
    return {
        "verified": check["verified"] and not result.restarts,
        "windows_measured": len(measured),
        "windows_at_the_end": int(len(latency) - len(measured)),
        "latency_p50_s": float(np.percentile(measured, 50)) if len(measured) else None,
        "latency_p99_s": float(np.percentile(measured, 99)) if len(measured) else None,
        "seconds": result.running_seconds,
        "checkpoints_completed": sum(1 for c in result.checkpoints if not c.final),
    }


def main() -> None:
    from pyspark import cloudpickle

    # the queries' functions live in nexmark.py and this file, which the Spark workers cannot
    # import: sent by value
    cloudpickle.register_pickle_by_value(nexmark)  # type: ignore[no-untyped-call]
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20_000.0, help="bids read per second")
    parser.add_argument(
        "--event-rate",
        type=int,
        default=1_000,
        help="events per second of event time in the generated input (200,000 events)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queries", default="q5,q7,q11")
    parser.add_argument("--out", type=Path, default=Path("bench/results/nexmark_latency.json"))
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/cutline-nexmark"))
    args = parser.parse_args()
    queries = args.queries.split(",")
    spec = InputSpec(events=200_000, rows_per_file=50_000, rate=args.event_rate)
    inp = nexmark.prepare_input(spec, args.work, lambda text: None)
    expected, _, _ = nexmark._ground_truth(inp, queries)
    spark = local_session(2)
    spark.range(1).collect()
    runs: dict[str, list[dict]] = {q: [] for q in queries}
    run(spark, inp, queries[0], args.rate, args.work / "latency-warmup", expected)
    for repeat in range(args.repeats):
        for query in queries:
            found = run(spark, inp, query, args.rate, args.work / f"latency-{query}", expected)
            runs[query].append(found)
            print(
                f"{query} round {repeat + 1}: p50 {found['latency_p50_s']:.3f} s, p99 "
                f"{found['latency_p99_s']:.3f} s over {found['windows_measured']} windows, "
                f"verified={found['verified']}",
                flush=True,
            )
    results = []
    for query in queries:
        good = [r for r in runs[query] if r["verified"] and r["latency_p50_s"] is not None]
        results.append(
            {
                "name": f"nexmark {query} latency",
                "system": "cutline",
                "parameters": {
                    "events": spec.events,
                    "events_per_s_of_event_time": spec.rate,
                    "bids": inp.bids,
                    "rate_bids_per_s": args.rate,
                    "parallelism": nexmark.PARALLELISM,
                    "checkpoint_interval_s": nexmark.CHECKPOINT_INTERVAL,
                    "max_out_of_orderness_s": nexmark.WATERMARK_S,
                },
                "figures": {
                    "latency_p50_s": statistics.median(r["latency_p50_s"] for r in good)
                    if good
                    else None,
                    "latency_p99_s": statistics.median(r["latency_p99_s"] for r in good)
                    if good
                    else None,
                },
                "verified": len(good) == len(runs[query]) and bool(good),
                "runs": runs[query],
            }
        )
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for r in results:
        f = r["figures"]
        print(f"{r['name']}: p50 {f['latency_p50_s']} s, p99 {f['latency_p99_s']} s")
    print(f"written {args.out}")
    if not all(r["verified"] for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
