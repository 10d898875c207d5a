"""Nexmark end-to-end latency at a fixed input rate: cutline, Spark and PyFlink side by side.

Issue 18, point 5: how long after the bids that complete a window its result comes out, on
cutline, Spark Structured Streaming and PyFlink SQL, in one run.

    .venv/bin/python bench/nexmark_latency.py [--rate 20000] [--repeats 3] [--queries q5,q7,q11]
        [--systems cutline,spark,pyflink] [--events 200000] [--flink-venv /tmp/pyflink-venv]
        [--out bench/results/nexmark_latency.json]

Input: ``--events`` Nexmark events (200,000: 184,000 bids; the generator and cache of
``bench/nexmark.py``) at ``--event-rate`` events a second of event time (1,000 by default:
200 s of event time, so that many windows complete while a job runs), fed at ``--rate`` bids
a second of wall clock (20,000: about 9 s). The queries are those of ``bench/nexmark.py``
(the same functions), watermark: newest event time - 2 s, parallelism 2, every system in the
same process and Spark session (PyFlink: a subprocess of its venv).

A window ``[start, end)`` is complete once the input read so far holds a bid at or after
``end + 2 s`` (the out-of-orderness bound: the watermark has then passed ``end - 1``): its
**latency** is from that moment (the *arrival*) to its result coming out of the system (the
*stamp*). That is the system's own delay (finding the input, the channels or micro-batches,
the watermark's travel, the window firing), not the 2 s the bound makes every window wait.
Windows that only the end of the input closes are not measured (``windows_at_the_end``).
Figures: p50 and p99 over the windows of a run, median over runs (``--repeats``; each round
runs every system once per query, in a rotating order, after one warm-up run of each). A run
counts only if its answer equals the reference exactly, as in ``bench/nexmark.py``.

* **cutline**: ``read_parquet(rate_limit=--rate)`` (each of the 2 source subtasks reads its
  share), checkpoints every second. Beside the query the job writes, per batch each source
  subtask reads, which subtask it is, the highest event time read so far and the wall clock
  (an operator of its own, through ``transform``); each result row is stamped with the wall
  clock it leaves the window operator (``map_batches``; for q5, the second stage's). Arrival:
  the latest of the source subtasks' reads that passed ``end + 2 s``.
* **spark structured streaming** (``nexmark_latency_peers.run_spark``): a feeder thread
  renames one Parquet file of ``rate / 10`` bids (consecutive slices of the stream in
  arrival order, staged beforehand) into the input directory every 100 ms, on a fixed
  schedule, then the two one-row "end" files of ``bench/nexmark.py`` (the second once the
  first was read). ``readStream.parquet`` without ``maxFilesPerTrigger`` (a micro-batch takes
  every new file), ``withWatermark("ts", "2 seconds")``, the default trigger (the next
  micro-batch as soon as the last one ends), append mode into ``foreachBatch``, which
  collects the batch's rows (``toArrow``: the micro-batch runs then) and stamps them after.
  Arrival: the rename of the file after which the highest event time fed is at or after
  ``end + 2 s`` (finding it, by listing the directory at each trigger, counts as latency).
  Also recorded: the micro-batches, their durations, and per window how many micro-batches
  after the one that read its completing file the result came: Spark moves its watermark
  at the end of a micro-batch, so a window closes in the next one (always 1 in the checks).
* **pyflink sql** (``nexmark_latency_peers.FlinkLatencyWorker``, when the PyFlink venv is
  there): the same feeder with CSV files of the 4 columns (the wheel has no Parquet format),
  read by the filesystem connector with ``source.monitor-interval`` 100 ms, checkpoints every
  second, the SQL of ``bench/nexmark.py`` with ``CURRENT_ROW_TIMESTAMP()`` added to its last
  projection (the stamp, ms resolution, where the row leaves the window operator; the rows
  are collected by ``TableResult.collect``, then the job cancelled). After the input, one-row
  files an hour of event time later, one every 100 ms until the answer is complete (each
  goes to one of the 2 source readers; a window closes once both readers' watermarks passed
  it; so also while the input is fed, the reader that did not read the completing file
  holds the window until it reads a later one: that wait counts). Arrival: as for Spark. Flink emits its watermark periodically
  (``pipeline.auto-watermark-interval``, 200 ms by default, left as it is): that counts in
  its latency, as does the directory monitor's interval.
  A file found in the same directory scan as the one before may be read after it, by the
  same reader, and its bids dropped as late: that run is then unverified (not seen yet).

Every system finds its input in its own way (cutline reads a rate-limited source; Spark and
Flink find files in a directory), so the arrivals are as close as each system allows, not
identical: cutline's is the read itself, the peers' the file's appearance.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

import nexmark  # (the benchmark beside this file: the script's folder is on sys.path)
import nexmark_latency_peers as peers
from cutline import EventTime, StreamEnvironment
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
        event_time=EventTime("date_time", max_out_of_orderness=f"{nexmark.WATERMARK_S}s"),
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


SYSTEMS = ("cutline", "spark structured streaming", "pyflink sql")
HOW = {
    "cutline": (
        "read_parquet(rate_limit=rate) at parallelism 2, checkpoints every 1 s; arrival: each "
        "source subtask's read batch (transform); stamp: the result leaving the window "
        "operator (map_batches)"
    ),
    "spark structured streaming": (
        "a feeder renames one Parquet file of rate/10 bids into the input directory every "
        "100 ms; readStream.parquet (no maxFilesPerTrigger), withWatermark 2 s, default "
        "trigger, append mode into foreachBatch; arrival: the rename; stamp: after the "
        "micro-batch's rows are collected (toArrow) in foreachBatch"
    ),
    "pyflink sql": (
        "a feeder renames one CSV file of rate/10 bids into the input directory every 100 ms; "
        "filesystem source with source.monitor-interval 100 ms, checkpoints every 1 s; "
        "arrival: the rename; stamp: CURRENT_ROW_TIMESTAMP() in the query's last projection "
        "(ms resolution); watermark emitted periodically (pipeline.auto-watermark-interval left "
        "at its default)"
    ),
}


def _systems(text: str) -> list[str]:
    """``--systems``: names of ``SYSTEMS``, or their first words (``spark``, ``pyflink``)."""
    chosen = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        found = [s for s in SYSTEMS if name in (s, s.split()[0])]
        if not found:
            raise SystemExit(f"--systems: {name!r} is none of {', '.join(SYSTEMS)}")
        chosen.append(found[0])
    return chosen


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


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
        help="events per second of event time in the generated input",
    )
    parser.add_argument(
        "--events",
        type=int,
        default=200_000,
        help="Nexmark events generated (92%% are bids); fewer for a quick check",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queries", default="q5,q7,q11")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="a comma-separated subset of: " + ", ".join(SYSTEMS) + " (or spark, pyflink)",
    )
    parser.add_argument("--flink-venv", type=Path, default=Path("/tmp/pyflink-venv"))
    parser.add_argument(
        "--timeout", type=float, default=300, help="seconds a Spark or PyFlink run may take"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/nexmark_latency.json"))
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/cutline-nexmark"))
    args = parser.parse_args()
    queries = args.queries.split(",")
    systems = _systems(args.systems)
    spec = InputSpec(events=args.events, rows_per_file=50_000, rate=args.event_rate)
    inp = nexmark.prepare_input(spec, args.work, lambda text: None)
    expected, _, _ = nexmark._ground_truth(inp, queries)
    spark = local_session(2)
    spark.range(1).collect()
    status = {s: "run" if s in systems else "not run: not in --systems" for s in SYSTEMS}
    status["spark structured streaming"] = (
        f"run: PySpark {spark.version}, the same session as cutline's"
        if "spark structured streaming" in systems
        else status["spark structured streaming"]
    )
    flink = None
    if "pyflink sql" in systems:
        flink, status["pyflink sql"] = peers.start_flink(
            args.flink_venv, args.work / "flink-latency-worker.log"
        )

    def measure(system: str, query: str, work: Path) -> dict:
        found = attempt(system, query, work)
        for key in ("latency_p50_s", "latency_p99_s"):
            found.setdefault(key, None)
        found.setdefault("windows_measured", 0)
        return found

    def attempt(system: str, query: str, work: Path) -> dict:
        try:
            if system == "cutline":
                return run(spark, inp, query, args.rate, work, expected)
            if system == "spark structured streaming":
                return peers.run_spark(
                    spark, inp, query, args.rate, work, expected, completed_at, args.timeout
                )
            assert flink is not None
            return flink.run(inp, query, args.rate, work, expected, completed_at, args.timeout)
        except Exception as exc:
            shutil.rmtree(work, ignore_errors=True)
            return {
                "verified": False,
                "error": f"{type(exc).__name__}: {exc}"[:2000],
                "traceback": traceback.format_exc()[-2000:],
            }

    active = [s for s in SYSTEMS if status[s].startswith("run")]
    runs: dict[tuple[str, str], list[dict]] = {(s, q): [] for s in active for q in queries}
    for system in active:  # one warm-up run of each, not counted
        found = measure(system, queries[0], args.work / "latency-warmup")
        print(
            f"warm-up {system} {queries[0]}: verified={found['verified']}"
            + (f" error={found['error'][:300]}" if "error" in found else ""),
            flush=True,
        )
    for repeat in range(args.repeats):
        order = active[repeat % len(active) :] + active[: repeat % len(active)]
        for query in queries:
            for system in order:
                found = measure(system, query, args.work / f"latency-{query}")
                found["round"] = repeat
                runs[system, query].append(found)
                print(
                    f"{query} {system} round {repeat + 1}: p50 {_seconds(found['latency_p50_s'])}, "
                    f"p99 {_seconds(found['latency_p99_s'])} over {found['windows_measured']} "
                    f"windows, verified={found['verified']}"
                    + (f" error={found['error'][:300]}" if "error" in found else ""),
                    flush=True,
                )
    if flink is not None:
        flink.close()
    results = []
    for query in queries:
        for system in SYSTEMS:
            mine = runs.get((system, query), [])
            good = [r for r in mine if r["verified"] and r["latency_p50_s"] is not None]
            figures: dict[str, Any] = {
                "latency_p50_s": statistics.median(r["latency_p50_s"] for r in good)
                if good
                else None,
                "latency_p99_s": statistics.median(r["latency_p99_s"] for r in good)
                if good
                else None,
            }
            if system == "spark structured streaming" and good:
                figures["micro_batches"] = statistics.median(r["micro_batches"] for r in good)
            results.append(
                {
                    "name": f"nexmark {query} latency",
                    "system": system,
                    "status": status[system],
                    "how": HOW[system],
                    "parameters": {
                        "events": spec.events,
                        "events_per_s_of_event_time": spec.rate,
                        "bids": inp.bids,
                        "rate_bids_per_s": args.rate,
                        "parallelism": nexmark.PARALLELISM,
                        "checkpoint_interval_s": nexmark.CHECKPOINT_INTERVAL
                        if system != "spark structured streaming"
                        else None,
                        "max_out_of_orderness_s": nexmark.WATERMARK_S,
                        **(
                            {"feed_interval_s": peers.FEED_INTERVAL_S}
                            if system != "cutline"
                            else {}
                        ),
                    },
                    "figures": figures,
                    "verified": (len(good) == len(mine) and bool(good)) if mine else None,
                    "runs": mine,
                }
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for r in results:
        f = r["figures"]
        if r["verified"] is None:
            print(f"{r['name']} {r['system']}: {r['status']}")
            continue
        print(
            f"{r['name']} {r['system']}: p50 {_seconds(f['latency_p50_s'])}, "
            f"p99 {_seconds(f['latency_p99_s'])}, verified={r['verified']}"
        )
    print(f"written {args.out}")
    if any(r["verified"] is False for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
