"""Spark Structured Streaming's stream-stream joins for ``bench/joins.py``, and the settings
swept to find its best.

Each query is one streaming query over the streams' Parquet directories
(``readStream.parquet``, the columns the query reads), ``trigger(availableNow=True)``, append
mode into a Parquet file sink, a fresh checkpoint location. As its best users would write
them:

* **q3**: the filters first, then an inner stream-stream join on ``seller = id``; no
  watermark (no time condition could let one drop state: Spark keeps both sides for ever,
  as the query asks).
* **q8**: both sides ``withWatermark(ts, "2 seconds")``, ``window(ts, "10 seconds")`` on
  each, an inner join on ``id = seller`` and window equality (Spark's event-time window
  join condition, by which the watermark drops state).
* **q9**: both sides ``withWatermark(ts, "2 seconds")``, an inner join on ``id = auction``
  with the time range ``bid.ts BETWEEN auction.ts AND auction.ts + interval 1 second``
  (Spark's time range condition, by which the watermark drops state) and
  ``bid.date_time <= auction.expires``.
* **asof**: not run: Spark Structured Streaming has no as-of (temporal) join of two streams.

Inner joins emit a pair in the micro-batch that has both rows: Spark's watermark not
advancing at the end of input (see ``bench/nexmark.py``) holds nothing back here.

Settings (:class:`SparkSetting`): ``maxFilesPerTrigger`` (files of each stream per
micro-batch; 0: every file in one), ``spark.sql.shuffle.partitions`` and the state store
(``HDFSBackedStateStoreProvider``, Spark's default, or ``RocksDBStateStoreProvider``).
"""

from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from joins_input import SCHEMAS, JoinsInput
from joins_reference import (
    ANSWER_COLUMNS,
    COLUMNS_READ,
    Q3_CATEGORY,
    Q3_STATES,
    Q8_WINDOW_MS,
    Q9_BOUND_MS,
    STREAMS_READ,
    compare,
)

WATERMARK = "2 seconds"
STATE_STORES = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
NOT_SUPPORTED = {
    "asof": (
        "not supported: Spark Structured Streaming has no as-of (event-time temporal) join "
        "of two streams"
    )
}


@dataclass(frozen=True)
class SparkSetting:
    max_files: int
    """``maxFilesPerTrigger`` of every stream; 0: no limit (one micro-batch takes all)."""
    partitions: int
    """``spark.sql.shuffle.partitions``: the join's tasks and state store instances."""
    state: str
    """A key of :data:`STATE_STORES`."""

    def label(self) -> str:
        files = self.max_files or "all"
        return f"maxFilesPerTrigger={files}, shuffle.partitions={self.partitions}, {self.state}"

    def short(self) -> str:
        return f"files {self.max_files or 'all'}, partitions {self.partitions}, {self.state}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "maxFilesPerTrigger": self.max_files or None,
            "spark.sql.shuffle.partitions": self.partitions,
            "state_store": STATE_STORES[self.state],
        }


def sweep(files: list[int], partitions: list[int], states: list[str]) -> list[SparkSetting]:
    return [SparkSetting(f, p, s) for s in states for f in files for p in partitions]


def _ddl(stream: str) -> str:
    return ", ".join(
        f"{f.name} {'BIGINT' if f.type == pa.int64() else 'STRING'}" for f in SCHEMAS[stream]
    )


def _read(spark: Any, inp: JoinsInput, query: str, stream: str, setting: SparkSetting) -> Any:
    reader = spark.readStream.schema(_ddl(stream))
    if setting.max_files:
        reader = reader.option("maxFilesPerTrigger", setting.max_files)
    return reader.parquet(str(inp.parquet(stream))).select(*COLUMNS_READ[query, stream])


def _timed(frame: Any, name: str) -> Any:
    """``frame`` with its event time as a timestamp column ``name`` and a watermark on it."""
    from pyspark.sql import functions as F

    return frame.withColumn(name, F.timestamp_millis("date_time")).withWatermark(name, WATERMARK)


