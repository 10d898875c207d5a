"""Stream joins (issue 37): Nexmark q3, q8, a q9-like interval join and an as-of join, on
cutline, Spark Structured Streaming and PyFlink SQL side by side, on the same files.

    .venv/bin/python bench/joins.py [--size small|large|both] [--repeats 3]
        [--large-repeats 1] [--queries q3,q8,q9,asof] [--out bench/results/joins.json]
        [--spark-files 1,5,0] [--spark-partitions 2,8] [--spark-states hdfs,rocksdb]
        [--spark-memory 4g]

**Input** (``bench/joins_input.py``): ``small`` is 1,000,000 Nexmark events (20,000
persons, 60,000 auctions, 920,000 bids; the bids exactly those of ``bench/nexmark.py``) and
1,000,000 as-of events (900,000 orders, 100,000 rates); ``large`` 10,000,000 of each. Every
stream is in 20 files of the same arrival times; 10,000 events per second of event time,
each event up to 2 s late (no record is late for a watermark 2 s behind the newest event).
``--events`` and ``--files`` make another size (the tests use a tiny one).

**Queries**, defined exactly in ``bench/joins_reference.py``: **q3** Nexmark q3, a regular
inner join (persons in OR, ID, CA selling in category 10); **q8** Nexmark q8's window join
(each person with the auctions they created in the tumbling 10 s window they registered in);
**q9** q9-like, an interval join (each bid with its auction when ``0 <= bid time - auction
time <= 1 s`` and the bid came by the auction's ``expires``); **asof** each order with the
latest rate of its currency at or before its time (left: orders before any rate have nulls).

**Systems**, each run ``--repeats`` times per size and query, interleaved (every round runs
every system once per query, in a rotating order), at parallelism 2:

* **reference**: one process reading the query's Parquet columns and computing the answer
  with pyarrow's hash join and NumPy: the ground truth, cross-checked against a per-record
  Python computation written from the definitions (at sizes up to 2,000,000 events; above,
  the reference is the one cross-checked at the small size), and the floor;
* **spark structured streaming** (``bench/joins_spark.py``): stream-stream joins, watermarks
  and time conditions as its best users write them, at its **best setting**: before the
  rounds, every setting of the sweep (``maxFilesPerTrigger`` x ``spark.sql.shuffle.partitions``
  x HDFS-backed or RocksDB state store) runs once per query on the small input (this is also
  Spark's warm-up); the fastest verified one is used in the rounds, at every size. The as-of
  join: not supported (no figure, not a zero);
* **pyflink sql** (``bench/joins_flink.py``, when a PyFlink venv is there: ``--flink-venv``,
  made by ``--install-flink``): regular join, window join of TUMBLE TVFs, interval join,
  event-time temporal join;
* **cutline** (``bench/joins_cutline.py``): ``join``, ``window_join``, ``interval_join``,
  ``asof_join``; not run, and said so, while ``cutline.DataStream`` has no ``interval_join``.

**Figures** per run (``bench/nexmark.py``'s): ``events_per_s_incl_start`` = rows of the
streams the query reads / seconds of the whole query on a warm session (Spark: ``start()``
to the end of ``awaitTermination()``; Flink: ``executeSql(INSERT ...)`` to its end, a local
MiniCluster inside; cutline: the whole ``execute()``); ``per_core`` = that / the cores the
system was given (2; the reference: 1); ``nexmark_events_per_core`` = the Nexmark events the
input was made from (persons, auctions and bids, all of them, as Flink's Nexmark counts:
its source makes every event and the query filters) / seconds / cores, beside **Flink's
published per-core figures** (:data:`FLINK_PUBLISHED`). A run counts only if its answer
equals the reference exactly, as a multiset, and it read every input row ("verified"); the
exit status is 1 if any run that could run was not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from figures import summary  # (bench/figures.py, beside this file)
from joins_cutline import cutline_missing, run_cutline
from joins_flink import run_flink, start_flink
from joins_input import JoinsInput, JoinsSpec, prepare_joins_input
from joins_reference import (
    QUERIES,
    STREAMS_READ,
    compare,
    python_answers,
    reference_answers,
    rows_table,
)
from joins_spark import NOT_SUPPORTED, SparkSetting, run_spark, sweep
from nexmark import _revision

SIZES = {
    "small": JoinsSpec(events=1_000_000, files=20),
    "large": JoinsSpec(events=10_000_000, files=20),
}
PARALLELISM = 2
CROSS_CHECK_UP_TO = 2_000_000
SYSTEMS = ("reference", "spark structured streaming", "pyflink sql", "cutline")
CORES = {"reference": 1}
FLINK_PUBLISHED = {
    "source": "https://github.com/nexmark/nexmark (README, 'Nexmark Benchmark Result')",
    "setup": (
        "Flink 1.13, 8 TaskManagers of 1 slot (parallelism 8) on 3 workers of 8 cores, "
        "RocksDB incremental checkpoints every 3 min, the Nexmark datagen source "
        "(100,000,000 events: 92% bids, 6% auctions, 2% persons), blackhole sink; "
        "Throughput/Cores = events / (cores used x seconds), every generated event counted"
    ),
    "events_per_s_per_core": {"q3": 152_120, "q8": 146_140, "q9": 14_240},
    "notes": {
        "q3": "the same query",
        "q8": "Nexmark q8 groups each side per window, then joins: one row per person and window",
        "q9": "Nexmark q9 joins the same way, then keeps each auction's highest bid (a Top-1)",
    },
}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- ground truth


def ground_truth(inp: JoinsInput, queries: list[str]) -> tuple[dict[str, pa.Table], dict]:
    """The reference answers, and facts about them (their cross-check)."""
    start = time.perf_counter()
    answers = reference_answers(inp, queries)
    facts: dict[str, Any] = {"reference_s": time.perf_counter() - start}
    facts["answer_rows"] = {q: answers[q].num_rows for q in queries}
    if inp.spec.events <= CROSS_CHECK_UP_TO:
        start = time.perf_counter()
        rows = python_answers(inp, queries)
        facts["python_cross_check_s"] = time.perf_counter() - start
        facts["reference_equals_python"] = {
            q: compare(rows_table(q, rows[q], answers[q]), answers[q], q)["verified"]
            for q in queries
        }
    else:
        facts["reference_equals_python"] = (
            f"not computed above {CROSS_CHECK_UP_TO:,} events: the same code is cross-checked "
            "at the small size"
        )
    return answers, facts


def run_reference(inp: JoinsInput, query: str, expected: pa.Table) -> dict:
    start = time.perf_counter()
    answer = reference_answers(inp, [query])[query]
    seconds = time.perf_counter() - start
    events = sum(inp.rows[s] for s in STREAMS_READ[query])
    return {
        **compare(answer, expected, query),
        "seconds_incl_start": seconds,
        "events_per_s_incl_start": events / seconds,
    }


# ----------------------------------------------------------------------------- systems


class Bench:
    """The systems that can run, and how to run one query on one of them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = args.work
        self.status: dict[str, str] = {"reference": f"run: pyarrow {pa.__version__}"}
        self.status["reference"] += f", numpy {np.__version__}"
        started = time.perf_counter()
        from cutline.spark.launcher import local_session

        # local mode runs the join's tasks in the driver's JVM: its default 1 GiB heap does
        # not hold a micro-batch of millions of rows (q9 at 10 M events ran out of it)
        submit = f"--driver-memory {args.spark_memory} pyspark-shell"
        # cutline's jobs send their functions (joins_cutline's filters) to Spark's Python
        # workers by reference: the workers import them from this folder
        here = str(Path(__file__).resolve().parent)
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, path) if p)
        os.environ.setdefault("PYSPARK_SUBMIT_ARGS", submit)
        self.spark = local_session(PARALLELISM)
        self.spark.range(1).collect()
        self.spark_start_s = time.perf_counter() - started
        memory = self.spark.sparkContext.getConf().get("spark.driver.memory", "1g (default)")
        self.status["spark structured streaming"] = (
            f"run: PySpark {self.spark.version}, spark.driver.memory {memory}"
        )
        self.best: dict[str, SparkSetting] = {}
        self.flink: Any = None
        if args.no_flink or "pyflink sql" not in args.systems:
            self.status["pyflink sql"] = "not run: --no-flink or not in --systems"
        else:
            self.flink, self.status["pyflink sql"] = start_flink(
                args.flink_venv, args.install_flink, self.work / "flink-worker.log"
            )
        self.status["cutline"] = cutline_missing() or "run: cutline joins API (issue 37)"

    def runnable(self, system: str, query: str) -> bool:
        if system == "spark structured streaming" and query in NOT_SUPPORTED:
            return False
        return self.status[system].startswith("run")

    def setting(self, query: str) -> SparkSetting:
        return self.best.get(query) or self.args.settings[0]

    def run(self, system: str, inp: JoinsInput, query: str, expected: pa.Table, tag: str) -> dict:
        work = self.work / "runs" / f"{tag}-{system.split()[0]}-{query}"
        timeout = self.args.timeout
        try:
            if system == "reference":
                figures = run_reference(inp, query, expected)
            elif system == "spark structured streaming":
                figures = run_spark(
                    self.spark, inp, query, self.setting(query), work, expected, timeout
                )
            elif system == "pyflink sql":
                figures = run_flink(self.flink, inp, query, work, expected, timeout)
            else:
                figures = run_cutline(self.spark, inp, query, work, expected, timeout)
        except Exception as exc:
            figures = {
                "verified": False,
                "error": f"{type(exc).__name__}: {exc}"[:3000],
                "traceback": traceback.format_exc()[-2000:],
            }
        shutil.rmtree(work, ignore_errors=True)
        return figures

    def sweep(self, inp: JoinsInput, queries: list[str], truth: dict[str, pa.Table]) -> dict:
        """Every setting once per query: every run, and the best verified setting."""
        found: dict[str, Any] = {}
        for query in queries:
            if not self.runnable("spark structured streaming", query):
                continue
            runs = []
            for setting in self.args.settings:
                work = self.work / "runs" / f"sweep-spark-{query}"
                try:
                    run = run_spark(
                        self.spark, inp, query, setting, work, truth[query], self.args.timeout
                    )
                except Exception as exc:
                    run = {"verified": False, "error": f"{type(exc).__name__}: {exc}"[:3000]}
                shutil.rmtree(work, ignore_errors=True)
                runs.append({"setting": setting.as_dict(), "label": setting.label(), **run})
                _log(f"sweep {query} {setting.label():<60} {_brief_rate(run)}")
            good = [(r["events_per_s_incl_start"], k) for k, r in enumerate(runs) if r["verified"]]
            if good:
                self.best[query] = self.args.settings[max(good)[1]]
            found[query] = {
                "best": self.best[query].as_dict() if query in self.best else None,
                "best_label": self.best[query].label() if query in self.best else None,
                "runs": runs,
            }
        return found

    def close(self) -> None:
        if self.flink is not None:
            self.flink.close()


