"""Nexmark (issue 18): event time, watermarks and windows, on cutline, Spark Structured
Streaming and PyFlink, side by side on the same bids.

    .venv/bin/python bench/nexmark.py [--size small|large|both] [--repeats 3]
        [--queries q5,q7,q11] [--out bench/results/nexmark.json] [--work DIR]

Input (``bench/nexmark_reference.py``): a Nexmark event stream (1 person, 3 auctions and 46
bids in every 50 events, hot auctions and bidders as in the Nexmark generator), 10,000 events
per second of event time, each event up to 2 s late (uniform in [0, 2000) ms, the stream in
order of arrival). Its bids go to Parquet once, in files of consecutive slices of the stream
(``small``: 200,000 events, 184,000 bids in files of 50,000 rows; ``large``: 10,000,000
events, 9,200,000 bids in files of 500,000 rows), cached under ``--work`` by their parameters.

Queries (event time = ``date_time``, ms; windows aligned to the epoch; watermark: the newest
event time seen - 2 s):

* **q5** hot items: bids per auction per sliding window of 10 s every 2 s; per window, the
  auction(s) with the most: ``(window_start, window_end, auction, count)``;
* **q7** highest bid: per tumbling window of 10 s, the highest price:
  ``(window_start, window_end, price)``;
* **q11** bids per bidder session, gap 10 s: ``(bidder, window_start, window_end, count)``,
  ``window_end`` = last bid + 10 s.

Systems, each run ``--repeats`` times per size and query, interleaved (each round runs every
system once, in a rotating order), at parallelism 2, after one warm-up run of each on the
small input:

* **numpy reference**: one process reading the Parquet columns and computing the answer
  vectorized: the ground truth (cross-checked once per size against a per-record Python
  implementation written from the definitions) and the floor;
* **spark structured streaming**: the same files, ``maxFilesPerTrigger=1``,
  ``withWatermark("ts", "2 seconds")``, ``window`` / ``session_window``, append mode into a
  memory sink, a checkpoint location, ``trigger(availableNow=True)``. q5 is one query of two
  chained window aggregations (Spark >= 3.4: ``window_time``). Spark does not advance its
  watermark when the input ends, so its input directory holds hard links to the same files
  plus two one-row files an hour of event time later, which close every window (their own
  windows never close and appear in no answer);
* **pyflink sql** (when a PyFlink venv is there: ``--flink-venv``, made by
  ``--install-flink``; never in the project's venv): HOP / TUMBLE / SESSION window TVFs, q5's
  max stage a window join, run by a subprocess of that venv (``--flink-worker``), checkpoints
  every 1 s. It reads a CSV copy of the same bids in one file (the wheel has no Parquet
  format, and Flink's file source hands several files to its readers in no set order: a file
  read after a later one has its records dropped as late);
* **cutline** (``StreamEnvironment``, checkpoints every 1 s, ``read_parquet(columns=[the
  query's two columns], event_time="date_time", max_out_of_orderness="2s")``): the window API of issue 18, in
  :func:`cutline_q5` (``Sliding`` counts, then keyed by ``window_end`` into ``Tumbling("2s")``
  whose ``process`` keeps the highest), :func:`cutline_q7` (a constant key added with
  ``map_batches``, ``Tumbling("10s").max("price")``), :func:`cutline_q11`
  (``Session(gap="10s").count()``); reported "not available yet" while ``from cutline import
  Tumbling, Sliding, Session`` fails.

Figures per run: events/s = bids / seconds of the whole query on a warm session (Spark: from
``start()`` to ``awaitTermination()``; Flink: ``executeSql(INSERT ...)`` to its end, a local
MiniCluster started inside; cutline: the whole ``execute()`` call, and also its
``running_seconds``), periodic checkpoints and their duration (cutline, also the final
checkpoint's, which every run takes; Flink: from its log), micro-batches (Spark). A run
counts only if its answer equals the reference exactly ("verified"); the exit status is 1 if
any run that could run was not verified. End-to-end latency is measured by
``bench/nexmark_latency.py`` (null here).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as ds

from cutline import EventTime
from figures import summary  # (bench/figures.py, beside this file)
from nexmark_reference import (
    BID_SCHEMA,
    CSV_COLUMNS,
    Q5_SIZE,
    Q5_SLIDE,
    Q7_SIZE,
    Q11_GAP,
    Answers,
    Input,
    InputSpec,
    exact_gap_pairs,
    out_of_order_stats,
    prepare_input,
    python_answers,
    read_bids,
    reference_answers,
)

SIZES = {
    "small": InputSpec(events=200_000, rows_per_file=50_000),
    "large": InputSpec(events=10_000_000, rows_per_file=500_000),
}
QUERIES = ("q5", "q7", "q11")
PARALLELISM = 2
WATERMARK_S = 2
CHECKPOINT_INTERVAL = "1s"
QUERY_COLUMNS = {
    "q5": ("auction", "date_time"),
    "q7": ("price", "date_time"),
    "q11": ("bidder", "date_time"),
}
SYSTEMS = ("numpy reference", "spark structured streaming", "pyflink sql", "cutline")
FLINK_MARK = "NEXMARK-FLINK "
LATENCY_NOTE = (
    "not measured here: bench/nexmark_latency.py measures it at a fixed input rate, for "
    "cutline, Spark Structured Streaming and PyFlink side by side"
)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- checking


def compare(answer: set[tuple[int, ...]], expected: set[tuple[int, ...]]) -> dict:
    """Whether ``answer`` is ``expected`` exactly, and if not, a few rows of each difference."""
    missing = expected - answer
    unexpected = answer - expected
    return {
        "verified": not missing and not unexpected,
        "rows": len(answer),
        "expected_rows": len(expected),
        "missing_rows": len(missing),
        "unexpected_rows": len(unexpected),
        "missing_examples": [list(r) for r in sorted(missing)[:3]],
        "unexpected_examples": [list(r) for r in sorted(unexpected)[:3]],
    }


def _ints(table: pa.Table, name: str) -> list[int]:
    """A column of ints: epoch milliseconds for a timestamp column."""
    column = table.column(name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
    return column.cast(pa.int64()).to_pylist()


def _rows(table: pa.Table, names: tuple[str, ...]) -> set[tuple[int, ...]]:
    return set(zip(*(_ints(table, n) for n in names), strict=True))


def hottest(table: pa.Table, count: str = "count") -> set[tuple[int, ...]]:
    """q5's second stage: of ``(window_start, window_end, auction, count)`` rows, those whose
    count is the highest of their window."""
    start = np.asarray(_ints(table, "window_start"), dtype=np.int64)
    end = np.asarray(_ints(table, "window_end"), dtype=np.int64)
    auction = np.asarray(_ints(table, "auction"), dtype=np.int64)
    counts = np.asarray(_ints(table, count), dtype=np.int64)
    if len(start) == 0:
        return set()
    order = np.lexsort((end, start))
    start, end, auction, counts = start[order], end[order], auction[order], counts[order]
    new = np.r_[True, (start[1:] != start[:-1]) | (end[1:] != end[:-1])]
    first = np.flatnonzero(new)
    best = np.repeat(np.maximum.reduceat(counts, first), np.diff(np.r_[first, len(start)]))
    keep = counts == best
    return set(
        zip(
            start[keep].tolist(),
            end[keep].tolist(),
            auction[keep].tolist(),
            counts[keep].tolist(),
            strict=True,
        )
    )


# ----------------------------------------------------------------------------- reference


def run_reference(inp: Input, query: str, cross_check: Answers) -> tuple[set, dict]:
    start = time.perf_counter()
    bids = read_bids(inp.parquet, QUERY_COLUMNS[query])
    answer = reference_answers(bids, [query])[query]
    seconds = time.perf_counter() - start
    return answer, {
        "verified_against": "per-record Python cross-check",
        **compare(answer, cross_check[query]),
        "seconds_incl_start": seconds,
        "events_per_s_incl_start": inp.bids / seconds,
    }


# ----------------------------------------------------------------------------- Spark


def _spark_bids(spark: Any, inp: Input) -> Any:
    from pyspark.sql import functions as F

    schema = ", ".join(
        f"{f.name} {'BIGINT' if f.type == pa.int64() else 'STRING'}" for f in BID_SCHEMA
    )
    return (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inp.spark))
        .withColumn("ts", F.timestamp_millis("date_time"))
        .withWatermark("ts", f"{WATERMARK_S} seconds")
    )


def spark_q5(bids: Any) -> Any:
    """Counts per auction and sliding window, then (a chained window aggregation on each
    count's ``window_time``, the window's last instant) the highest counts per window; ties
    kept: the counts of the window are collected and those equal to its maximum exploded."""
    from pyspark.sql import functions as F

    counts = bids.groupBy(
        F.window("ts", f"{Q5_SIZE // 1000} seconds", f"{Q5_SLIDE // 1000} seconds"), "auction"
    ).count()
    per_window = counts.groupBy(
        F.window(F.window_time("window"), f"{Q5_SLIDE // 1000} seconds").alias("slot")
    ).agg(
        F.max("count").alias("top"),
        F.collect_list(F.struct("auction", "count")).alias("counts"),
    )
    hot = per_window.select(
        F.unix_millis(F.col("slot.end")).alias("window_end"),
        F.explode(F.filter("counts", lambda c: c["count"] == F.col("top"))).alias("hot"),
    )
    return hot.select(
        (F.col("window_end") - Q5_SIZE).alias("window_start"),
        "window_end",
        F.col("hot.auction").alias("auction"),
        F.col("hot.count").alias("count"),
    )


def spark_q7(bids: Any) -> Any:
    from pyspark.sql import functions as F

    highest = bids.groupBy(F.window("ts", f"{Q7_SIZE // 1000} seconds")).agg(
        F.max("price").alias("price")
    )
    return highest.select(
        F.unix_millis(F.col("window.start")).alias("window_start"),
        F.unix_millis(F.col("window.end")).alias("window_end"),
        "price",
    )


def spark_q11(bids: Any) -> Any:
    from pyspark.sql import functions as F

    sessions = bids.groupBy("bidder", F.session_window("ts", f"{Q11_GAP // 1000} seconds")).count()
    return sessions.select(
        "bidder",
        F.unix_millis(F.col("session_window.start")).alias("window_start"),
        F.unix_millis(F.col("session_window.end")).alias("window_end"),
        "count",
    )


SPARK_QUERIES: dict[str, Callable[[Any], Any]] = {"q5": spark_q5, "q7": spark_q7, "q11": spark_q11}
ANSWER_COLUMNS = {
    "q5": ("window_start", "window_end", "auction", "count"),
    "q7": ("window_start", "window_end", "price"),
    "q11": ("bidder", "window_start", "window_end", "count"),
}


def run_spark(
    spark: Any, inp: Input, query: str, work: Path, expected: Answers
) -> tuple[set, dict]:
    shutil.rmtree(work, ignore_errors=True)
    name = f"nexmark_{query}_{time.time_ns()}"
    start = time.perf_counter()
    stream = SPARK_QUERIES[query](_spark_bids(spark, inp))
    handle = (
        stream.writeStream.format("memory")
        .queryName(name)
        .outputMode("append")
        .option("checkpointLocation", str(work / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    handle.awaitTermination()
    seconds = time.perf_counter() - start
    progress = handle.recentProgress
    table = spark.sql(f"select * from {name}").toArrow()
    spark.catalog.dropTempView(name)
    shutil.rmtree(work, ignore_errors=True)
    answer = _rows(table, ANSWER_COLUMNS[query])
    rows_in = sum(p["numInputRows"] for p in progress)
    dropped = sum(
        op.get("numRowsDroppedByWatermark", 0)
        for p in progress
        for op in p.get("stateOperators", [])
    )
    batches = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in progress]
    check = compare(answer, expected[query])
    return answer, {
        **check,
        "verified": check["verified"] and rows_in == inp.bids + 2,
        "rows_in": rows_in,
        "rows_in_expected": inp.bids + 2,
        "rows_dropped_by_watermark": dropped,
        "seconds_incl_start": seconds,
        "events_per_s_incl_start": inp.bids / seconds,
        "micro_batches": len(progress),
        "micro_batch_s_p50": statistics.median(batches) if batches else None,
        "micro_batch_s_max": max(batches, default=None),
        "state_rows_max": max(
            (op.get("numRowsTotal", 0) for p in progress for op in p.get("stateOperators", [])),
            default=None,
        ),
    }


# ----------------------------------------------------------------------------- PyFlink

FLINK_SINKS = {
    "q5": "window_start TIMESTAMP(3), window_end TIMESTAMP(3), auction BIGINT, num BIGINT",
    "q7": "window_start TIMESTAMP(3), window_end TIMESTAMP(3), price BIGINT",
    "q11": "bidder BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3), num BIGINT",
}


def flink_sql(query: str, bids: str, counts: str) -> tuple[list[str], str]:
    """The views the query needs and its SELECT, over the table ``bids`` (``ts``: the event
    time attribute). q5: counts per auction and HOP window, re-windowed by their window's
    last instant (``window_time``) into tumbling windows of the slide, so that a window join
    can match each count with its window's maximum (window Top-N takes only ROW_NUMBER, which
    drops ties)."""
    size, slide, gap = Q5_SIZE // 1000, Q5_SLIDE // 1000, Q11_GAP // 1000
    if query == "q5":
        view = (
            f"CREATE TEMPORARY VIEW {counts} AS SELECT window_time AS wt, auction, COUNT(*) AS num "
            f"FROM TABLE(HOP(TABLE {bids}, DESCRIPTOR(ts), INTERVAL '{slide}' SECOND, "
            f"INTERVAL '{size}' SECOND)) GROUP BY window_start, window_end, window_time, auction"
        )
        per_slot = f"TABLE(TUMBLE(TABLE {counts}, DESCRIPTOR(wt), INTERVAL '{slide}' SECOND))"
        select = (
            f"SELECT c.window_end - INTERVAL '{size}' SECOND, c.window_end, c.auction, c.num "
            f"FROM (SELECT * FROM {per_slot}) c JOIN (SELECT window_start, window_end, "
            f"MAX(num) AS top FROM {per_slot} GROUP BY window_start, window_end) m "
            "ON c.window_start = m.window_start AND c.window_end = m.window_end AND c.num = m.top"
        )
        return [view], select
    if query == "q7":
        return [], (
            "SELECT window_start, window_end, MAX(price) FROM "
            f"TABLE(TUMBLE(TABLE {bids}, DESCRIPTOR(ts), INTERVAL '{Q7_SIZE // 1000}' SECOND)) "
            "GROUP BY window_start, window_end"
        )
    return [], (
        "SELECT bidder, window_start, window_end, COUNT(*) FROM "
        f"TABLE(SESSION(TABLE {bids} PARTITION BY bidder, DESCRIPTOR(ts), INTERVAL '{gap}' SECOND)) "
        "GROUP BY bidder, window_start, window_end"
    )


def flink_worker() -> None:
    """``--flink-worker``, run with the PyFlink venv's Python: one TableEnvironment, then one
    job per JSON command line on standard input, each answered by one line on standard output
    (``FLINK_MARK`` and JSON)."""

    def reply(message: dict) -> None:
        print(FLINK_MARK + json.dumps(message), flush=True)

    started = time.perf_counter()
    try:
        from pyflink.table import EnvironmentSettings, TableEnvironment
        from pyflink.version import __version__ as flink_version

        env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
        config = env.get_config()
        config.set("parallelism.default", str(PARALLELISM))
        config.set("table.local-time-zone", "UTC")
        config.set("execution.checkpointing.interval", "1 s")
    except Exception as exc:  # reported to the benchmark, which records why
        reply({"error": f"{type(exc).__name__}: {exc}"})
        return
    reply({"ready_s": time.perf_counter() - started, "flink_version": flink_version})
    for number, line in enumerate(sys.stdin):
        command = json.loads(line)
        try:
            config.set("execution.checkpointing.dir", Path(command["ck"]).as_uri())
            bids, counts, sink = f"bids_{number}", f"counts_{number}", f"sink_{number}"
            columns = ", ".join(f"{c} BIGINT" for c in CSV_COLUMNS)
            env.execute_sql(
                f"CREATE TEMPORARY TABLE {bids} ({columns}, ts AS TO_TIMESTAMP_LTZ(date_time, 3), "
                f"WATERMARK FOR ts AS ts - INTERVAL '{WATERMARK_S}' SECOND) WITH ("
                f"'connector' = 'filesystem', 'path' = '{command['csv']}', 'format' = 'csv')"
            )
            views, select = flink_sql(command["query"], bids, counts)
            for view in views:
                env.execute_sql(view)
            env.execute_sql(
                f"CREATE TEMPORARY TABLE {sink} ({FLINK_SINKS[command['query']]}) WITH ("
                f"'connector' = 'filesystem', 'path' = '{command['out']}', 'format' = 'csv')"
            )
            start = time.perf_counter()
            result = env.execute_sql(f"INSERT INTO {sink} {select}")
            result.wait()
            seconds = time.perf_counter() - start
            client = result.get_job_client()
            job = str(client.get_job_id()) if client is not None else ""
            reply({"seconds": seconds, "job_id": job, **_flink_checkpoints(job)})
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {exc}"[:3000]})


def _flink_checkpoints(job: str) -> dict:
    """The checkpoints Flink completed for ``job``, from the local cluster's log (in the
    pyflink package's ``log`` folder): their number and durations (trigger to complete)."""
    import re

    import pyflink

    durations = []
    pattern = re.compile(rf"Completed checkpoint \d+ for job {job} .*checkpointDuration=(\d+) ms")
    for log in (Path(pyflink.__file__).parent / "log").glob("*.log"):
        with open(log, errors="replace") as lines:
            for line in lines:
                if job and job in line and (found := pattern.search(line)):
                    durations.append(int(found.group(1)) / 1000)
    durations.sort()
    return {
        "checkpoints_completed": len(durations),
        "checkpoint_duration_p50_s": _pct(durations, 50),
        "checkpoint_duration_p99_s": _pct(durations, 99),
    }


