"""cutline's joins for ``bench/joins.py``, written against the API of issue 37:
``join`` (regular), ``window_join``, ``interval_join`` and ``asof_join`` of
:class:`cutline.DataStream`, whose results are the join key once, then the left's columns,
then the right's (a right column whose name the left has gets ``_right``).

Each query: ``StreamEnvironment(parallelism=2, checkpoint_interval="1s")``, one
``read_parquet`` per stream (the columns the query reads, ``EventTime("date_time",
max_out_of_orderness="2s")``), the join, ``write_parquet``; timed as ``bench/nexmark.py``
times cutline (the whole ``execute()``, and its ``running_seconds``):

* **q3**: the filters (``map_batches``, vectorized), then ``auctions.join(persons,
  left_on="seller", right_on="id")`` (state kept for ever: no ``ttl``);
* **q8**: ``persons.window_join(auctions, left_on="id", right_on="seller",
  window=Tumbling("10s"))``;
* **q9**: ``auctions.interval_join(bids, left_on="id", right_on="auction",
  between=("0s", "1s"))`` (a bid's time minus its auction's within [0, 1 s]), then
  ``map_batches`` keeping the pairs with ``bid time <= expires``;
* **asof**: ``orders.asof_join(rates, on="currency", how="left")``.

While :class:`cutline.DataStream` has no ``interval_join`` (the joins are being built), the
benchmark says so and does not run cutline (:func:`cutline_missing`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from cutline import EventTime
from joins_input import JoinsInput
from joins_reference import (
    COLUMNS_READ,
    Q3_CATEGORY,
    Q3_STATES,
    Q8_WINDOW_MS,
    Q9_BOUND_MS,
    STREAMS_READ,
    compare,
)
from nexmark import _pct

PARALLELISM = 2
CHECKPOINT_INTERVAL = "1s"
RESULT_NAMES = {
    "q3": {"id": "auction_id"},
    "q8": {"id": "person_id", "id_right": "auction_id"},
    "q9": {"id": "auction_id", "date_time_right": "bid_time"},
    "asof": {"date_time": "order_time", "date_time_right": "rate_time"},
}
"""The join's result columns renamed to the answer's (``joins_reference.ANSWER_COLUMNS``)."""


def cutline_missing() -> str | None:
    """Why the cutline queries cannot run (None: they can)."""
    from cutline import DataStream

    absent = [
        name
        for name in ("join", "window_join", "interval_join", "asof_join")
        if not hasattr(DataStream, name)
    ]
    if absent:
        return (
            f"not available yet: cutline.DataStream has no {', '.join(absent)} (issue 37's "
            "joins are being built); cutline was not run"
        )
    return None


def local_sellers(batch: pa.RecordBatch) -> pa.RecordBatch:
    """q3's persons: those in OR, ID or CA."""
    return batch.filter(pc.is_in(batch.column("state"), pa.array(Q3_STATES)))


def in_category(batch: pa.RecordBatch) -> pa.RecordBatch:
    """q3's auctions: those of category 10."""
    return batch.filter(pc.equal(batch.column("category"), Q3_CATEGORY))


def while_open(batch: pa.RecordBatch) -> pa.RecordBatch:
    """q9's pairs whose bid came at or before the auction expired."""
    return batch.filter(pc.less_equal(batch.column("date_time_right"), batch.column("expires")))


def cutline_q3(s: dict[str, Any]) -> Any:
    sellers = s["persons"].map_batches(local_sellers)
    return s["auctions"].map_batches(in_category).join(sellers, left_on="seller", right_on="id")


def cutline_q8(s: dict[str, Any]) -> Any:
    from cutline import Tumbling

    window = Tumbling(f"{Q8_WINDOW_MS // 1000}s")
    return s["persons"].window_join(
        s["auctions"], left_on="id", right_on="seller", window=window, how="inner"
    )


def cutline_q9(s: dict[str, Any]) -> Any:
    between = ("0s", f"{Q9_BOUND_MS}ms")
    pairs = s["auctions"].interval_join(
        s["bids"], left_on="id", right_on="auction", between=between, how="inner"
    )
    return pairs.map_batches(while_open)


def cutline_asof(s: dict[str, Any]) -> Any:
    return s["orders"].asof_join(s["rates"], on="currency", how="left")


CUTLINE_QUERIES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "q3": cutline_q3,
    "q8": cutline_q8,
    "q9": cutline_q9,
    "asof": cutline_asof,
}


def run_cutline(
    spark: Any, inp: JoinsInput, query: str, work: Path, expected: pa.Table, timeout: float
) -> dict:
    """One run of ``query``: its figures and whether its answer is exact."""
    from cutline import StreamEnvironment

    shutil.rmtree(work, ignore_errors=True)
    out = work / "out"
    env = StreamEnvironment(
        PARALLELISM, checkpoint_interval=CHECKPOINT_INTERVAL, checkpoint_dir=str(work / "ck")
    )
    streams = {
        stream: env.read_parquet(
            str(inp.parquet(stream)),
            columns=list(COLUMNS_READ[query, stream]),
            event_time=EventTime("date_time", max_out_of_orderness="2s"),
            name=f"read_{stream}",
        )
        for stream in STREAMS_READ[query]
    }
    CUTLINE_QUERIES[query](streams).write_parquet(str(out))
    start = time.perf_counter()
    result = env.execute(spark, progress=False, stop_after=timeout)  # a bound, not a figure
    wall = time.perf_counter() - start
    table = ds.dataset(str(out), format="parquet").to_table() if out.exists() else pa.table({})
    shutil.rmtree(work, ignore_errors=True)
    names = RESULT_NAMES[query]
    table = table.rename_columns([names.get(n, n) for n in table.column_names])
    events = sum(inp.rows[s] for s in STREAMS_READ[query])
    read = max(result.source_records.values(), default=0)
    periodic = sorted(c.duration for c in result.checkpoints if not c.final)
    check = compare(table, expected, query) if table.num_columns else {"verified": False}
    return {
        **check,
        "verified": check["verified"] and not result.restarts and read == events,
        "restarts": len(result.restarts),
        "rows_read": read,
        "stopped_at_timeout": read < events,
        "seconds_incl_start": wall,
        "events_per_s_incl_start": events / wall,
        "seconds": result.running_seconds,
        "events_per_s": events / result.running_seconds if result.running_seconds else None,
        "checkpoints_completed": len(periodic),
        "checkpoint_duration_p50_s": _pct(periodic, 50),
        "checkpoint_duration_p99_s": _pct(periodic, 99),
        "final_checkpoint_s": next((c.duration for c in result.checkpoints if c.final), None),
    }
