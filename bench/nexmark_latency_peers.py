"""The peers of ``bench/nexmark_latency.py``: Spark Structured Streaming and PyFlink SQL fed
the same bids at the same fixed rate, their window results stamped with the wall clock.

Both read a directory that a feeder thread fills: the bids, in arrival order, cut into
consecutive slices of ``rate * FEED_INTERVAL_S`` bids, are staged as files beforehand; every
``FEED_INTERVAL_S`` (on a fixed schedule) the next one is renamed into the directory the
query reads (atomic: a reader never sees half a file). The feeder records each rename's wall
clock and the highest event time of the bids so far, including that file: the arrivals, as
cutline's source subtasks record theirs (here one "subtask"), so that
``nexmark_latency.completed_at`` gives each window's completion the same way. Finding a new
file (Spark: listing the directory at each trigger; Flink: ``source.monitor-interval``) is
the system's own delay and counts in its latency.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import sys
import threading
import time
from datetime import UTC
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

import nexmark
from nexmark_reference import BID_SCHEMA, CSV_COLUMNS

FEED_INTERVAL_S = 0.1
"""One file every 100 ms."""
FLINK_MONITOR_INTERVAL = "100 ms"
FLINK_MARK = nexmark.FLINK_MARK  # (the answers the worker class of nexmark.py reads)


# ----------------------------------------------------------------------------- feeding


def bid_slices(inp: Any, rows: int) -> list[pa.Table]:
    """The bids in arrival order (file order), as consecutive slices of ``rows``."""
    table = pa.concat_tables(
        pq.read_table(path) for path in sorted(Path(inp.parquet).glob("*.parquet"))
    )
    return [table.slice(start, rows) for start in range(0, table.num_rows, rows)]


class Feeder:
    """Renames the staged files into ``target`` one every ``interval`` seconds (start +
    k * interval, so that a late rename does not delay the next ones), in a thread."""

    def __init__(self, staged: list[Path], highest: list[int], target: Path, interval: float):
        self.staged = staged
        self.highest = highest
        self.target = target
        self.interval = interval
        self.at: list[float] = []
        self.behind_max_s = 0.0
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        start = time.time()
        for k, path in enumerate(self.staged):
            due = start + k * self.interval
            pause = due - time.time()
            if pause > 0:
                time.sleep(pause)
            os.rename(path, self.target / path.name)
            now = time.time()
            self.behind_max_s = max(self.behind_max_s, now - due)
            self.at.append(now)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def arrivals(self) -> pa.Table:
        """What ``completed_at`` takes: one source "subtask" 0."""
        n = len(self.at)
        return pa.table(
            {
                "subtask": pa.array([0] * n, pa.int64()),
                "highest": pa.array(self.highest[:n], pa.int64()),
                "at": pa.array(self.at, pa.float64()),
            }
        )


def stage(slices: list[pa.Table], folder: Path, write: Any, suffix: str) -> tuple[list, list]:
    """The slices written to ``folder`` (names in arrival order), and the highest event time
    of the bids up to and including each."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, highest, top = [], [], -(2**63)
    for k, part in enumerate(slices):
        path = folder / f"bids-{k:05d}.{suffix}"
        write(part, path)
        os.utime(path, (1_600_000_000 + k, 1_600_000_000 + k))  # name order = age order
        paths.append(path)
        top = max(top, int(pa.compute.max(part.column("date_time")).as_py()))
        highest.append(top)
    return paths, highest


def latency_figures(latency: np.ndarray) -> dict:
    measured = latency[np.isfinite(latency)]
    return {
        "windows_measured": len(measured),
        "windows_at_the_end": int(len(latency) - len(measured)),
        "latency_p50_s": float(np.percentile(measured, 50)) if len(measured) else None,
        "latency_p99_s": float(np.percentile(measured, 99)) if len(measured) else None,
        "latency_min_s": float(measured.min()) if len(measured) else None,
        "latency_max_s": float(measured.max()) if len(measured) else None,
    }


# ----------------------------------------------------------------------------- Spark


def _file_log(ck: Path) -> dict[str, int]:
    """The file source's log in the checkpoint: each file read, by name, and the micro-batch
    that read it."""
    found: dict[str, int] = {}
    folder = ck / "sources" / "0"
    if not folder.exists():
        return found
    for log in folder.iterdir():
        if log.name.startswith(".") or log.name.endswith(".tmp"):
            continue
        try:
            lines = log.read_text().splitlines()
        except OSError:
            continue
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a file being written
            found[Path(entry["path"]).name] = int(entry["batchId"])
    return found