class FlinkWorker:
    """The ``--flink-worker`` subprocess (of ``script``: this file by default), started once
    and fed one query at a time."""

    def __init__(self, python: Path, log: Path, script: Path | None = None) -> None:
        script = (script or Path(__file__)).resolve()
        self.log = log
        self._stderr = open(log, "w")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            [str(python), str(script), "--flink-worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=script.parent,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        started = time.perf_counter()
        self.hello = self.answer(timeout=300)
        self.start_s = time.perf_counter() - started

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(FLINK_MARK):
                self._lines.put(line[len(FLINK_MARK) :])
        self._lines.put(None)

    def answer(self, timeout: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return {"error": f"no answer from the PyFlink worker in {timeout:.0f} s"}
        if line is None:
            tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
            return {"error": f"the PyFlink worker ended (exit {self.process.poll()}): {tail}"}
        return json.loads(line)

    def run(
        self, inp: Input, query: str, work: Path, expected: Answers, timeout: float
    ) -> tuple[set, dict]:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        command = {
            "query": query,
            "csv": str(inp.csv),
            "out": str(work / "out"),
            "ck": str(work / "ck"),
        }
        assert self.process.stdin is not None
        started = time.perf_counter()
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        reply = self.answer(timeout)
        wall = time.perf_counter() - started
        if "error" in reply:
            shutil.rmtree(work, ignore_errors=True)
            return set(), {"verified": False, "error": reply["error"]}
        names = ANSWER_COLUMNS[query]
        parts = [p for p in sorted((work / "out").rglob("part-*")) if p.is_file()]
        types = {n: pa.timestamp("ms") if n.startswith("window_") else pa.int64() for n in names}
        tables = [
            pacsv.read_csv(
                part,
                read_options=pacsv.ReadOptions(column_names=list(names)),
                convert_options=pacsv.ConvertOptions(column_types=types),
            )
            for part in parts
        ]
        table = (
            pa.concat_tables(tables)
            if tables
            else pa.table({n: pa.array([], types[n]) for n in names})
        )
        shutil.rmtree(work, ignore_errors=True)
        answer = _rows(table, names)
        return answer, {
            **compare(answer, expected[query]),
            "seconds_incl_start": reply["seconds"],
            "events_per_s_incl_start": inp.bids / reply["seconds"],
            "seconds_round_trip": wall,
            "job_id": reply.get("job_id"),
            "checkpoints_completed": reply.get("checkpoints_completed"),
            "checkpoint_duration_p50_s": reply.get("checkpoint_duration_p50_s"),
            "checkpoint_duration_p99_s": reply.get("checkpoint_duration_p99_s"),
        }

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stderr.close()


def start_flink(
    venv: Path, install: bool, log: Path, script: Path | None = None
) -> tuple[FlinkWorker | None, str]:
    """The PyFlink worker (of ``script``, this file by default), or None and why not."""
    python = venv / "bin" / "python"
    if not python.exists() and install:
        _log(f"installing apache-flink into a new venv {venv} (not the project's)")
        base = Path(sys.base_prefix) / "bin" / "python3"
        made = subprocess.run([str(base), "-m", "venv", str(venv)], capture_output=True, text=True)
        pip = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "apache-flink"],
            capture_output=True,
            text=True,
        )
        if made.returncode or pip.returncode:
            return (
                None,
                f"not run: pip install apache-flink failed: {(made.stderr + pip.stderr)[-800:]}",
            )
    if not python.exists():
        return None, (
            f"not run: no PyFlink venv at {venv} (make one with --install-flink, or: python3.11 -m venv {venv} && {venv}/bin/pip install apache-flink)"
        )
    worker = FlinkWorker(python, log, script)
    if "error" in worker.hello:
        worker.close()
        return None, f"not run: PyFlink does not start: {worker.hello['error'][:800]}"
    return (
        worker,
        f"run: apache-flink {worker.hello['flink_version']} in {venv}, worker started in {worker.start_s:.1f} s",
    )