def _brief_rate(run: dict) -> str:
    rate = run.get("events_per_s_incl_start")
    shown = f"{rate:>12,.0f} events/s" if rate else "           - events/s"
    error = f" error={run['error'][:300]}" if "error" in run else ""
    return f"{shown} verified={run.get('verified')}{error}"


# ----------------------------------------------------------------------------- measurements


def _measurement(
    system: str, query: str, size: str, inp: JoinsInput, facts: dict, runs: list[dict], bench: Bench
) -> dict:
    ran = bench.runnable(system, query)
    cores = CORES.get(system, PARALLELISM)
    for run in runs:
        if run.get("seconds_incl_start"):
            run["events_per_s_per_core"] = run["events_per_s_incl_start"] / cores
            if query != "asof":
                run["nexmark_events_per_s_per_core"] = (
                    inp.spec.events / run["seconds_incl_start"] / cores
                )
    figures = {
        key: summary(runs, key)
        for key in (
            "events_per_s_incl_start",
            "events_per_s_per_core",
            "nexmark_events_per_s_per_core",
            "seconds_incl_start",
            "events_per_s",
            "micro_batches",
            "state_rows_max",
            "checkpoints_completed",
        )
    }
    status = bench.status[system]
    if system == "spark structured streaming" and query in NOT_SUPPORTED:
        status = NOT_SUPPORTED[query]
    setting = None
    if system == "spark structured streaming" and ran:
        chosen = bench.setting(query)
        setting = {**chosen.as_dict(), "label": chosen.label(), "short": chosen.short()}
    return {
        "name": f"joins {query}",
        "system": system,
        "status": status,
        "parameters": {
            "size": size,
            "events": inp.spec.events,
            "rows_read": {s: inp.rows[s] for s in STREAMS_READ[query]},
            "parallelism": PARALLELISM,
            "cores": cores,
            "answer_rows": facts["answer_rows"][query],
            "setting": setting,
        },
        "figures": figures,
        "flink_published_events_per_s_per_core": FLINK_PUBLISHED["events_per_s_per_core"].get(
            query
        ),
        "verified": all(r.get("verified") for r in runs) if ran and runs else None,
        "runs": runs,
    }