def run_spark(
    spark: Any,
    inp: Any,
    query: str,
    rate: float,
    work: Path,
    expected: Any,
    completed_at: Any,
    timeout: float = 300,
) -> dict:
    """One run: the bids fed at ``rate``, the query read with ``readStream.parquet`` (no
    ``maxFilesPerTrigger``: a micro-batch takes every new file), the default trigger (the
    next micro-batch as soon as the last ends), append mode into ``foreachBatch``, which
    collects the batch's rows (``toArrow``: the micro-batch runs then) and stamps them."""
    from pyspark.sql import functions as F

    shutil.rmtree(work, ignore_errors=True)
    source, ck = work / "in", work / "ck"
    source.mkdir(parents=True)
    rows = max(1, round(rate * FEED_INTERVAL_S))
    paths, highest = stage(bid_slices(inp, rows), work / "stage", pq.write_table, "parquet")
    ends = []
    for k in (1, 2):  # the one-row files an hour of event time later (nexmark_reference)
        end = work / "stage" / f"bids-zz-end-{k}.parquet"
        shutil.copy(Path(inp.spark) / end.name, end)
        ends.append(end)
    batches: list[tuple[int, float, pa.Table]] = []

    def sink(frame: Any, batch_id: int) -> None:
        table = frame.toArrow()
        batches.append((batch_id, time.time(), table))

    schema = ", ".join(
        f"{f.name} {'BIGINT' if f.type == pa.int64() else 'STRING'}" for f in BID_SCHEMA
    )
    bids = (
        spark.readStream.schema(schema)
        .parquet(str(source))
        .withColumn("ts", F.timestamp_millis("date_time"))
        .withWatermark("ts", f"{nexmark.WATERMARK_S} seconds")
    )
    handle = (
        nexmark.SPARK_QUERIES[query](bids)
        .writeStream.foreachBatch(sink)
        .outputMode("append")
        .option("checkpointLocation", str(ck))
        .start()
    )
    feeder = Feeder(paths, highest, source, FEED_INTERVAL_S)
    deadline = time.time() + timeout
    try:
        waited = time.time()
        while "Waiting for data" not in handle.status["message"] and time.time() < waited + 30:
            time.sleep(0.01)
        feeder.start()
        feeder.join(timeout)
        for end in ends:  # the second once the first was read (its micro-batch moved the mark)
            os.rename(end, source / end.name)
            while end.name not in _file_log(ck) and time.time() < deadline:
                time.sleep(0.01)
        want = len(expected[query])
        while sum(t.num_rows for _, _, t in batches) < want and time.time() < deadline:
            if handle.exception() is not None:
                break
            time.sleep(0.02)
        handle.processAllAvailable()
    finally:
        progress = handle.recentProgress
        error = handle.exception()
        handle.stop()
    read_by = _file_log(ck)
    shutil.rmtree(work, ignore_errors=True)
    names = nexmark.ANSWER_COLUMNS[query]
    tables = [t.select(list(names)) for _, _, t in batches if t.num_rows]
    table = (
        pa.concat_tables(tables)
        if tables
        else pa.table({n: pa.array([], pa.int64()) for n in names})
    )
    stamps = np.concatenate([np.full(t.num_rows, at) for _, at, t in batches] or [np.zeros(0)])
    out_batch = np.concatenate(
        [np.full(t.num_rows, b) for b, _, t in batches] or [np.zeros(0, np.int64)]
    )
    check = nexmark.compare(nexmark._rows(table, names), expected[query])
    all_read = all(p.name in read_by for p in paths) and all(e.name in read_by for e in ends)
    ends_ms = np.asarray(nexmark._ints(table, "window_end"), dtype=np.int64)
    done = completed_at(feeder.arrivals(), ends_ms, nexmark.WATERMARK_S * 1000)
    latency = stamps - done
    # per measured window: the micro-batch that read the file completing it, and the one
    # whose output held the window
    completing = np.searchsorted(np.asarray(highest), ends_ms + nexmark.WATERMARK_S * 1000)
    lag = [
        int(out_batch[i]) - read_by[paths[completing[i]].name]
        for i in range(len(ends_ms))
        if np.isfinite(latency[i]) and paths[completing[i]].name in read_by
    ]
    durations = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in progress]
    dropped = sum(
        op.get("numRowsDroppedByWatermark", 0)
        for p in progress
        for op in p.get("stateOperators", [])
    )
    return {
        "verified": check["verified"] and all_read and error is None,
        **({"error": str(error)[:2000]} if error is not None else {}),
        **{k: v for k, v in check.items() if k != "verified"},
        **latency_figures(latency),
        "files_fed": len(paths),
        "bids_per_file": rows,
        "feeder_behind_max_s": feeder.behind_max_s,
        "seconds_feeding": feeder.at[-1] - feeder.at[0] if feeder.at else None,
        "micro_batches": len({b for b, _, _ in batches}),
        "micro_batch_s_p50": float(np.median(durations)) if durations else None,
        "micro_batch_s_max": max(durations, default=None),
        "micro_batches_reading_files": len(set(read_by.values())),
        "batches_from_read_to_result": {
            str(k): lag.count(k) for k in sorted(set(lag))
        },  # per measured window: output batch id - id of the batch that read its last file
        "rows_dropped_by_watermark_in_last_100_batches": dropped,
    }