# ----------------------------------------------------------------------------- cutline
# The window API of issue 18 is being built: these functions follow the names of the issue
# (StreamEnvironment.read_parquet(event_time=..., max_out_of_orderness=...), key_by(...)
# .window(Tumbling | Sliding | Session).count() / .max(field), result rows with window_start
# and window_end) and are meant to be adjusted when it lands.


def cutline_missing() -> str | None:
    """Why the cutline queries cannot run (None: they can)."""
    try:
        from cutline import Session, Sliding, Tumbling  # noqa: F401
    except ImportError as exc:
        return f"not available yet: {exc}"
    return None


QUERY_COLUMNS = {"q5": ["auction", "date_time"], "q7": ["price", "date_time"]}
QUERY_COLUMNS["q11"] = ["bidder", "date_time"]
"""The bid columns each query reads (Spark prunes the others itself; the PyFlink CSV has only
the four columns the queries use)."""


def cutline_bids(env: Any, parquet: Path, query: str) -> Any:
    return env.read_parquet(
        str(parquet),
        columns=QUERY_COLUMNS[query],
        event_time=EventTime("date_time", max_out_of_orderness=f"{WATERMARK_S}s"),
    )


CUTLINE_Q5_MAX_IN_JOB = True
"""q5's max stage: in the job (a second window, ``process``), or (False) on the streamed
counts after the job (:func:`hottest`)."""


