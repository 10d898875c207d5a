"""PyFlink SQL's joins for ``bench/joins.py``: a worker run by the PyFlink venv's Python
(``python bench/joins_flink.py --flink-worker``; it imports only the standard library and
PyFlink), fed one query at a time by :class:`nexmark.FlinkWorker`, and the driver's side.

Each query reads one CSV file per stream (the columns the queries read; the wheel has no
Parquet format) with ``ts AS TO_TIMESTAMP_LTZ(date_time, 3)`` and ``WATERMARK FOR ts AS ts -
INTERVAL '2' SECOND``, and writes a CSV file sink; parallelism 2, checkpoints every 1 s,
Flink's default state backend (heap):

* **q3**: a regular join (``auctions JOIN persons ON seller = id`` with the filters), on
  tables without a watermark (a regular join has no use for one);
* **q8**: a window join of two ``TUMBLE`` window TVFs of 10 s on ``id = seller`` and the
  window's bounds;
* **q9**: an interval join, ``B.ts BETWEEN A.ts AND A.ts + INTERVAL '1' SECOND`` and
  ``B.date_time <= A.expires``;
* **asof**: an event-time temporal join, ``orders LEFT JOIN rates FOR SYSTEM_TIME AS OF
  O.ts``, the rates a versioned table by ``PRIMARY KEY (currency) NOT ENFORCED`` on the
  append-only file (each row a new version of its currency).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

FLINK_MARK = "NEXMARK-FLINK "
"""What the worker's answers start with (``nexmark.FLINK_MARK``: its FlinkWorker reads them)."""
PARALLELISM = 2
COLUMNS = {
    "persons": "id BIGINT, name STRING, city STRING, state STRING, date_time BIGINT",
    "auctions": "id BIGINT, seller BIGINT, category BIGINT, date_time BIGINT, expires BIGINT",
    "bids": "auction BIGINT, bidder BIGINT, price BIGINT, date_time BIGINT",
    "orders": "order_id BIGINT, currency STRING, amount BIGINT, date_time BIGINT",
    "rates": "currency STRING, rate BIGINT, date_time BIGINT",
}
"""The CSV copies' columns (``joins_input.CSV_COLUMNS``), in their order."""
SINKS = {
    "q3": "name STRING, city STRING, state STRING, auction_id BIGINT",
    "q8": "person_id BIGINT, name STRING, window_start TIMESTAMP(3), auction_id BIGINT",
    "q9": "auction_id BIGINT, bidder BIGINT, price BIGINT, bid_time BIGINT, expires BIGINT",
    "asof": (
        "order_id BIGINT, currency STRING, amount BIGINT, order_time BIGINT, rate BIGINT, "
        "rate_time BIGINT"
    ),
}
STREAMS = {
    "q3": ("persons", "auctions"),
    "q8": ("persons", "auctions"),
    "q9": ("auctions", "bids"),
    "asof": ("orders", "rates"),
}


def flink_select(query: str, t: dict[str, str]) -> str:
    """The query's SELECT over the tables named ``t[stream]``."""
    if query == "q3":
        return (
            f"SELECT P.name, P.city, P.state, A.id FROM {t['auctions']} AS A "
            f"JOIN {t['persons']} AS P ON A.seller = P.id "
            "WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')"
        )
    if query == "q8":
        window = "DESCRIPTOR(ts), INTERVAL '10' SECOND"
        return (
            "SELECT P.id, P.name, P.window_start, A.id FROM "
            f"(SELECT * FROM TABLE(TUMBLE(TABLE {t['persons']}, {window}))) P JOIN "
            f"(SELECT * FROM TABLE(TUMBLE(TABLE {t['auctions']}, {window}))) A "
            "ON P.id = A.seller AND P.window_start = A.window_start "
            "AND P.window_end = A.window_end"
        )
    if query == "q9":
        return (
            "SELECT A.id, B.bidder, B.price, B.date_time, A.expires "
            f"FROM {t['auctions']} AS A JOIN {t['bids']} AS B ON A.id = B.auction "
            "AND B.ts BETWEEN A.ts AND A.ts + INTERVAL '1' SECOND AND B.date_time <= A.expires"
        )
    if query == "asof":
        return (
            "SELECT O.order_id, O.currency, O.amount, O.date_time, R.rate, R.date_time "
            f"FROM {t['orders']} AS O LEFT JOIN {t['rates']} FOR SYSTEM_TIME AS OF O.ts AS R "
            "ON O.currency = R.currency"
        )
    raise ValueError(f"unknown query {query!r}")