# ----------------------------------------------------------------------------- PyFlink


def flink_worker() -> None:
    """``--flink-worker``, run with the PyFlink venv's Python: one TableEnvironment, then one
    job per JSON command on standard input, answered by one ``FLINK_MARK`` line each. A job
    reads the CSV files that appear in ``command['in']`` (``source.monitor-interval``); its
    SELECT adds ``CURRENT_ROW_TIMESTAMP()`` (the wall clock, per row, where the row leaves
    the window operator: the projection is chained to it) and is collected here until
    ``command['rows']`` rows came, then cancelled."""

    def reply(message: dict) -> None:
        print(FLINK_MARK + json.dumps(message), flush=True)

    try:
        from pyflink.table import EnvironmentSettings, TableEnvironment
        from pyflink.version import __version__ as flink_version

        env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
        config = env.get_config()
        config.set("parallelism.default", str(nexmark.PARALLELISM))
        config.set("table.local-time-zone", "UTC")
        config.set("execution.checkpointing.interval", "1 s")
    except Exception as exc:
        reply({"error": f"{type(exc).__name__}: {exc}"})
        return
    reply({"flink_version": flink_version})
    for number, line in enumerate(sys.stdin):
        command = json.loads(line)
        try:
            config.set("execution.checkpointing.dir", Path(command["ck"]).as_uri())
            bids, counts = f"bids_{number}", f"counts_{number}"
            columns = ", ".join(f"{c} BIGINT" for c in CSV_COLUMNS)
            env.execute_sql(
                f"CREATE TEMPORARY TABLE {bids} ({columns}, ts AS TO_TIMESTAMP_LTZ(date_time, 3), "
                f"WATERMARK FOR ts AS ts - INTERVAL '{nexmark.WATERMARK_S}' SECOND) WITH ("
                f"'connector' = 'filesystem', 'path' = '{command['in']}', 'format' = 'csv', "
                f"'source.monitor-interval' = '{FLINK_MONITOR_INTERVAL}')"
            )
            views, select = nexmark.flink_sql(command["query"], bids, counts)
            for view in views:
                env.execute_sql(view)
            stamped = (  # (a TIMESTAMP_LTZ does not pickle to Python: a TIMESTAMP in UTC)
                "SELECT *, CAST(CURRENT_ROW_TIMESTAMP() AS TIMESTAMP(3)) AS stamped "
                f"FROM ({select})"
            )
            result = env.execute_sql(stamped)
            reply({"started": True})
            rows: list[list[Any]] = []
            failed: list[str] = []
            puller = threading.Thread(
                target=_pull, args=(result, command["rows"], rows, failed), daemon=True
            )
            puller.start()
            puller.join(command["timeout"])
            timed_out = puller.is_alive()
            client = result.get_job_client()
            if client is not None:
                client.cancel().result()
            puller.join(30)
            reply({"rows": list(rows), "timed_out": timed_out, "collect_error": failed[:1]})
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {exc}"[:3000]})


def _pull(result: Any, wanted: int, rows: list, failed: list) -> None:
    """The job's rows into ``rows`` until ``wanted`` came (or the job ended: ``failed``)."""
    try:
        with result.collect() as results:
            for row in results:
                rows.append([_plain(v) for v in row])
                if len(rows) >= wanted:
                    break
    except Exception as exc:  # (also when the job is cancelled)
        failed.append(f"{type(exc).__name__}: {exc}"[:1000])