def top_auctions(key: Any, window: Any, counts: list[dict]) -> list[dict]:
    """q5's second stage: of one sliding window's counts (regrouped by their ``window_end``),
    those equal to the highest."""
    top = max(c["count"] for c in counts)
    return [
        {
            "window_start": c["window_start"],
            "window_end": c["window_end"],
            "auction": c["auction"],
            "count": c["count"],
        }
        for c in counts
        if c["count"] == top
    ]


def top_auctions_arrow(key: Any, window: Any, counts: pa.Table) -> pa.Table:
    """q5's second stage, vectorized (``process_batches``): of one sliding window's counts,
    the rows equal to the highest."""
    top = pc.max(counts.column("count"))
    return counts.filter(pc.equal(counts.column("count"), top)).select(
        ["window_start", "window_end", "auction", "count"]
    )


def cutline_q5(bids: Any) -> Any:
    """Counts per auction and sliding window; then, as the counts carry event time
    ``window_end - 1``, a tumbling window of the slide keyed by ``window_end`` gets each
    sliding window's counts together (as one Arrow table: ``process_batches``) and keeps the
    highest."""
    from cutline import Sliding, Tumbling

    counts = (
        bids.key_by("auction")
        .window(Sliding(f"{Q5_SIZE // 1000}s", every=f"{Q5_SLIDE // 1000}s"))
        .count()
    )
    if not CUTLINE_Q5_MAX_IN_JOB:
        return counts
    return (
        counts.key_by("window_end")
        .window(Tumbling(f"{Q5_SLIDE // 1000}s"))
        .process_batches(top_auctions_arrow)
    )