def spark_q3(streams: dict[str, Any]) -> Any:
    from pyspark.sql import functions as F

    persons = streams["persons"].where(F.col("state").isin(*Q3_STATES))
    auctions = streams["auctions"].where(F.col("category") == Q3_CATEGORY)
    local = persons.select(F.col("id").alias("person_id"), "name", "city", "state")
    sold = auctions.select(F.col("id").alias("auction_id"), "seller")
    return sold.join(local, F.col("seller") == F.col("person_id")).select(*ANSWER_COLUMNS["q3"])


def spark_q8(streams: dict[str, Any]) -> Any:
    from pyspark.sql import functions as F

    size = f"{Q8_WINDOW_MS // 1000} seconds"
    persons = _timed(streams["persons"], "p_ts").select(
        F.col("id").alias("person_id"), "name", F.window("p_ts", size).alias("p_window")
    )
    auctions = _timed(streams["auctions"], "a_ts").select(
        F.col("id").alias("auction_id"), "seller", F.window("a_ts", size).alias("a_window")
    )
    joined = persons.join(
        auctions,
        (F.col("person_id") == F.col("seller")) & (F.col("p_window") == F.col("a_window")),
    )
    return joined.select(
        "person_id",
        "name",
        F.unix_millis(F.col("p_window.start")).alias("window_start"),
        "auction_id",
    )


def spark_q9(streams: dict[str, Any]) -> Any:
    from pyspark.sql import functions as F

    auctions = _timed(streams["auctions"], "a_ts").select(
        F.col("id").alias("auction_id"), "a_ts", "expires"
    )
    bids = _timed(streams["bids"], "b_ts").select(
        "auction", "bidder", "price", F.col("date_time").alias("bid_time"), "b_ts"
    )
    condition = (
        (F.col("auction_id") == F.col("auction"))
        & (F.col("b_ts") >= F.col("a_ts"))
        & (F.col("b_ts") <= F.col("a_ts") + F.expr(f"INTERVAL {Q9_BOUND_MS} MILLISECONDS"))
        & (F.col("bid_time") <= F.col("expires"))
    )
    return auctions.join(bids, condition).select(*ANSWER_COLUMNS["q9"])


SPARK_QUERIES = {"q3": spark_q3, "q8": spark_q8, "q9": spark_q9}


def run_spark(
    spark: Any,
    inp: JoinsInput,
    query: str,
    setting: SparkSetting,
    work: Path,
    expected: pa.Table,
    timeout: float = 1800,
) -> dict:
    """One run of ``query`` at ``setting``: its figures and whether its answer is exact."""
    shutil.rmtree(work, ignore_errors=True)
    spark.conf.set("spark.sql.shuffle.partitions", str(setting.partitions))
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", STATE_STORES[setting.state])
    streams = {s: _read(spark, inp, query, s, setting) for s in STREAMS_READ[query]}
    start = time.perf_counter()
    handle = (
        SPARK_QUERIES[query](streams)
        .writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "ck"))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    finished = handle.awaitTermination(timeout)  # a bound, not a figure
    seconds = time.perf_counter() - start
    if not finished:
        handle.stop()
    progress = handle.recentProgress
    out = work / "out"
    table = (
        ds.dataset(str(out), format="parquet").to_table()
        if out.exists()
        else pa.table({c: pa.array([], pa.int64()) for c in ANSWER_COLUMNS[query]})
    )
    shutil.rmtree(work, ignore_errors=True)
    rows_in = sum(p["numInputRows"] for p in progress)
    expected_in = sum(inp.rows[s] for s in STREAMS_READ[query])
    operators = [op for p in progress for op in p.get("stateOperators", [])]
    batches = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in progress]
    check = compare(table, expected, query)
    return {
        **check,
        "verified": check["verified"] and rows_in == expected_in and bool(finished),
        "stopped_at_timeout": not finished,
        "setting": setting.label(),
        "rows_in": rows_in,
        "rows_in_expected": expected_in,
        "rows_dropped_by_watermark": sum(
            op.get("numRowsDroppedByWatermark", 0) for op in operators
        ),
        "seconds_incl_start": seconds,
        "events_per_s_incl_start": expected_in / seconds,
        "micro_batches": len(progress),
        "micro_batch_s_p50": statistics.median(batches) if batches else None,
        "micro_batch_s_max": max(batches, default=None),
        "state_rows_max": max((op.get("numRowsTotal", 0) for op in operators), default=None),
    }