def _plain(value: Any) -> Any:
    """A row value as JSON: a timestamp (UTC: ``table.local-time-zone``) as epoch ms."""
    if hasattr(value, "timestamp"):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return round(value.timestamp() * 1000)
    return value


class FlinkLatencyWorker(nexmark.FlinkWorker):
    """The ``--flink-worker`` subprocess of this file, in the PyFlink venv."""

    def __init__(self, python: Path, log: Path) -> None:
        super().__init__(python, log, script=Path(__file__))

    def run(
        self,
        inp: Any,
        query: str,
        rate: float,
        work: Path,
        expected: Any,
        completed_at: Any,
        timeout: float = 300,
    ) -> dict:
        shutil.rmtree(work, ignore_errors=True)
        source = work / "in"
        source.mkdir(parents=True)
        rows = max(1, round(rate * FEED_INTERVAL_S))
        slices = [s.select(list(CSV_COLUMNS)) for s in bid_slices(inp, rows)]

        def write(part: pa.Table, path: Path) -> None:
            pacsv.write_csv(part, path, pacsv.WriteOptions(include_header=False))

        paths, highest = stage(slices, work / "stage", write, "csv")
        end_row = pa.table(
            {"auction": [-1], "bidder": [-1], "price": [0], "date_time": [inp.sentinel_time_ms]}
        ).select(list(CSV_COLUMNS))
        want = len(expected[query])
        command = {
            "query": query,
            "in": str(source),
            "ck": str(work / "ck"),
            "rows": want,
            "timeout": timeout,
        }
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        started = self.answer(120)
        if "error" in started:
            shutil.rmtree(work, ignore_errors=True)
            return {"verified": False, "error": started["error"]}
        time.sleep(1.0)  # the job's tasks running before the first file (no marker for it)
        feeder = Feeder(paths, highest, source, FEED_INTERVAL_S)
        feeder.start()
        feeder.join(timeout)
        # One-row files an hour of event time later close the last windows, one every
        # FEED_INTERVAL_S until the answer is complete: each goes to one source reader, and
        # a window closes once the watermarks of both have passed it (a reader with no file
        # holds its watermark back).
        reply = None
        for k in range(100):
            end = work / "stage" / f"bids-zz-end-{k:03d}.csv"
            write(end_row, end)
            os.rename(end, source / end.name)
            try:
                line = self._lines.get(timeout=FEED_INTERVAL_S)
            except queue.Empty:
                continue
            reply = {"error": "the PyFlink worker ended"} if line is None else json.loads(line)
            break
        if reply is None:
            reply = self.answer(timeout + 60)
        if "error" in reply and self.process.poll() is None:
            self.process.kill()  # stuck: its next answers would belong to this job
        shutil.rmtree(work, ignore_errors=True)
        if "error" in reply:
            return {"verified": False, "error": reply["error"]}
        late = {"timed_out": reply["timed_out"], "collect_error": reply["collect_error"]}
        names = nexmark.ANSWER_COLUMNS[query]
        got = reply["rows"]
        table = pa.table(
            {n: pa.array([r[i] for r in got], pa.int64()) for i, n in enumerate(names)}
        )
        stamps = np.asarray([r[len(names)] for r in got], dtype=np.float64) / 1000
        check = nexmark.compare(nexmark._rows(table, names), expected[query])
        ends_ms = table.column("window_end").to_numpy().astype(np.int64)
        done = completed_at(feeder.arrivals(), ends_ms, nexmark.WATERMARK_S * 1000)
        return {
            **check,
            "verified": check["verified"] and not reply["timed_out"],
            **late,
            **latency_figures(stamps - done),
            "files_fed": len(paths),
            "bids_per_file": rows,
            "feeder_behind_max_s": feeder.behind_max_s,
            "monitor_interval": FLINK_MONITOR_INTERVAL,
            "stamp_resolution_s": 0.001,
        }


def start_flink(venv: Path, log: Path) -> tuple[FlinkLatencyWorker | None, str]:
    python = venv / "bin" / "python"
    if not python.exists():
        return None, f"not measured: no PyFlink venv at {venv}"
    worker = FlinkLatencyWorker(python, log)
    if "error" in worker.hello:
        worker.close()
        return None, f"not measured: PyFlink does not start: {worker.hello['error'][:800]}"
    return worker, f"run: apache-flink {worker.hello['flink_version']} in {venv}"


if __name__ == "__main__" and "--flink-worker" in sys.argv:
    flink_worker()