def with_constant_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    """q7 keys every bid alike: a column ``all`` of zeros."""
    return batch.append_column("all", pa.array(np.zeros(batch.num_rows, dtype=np.int64)))


def cutline_q7(bids: Any) -> Any:
    from cutline import Tumbling

    return (
        bids.map_batches(with_constant_key)
        .key_by("all")
        .window(Tumbling(f"{Q7_SIZE // 1000}s"))
        .max("price")
    )


def cutline_q11(bids: Any) -> Any:
    from cutline import Session

    return bids.key_by("bidder").window(Session(gap=f"{Q11_GAP // 1000}s")).count()


CUTLINE_QUERIES: dict[str, Callable[[Any], Any]] = {
    "q5": cutline_q5,
    "q7": cutline_q7,
    "q11": cutline_q11,
}


def cutline_answer(query: str, table: pa.Table) -> set[tuple[int, ...]]:
    """The answer set from the rows a cutline query wrote."""
    if query == "q5" and not CUTLINE_Q5_MAX_IN_JOB:
        return hottest(table)
    return _rows(table, ANSWER_COLUMNS[query])


def run_cutline(
    spark: Any, inp: Input, query: str, work: Path, expected: Answers, timeout: float = 1800
) -> tuple[set, dict]:
    from cutline import StreamEnvironment

    shutil.rmtree(work, ignore_errors=True)
    out = work / "out"
    env = StreamEnvironment(
        PARALLELISM, checkpoint_interval=CHECKPOINT_INTERVAL, checkpoint_dir=str(work / "ck")
    )
    CUTLINE_QUERIES[query](cutline_bids(env, inp.parquet, query)).write_parquet(str(out))
    start = time.perf_counter()
    result = env.execute(spark, progress=False, stop_after=timeout)  # a bound, not a figure
    wall = time.perf_counter() - start
    table = ds.dataset(str(out), format="parquet").to_table() if out.exists() else pa.table({})
    shutil.rmtree(work, ignore_errors=True)
    answer = cutline_answer(query, table)
    read = sum(n for subtask, n in result.records_in.items() if "read_parquet" in subtask)
    periodic = sorted(c.duration for c in result.checkpoints if not c.final)
    check = compare(answer, expected[query])
    return answer, {
        **check,
        "verified": check["verified"] and not result.restarts and read == inp.bids,
        "restarts": len(result.restarts),
        "stopped_at_timeout": read < inp.bids,
        "rows_read": read,
        "seconds_incl_start": wall,
        "events_per_s_incl_start": inp.bids / wall,
        "seconds": result.running_seconds,
        "events_per_s": inp.bids / result.running_seconds if result.running_seconds else None,
        "checkpoints_completed": len(periodic),
        "checkpoint_duration_p50_s": _pct(periodic, 50),
        "checkpoint_duration_p99_s": _pct(periodic, 99),
        "final_checkpoint_s": next((c.duration for c in result.checkpoints if c.final), None),
        "alignment_max_s": max((c.alignment for c in result.checkpoints), default=None),
    }