def _fmt(value: Any, scale: float = 1.0) -> str:
    if not isinstance(value, dict) or value.get("median") is None:
        return "-"
    return (
        f"{value['median'] * scale:,.0f} ({value['min'] * scale:,.0f}-{value['max'] * scale:,.0f})"
    )


def _table(results: list[dict], sweeps: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=(
            f"Stream joins, parallelism {PARALLELISM}: median (min-max) of the verified runs; "
            "Flink: published Nexmark figures (github.com/nexmark/nexmark)"
        )
    )
    for column in (
        "query",
        "size",
        "system",
        "setting",
        "rows read/s",
        "rows read/s/core",
        "Nexmark events/s/core",
        "Flink published/core",
        "verified",
    ):
        table.add_column(
            column, justify="left" if column in ("query", "size", "system", "setting") else "right"
        )
    for entry in results:
        figures, ran = entry["figures"], entry["verified"] is not None
        setting = entry["parameters"]["setting"]
        published = entry["flink_published_events_per_s_per_core"]
        table.add_row(
            entry["name"].split()[-1],
            entry["parameters"]["size"],
            entry["system"],
            setting["short"] if setting else "",
            _fmt(figures["events_per_s_incl_start"]) if ran else entry["status"][:70],
            _fmt(figures["events_per_s_per_core"]),
            _fmt(figures["nexmark_events_per_s_per_core"]),
            f"{published:,}" if published else "-",
            {None: "-", True: "yes", False: "NO"}[entry["verified"]],
        )
    console = Console(width=200)
    console.print(table)
    for query, found in sweeps.items():
        console.print(f"Spark sweep {query}: best {found['best_label']}")
        for run in found["runs"]:
            console.print(f"  {run['label']:<62} {_brief_rate(run)}")


