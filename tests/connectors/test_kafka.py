"""The Kafka source and sink against a real broker (Tansu, started by the test on loopback), in
real jobs (slots as threads): records read exactly once with Kafka's fields, from where
``start=`` says, through a failure, a stop with a savepoint and a resume at another
parallelism; partitions found while the job runs; records that do not decode kept aside with
their topic, partition and offset; watermarks per partition that an empty partition does not
hold back; the sink's records all in the topic through a failure; and clear errors.

Records arrive by construction, not on a timer: the job's listener produces the next records
each time a checkpoint completes, and asks the job to stop with a savepoint once a checkpoint
holds, as the source's positions, the end of every partition.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from test_runtime_jobs import dead_letters
from test_savepoints import StopWithSavepoint, endpoints_of

from cutline import (
    EventTime,
    FixedDelay,
    JobClient,
    JobFailedError,
    SourceError,
    StreamEnvironment,
    Tumbling,
    testing,
)
from cutline.connectors.kafka import KafkaSource, ValueFormat
from cutline.connectors.kafka import metadata as kafka_metadata
from cutline.connectors.kafka.metadata import resolve_start
from cutline.examples.servers import KafkaBroker, free_port, produce
from cutline.protocol.splits import Split
from cutline.runtime.checkpoint.reader import open_checkpoint
from cutline.runtime.driver.client import JobEndpoint
from cutline.runtime.io.formats import InputWarning
from cutline.runtime.task.local import ThreadLauncher

from ledger import first_time

pytestmark = pytest.mark.connectors

Row = dict[str, Any]


def click(i: int, users: int = 5) -> Row:
    return {"user": f"u{i % users}", "amount": i}


def put(broker: KafkaBroker, topic: str, rows: Iterable[Row], partitions: int) -> None:
    """Rows dealt to the partitions round-robin (row i to partition i % partitions), keyed by
    their user."""
    rows = list(rows)
    for p in range(partitions):
        mine = [(r["user"], json.dumps(r)) for i, r in enumerate(rows) if i % partitions == p]
        if mine:
            produce(broker, topic, mine, partition=p)


def environment(tmp_path: Path, parallelism: int = 2, **options: Any) -> StreamEnvironment:
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / "ck",
        "dead_letter_dir": tmp_path / "dead",
        "restart_strategy": FixedDelay(delay=0),
    }
    settings.update(options)
    return StreamEnvironment(parallelism, **settings)


def run(env: StreamEnvironment, **options: Any) -> Any:
    return testing.execute(env, launcher=ThreadLauncher(), progress=False, **options)


def test_a_bounded_topic_is_read_once_with_kafkas_fields(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    kafka_broker.create_topic("clicks", 3)
    rows = [click(i) for i in range(90)]
    put(kafka_broker, "clicks", rows, 3)
    env = environment(tmp_path)
    stream = env.read_kafka(
        "clicks", bootstrap_servers=kafka_broker.bootstrap_servers, bounded=True
    )
    stream.collect()
    out = run(env).output
    assert sorted((r["_partition"], r["_offset"]) for r in out) == sorted(
        (i % 3, i // 3) for i in range(90)
    )
    for r in out:
        i = r["_offset"] * 3 + r["_partition"]
        assert (r["user"], r["amount"], r["_key"]) == (rows[i]["user"], i, rows[i]["user"])
        assert r["_timestamp"].tzinfo is not None
    # the schema was inferred on the driver: the records are Arrow columns of these types
    source = env.graph.operators[stream.operator.uid].logic.source
    assert source.record_schema() == pa.schema(
        [
            ("user", pa.string()),
            ("amount", pa.int64()),
            ("_key", pa.string()),
            ("_partition", pa.int32()),
            ("_offset", pa.int64()),
            ("_timestamp", pa.timestamp("ms", tz="UTC")),
            ("_headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
            ("_tombstone", pa.bool_()),
        ]
    )


def test_a_schema_dict_sets_the_types_of_the_fields_it_names_only(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """``schema={"amount": "double"}`` types ``amount``; the value's other fields are inferred
    as without it (not left out); a field it names that no sampled value has is there too. On
    an empty topic the dict's fields are the value's, and the job says so."""
    kafka_broker.create_topic("typed", 1)
    produce(
        kafka_broker,
        "typed",
        ['{"user": "u1", "amount": 1, "note": "x"}', '{"user": "u2", "amount": 2, "note": "y"}'],
    )
    env = environment(tmp_path, parallelism=1)
    stream = env.read_kafka(
        "typed",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        bounded=True,
        schema={"amount": "double", "score": "int64"},
    )
    stream.collect()
    source = env.graph.operators[stream.operator.uid].logic.source
    assert source.record_schema().names[:4] == ["user", "amount", "note", "score"]
    assert [source.record_schema().field(n).type for n in ("user", "amount", "note", "score")] == [
        pa.string(),
        pa.float64(),
        pa.string(),
        pa.int64(),
    ]
    out = run(env).output
    assert [(r["user"], r["amount"], r["note"], r["score"]) for r in out] == [
        ("u1", 1.0, "x", None),
        ("u2", 2.0, "y", None),
    ]
    assert all(type(r["amount"]) is float for r in out)
    kafka_broker.create_topic("nothing-yet", 1)
    later = environment(tmp_path, parallelism=1, checkpoint_dir=tmp_path / "ck2")
    with pytest.warns(InputWarning, match=r"the records have the fields schema= names only"):
        empty = later.read_kafka(
            "nothing-yet",
            bootstrap_servers=kafka_broker.bootstrap_servers,
            schema={"amount": "double"},
        )
    source = later.graph.operators[empty.operator.uid].logic.source
    assert source.record_schema().names[0] == "amount"
    # a pyarrow.Schema is the whole value: its fields only
    whole = environment(tmp_path, parallelism=1, checkpoint_dir=tmp_path / "ck3")
    only = whole.read_kafka(
        "typed",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        bounded=True,
        schema=pa.schema([("user", pa.string())]),
    )
    source = whole.graph.operators[only.operator.uid].logic.source
    assert source.record_schema().names[0] == "user" and "note" not in source.record_schema().names


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_failure_at_a_random_record_reads_each_record_once(
    kafka_broker: KafkaBroker, tmp_path: Path, seed: int
) -> None:
    """A keyed running sum over the topic, a failure injected once at record ``seed * 37``:
    every running sum once, as without the failure."""
    kafka_broker.create_topic("clicks", 3)
    rows = [click(i, users=6) for i in range(240)]
    put(kafka_broker, "clicks", rows, 3)
    env = environment(tmp_path, batch_size=8)
    env.read_kafka(
        "clicks",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        bounded=True,
        schema={"user": "string", "amount": "int64"},
    ).map(FailOnce(37 * seed + 11, str(tmp_path / "failed")), name="fail_once").key_by("user").sum(
        "amount", name="sums"
    ).collect()
    result = run(env)
    assert len(result.restarts) == 1
    assert Counter((r["user"], r["amount"]) for r in result.output) == running_sums(rows)


def running_sums(rows: list[Row]) -> Counter[tuple[str, int]]:
    """Every running sum per user, once each. Fixed however the partitions interleave when
    each user's rows are all in one partition, in order (``put`` deals row i to partition
    i % 3, and ``click(i, users=6)`` is of user i % 6: user u is in partition u % 3)."""
    sums: dict[str, int] = {}
    out: Counter[tuple[str, int]] = Counter()
    for r in rows:
        sums[r["user"]] = sums.get(r["user"], 0) + r["amount"]
        out[(r["user"], sums[r["user"]])] += 1
    return out


@dataclass(frozen=True)
class FailOnce:
    amount: int
    flag: str

    @property
    def __name__(self) -> str:
        return "fail_once"

    def __call__(self, record: Row) -> Row:
        if record["amount"] == self.amount and first_time(self.flag):
            raise RuntimeError(f"injected failure at amount {self.amount}")
        return record


def test_start_at_offsets_or_at_the_end(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    kafka_broker.create_topic("clicks", 2)
    put(kafka_broker, "clicks", [click(i) for i in range(40)], 2)
    env = environment(tmp_path)
    env.read_kafka(
        "clicks",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        bounded=True,
        start={0: 15, 1: 3},
    ).collect()
    out = run(env).output
    assert sorted((r["_partition"], r["_offset"]) for r in out) == [
        *((0, o) for o in range(15, 20)),
        *((1, o) for o in range(3, 20)),
    ]
    env = environment(tmp_path, checkpoint_dir=tmp_path / "ck2")
    with pytest.warns(InputWarning, match="no JSON record to infer the schema from"):
        env.read_kafka(
            "clicks", bootstrap_servers=kafka_broker.bootstrap_servers, bounded=True, start="latest"
        ).collect()
    assert run(env).output == []


class Offsets:
    """A consumer's answers to the look-ups a start at a time makes (Tansu answers
    ``offsets_for_times`` with a partition's first offset, whatever the time, so this one
    rule is checked without it): partition p has records at times 1000, 2000, ... up to
    ``ends[p]`` records."""

    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends

    def offsets_for_times(self, asked: list[TopicPartition], timeout: float) -> list[Any]:
        found = []
        for tp in asked:
            offset = max(0, -(-tp.offset // 1000) - 1)  # first record at or after the time
            found.append(
                TopicPartition(
                    tp.topic, tp.partition, offset if offset < self.ends[tp.partition] else -1
                )
            )
        return found

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, self.ends[tp.partition]


def test_a_start_at_a_time_is_each_partitions_first_record_at_or_after_it() -> None:
    source = KafkaSource(("t",), "127.0.0.1:1", start=3500)
    starts = resolve_start(Offsets({0: 10, 1: 2}), source, [("t", 0), ("t", 1)])  # type: ignore[arg-type]
    # partition 0: its record of time 4000 (offset 3); partition 1 has none so late: its end
    assert starts == {"t/0": 3, "t/1": 2}


def test_records_that_do_not_decode_go_to_the_dead_letters_named(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    kafka_broker.create_topic("mixed", 1)
    produce(
        kafka_broker,
        "mixed",
        [
            '{"user": "u1", "amount": 1}',
            "not json",
            '{"user": "u2", "amount": "abc"}',
            "[1, 2]",
            '{"user": "u3", "amount": 3}',
        ],
    )
    env = environment(tmp_path, parallelism=1)
    env.read_kafka(
        "mixed",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        bounded=True,
        schema={"user": "string", "amount": "int64"},
        on_error="dead_letter",
    ).collect()
    out = run(env).output
    assert [(r["user"], r["amount"], r["_offset"]) for r in out] == [("u1", 1, 0), ("u3", 3, 4)]
    dead = dead_letters(tmp_path / "dead")
    assert [json.loads(d["record"])["offset"] for d in dead] == [1, 2, 3]
    for d in dead:
        record = json.loads(d["record"])
        assert (record["topic"], record["partition"]) == ("mixed", 0)
    assert "not JSON" in dead[0]["error"]
    assert "does not fit the schema" in dead[1]["error"]
    assert "not an object" in dead[2]["error"]
    # failing instead names where
    env = environment(
        tmp_path,
        parallelism=1,
        checkpoint_dir=tmp_path / "ck2",
        restart_strategy=FixedDelay(0, delay=0),
    )
    env.read_kafka(
        "mixed",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        bounded=True,
        schema={"user": "string", "amount": "int64"},
    ).collect()
    with pytest.raises(
        JobFailedError, match=r"topic 'mixed' partition 0 offset 1: its value is not JSON"
    ):
        run(env)


def test_a_deserializer_of_the_users(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    kafka_broker.create_topic("csv", 1)
    produce(kafka_broker, "csv", ["u1,5", "u2,7", "broken"])
    env = environment(tmp_path, parallelism=1)
    env.read_kafka(
        "csv",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        bounded=True,
        value_format=from_csv,
        on_error="dead_letter",
    ).collect()
    out = run(env).output
    assert [(r["user"], r["amount"]) for r in out] == [("u1", 5), ("u2", 7)]
    (dead,) = dead_letters(tmp_path / "dead")
    assert "the deserializer raised ValueError" in dead["error"]


def from_csv(value: bytes) -> Row:
    user, amount = value.decode().split(",")
    return {"user": user, "amount": int(amount)}


def test_raw_and_string_values(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    kafka_broker.create_topic("bytes", 1)
    produce(kafka_broker, "bytes", [(b"k", b"\xff\xfe"), (None, "text")])
    for fmt in ("raw", "string"):
        env = environment(tmp_path, parallelism=1, checkpoint_dir=tmp_path / fmt)
        env.read_kafka(
            "bytes",
            bootstrap_servers=kafka_broker.bootstrap_servers,
            bounded=True,
            value_format=fmt,
            key_format="raw",
            on_error="dead_letter",
            dead_letter_dir=None,
        ) if False else env.read_kafka(
            "bytes",
            bootstrap_servers=kafka_broker.bootstrap_servers,
            bounded=True,
            value_format=fmt,
            key_format="raw",
            on_error="dead_letter",
        ).collect()
        out = run(env).output
        if fmt == "raw":
            assert [(r["_key"], r["value"]) for r in out] == [(b"k", b"\xff\xfe"), (None, b"text")]
        else:  # (the first value is not UTF-8 text: kept aside)
            assert [r["value"] for r in out] == ["text"]


def test_clear_errors_when_the_job_is_built(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_metadata, "METADATA_TIMEOUT", 1.0)  # (no broker: a wait)
    kafka_broker.create_topic("clicks", 1)
    env = environment(tmp_path)
    with pytest.raises(
        SourceError,
        match=r"topic 'nope' does not exist on the Kafka brokers at 127\.0\.0\.1:\d+ \(its topics: clicks\)",
    ):
        env.read_kafka("nope", bootstrap_servers=kafka_broker.bootstrap_servers)
    with pytest.raises(SourceError, match=r"cannot reach the Kafka brokers at 127\.0\.0\.1:\d+"):
        env.read_kafka(
            "clicks",
            bootstrap_servers=f"127.0.0.1:{free_port()}",
            config={"socket.connection.setup.timeout.ms": 1000},
        )
    with pytest.raises(ValueError, match="value_format must be one of json, avro, raw, string"):
        env.read_kafka(
            "clicks", bootstrap_servers=kafka_broker.bootstrap_servers, value_format="protobuf"
        )
    with pytest.raises(
        ValueError, match=r"the value's fields \['_offset'\] would hide Kafka's own"
    ):
        env.read_kafka(
            "clicks", bootstrap_servers=kafka_broker.bootstrap_servers, schema={"_offset": "int64"}
        )
    with pytest.raises(ValueError, match="start must be 'earliest', 'latest', a time"):
        env.read_kafka("clicks", bootstrap_servers=kafka_broker.bootstrap_servers, start="first")
    with pytest.raises(
        SourceError, match=r"start names partition 'clicks/4', which does not exist"
    ):
        env.read_kafka("clicks", bootstrap_servers=kafka_broker.bootstrap_servers, start={4: 0})


# ------------------------------------------------------------------------- unbounded


def positions(checkpoints: Path, checkpoint: int, uid: str) -> dict[str, int]:
    """The source's position per partition in ``checkpoint`` (its beginning: 0)."""
    reader = open_checkpoint(str(checkpoints), checkpoint)
    found: dict[str, int] = {}
    for subtask, handle in reader.handles.items():
        if uid in handle.operators:
            for split, state in reader.state_file(subtask).operators[uid]["splits"].items():
                found[split] = state.position or 0
    return found