# ----------------------------------------------------------------------------- running


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


class Bench:
    """The systems that can run, and how to run one query on one of them."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.status: dict[str, str] = {}
        started = time.perf_counter()
        from cutline.spark.launcher import local_session

        self.spark = local_session(PARALLELISM)
        self.spark.range(1).collect()
        self.spark_start_s = time.perf_counter() - started
        self.status["spark structured streaming"] = f"run: PySpark {self.spark.version}"
        self.status["numpy reference"] = f"run: numpy {np.__version__}, pyarrow {pa.__version__}"
        self.flink: FlinkWorker | None = None
        if args.no_flink:
            self.status["pyflink sql"] = "not run: --no-flink"
        elif "pyflink sql" not in args.systems.split(","):
            self.status["pyflink sql"] = "not run: not in --systems"
        else:
            self.flink, self.status["pyflink sql"] = start_flink(
                args.flink_venv, args.install_flink, work / "flink-worker.log"
            )
        missing = cutline_missing()
        self.status["cutline"] = missing or "run: cutline window API"

    def runnable(self, system: str) -> bool:
        return self.status[system].startswith("run")

    def run(
        self, system: str, inp: Input, query: str, expected: Answers, cross_check: Answers, tag: str
    ) -> dict:
        work = self.work / "runs" / f"{tag}-{system.split()[0]}-{query}"
        try:
            if system == "numpy reference":
                _, figures = run_reference(inp, query, cross_check)
            elif system == "spark structured streaming":
                _, figures = run_spark(self.spark, inp, query, work, expected)
            elif system == "pyflink sql":
                assert self.flink is not None
                _, figures = self.flink.run(inp, query, work, expected, self.args.timeout)
            else:
                _, figures = run_cutline(self.spark, inp, query, work, expected, self.args.timeout)
        except Exception as exc:
            figures = {
                "verified": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-2000:],
            }
        shutil.rmtree(work, ignore_errors=True)
        return figures

    def close(self) -> None:
        if self.flink is not None:
            self.flink.close()


def _ground_truth(inp: Input, queries: list[str]) -> tuple[Answers, Answers, dict]:
    """The reference answers (sessions merging when they touch, as Flink's and Spark's do),
    those where they do not (the issue's rule), the per-record cross-check, and facts about
    the input."""
    bids = read_bids(inp.parquet)
    start = time.perf_counter()
    merged = reference_answers(bids, queries)
    numpy_s = time.perf_counter() - start
    gaps = exact_gap_pairs(bids)
    strict = (
        reference_answers(bids, ["q11"], merge_touching=False) if "q11" in queries and gaps else {}
    )
    start = time.perf_counter()
    cross = python_answers(bids, queries)
    python_s = time.perf_counter() - start
    facts = {
        **out_of_order_stats(bids),
        "q11_exact_gap_pairs": gaps,
        "answer_rows": {q: len(merged[q]) for q in queries},
        "numpy_reference_s": numpy_s,
        "python_cross_check_s": python_s,
        "numpy_equals_python": {q: merged[q] == cross[q] for q in queries},
    }
    return merged, {**merged, **strict}, facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("small", "large", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--out", type=Path, default=Path("bench/results/nexmark.json"))
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/var/tmp/cutline-nexmark"),
        help="where the generated input is cached, and the runs' scratch space",
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="a comma-separated subset of: " + ", ".join(SYSTEMS),
    )
    parser.add_argument("--flink-venv", type=Path, default=Path("/tmp/pyflink-venv"))
    parser.add_argument(
        "--install-flink",
        action="store_true",
        help="pip install apache-flink into --flink-venv when it is missing",
    )
    parser.add_argument("--no-flink", action="store_true")
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800,
        help="seconds one PyFlink or cutline job may take (cutline: stopped then, unverified)",
    )
    parser.add_argument("--flink-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flink_worker:
        flink_worker()
        return
    queries = [q for q in args.queries.split(",") if q]
    systems = [s for s in args.systems.split(",") if s]
    if set(queries) - set(QUERIES) or set(systems) - set(SYSTEMS):
        parser.error(f"queries among {QUERIES}, systems among {SYSTEMS}")
    sizes = ["small", "large"] if args.size == "both" else [args.size]
    args.work.mkdir(parents=True, exist_ok=True)
    inputs = {size: prepare_input(SIZES[size], args.work, _log) for size in {"small", *sizes}}

    revision = _revision()
    bench = Bench(args, args.work)
    for system in SYSTEMS:
        _log(f"{system}: {bench.status[system]}")
    active = [s for s in systems if bench.runnable(s)]
    truths = {}
    for size in {"small", *sizes}:
        _log(f"{size}: reference answers and their per-record cross-check ...")
        truths[size] = _ground_truth(inputs[size], queries)
        _log(f"{size}: {json.dumps(truths[size][2])}")
    warmups = []
    for system in active:  # JIT, code generation, Python workers: one run of each, not counted
        for query in queries:
            merged, _, _ = truths["small"]
            expected = merged  # (every system merges sessions that touch, as Flink does)
            run = bench.run(system, inputs["small"], query, expected, merged, "warmup")
            warmups.append({"system": system, "query": query, **_brief(run)})
            _log(f"warm-up {system} {query}: {_brief(run)}")

    results = []
    for size in sizes:
        inp = inputs[size]
        merged, _, facts = truths[size]
        runs: dict[tuple[str, str], list[dict]] = {(s, q): [] for s in systems for q in queries}
        for repeat in range(args.repeats):
            order = (
                active[repeat % len(active) :] + active[: repeat % len(active)] if active else []
            )
            for query in queries:
                for system in order:
                    expected = merged  # (every system merges sessions that touch, as Flink does)
                    run = bench.run(system, inp, query, expected, merged, f"{size}-{repeat}")
                    run["round"] = repeat
                    runs[system, query].append(run)
                    rate = run.get("events_per_s_incl_start")
                    shown = f"{rate:>12,.0f} events/s" if rate else "           - events/s"
                    _log(
                        f"{size} {query} {system:<28} round {repeat + 1}: {shown} verified={run.get('verified')}"
                        + (f" error={run['error'][:300]}" if "error" in run else "")
                    )
        for query in queries:
            for system in systems:
                results.append(
                    _measurement(
                        system, query, size, inp, facts, runs[system, query], bench.status[system]
                    )
                )
    bench.close()

    document = {
        "benchmark": "Nexmark (issue 18): event time, watermarks, windows",
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "revision": revision,
        "parallelism": PARALLELISM,
        "systems": bench.status,
        "spark_session_start_s": bench.spark_start_s,
        "pyflink_worker_start_s": bench.flink.start_s if bench.flink else None,
        "inputs": {size: _input_parameters(inputs[size], truths[size][2]) for size in inputs},
        "warmups": warmups,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    _table(results, bench.status)
    print(f"written {args.out}")
    failed = [r for r in results if r["verified"] is False]
    sys.exit(1 if failed else 0)


def _revision() -> str:
    """The commit measured, and whether src/ had uncommitted changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head} + uncommitted changes in src/" if git("status", "--porcelain", "src") else head