def flink_worker() -> None:
    """One TableEnvironment, then one job per JSON command line on standard input
    (``query``, ``csv``: the stream -> file, ``out``, ``ck``), each answered by one line."""

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
            query = command["query"]
            config.set("execution.checkpointing.dir", Path(command["ck"]).as_uri())
            tables = {}
            for stream in STREAMS[query]:
                tables[stream] = name = f"{stream}_{number}"
                time_columns = (
                    ""
                    if query == "q3"
                    else ", ts AS TO_TIMESTAMP_LTZ(date_time, 3), "
                    "WATERMARK FOR ts AS ts - INTERVAL '2' SECOND"
                )
                key = ", PRIMARY KEY (currency) NOT ENFORCED" if stream == "rates" else ""
                env.execute_sql(
                    f"CREATE TEMPORARY TABLE {name} ({COLUMNS[stream]}{time_columns}{key}) "
                    f"WITH ('connector' = 'filesystem', 'path' = '{command['csv'][stream]}', "
                    "'format' = 'csv')"
                )
            sink = f"sink_{number}"
            env.execute_sql(
                f"CREATE TEMPORARY TABLE {sink} ({SINKS[query]}) WITH ("
                f"'connector' = 'filesystem', 'path' = '{command['out']}', 'format' = 'csv')"
            )
            start = time.perf_counter()
            result = env.execute_sql(f"INSERT INTO {sink} {flink_select(query, tables)}")
            result.wait()
            seconds = time.perf_counter() - start
            client = result.get_job_client()
            reply({"seconds": seconds, "job_id": str(client.get_job_id()) if client else ""})
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {exc}"[:3000]})


# ----------------------------------------------------------------------------- the driver's side


def start_flink(venv: Path, install: bool, log: Path) -> tuple[Any, str]:
    """The PyFlink worker of this file (``nexmark.start_flink``'s venv and install), or None
    and why not."""
    import nexmark

    assert nexmark.FLINK_MARK == FLINK_MARK
    return nexmark.start_flink(venv, install, log, script=Path(__file__))


def run_flink(worker: Any, inp: Any, query: str, work: Path, expected: Any, timeout: float) -> dict:
    """One run of ``query`` on the worker: its figures and whether its answer is exact."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from joins_reference import ANSWER_COLUMNS, compare

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    command = {
        "query": query,
        "csv": {s: str(inp.csv(s)) for s in STREAMS[query]},
        "out": str(work / "out"),
        "ck": str(work / "ck"),
    }
    started = time.perf_counter()
    worker.process.stdin.write(json.dumps(command) + "\n")
    worker.process.stdin.flush()
    reply = worker.answer(timeout)
    wall = time.perf_counter() - started
    if "error" in reply:
        shutil.rmtree(work, ignore_errors=True)
        return {"verified": False, "error": reply["error"]}
    names = ANSWER_COLUMNS[query]
    types = {n: expected.schema.field(n).type for n in names}
    if query == "q8":
        types["window_start"] = pa.timestamp("ms")
    parts = [p for p in sorted((work / "out").rglob("part-*")) if p.is_file()]
    tables = [
        pacsv.read_csv(
            part,
            read_options=pacsv.ReadOptions(column_names=list(names)),
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False),
        )
        for part in parts
        if part.stat().st_size
    ]
    empty = pa.table({n: pa.array([], types[n]) for n in names})
    table = pa.concat_tables(tables) if tables else empty
    shutil.rmtree(work, ignore_errors=True)
    events = sum(inp.rows[s] for s in STREAMS[query])
    return {
        **compare(table, expected, query),
        "seconds_incl_start": reply["seconds"],
        "events_per_s_incl_start": events / reply["seconds"],
        "seconds_round_trip": wall,
        "job_id": reply.get("job_id"),
    }


if __name__ == "__main__" and "--flink-worker" in sys.argv:
    flink_worker()