class Feeder(StopWithSavepoint):
    """The job's listener: on each complete checkpoint, the next chunk of rows goes into the
    topic; once a checkpoint holds every partition's end as the source's position (``ends``,
    kept up to date as rows are put), the job is asked to stop with a savepoint."""

    def __init__(
        self,
        broker: KafkaBroker,
        topic: str,
        chunks: list[list[Row]],
        partitions: int,
        checkpoints: Path,
        endpoints: list[JobEndpoint],
        ends: dict[str, int],
        uid: str = "clicks",
    ) -> None:
        super().__init__(checkpoints, endpoints)
        self.broker, self.topic, self.partitions = broker, topic, partitions
        self.chunks = list(chunks)
        self.uid = uid
        self.ends = ends

    def __call__(self, kind: str, message: str) -> None:
        if kind != "checkpoint" or self.stopping:
            return
        checkpoint = int(message.split()[0])
        if self.chunks:
            self.feed(self.chunks.pop(0))
            return
        if positions(self.checkpoints, checkpoint, self.uid) == self.ends:
            self.stop()

    def feed(self, rows: list[Row]) -> None:
        for p in range(self.partitions):
            mine = [(r["user"], json.dumps(r)) for r in rows if r["amount"] % self.partitions == p]
            if mine:
                offsets = produce(self.broker, self.topic, mine, partition=p)
                self.ends[f"{self.topic}/{p}"] = offsets[-1] + 1