def _brief(run: dict) -> dict:
    keys = ("verified", "seconds_incl_start", "rows", "missing_rows", "unexpected_rows", "error")
    return {k: run[k] for k in keys if k in run}


def _input_parameters(inp: Input, facts: dict) -> dict:
    return {
        "events": inp.spec.events,
        "bids": inp.bids,
        "files": inp.files,
        "rows_per_file": inp.spec.rows_per_file,
        "seed": inp.spec.seed,
        "events_per_s_of_event_time": inp.spec.rate,
        "max_delay_ms": inp.spec.max_delay_ms,
        "event_time_span_s": (inp.max_time_ms - inp.min_time_ms) / 1000,
        "directory": str(inp.directory),
        "seconds_to_generate": inp.seconds_to_generate,
        **facts,
    }


SYSTEM_NOTES = {
    "numpy reference": "one process: reads the query's Parquet columns, computes the answer vectorized (the ground truth and the floor)",
    "spark structured streaming": (
        "readStream.parquet, maxFilesPerTrigger=1, withWatermark 2 s, append mode, memory sink, "
        "checkpoint location, trigger(availableNow=True); two one-row files an hour of event time "
        "after the input close the last windows (Spark does not advance the watermark at the end "
        "of input)"
    ),
    "pyflink sql": (
        "PyFlink SQL window TVFs (HOP/TUMBLE/SESSION), the operators in Flink's JVM (no Python "
        "UDF), checkpoints every 1 s (counted, with their durations, from the local cluster's log), filesystem CSV sink; input: the same bids as one CSV file of "
        "the 4 columns the queries read (no Parquet format in the apache-flink wheel; files are "
        "handed to Flink's readers in no set order)"
    ),
    "cutline": "StreamEnvironment(parallelism=2, checkpoint_interval=1 s), read_parquet(event_time=date_time, max_out_of_orderness=2s), window API of issue 18",
}
QUERY_NOTES = {
    "q5": {
        "spark structured streaming": "one streaming query: window counts, then a chained window aggregation on window_time (max and the collected counts, ties kept)",
        "pyflink sql": "one job: HOP counts, re-windowed by window_time into TUMBLE 2 s, window join of each count with its window's MAX",
        "cutline": (
            "one job: Sliding counts, then keyed by window_end, Tumbling 2 s, process() keeps the highest counts (ties kept)"
            if CUTLINE_Q5_MAX_IN_JOB
            else "the counts are streamed; the max stage runs on them after the job (hottest())"
        ),
    },
    "q7": {"cutline": "keyed by a constant column (map_batches), Tumbling 10 s, max(price)"},
    "q11": {
        "cutline": "sessions merge when they touch, as Flink's and Spark's do (a bid exactly the gap after the previous one continues its session)",
    },
}