# ----------------------------------------------------------------------------- main


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", choices=("small", "large", "both"), default="small")
    parser.add_argument("--events", type=int, help="another size: this many events of each kind")
    parser.add_argument("--files", type=int, default=20, help="files per stream (with --events)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--large-repeats", type=int, default=1)
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--out", type=Path, default=Path("bench/results/joins.json"))
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/cutline-joins"))
    parser.add_argument("--spark-files", default="1,5,0", help="maxFilesPerTrigger (0: all)")
    parser.add_argument("--spark-partitions", default="2,8")
    parser.add_argument("--spark-states", default="hdfs,rocksdb")
    parser.add_argument("--spark-memory", default="4g", help="spark.driver.memory (local mode)")
    parser.add_argument("--flink-venv", type=Path, default=Path("/tmp/pyflink-venv"))
    parser.add_argument("--install-flink", action="store_true")
    parser.add_argument("--no-flink", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a run may take")
    args = parser.parse_args()
    args.queries = [q for q in args.queries.split(",") if q]
    args.systems = [s for s in args.systems.split(",") if s]
    if set(args.queries) - set(QUERIES) or set(args.systems) - set(SYSTEMS):
        parser.error(f"queries among {QUERIES}, systems among {SYSTEMS}")
    args.settings = sweep(
        [int(f) for f in args.spark_files.split(",")],
        [int(p) for p in args.spark_partitions.split(",")],
        args.spark_states.split(","),
    )
    return args


def main() -> None:
    args = _parse()
    if args.events:
        sizes = {f"{args.events} events": JoinsSpec(events=args.events, files=args.files)}
        sweep_size = next(iter(sizes))
    else:
        names = ["small", "large"] if args.size == "both" else [args.size]
        sizes = {n: SIZES[n] for n in names}
        sweep_size = "small"  # (Spark's sweep and every warm-up run there)
    made = {sweep_size: SIZES["small"], **sizes} if not args.events else sizes
    args.work.mkdir(parents=True, exist_ok=True)
    inputs = {n: prepare_joins_input(spec, args.work, _log) for n, spec in made.items()}
    load_before = os.getloadavg()
    bench = Bench(args)
    for system in SYSTEMS:
        _log(f"{system}: {bench.status[system]}")
    truths = {}
    for name, inp in inputs.items():
        _log(f"{name}: reference answers and their per-record cross-check ...")
        truths[name] = ground_truth(inp, args.queries)
        _log(f"{name}: {json.dumps(truths[name][1])}")
    sweeps = {}
    if "spark structured streaming" in args.systems:
        sweeps = bench.sweep(inputs[sweep_size], args.queries, truths[sweep_size][0])
    warmups = []
    for system in ("pyflink sql", "cutline"):  # (Spark's warm-up is its sweep)
        for query in args.queries:
            if system in args.systems and bench.runnable(system, query):
                run = bench.run(
                    system, inputs[sweep_size], query, truths[sweep_size][0][query], "warmup"
                )
                warmups.append({"system": system, "query": query, **_brief(run)})
                _log(f"warm-up {system} {query}: {_brief_rate(run)}")

    results = []
    for name, inp in ((n, inputs[n]) for n in sizes):
        truth, facts = truths[name]
        repeats = args.large_repeats if name == "large" else args.repeats
        runs: dict[tuple[str, str], list[dict]] = {
            (s, q): [] for s in args.systems for q in args.queries
        }
        for repeat in range(repeats):
            active = [s for s in args.systems if s in SYSTEMS]
            order = active[repeat % len(active) :] + active[: repeat % len(active)]
            for query in args.queries:
                for system in order:
                    if not bench.runnable(system, query):
                        continue
                    run = bench.run(system, inp, query, truth[query], f"{name}-{repeat}")
                    run["round"] = repeat
                    runs[system, query].append(run)
                    _log(f"{name} {query} {system:<28} round {repeat + 1}: {_brief_rate(run)}")
        for query in args.queries:
            for system in args.systems:
                results.append(
                    _measurement(system, query, name, inp, facts, runs[system, query], bench)
                )
    bench.close()
    document = {
        "benchmark": "stream joins (issue 37): Nexmark q3, q8, q9-like interval join, as-of join",
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "revision": _revision(),
        "parallelism": PARALLELISM,
        "systems": bench.status,
        "not_supported": {"spark structured streaming": NOT_SUPPORTED},
        "spark_session_start_s": bench.spark_start_s,
        "spark_sweep": {"size": sweep_size, "queries": sweeps},
        "flink_published": FLINK_PUBLISHED,
        "inputs": {
            n: {
                **asdict(inp.spec),
                "rows": inp.rows,
                "directory": str(inp.directory),
                "seconds_to_generate": inp.seconds_to_generate,
                **truths[n][1],
            }
            for n, inp in inputs.items()
        },
        "warmups": warmups,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1, default=str) + "\n")
    _table(results, sweeps)
    print(f"written {args.out}")
    failed = [r for r in results if r["verified"] is False]
    unchecked = [q for n in inputs for q, ok in _cross_checks(truths[n][1]).items() if ok is False]
    sys.exit(1 if failed or unchecked else 0)


def _cross_checks(facts: dict) -> dict:
    found = facts.get("reference_equals_python")
    return found if isinstance(found, dict) else {}


def _brief(run: dict) -> dict:
    keys = ("verified", "seconds_incl_start", "rows", "missing_rows", "unexpected_rows", "error")
    return {k: run[k] for k in keys if k in run}


if __name__ == "__main__":
    main()