def summing_job(
    tmp_path: Path, broker: KafkaBroker, parallelism: int, ck: str, out: str
) -> StreamEnvironment:
    env = environment(tmp_path, parallelism, checkpoint_dir=tmp_path / ck)
    env.read_kafka(
        "clicks",
        bootstrap_servers=broker.bootstrap_servers,
        schema={"user": "string", "amount": "int64"},
        discovery_interval="20ms",
        name="clicks",
    ).key_by("user").sum("amount", name="sums").write_parquet(tmp_path / out, name="out")
    return env


def published(*folders: Path) -> Counter[tuple[str, int]]:
    import pyarrow.dataset as ds

    found: Counter[tuple[str, int]] = Counter()
    for folder in folders:
        if folder.exists():
            for r in ds.dataset(str(folder), format="parquet").to_table().to_pylist():
                found[(r["user"], r["amount"])] += 1
    return found


def test_a_live_topic_is_read_exactly_once_through_a_savepoint_and_a_rescale(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows come while the job runs (a chunk per checkpoint), the job stops with a savepoint,
    more rows come while it is stopped, and it resumes at parallelism 3 while more come:
    every running sum once over the two runs."""
    kafka_broker.create_topic("clicks", 3)
    rows = [click(i, users=6) for i in range(360)]
    chunks = [rows[i : i + 30] for i in range(0, 360, 30)]
    endpoints = endpoints_of(monkeypatch)
    ends = {f"clicks/{p}": 0 for p in range(3)}
    first = Feeder(kafka_broker, "clicks", chunks[:5], 3, tmp_path / "ck1", endpoints, ends)
    first.feed(chunks[5])  # there before the job starts, read from the earliest
    run(summing_job(tmp_path, kafka_broker, 2, "ck1", "out1"), listener=first)
    path = first.savepoint()
    second = Feeder(kafka_broker, "clicks", chunks[7:], 3, tmp_path / "ck2", endpoints, ends)
    second.feed(chunks[6])  # while no job runs
    result = run(
        summing_job(tmp_path, kafka_broker, 3, "ck2", "out2"), listener=second, restore_from=path
    )
    assert result.restored_from == path
    assert published(tmp_path / "out1") and published(tmp_path / "out2")
    assert published(tmp_path / "out1", tmp_path / "out2") == running_sums(
        [r for chunk in [chunks[5], *chunks[:5], chunks[6], *chunks[7:]] for r in chunk]
    )


@dataclass(frozen=True)
class Hiding(KafkaSource):
    """The topic's partitions but ``hidden``, until the file ``shown`` exists: partitions
    that appear while the job runs (Tansu cannot add partitions to a topic)."""

    hidden: int = 0
    shown: str = ""

    def splits(self) -> list[Split]:
        found = list(super().splits())
        if Path(self.shown).exists():
            return found
        return [s for s in found if not s.id.endswith(f"/{self.hidden}")]


def test_a_partition_found_while_the_job_runs_is_read_from_its_beginning(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kafka_broker.create_topic("clicks", 3)
    rows = [click(i, users=6) for i in range(180)]
    chunks = [rows[i : i + 30] for i in range(0, 180, 30)]
    shown = tmp_path / "shown"
    ends = {f"clicks/{p}": 0 for p in range(3)}
    feeder = Feeder(
        kafka_broker, "clicks", chunks[1:], 3, tmp_path / "ck", endpoints_of(monkeypatch), ends
    )
    feeder.feed(chunks[0])
    real = feeder.feed

    def feed(rows: list[Row]) -> None:  # (partition 2 appears with the third chunk)
        real(rows)
        if len(feeder.chunks) == 2:
            shown.write_text("")

    feeder.feed = feed  # type: ignore[method-assign]
    env = environment(tmp_path, 2, checkpoint_dir=tmp_path / "ck")
    source = Hiding(
        ("clicks",),
        kafka_broker.bootstrap_servers,
        ValueFormat("json", pa.schema([("user", pa.string()), ("amount", pa.int64())])),
        discovery_interval=0.02,
        hidden=2,
        shown=str(shown),
    )
    env.from_source(source, name="clicks").key_by("user").sum("amount", name="sums").write_parquet(
        tmp_path / "out", name="out"
    )
    run(env, listener=feeder)
    feeder.savepoint()
    assert published(tmp_path / "out") == running_sums(rows)


def test_an_empty_partition_does_not_hold_the_watermark_back(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partitions 0 and 1 have records of four one-second windows (and one later, to move
    their watermarks past them); partition 2 has none. With watermarks per partition, the
    windows fire once partition 2 has been idle ``idle_timeout``: the job's sink stops it
    when it has all four."""
    kafka_broker.create_topic("events", 3)
    base = 1_700_000_000_000
    for p in (0, 1):  # (and one record each at 5 s, past the four windows)
        mine = [i for i in range(200) if i % 2 == p]
        values = [json.dumps({"k": "all", "i": i}) for i in [*mine, -1]]
        times = [base + i * 20 for i in mine] + [base + 5000]
        produce(kafka_broker, "events", values, partition=p, timestamps=times)
    windows: dict[int, int] = {}
    stopping = threading.Event()
    endpoints = endpoints_of(monkeypatch)
    answers: list[Any] = []

    def seen(batch: Any) -> None:
        rows = batch.to_pylist() if hasattr(batch, "to_pylist") else batch
        for r in rows:
            windows[int(r["window_start"].timestamp() * 1000) - base] = r["count"]
        if len(windows) == 4 and not stopping.is_set():
            stopping.set()
            threading.Thread(
                target=lambda: answers.append(JobClient(str(tmp_path / "ck")).savepoint(stop=True)),
                daemon=True,
            ).start()

    env = environment(tmp_path, 2)
    env.read_kafka(
        "events",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        event_time=EventTime("_timestamp", idle_timeout="50ms"),
    ).key_by("k").window(Tumbling("1s")).count().sink_to(seen, name="seen")
    run(env)
    # (the stop may fire the last window too: a stop with a savepoint ends event time)
    assert {w: n for w, n in windows.items() if w < 5000} == {0: 50, 1000: 50, 2000: 50, 3000: 50}
    assert endpoints


# ---------------------------------------------------------------------------- sink


def read_topic(broker: KafkaBroker, topic: str, partitions: int) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "check"})
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        ]
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        while len(got) < sum(ends):
            got += [m for m in consumer.consume(1000, timeout=1.0) if m.error() is None]
        return got
    finally:
        consumer.close()