def _measurement(
    system: str, query: str, size: str, inp: Input, facts: dict, runs: list[dict], status: str
) -> dict:
    ran = status.startswith("run")
    figures: dict[str, Any] = {
        "events_per_s_incl_start": summary(runs, "events_per_s_incl_start"),
        "seconds_incl_start": summary(runs, "seconds_incl_start"),
        "latency_p50_s": None,
        "latency_p99_s": None,
        "latency_note": LATENCY_NOTE,
    }
    checkpoints = (
        "checkpoints_completed",
        "checkpoint_duration_p50_s",
        "checkpoint_duration_p99_s",
    )
    if system == "cutline":
        for key in (
            "events_per_s",
            "seconds",
            *checkpoints,
            "final_checkpoint_s",
            "alignment_max_s",
        ):
            figures[key] = summary(runs, key)
    if system == "pyflink sql":
        for key in checkpoints:
            figures[key] = summary(runs, key)
    if system == "spark structured streaming":
        for key in (
            "micro_batches",
            "micro_batch_s_p50",
            "micro_batch_s_max",
            "state_rows_max",
            "rows_dropped_by_watermark",
        ):
            figures[key] = summary(runs, key)
    parameters = {
        "size": size,
        "events": inp.spec.events,
        "bids": inp.bids,
        "files": inp.files,
        "rows_per_file": inp.spec.rows_per_file,
        "parallelism": PARALLELISM,
        "watermark_s": WATERMARK_S,
        "window": {
            "q5": "sliding 10 s every 2 s",
            "q7": "tumbling 10 s",
            "q11": "session, gap 10 s",
        }[query],
        "answer_rows": facts["answer_rows"][query],
        "how": SYSTEM_NOTES[system],
        "query_note": QUERY_NOTES.get(query, {}).get(system, ""),
    }
    if query == "q11":
        parameters["q11_exact_gap_pairs"] = facts["q11_exact_gap_pairs"]
    return {
        "name": f"nexmark {query}",
        "system": system,
        "status": status,
        "parameters": parameters,
        "figures": figures,
        "verified": all(r.get("verified") for r in runs) if ran and runs else None,
        "runs": runs,
    }


def _fmt(summary: Any, scale: float = 1.0, digits: int = 0) -> str:
    if not isinstance(summary, dict) or summary.get("median") is None:
        return "-"
    return f"{summary['median'] * scale:,.{digits}f} ({summary['min'] * scale:,.{digits}f}-{summary['max'] * scale:,.{digits}f})"


def _table(results: list[dict], status: dict[str, str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Nexmark, parallelism {PARALLELISM}: bids/s, median (min-max) of the verified runs"
    )
    for column in (
        "query",
        "size",
        "system",
        "events/s incl. start",
        "events/s running",
        "ckpts / batches",
        "ckpt p50 ms",
        "verified",
    ):
        table.add_column(
            column, justify="left" if column in ("query", "size", "system") else "right"
        )
    for entry in results:
        figures = entry["figures"]
        verified = {None: "-", True: "yes", False: "NO"}[entry["verified"]]
        batches = figures.get("checkpoints_completed") or figures.get("micro_batches")
        table.add_row(
            entry["name"].split()[-1],
            entry["parameters"]["size"],
            entry["system"],
            _fmt(figures["events_per_s_incl_start"])
            if entry["verified"] is not None
            else entry["status"][:60],
            _fmt(figures.get("events_per_s")),
            _fmt(batches),
            _fmt(figures.get("checkpoint_duration_p50_s"), 1000),
            verified,
        )
    console = Console(width=170)
    console.print(table)
    for system, text in status.items():
        if not text.startswith("run"):
            console.print(f"{system}: {text}")
    console.print(f"latency: {LATENCY_NOTE}")


if __name__ == "__main__":
    main()