def test_the_sink_writes_every_record_at_least_once_through_a_failure(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    kafka_broker.create_topic("sums", 2)
    rows = [click(i, users=6) for i in range(300)]
    env = environment(tmp_path, batch_size=16)
    env.from_sequence(0, 300).map(lambda r: click(r["value"], users=6), name="clicks").map(
        FailOnce(150, str(tmp_path / "failed")), name="fail_once"
    ).key_by("user").sum("amount", name="sums").write_kafka(
        "sums", bootstrap_servers=kafka_broker.bootstrap_servers, key="user"
    )
    result = run(env)
    assert len(result.restarts) == 1
    written = read_topic(kafka_broker, "sums", 2)
    values = Counter(
        (json.loads(m.value())["user"], json.loads(m.value())["amount"]) for m in written
    )
    expected = running_sums(rows)
    assert set(values) == set(expected)  # every result present; some twice (at least once)
    assert all(m.key().decode() == json.loads(m.value())["user"] for m in written)


def test_offsets_are_published_to_the_group_for_monitoring(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    kafka_broker.create_topic("clicks", 2)
    put(kafka_broker, "clicks", [click(i) for i in range(40)], 2)
    env = environment(tmp_path)
    env.read_kafka(
        "clicks",
        bootstrap_servers=kafka_broker.bootstrap_servers,
        bounded=True,
        group_id="watchers",
    ).collect()
    run(env)
    consumer = Consumer(
        {"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "watchers"}
    )
    try:
        committed = consumer.committed([TopicPartition("clicks", p) for p in range(2)], timeout=10)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == [20, 20]


def test_a_broker_lost_while_the_job_runs_is_waited_for_and_nothing_is_lost(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker stops answering (SIGSTOP, by construction right after a chunk of rows went
    in at a checkpoint) and comes back a checkpoint later: the readers wait for it, and
    every running sum is published once."""
    kafka_broker.create_topic("clicks", 3)
    rows = [click(i, users=6) for i in range(240)]
    chunks = [rows[i : i + 30] for i in range(0, 240, 30)]
    ends = {f"clicks/{p}": 0 for p in range(3)}
    feeder = Feeder(
        kafka_broker, "clicks", chunks[1:], 3, tmp_path / "ck1", endpoints_of(monkeypatch), ends
    )
    feeder.feed(chunks[0])
    frozen: list[int] = []
    real = Feeder.__call__

    def call(self: Feeder, kind: str, message: str) -> None:
        if kind == "checkpoint" and len(self.chunks) == 4 and not frozen:
            real(self, kind, message)  # (a chunk goes in, then the broker stops answering)
            kafka_broker.freeze()
            frozen.append(int(message.split()[0]))
            return
        if kind == "checkpoint" and len(frozen) == 1:
            kafka_broker.thaw()  # (a checkpoint completed while it did not answer)
            frozen.append(int(message.split()[0]))
        real(self, kind, message)

    monkeypatch.setattr(Feeder, "__call__", call)
    run(summing_job(tmp_path, kafka_broker, 2, "ck1", "out"), listener=feeder)
    feeder.savepoint()
    assert len(frozen) == 2 and frozen[1] > frozen[0]
    assert published(tmp_path / "out") == running_sums(rows)
